"""Text training logs to series and events.

``read_log`` turns one log (or a Hugging Face ``trainer_state.json``) into
:class:`analyzer.model.Series` (``position_unit="line"``: positions are 1-based line
numbers) and :class:`analyzer.model.Event` records, with the framework it looks like
and how sure that guess is. Each format lives in its own module under
``analyzer.ingest.logformats``; this module runs them over the records of a file.

Event kinds produced: ``nonfinite`` (a line reports a NaN/Inf without a number to
plot; detail ``tag`` and ``kind``), ``overflow_skip``, ``loss_scale``,
``min_loss_scale``, ``error``, ``checkpoint_save`` and ``model_description`` (a model
summary or printed module: :mod:`analyzer.ingest.logformats.model_print`).

A log may come from anyone, so it is opened through :mod:`analyzer.ingest.safeio` and
never read past the size it had when opened. Policy for the kinds reported here (the
reading itself reports more: see ``logformats.source``, ``logformats.reader`` and
``logformats.trainer_state``):

- ``not_regular``: a FIFO, device, socket or folder under a log's name is not opened;
- ``unreadable``: the file cannot be opened or read; what was read before is kept;
- ``empty_file``: no text at all, NUL bytes and blanks aside;
- ``not_text``: the head of the file, NUL bytes aside, is more than 2% control bytes
  that text never holds (a compressed or binary file under a log's name): not read;
- ``too_large``: a ``trainer_state.json`` above 256 MiB, or an ``error.json`` above 16 MiB,
  is refused before it is read.

Lightning's ``CSVLogger`` ``metrics.csv`` is read by
:mod:`analyzer.ingest.logformats.csv_logger`, on the global step (its ``step`` column).
A torchrun worker's ``error.json`` (in ``attempt_N/<local_rank>/``, where the elastic agent
puts it) is read by :func:`analyzer.ingest.logformats.elastic.read_error_file`: its
message as an ``error`` event, and a ``nonfinite`` one when it reports a NaN or Inf.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from analyzer.ingest.logformats import reader
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.csv_logger import METRICS_FILE, read_metrics_csv
from analyzer.ingest.logformats.dispatch import Dispatcher
from analyzer.ingest.logformats.elastic import (
    ERROR_FILE,
    ERROR_FILE_CAP,
    error_file_rank,
    read_error_file,
)
from analyzer.ingest.logformats.lightning import BATCH, IN_EPOCH, last_frames
from analyzer.ingest.logformats.loop_skips import place_skips
from analyzer.ingest.logformats.prefixes import PrefixRule, decide_rule
from analyzer.ingest.logformats.reader import Lines, iter_batches
from analyzer.ingest.logformats.source import Chunks, sniff
from analyzer.ingest.logformats.trainer_state import read_trainer_state
from analyzer.ingest.safeio import Deadline, NotRegularFile, open_regular
from analyzer.model import Event, IngestIssue, Series
from analyzer.model.runs import EpochLength

LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
TRAINER_STATE = "trainer_state.json"
_NOT_LOGS = frozenset(
    {"readme.txt", "license.txt", "requirements.txt", "notes.txt", "cmake_install.txt"}
)
_VOCABULARIES = ("vocab.txt", "merges.txt")
"""A tokenizer's files: WordPiece's ``vocab.txt``, BPE's ``merges.txt`` (``tokenizers``
names them ``{prefix}-vocab.txt`` under a prefix); fairseq's ``dict.txt`` and
``dict.<lang>.txt`` are dictionaries too."""
_TRAINER_STATE_CAP = 1 << 28
"""A trainer_state.json is read whole; past this size it is refused, not loaded."""
BAR_AXES = (BATCH, IN_EPOCH)
"""Lightning's bar counts, which draw each count twice: the last frame is the step's."""
_CONTROL_SHARE = 0.02
"""Share of control bytes above which a file's head is not text."""


@dataclass(frozen=True)
class LogRead:
    """What one text log gave."""

    series: tuple[Series, ...]
    events: tuple[Event, ...]
    issues: tuple[IngestIssue, ...]
    framework: str | None
    confidence: float
    notes: tuple[str, ...]
    epoch_length: EpochLength | None = None
    """The one epoch length the log printed (none where it printed several)."""


def is_log_file(path: str) -> bool:
    """True for the files ``read_log`` is meant for: ``*.log``, ``*.txt``, ``*.out``,
    ``*.err``, ``trainer_state.json``, Lightning's ``CSVLogger`` ``metrics.csv`` and the
    elastic agent's ``attempt_N/<local_rank>/error.json``; not README, LICENSE and the
    like, nor a tokenizer's vocabulary (``vocab.txt``, ``merges.txt``, as ``tokenizers``
    saves a model and Hugging Face output folders hold them)."""
    name = os.path.basename(path).lower()
    if name == TRAINER_STATE:
        return True
    if name == ERROR_FILE:
        return error_file_rank(path) is not None
    if name == METRICS_FILE:
        return True
    if not name.endswith(LOG_SUFFIXES) or name in _NOT_LOGS:
        return False
    if name.endswith(_VOCABULARIES) or (name.startswith("dict.") and name.endswith(".txt")):
        return False
    return not name.startswith(("readme", "license", "requirements", "changelog"))


