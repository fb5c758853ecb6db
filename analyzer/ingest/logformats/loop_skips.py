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
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step

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
