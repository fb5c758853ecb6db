"""Megatron-LM ``training_log`` lines.

`` iteration      120/  500000 | consumed samples: 3840 | ... | lm loss: 2.304E+00 |
loss scale: 65536.0 | grad norm: 1.234 | number of skipped iterations:   0 |
number of nan iterations:   0 |``

Megatron prints a loss only when its interval average is > 0, and NaN > 0 is false:
a NaN loss vanishes from the line while ``number of nan iterations`` counts it. So a
rising nan counter is a ``nonfinite`` event for the loss that went missing.
"""

from __future__ import annotations

import math
import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import STEP, number_value, to_step

_ITERATION = re.compile(r"iteration\s++(" + STEP + r")/\s*+(" + STEP + r")\s*+\|")
_FIELD = re.compile(r" ?+([^|:]++):[ \t]*+([^|]*+)\|")
SKIP = frozenset(
    {
        "consumed samples",
        "consumed tokens",
        "global batch size",
        "elapsed time per iteration (ms)",
        "elapsed time per iteration (s)",
        "throughput per GPU (TFLOP/s/GPU)",
        "samples per second",
        "TFLOPs",
    }
)
"""Bookkeeping and speed fields: never the seat of a NaN, and half of every line."""
RENAME = {
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "learning rate": "lr",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "params norm": "params_norm",
    "num zeros": "num_zeros",
}


class MegatronParser:
    framework = "megatron"
    repeats = True
    triggers: tuple[str, ...] = ("iteration",)

    def __init__(self) -> None:
        self.loss_names: list[str] = []
        self.scale: float | None = None

    def parse(self, text: str, ctx: Context) -> bool:
        at = text.find("iteration")
        if at < 0 or (at > 0 and text[at - 1] not in " \t]"):
            return False
        m = _ITERATION.match(text, at)
        if m is None:
            return False
        step = to_step(m.group(1))
        tail = text[m.end() :]
        cut = tail.find("| time (ms) |")
        if cut >= 0:
            tail = tail[: cut + 1]  # the per-timer breakdown after it is not training metrics
        values: dict[str, float] = {}
        for name, raw in _FIELD.findall(tail if tail.endswith("|") else tail + "|"):
            if name in SKIP:
                continue
            try:
                values[RENAME.get(name, name)] = float(raw)  # inline: the common case
            except ValueError:
                value = number_value(raw)
                if value is not None:
                    values[RENAME.get(name, name)] = value
        ctx.points_at(step, list(values.items()))
        for name in values:
            if "loss" in name and name != "loss_scale" and name not in self.loss_names:
                self.loss_names.append(name)
        self._events(values, step, text, ctx)
        ctx.votes["megatron"] += 1
        return True

    def _events(self, values: dict[str, float], step: int, text: str, ctx: Context) -> None:
        nan_iters = values.get("nan_iterations", 0.0)
        if nan_iters > 0 and math.isfinite(nan_iters):
            missing = [n for n in self.loss_names if n not in values] or ["lm loss"]
            ctx.nonfinite(
                missing[0], "nan-or-inf", step, text, nan_iterations=int(nan_iters), missing=missing
            )
            ctx.note(
                "megatron-missing-loss",
                f"{ctx.source}:{ctx.line}: Megatron counted {int(nan_iters)} NaN iteration(s) "
                f"at iteration {step}; it leaves a NaN loss out of the line, so the "
                "missing loss field is the evidence.",
            )
        skipped = values.get("skipped_iterations", 0.0)
        scale = values.get("loss_scale")
        if skipped > 0 and math.isfinite(skipped):
            ctx.event("overflow_skip", step, text, {"skipped": int(skipped), "new_scale": scale})
        if scale is not None and self.scale is not None and scale != self.scale:
            ctx.event("loss_scale", step, text, {"old_scale": self.scale, "new_scale": scale})
        if scale is not None:
            self.scale = scale