_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("deepspeed", ("[deepspeed]", "DeepSpeed", "deepspeed.", "OVERFLOW! Rank")),
    ("megatron", ("number of skipped iterations", "| consumed samples:", "megatron")),
    ("transformers", ("{'loss':", "{'eval_loss':", "{'train_runtime':", "transformers")),
    ("lightning", ("v_num=", "LOCAL_RANK:", "lightning", "GPU available:")),
    ("detectron2", ("d2.utils.events", "detectron2", "d2.engine")),
    ("mmengine", ("mmengine", "Epoch(train)", "Iter(train)", "mmcv", "mmdet")),
    ("fairseq", ("fairseq", "train_inner |", "num_updates=")),
    ("keras", ("ms/step", "s/step", "━━━━", "[=====", "TerminateOnNaN")),
    ("tensorflow", ("INFO:tensorflow", "basic_session_run_hooks", "global_step/sec")),
    ("nanogpt", ("mfu ", "iter 0: loss", "tokens per iteration will be")),
    ("yolo", ("GPU_mem", "gpu_mem", "ultralytics", "YOLOv5")),
    ("metric_logger", ("Averaged stats:", "max mem:", "stopping training")),
    ("timm", ("Train: ", "*** Best metric:", "Model ", "param count:")),
    ("progress_meter", ("=> creating model", " * Acc@1", "Epoch: [")),
)


def sniff_framework(text_head: str) -> tuple[str | None, float]:
    """A cheap guess from the first kilobytes: the framework whose marker strings
    occur most, and a confidence in 0..1 (0 when nothing matched)."""
    best: str | None = None
    best_hits = 0
    total = 0
    for name, markers in _MARKERS:
        hits = sum(1 for marker in markers if marker in text_head)
        total += hits
        if hits > best_hits:
            best, best_hits = name, hits
    if best is None:
        return None, 0.0
    return best, round(min(1.0, best_hits / 2) * best_hits / total, 3)


def read_log(path: str, deadline: Deadline | None = None) -> LogRead:
    """Read one log. Never raises for damaged content: damage becomes issues. Reading
    stops at ``deadline`` (by default ``safeio.READ_SECONDS`` from now), keeping what
    was read."""
    ctx = Context(path)
    try:
        stream, size = open_regular(path)
    except NotRegularFile as exc:
        ctx.issue("not_regular", str(exc), 0)
        return _result(ctx)
    except OSError as exc:
        ctx.issue("unreadable", f"cannot read: {exc.strerror or exc}", 0)
        return _result(ctx)
    budget = Deadline() if deadline is None else deadline
    try:
        with stream:
            name = os.path.basename(path).lower()
            if name == TRAINER_STATE:
                _read_state(stream, size, ctx, budget)
            elif name == ERROR_FILE:
                _read_error_file(stream, size, ctx)
            elif name == METRICS_FILE:
                read_metrics_csv(stream, size, ctx, budget)
            else:
                _read_text(stream, size, ctx, budget)
    except OSError as exc:
        ctx.issue("unreadable", f"cannot read on: {exc.strerror or exc}; what came before is kept")
    return _result(ctx)


def _whole(stream: BinaryIO, size: int, cap: int, what: str, ctx: Context) -> bytes | None:
    """A file read whole (a JSON document), or None with the issue: over ``cap`` bytes
    (``what`` says what the cap is), or nothing but whitespace."""
    if size > cap:
        ctx.issue("too_large", f"{size} bytes, above the {cap} {what}: not read", 1)
        return None
    data = stream.read(size)
    if not data.strip(b" \t\r\n\x00"):
        ctx.issue("empty_file", "the file holds no text", 1)
        return None
    return data


def _read_state(stream: BinaryIO, size: int, ctx: Context, deadline: Deadline) -> None:
    data = _whole(stream, size, _TRAINER_STATE_CAP, "read whole", ctx)
    if data is not None:
        read_trainer_state(data, ctx, deadline)


def _read_error_file(stream: BinaryIO, size: int, ctx: Context) -> None:
    data = _whole(stream, size, ERROR_FILE_CAP, "an error file holds", ctx)
    if data is not None:
        read_error_file(data, error_file_rank(ctx.source), ctx)


