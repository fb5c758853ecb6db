"""nanoGPT's ``train.py``: ``iter 100: loss 4.1234, time 12.34ms, mfu 12.34%`` and the
evaluation line ``step 500: train loss 2.3012, val loss 2.4120``.

Both print ``iter_num``, counted from 0 (the first line is ``iter 0``), the number a
script's own SummaryWriter would log at (:data:`ITER`)."""

from __future__ import annotations

import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step
from analyzer.model import StepAxis

_ITER = re.compile(r"\s*+iter (" + STEP + r"): loss (" + NUM + r"),")
_EVAL = re.compile(r"\s*+step (" + STEP + r"): train loss (" + NUM + r"), val loss (" + NUM + r")")

ITER = StepAxis("counter", base=0, counts_skipped=True, label="iter")
"""nanoGPT's ``iter_num``: from 0, every iteration counted (a GradScaler skip too)."""


class NanoGPTParser:
    framework = "nanogpt"
    repeats = True
    triggers: tuple[str, ...] = ("iter ", "step ")

    def parse(self, text: str, ctx: Context) -> bool:
        m = _ITER.match(text)
        if m is not None:
            value = to_float(m.group(2))
            ctx.axis = ITER
            if value is not None:
                ctx.point("loss", to_step(m.group(1)), value)
            ctx.votes["nanogpt"] += 1
            return True
        m = _EVAL.match(text)
        if m is not None:
            ctx.axis = ITER
            step = to_step(m.group(1))
            for tag, token in (("train_loss", m.group(2)), ("val_loss", m.group(3))):
                value = to_float(token)
                if value is not None:
                    ctx.point(tag, step, value)
            ctx.votes["nanogpt"] += 1
            return True
        return False
