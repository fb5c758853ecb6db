"""``forensics replay``: replay one capture (or, for a run without one, a step from a
checkpoint on a supplied batch), print what it found, write its JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TextIO

from analyzer.cli.exit import status
from analyzer.cli.output import check_json_target, write_json_file
from analyzer.errors import UsageError
from analyzer.ingest import storage


def replay_command(path: str, *, device: str = "cpu", dtype: str = "as-run",
                   json_file: str | None = None, import_paths: Sequence[str] = (),
                   trust_code: bool = False, run_roots: Sequence[str] = (),
                   out: TextIO | None = None, checkpoint: str | None = None,
                   batch: str | None = None, data: str | None = None,
                   model: str | None = None, model_kwargs: str | None = None,
                   loss: str | None = None, step: str | None = None,
                   passes: str = "auto") -> int:
    """Replay the capture behind ``path``; print the report; return the exit status:
    1 when the replay found a non-finite value, 0 when the step stayed finite.
    ``json_file`` '-' prints the JSON instead of the text report. A run folder without a
    ``capture/`` of its own replays the earliest capture of the run discovery groups there
    (``run_roots``: as ``analyze --run-root``).

    With ``batch`` or ``data`` the run's checkpoint is replayed instead, on that batch
    (:mod:`analyzer.replayer.from_checkpoint`): ``checkpoint``, ``model`` (with its JSON
    ``model_kwargs``), ``loss`` and ``step`` say what to rebuild it from. ``path`` may be a
    URL: the capture is read in place (:mod:`analyzer.ingest.storage`). ``passes`` "all"
    runs every replay pass, "auto" only those the verdict needs."""
    from analyzer.report.replay import format_replay

    stream = out if out is not None else sys.stdout
    if json_file and json_file != "-":
        check_json_target(json_file)
    asked = {"--checkpoint": checkpoint, "--model": model, "--model-kwargs": model_kwargs,
             "--loss": loss, "--step": step}
    label: str | None = None
    if (batch is not None or data is not None) and \
            any(storage.is_url(p) for p in (path, checkpoint or "")):
        raise UsageError(f"{path}: a replay from a checkpoint reads a local run; copy the run "
                         "out of the store first (a capture is replayed in place)")
    if batch is not None or data is not None:
        from analyzer.replayer.from_checkpoint import Request, parse_kwargs, replay_checkpoint

        done = replay_checkpoint(Request(
            path, checkpoint=checkpoint, model=model, model_kwargs=parse_kwargs(model_kwargs),
            batch=batch, data=data, loss=loss, step=step, device=device, dtype=dtype,
            import_paths=import_paths, trust_code=trust_code, run_roots=run_roots,
            passes=passes))
        result, label, document = done.result, done.label, done.to_dict()
    else:
        given = [name for name, value in asked.items() if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: a replay from a checkpoint, which needs a "
                             "batch: add --batch FILE or --data module:function")
        from analyzer.capture.folder import capture_of
        from analyzer.replayer import CaptureError, replay

        target = run_capture(path, run_roots)
        if storage.isdir(target) and capture_of(target) is None:
            raise CaptureError(path, "holds no capture (no capture/step_<N>/meta.json); to "
                                     "replay a step from one of its checkpoints instead, add "
                                     "--batch FILE or --data module:function")
        result = replay(target, device=device, dtype=dtype, import_paths=import_paths,
                        trust_code=trust_code, passes=passes)
        document = result.to_dict()
    text = json.dumps(document, indent=2, allow_nan=False)
    if json_file == "-":
        stream.write(text + "\n")
    else:
        stream.write(format_replay(result, label=label) + "\n")
        if json_file:
            write_json_file(json_file, text)
    return status(nonfinite=result.phase is not None)


def run_capture(path: str, run_roots: Sequence[str] = ()) -> str:
    """What to replay for ``path``: itself when it is or holds a capture, else the earliest
    complete capture of the run whose root it is (its captures may lie in a segment's
    folder), else ``path`` (the replay then says it holds none)."""
    from analyzer.capture.folder import capture_of, is_complete
    from analyzer.ingest.discover import discover

    path = storage.normalize(path)
    if not storage.isdir(path) or capture_of(path) is not None:
        return path
    here = storage.absolute(path)
    for run in discover([path], run_roots=run_roots).runs:
        if storage.absolute(run.path) == here:
            return next((c for c in run.capture_dirs if is_complete(c)), path)
    return path
