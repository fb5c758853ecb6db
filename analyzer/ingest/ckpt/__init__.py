"""Checkpoint forensics, one concept per module.

    ranges           one file opened through safeio, read by byte ranges (no memory map)
    sniff            what a file holds, by its first bytes
    quoting          what a message may quote of a file: names, cut short; nothing else
    archive          zip layout checks: bombs, overlaps, truncation (no extraction)
    staticpickle     a pickle rebuilt from its opcodes, nothing imported or called
    extents          every tensor's bytes checked to lie inside its storage's record
    wopredict        when torch's weights_only reading of an archive is known without torch
    safetensors_file safetensors header validation and raw tensor reading
    leaves           one view of a tensor, loaded or described
    metaleaves       tensors of torch's meta-device reading, read and checked here
    stats            chunked per-tensor statistics and per-layer aggregation
    npdtypes         element types read with numpy; bfloat16 and float8 widened exactly
    npstats          the same statistics of numpy chunks, to torch's bits
    npsum            a float32 sum in the order torch's CPU kernel adds
    pinning          torch on one thread during a scan, imported only when needed
    tree             where model, optimizer, scaler and step sit in a checkpoint
    roles            what each section means: evidence or the trainer's bookkeeping
    meta             the bookkeeping read: framework, step, epoch, hyperparameters, callbacks
    optimizer        optimizer tensors and Adam second-moment findings
    build            tree -> CheckpointScan
    scan             one file: which reader, under which safety policy
    sharded          index JSON + shards
    history          a run's saves in step order

The public API is :mod:`analyzer.ingest.checkpoints`; its terminal text is
:mod:`analyzer.report.checkpoints` and ``forensics inspect`` is :mod:`analyzer.cli.inspect`.
"""
