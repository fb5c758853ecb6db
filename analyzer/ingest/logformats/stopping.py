"""The stop message of reference training loops (DETR, DeiT, MAE and many timm-style
``engine.py`` files): when ``math.isfinite(loss_value)`` fails they print
``"Loss is {}, stopping training".format(loss_value)`` and exit, so the log shows
``Loss is nan, stopping training``. Copies vary: ``Loss is inf at step 23, stopping
training.``, a tensor (``Loss is tensor(nan, device='cuda:0'), stopping training``), a
logger prefix. The line becomes a ``nonfinite`` event for ``loss``; its step is the one
the line names, if any.
"""

from __future__ import annotations

import math
import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, to_float, to_step

_LOSS = re.compile(
    r"(?i)(?<![\w.])loss(?:_value)?+ is:?+ ++(?:tensor\(\[?+)?+(" + NUM + r")(?![\w.])"
)
_STEP = re.compile(
    r"(?i)(?<![\w.])(?:global[ _])?+(?:step|iteration|iter|update)"
    r"[ \t]*+[:=#]?+[ \t]*+(\d{1,3}+(?:,\d{3}){1,4}+|\d{1,15}+)(?!,?+\d)(?![\w.])"
)
"""``numbers.STEP`` refuses ``1,200,`` (the comma could start another group); here the
step is followed by ``, stopping training``."""


class StoppingParser:
    framework = "pytorch"
    repeats = False  # a one-off message; nothing follows it in the same shape
    triggers: tuple[str, ...] = ("stopping training", "Stopping training")

    def parse(self, text: str, ctx: Context) -> bool:
        m = _LOSS.search(text)
        if m is None:
            return False
        value = to_float(m.group(1))
        if value is None or not (math.isnan(value) or math.isinf(value)):
            # A finite loss stopped by some other rule (a divergence threshold) is not
            # this message.
            return False
        kind = "nan" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
        s = _STEP.search(text)
        step = to_step(s.group(1)) if s is not None else None
        ctx.nonfinite("loss", kind, step, text)
        ctx.votes["pytorch"] += 1
        return True