def _read_text(stream: BinaryIO, size: int, ctx: Context, deadline: Deadline) -> None:
    head = sniff(stream, size, deadline, reader.CHUNK_BYTES)
    if not head.text.strip() and head.whole:
        nuls = f" ({head.nul_bytes} NUL bytes only)" if head.nul_bytes else ""
        ctx.issue("empty_file", f"the file holds no text{nuls}", 1)
        return
    share = head.control_share()
    if share > _CONTROL_SHARE:
        ctx.issue(
            "not_text",
            f"{share:.0%} of its first {len(head.text)} bytes (NULs aside) are control "
            "bytes text never holds: not a text log",
            1,
        )
        return
    head_lines = head.text.decode("utf-8", errors="replace").splitlines()[:200]
    _run(Chunks(stream, size, ctx, head, deadline), decide_rule(head_lines), ctx)


def _run(chunks: Chunks, rule: PrefixRule, ctx: Context) -> None:
    dispatcher = Dispatcher(rule, ctx)
    for batch in iter_batches(chunks, ctx):
        if isinstance(batch, Lines):
            dispatcher.lines(batch)
        else:
            for number, text in batch:
                dispatcher.record(number, text)


def _result(ctx: Context) -> LogRead:
    series = []
    for (tag, rank), axis, steps, values, lines in ctx.series():
        if axis in BAR_AXES:
            keep = last_frames(steps)
            if not keep.all():
                steps, values, lines = steps[keep], values[keep], lines[keep]
        series.append(
            Series(
                tag=tag,
                steps=steps,
                values=values,
                wall_times=np.full(len(steps), np.nan),
                source=ctx.source,
                positions=lines,
                position_unit="line",
                rank=rank,
                axis=axis,
            )
        )
    framework, confidence = _verdict(ctx)
    notes = list(ctx.notes)
    events = place_skips(ctx.placed_events(), series)
    overflow = _overflow_note(events)
    if overflow:
        notes.append(overflow)
    return LogRead(
        series=tuple(series),
        events=tuple(events),
        issues=tuple(ctx.issues()),
        framework=framework,
        confidence=confidence,
        notes=tuple(notes),
        epoch_length=_one_length(ctx),
    )


def _one_length(ctx: Context) -> EpochLength | None:
    """The log's epoch length where its parsers read one only: two totals (two fits of
    different data appended to one file) say no one length."""
    lengths = list(ctx.epoch_lengths.values())
    return lengths[0] if len(lengths) == 1 else None


def _verdict(ctx: Context) -> tuple[str | None, float]:
    votes = {k: v for k, v in ctx.votes.items() if v > 0}
    if not votes:
        return None, 0.0
    loose = {k: v for k, v in votes.items() if k in ("generic", "tqdm")}
    specific = {k: v for k, v in votes.items() if k not in loose}
    # Tracebacks, anomaly errors and a loop's stop message are plain PyTorch, printed
    # under any framework: they name the log's framework only when no other does.
    framed = {k: v for k, v in specific.items() if k != "pytorch"}
    name = max(framed or specific or loose, key=lambda k: (votes[k], k))
    if name in specific and 4 * votes[name] < sum(loose.values()):
        # A stray framework message in a hand-written loop's log does not make the
        # log that framework's.
        name = max(loose, key=lambda k: (votes[k], k))
    count = votes[name]
    if name == "deepspeed" or (name in _TRAINERS and "deepspeed" in votes):
        # DeepSpeed is an engine under a trainer; its messages may outnumber the
        # trainer's lines (every steps_per_print steps, every overflow) or not, yet the
        # log is the trainer's, run with DeepSpeed.
        trainers = [k for k in specific if k in _TRAINERS]
        if trainers:
            trainer = max(trainers, key=lambda k: (votes[k], k))
            name, count = f"{trainer}+deepspeed", votes["deepspeed"] + votes[trainer]
    share = count / sum(votes.values())
    # A handful of matching lines is weaker evidence than thousands.
    weight = 1.0 - 0.5 ** min(count, 60)
    cap = 0.3 if name in loose else 1.0
    return name, round(min(cap, share * weight), 3)


_TRAINERS = frozenset(
    {"transformers", "lightning", "megatron", "mmengine", "detectron2", "metric_logger", "timm"}
)
"""Frameworks that run DeepSpeed underneath rather than beside."""


def _overflow_note(events: list[Event]) -> str | None:
    skips = [e for e in events if e.kind == "overflow_skip"]
    if not skips:
        return None
    scales = [
        float(s)
        for e in skips
        if isinstance(s := e.detail.get("new_scale"), int | float) and not math.isnan(s)
    ]
    floor = any(e.kind == "min_loss_scale" for e in events)
    text = f"{len(skips)} mixed-precision overflow skip(s), first at {skips[0].location}"
    if scales:
        text += f"; loss scale went down to {min(scales):g}"
    if floor:
        text += "; the minimum loss scale was reached"
    return text + "."


__all__ = ["LogRead", "is_log_file", "read_log", "sniff_framework"]
