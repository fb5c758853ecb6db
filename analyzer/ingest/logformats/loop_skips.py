"""Overflow skips printed by hand-written mixed-precision loops and smaller libraries.

torch's ``GradScaler`` prints nothing when it skips a step, so loops that want to see it
print their own line, in their own words: ``gradient overflow, skipping step, loss scale
65536.0 -> 32768.0``, ``step 120: overflow, skipped update (scale 1024 to 512)``. Older
apex printed ``Gradient overflow.  Skipping step, reducing loss scale to 32768.0`` (no
loss scaler id); BMTrain ``Gradient overflow, change scale from 1024.000000 to
512.000000``. The messages DeepSpeed, apex and fairseq print are read by
:mod:`mixed_precision`, first.

A line is read here when it speaks of a skip (``skip``, ``skipping``, ``skipped``) or a
scale change, and of an overflow or a loss scale; it becomes an ``overflow_skip`` event
with ``attempted_scale`` (the scale before) and ``new_scale`` (after) where printed, at
the step the line names (a loop's own global step) or, naming none, after the last step
logged. A line that speaks of a scale change alone, with neither a skip nor an
overflow, is a ``loss_scale`` event.

A skip line naming no step is printed before its step's metric line by some loops and
after it by others; once the file is read, :func:`place_skips` puts such skips at the
step the logged gradients show was skipped (detail ``placed_by``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step
from analyzer.model import Event, Series
from analyzer.tags import role

_SKIP = re.compile(r"(?i)\bskip(?:ping|ped|s)?+\b")
_OVERFLOW = re.compile(r"(?i)overflow|non-?finite|\b(?:nan|inf)\b|loss[ _]?+scal")
_FROM_TO = re.compile(
    r"(?i)scal(?:e|er|ing)\b[^\d\n]{0,40}?(?:from )?+(" + NUM + r")\s*+(?:->|→|=>|to)\s*+("
    + NUM + r")(?![\w.])"
)
_TO = re.compile(
    r"(?i)(?:(?:reduc|decreas|lower|halv|sett?)(?:e|es|ed|ing)?+|new)\s++(?:the\s++)?+(?:loss\s*+)?+"
    r"scale\s*+(?:to|=|:)\s*+(" + NUM + r")(?![\w.])"
)
_STEP = re.compile(
    r"(?i)(?<![\w.])(?:global[ _])?+(?:step|iteration|iter|update)[ \t]*+[:=#]?+[ \t]*+("
    + STEP + r")(?![\w.])"
)
_CHANGE = ("change scale", "Change scale", "scale from", "Scale from")


class LoopSkipParser:
    framework = "pytorch"
    repeats = False  # one-off messages between a loop's metric lines
    triggers: tuple[str, ...] = (
        "skip", "Skip", "SKIP", "change scale", "Change scale", "scale from", "Scale from",
    )

    def parse(self, text: str, ctx: Context) -> bool:
        skipped = _SKIP.search(text) is not None
        if not skipped and not any(c in text for c in _CHANGE):
            return False
        if _OVERFLOW.search(text) is None:
            return False
        detail: dict[str, object] = {}
        m = _FROM_TO.search(text)
        if m is not None:
            detail["attempted_scale"] = to_float(m.group(1))
            detail["new_scale"] = to_float(m.group(2))
        else:
            t = _TO.search(text)
            if t is not None:
                detail["new_scale"] = to_float(t.group(1))
        overflow = skipped or "overflow" in text.lower()
        if not overflow and not detail:
            return False
        s = _STEP.search(text)
        step = to_step(s.group(1)) if s is not None else None
        if overflow:
            ctx.event("overflow_skip", step, text, detail, global_step=True)
        else:
            detail["old_scale"] = detail.pop("attempted_scale", None)
            ctx.event("loss_scale", step, text, detail, global_step=True)
        ctx.votes["pytorch"] += 1
        return True


def place_skips(events: list[Event], series: Sequence[Series]) -> list[Event]:
    """``events`` with each overflow skip that names no step put at the step it was, where
    the gradients logged beside it say which.

    A loop prints its skip line before the step's metric line (``gradient overflow,
    skipping step ...`` then ``step 0 loss 29.7 grad_norm nan``) or after it, and a skipped
    step's gradient norm is Inf or NaN. Over the file, the skips whose next numbered step
    shows a non-finite gradient are counted against those whose previous one does; the
    side that holds more places every such skip (the next step, or the one before it).
    Only skips between two consecutive steps (or before the first) are placed, on a
    numbering that counts skipped steps: a log printed every k steps (fairseq's
    ``num_updates``, which a skipped update does not advance) does not say which step
    was skipped. Neither side ahead (no gradient printed, or both non-finite alike)
    leaves them after the step before, as read."""
    stepless = [i for i, e in enumerate(events)
                if e.kind == "overflow_skip" and e.step is None and e.location.line]
    grads = [s for s in series if role(s.tag).is_gradient and len(s) and s.axis.counts_skipped]
    if not stepless or not grads:
        return events
    placed: list[tuple[int, int, int]] = []  # (event index, step before, step after); -1: none
    votes = [0, 0]
    for axis in {events[i].axis for i in stepless}:
        mine = [s for s in grads if s.axis == axis]
        at = [i for i in stepless if events[i].axis == axis]
        if not mine:
            continue
        lines = np.array([events[i].location.line or 0 for i in at], dtype=np.int64)
        before, bad_before = _nearest(mine, lines, before=True)
        after, bad_after = _nearest(mine, lines, before=False)
        # Steps between them not printed (a log every k steps): either side may be wrong.
        ok = (before < 0) | (after < 0) | (after == before + 1)
        votes[0] += int((ok & bad_before).sum())
        votes[1] += int((ok & bad_after).sum())
        placed += [(i, int(b), int(a)) for i, b, a, good in
                   zip(at, before.tolist(), after.tolist(), ok.tolist(), strict=True) if good]
    if votes[0] == votes[1]:
        return events
    pick = 1 if votes[1] > votes[0] else 0
    out = list(events)
    for i, *sides in placed:
        step = sides[pick]
        if step >= 0:
            out[i] = replace(events[i], step=step,
                             detail={**events[i].detail, "placed_by": _PLACED[pick]})
    return out


_PLACED = ("the non-finite gradient logged on the step before it",
           "the non-finite gradient logged on the step after it")


def _nearest(series: Sequence[Series], lines: np.ndarray, *, before: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``lines``: the step of the nearest gradient record before it (or after
    it), -1 where none, and whether any gradient is non-finite on that record's line.
    A series' positions are line numbers in file order."""
    none = np.iinfo(np.int64).max
    near = np.full(lines.shape, -1 if before else none, dtype=np.int64)
    for s in series:
        pos = s.positions.astype(np.int64)
        k = np.searchsorted(pos, lines, side="left" if before else "right") - int(before)
        valid = (k >= 0) & (k < pos.size)
        found = np.where(valid, pos[np.clip(k, 0, pos.size - 1)], near)
        near = np.maximum(near, found) if before else np.minimum(near, found)
    step = np.full(lines.shape, -1, dtype=np.int64)
    bad = np.zeros(lines.shape, dtype=bool)
    known = (near >= 0) & (near != none)
    for s in series:
        pos = s.positions.astype(np.int64)
        lo = np.searchsorted(pos, near, side="left")
        hi = np.searchsorted(pos, near, side="right")
        here = known & (hi > lo)
        nonfinite = np.concatenate([[0], np.cumsum(~np.isfinite(s.values))])
        step = np.where(here, s.steps[np.clip(hi - 1, 0, pos.size - 1)], step)
        bad |= here & (nonfinite[hi] > nonfinite[lo])
    return step, bad
