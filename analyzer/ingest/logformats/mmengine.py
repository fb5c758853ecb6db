"""OpenMMLab loggers: mmengine's ``LogProcessor`` and the older mmcv ``TextLoggerHook``.

``Epoch(train)  [1][  50/1509]  base_lr: 2.0e-04 lr: 2.1e-06  eta: 8:27:55  time: 0.25
... grad_norm: nan  loss: 59.17  loss_cls: 21.07`` and ``Iter(train) [  50/80000] ...``;
mmcv: ``Epoch [1][50/500]\tlr: 2.000e-02, eta: ..., loss: nan`` and ``Iter [50/80000]``.

By-epoch steps are ``(epoch - 1) * iterations_per_epoch + i``; validation lines get
their tags prefixed with ``val/``. Both counts are from 1: ``LogProcessor`` prints
``runner.epoch + 1``, ``batch_idx + 1`` and ``runner.iter + 1``, and ``LoggerHook`` hands
the visualizer (its TensorBoard backend) ``step=runner.iter + 1``, the same number
(:data:`ITER`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from analyzer.ingest.logformats import fast
from analyzer.ingest.logformats.base import colon_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.fast import colon_shape
from analyzer.ingest.logformats.store import Row, Stepper, counter
from analyzer.model import StepAxis

_EPOCH = re.compile(r"Epoch(?:\((\w++)\))?+\s*+\[(\d{1,15}+)\]\s*+\[\s*+(\d{1,15}+)/(\d{1,15}+)\]")
_ITER = re.compile(r"Iter(?:\((\w++)\))?+\s*+\[\s*+(\d{1,15}+)/(\d{1,15}+)\]")
_SKIP = frozenset({"eta", "time", "data_time"})
"""Timing fields: never where a NaN shows, and a third of every line."""
ITER = StepAxis("counter", base=1, counts_skipped=True, label="iter")
"""mmengine's ``runner.iter + 1``: the iteration from 1."""


class MMEngineParser:
    framework = "mmengine"
    repeats = True
    triggers: tuple[str, ...] = ("Epoch(", "Iter(", "Epoch [", "Iter [")

    def __init__(self) -> None:
        self.shape: fast.Shape | None = None
        self.learn = fast.ENABLED
        self.heads: dict[bytes, tuple[int, bool]] = {}
        """Per record layout, where its header starts and whether it is by epoch."""

    def parse(self, text: str, ctx: Context) -> bool:
        shape = self.shape
        key = fast.record_key(text, ctx)
        if shape is not None and key is not None:
            # Where the header is and which one: the same for every record of a layout,
            # as the header patterns hold no digit and their classes hold all ten or none.
            head = self.heads.get(key)
            if head is not None and (shape.block.skip == 3) == head[1]:
                ctx.axis = ITER
                row = shape.match(text, head[0], ctx)
                if row is not None:
                    shape.take(row, ctx, "mmengine")
                    return True
        m = _EPOCH.search(text)
        by_epoch = m is not None
        if m is None:
            m = _ITER.search(text)
            if m is None:
                return False
        if key is not None and len(self.heads) < fast.TEMPLATES:
            self.heads[key] = (m.start(), by_epoch)
        ctx.axis = ITER
        if shape is not None and (shape.block.skip == 3) == by_epoch:
            row = shape.match(text, m.start(), ctx)
            if row is not None:
                shape.take(row, ctx, "mmengine")
                return True
        mode = m.group(1) or "train"
        if by_epoch:
            step = (int(m.group(2)) - 1) * int(m.group(4)) + int(m.group(3))
        else:
            step = int(m.group(2))
        pairs = colon_pairs(text[m.end() :], _SKIP)
        if mode != "train":
            pairs = [(f"{mode}/{name}", value) for name, value in pairs]
        ctx.points_at(step, pairs)
        ctx.votes["mmengine"] += 1
        if self.learn and len(text) <= fast.LEARN_CHARS:
            self.shape = _learn(text, m, by_epoch, pairs, ctx)
        return True

    def bulk(self, lines: list[str], start: int, before: int, ctx: Context) -> int:
        if self.shape is None:
            return start
        return self.shape.bulk(lines, start, before, ctx, "mmengine")


def _epoch_step(row: Row) -> int:
    return (int(row[0]) - 1) * int(row[2]) + int(row[1])  # type: ignore[arg-type]


def _epoch_steps(columns: list[tuple[str, ...]]) -> np.ndarray:
    epoch, i, per_epoch = map(counter, columns)
    return np.asarray((epoch - 1) * per_epoch + i)


def _iter_step(row: Row) -> int:
    return int(row[0])  # type: ignore[arg-type]


def _iter_steps(columns: list[tuple[str, ...]]) -> np.ndarray:
    return counter(columns[0])


def _epoch_steps_of(counts: list[np.ndarray]) -> np.ndarray:
    epoch, i, per_epoch = counts
    return np.asarray((epoch - 1) * per_epoch + i)


def _iter_steps_of(counts: list[np.ndarray]) -> np.ndarray:
    return counts[0]


_FAST: dict[str, tuple[str, str, Callable[[Row], int], Stepper]] = {
    "Epoch": (
        r"[^E]*+(?:E(?!poch)[^E]*+)*+",
        r"\[(\d{1,9}+)\]\s*+\[\s*+(\d{1,9}+)/(\d{1,9}+)\]",
        _epoch_step,
        _epoch_steps,
    ),
    "Iter": (
        r"(?!.*Epoch)[^I]*+(?:I(?!ter)[^I]*+)*+",
        r"\[\s*+(\d{1,9}+)/\d{1,15}+\]",
        _iter_step,
        _iter_steps,
    ),
}
"""Per header word: for whole lines, the prefix up to its first occurrence (an Iter
line must hold no Epoch, whose header the plain parser would prefer); the header
after the mode; the step of one row and of a block's counter columns. Counts are short
enough that a step always fits in 64 bits; a longer count leaves the line to the plain
parser."""


def _learn(
    text: str, head: re.Match[str], by_epoch: bool, pairs: list[tuple[str, float]], ctx: Context
) -> fast.Shape | None:
    """The shape of a line just read. The mode is held literally, and a header without
    one must read ``Epoch [`` or ``Iter [``, so that every line of the shape holds one
    of this parser's triggers."""
    tail = colon_shape(text[head.end() :], _SKIP)
    if tail is None or len(tail[1]) != len(pairs):
        return None
    word = "Epoch" if by_epoch else "Iter"
    prefix, counts, step_of, stepper = _FAST[word]
    mode = head.group(1)
    if mode is None:
        pattern = word + " " + counts
    else:
        pattern = word + r"\(" + re.escape(mode) + r"\)\s*+" + counts
    tags = tuple(name for name, _ in pairs)
    block = ctx.store.block(tags, ctx.rank, 3 if by_epoch else 1, stepper)
    literals = f"{word} {mode or ''} {tail[2]}"
    steps_of = ((0, 1, 2), _epoch_steps_of) if by_epoch else ((0,), _iter_steps_of)
    return fast.Shape(prefix, pattern + tail[0], block, step_of, literals, steps_of=steps_of)
