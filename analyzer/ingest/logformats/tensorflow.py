"""TensorFlow 1 Estimator hooks.

``LoggingTensorHook`` prints ``loss = 0.693, step = 1`` (then ``(0.512 sec)``);
``NanTensorHook`` prints ``Model diverged with loss = NaN.`` and raises
``NanLossDuringTrainingError: NaN loss during training.``. Neither names the step:
the events carry ``after_step``, the last step logged before them.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step

_STEP = re.compile(r"(?<![\w])(?:global_)?+step = (" + STEP + r")(?![\w.])")
_KV = re.compile(r"(?<![\w/])([A-Za-z_][\w/]*+) = (" + NUM + r")(?![\w.])")
_DIVERGED = ("Model diverged with loss = NaN", "NaN loss during training")


class TensorFlowParser:
    framework = "tensorflow"
    repeats = True
    triggers: tuple[str, ...] = (" = ", "NaN loss during training")

    def parse(self, text: str, ctx: Context) -> bool:
        if any(marker in text for marker in _DIVERGED):
            ctx.nonfinite("loss", "nan", None, text)
            ctx.votes["tensorflow"] += 1
            return True
        m = _STEP.search(text)
        if m is None:
            return False
        step = to_step(m.group(1))
        found = False
        for kv in _KV.finditer(text):
            key = kv.group(1)
            if key in ("step", "global_step"):
                continue
            value = to_float(kv.group(2))
            if value is not None:
                ctx.point(key, step, value)
                found = True
        if found:
            ctx.votes["tensorflow"] += 1
        return found
