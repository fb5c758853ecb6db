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
    if not stepless:
        return events
    grads = [s for s in series if role(s.tag).is_gradient and len(s)]
    if not grads:
        return events
    sides: dict[int, tuple[int | None, int | None]] = {}
    votes = [0, 0]
    for i in stepless:
        event = events[i]
        line = event.location.line or 0
        mine = [s for s in grads if s.axis == event.axis and s.axis.counts_skipped]
        before = _neighbour(mine, line, -1)
        after = _neighbour(mine, line, +1)
        if before and after and after[0] != before[0] + 1:
            continue  # steps between them were not printed: either side may be wrong
        sides[i] = (before[0] if before else None, after[0] if after else None)
        votes[0] += bool(before and before[1])
        votes[1] += bool(after and after[1])
    if votes[0] == votes[1]:
        return events
    pick = 1 if votes[1] > votes[0] else 0
    out = list(events)
    for i, (before_step, after_step) in sides.items():
        step = (before_step, after_step)[pick]
        if step is not None:
            out[i] = replace(events[i], step=step,
                             detail={**events[i].detail, "placed_by": _PLACED[pick]})
    return out


_PLACED = ("the non-finite gradient logged on the step before it",
           "the non-finite gradient logged on the step after it")


def _neighbour(series: Sequence[Series], line: int, side: int) -> tuple[int, bool] | None:
    """The step of the record nearest ``line`` on ``side`` (-1 before, +1 after) among the
    gradient series (their positions are line numbers, in file order), and whether any of
    them is non-finite on that record's line."""
    near: int | None = None
    for s in series:
        at = int(np.searchsorted(s.positions, line, side="left" if side < 0 else "right"))
        k = at - 1 if side < 0 else at
        if 0 <= k < len(s):
            found = int(s.positions[k])
            if near is None or abs(found - line) < abs(near - line):
                near = found
    if near is None:
        return None
    step: int | None = None
    bad = False
    for s in series:
        lo, hi = np.searchsorted(s.positions, [near, near + 1])
        if lo < hi:
            step = int(s.steps[hi - 1])
            bad = bad or not bool(np.isfinite(s.values[lo:hi]).all())
    return (step, bad) if step is not None else None
