"""detectron2: ``CommonMetricPrinter`` lines and the anomaly check's error.

``[11/29 17:03:40 d2.utils.events]:  eta: 0:10:00  iter: 19  total_loss: 2.345
loss_cls: 0.8  time: 0.5  data_time: 0.01  lr: 0.0002  max_mem: 1234M``

``FloatingPointError: Loss became infinite or NaN at iteration=N!`` comes from
``_write_metrics``; its ``loss_dict = {...}`` (same or next line) names the losses.

Steps are the trainer's ``iter`` (:data:`ITER`): ``for self.iter in range(start_iter,
max_iter)``, from 0, copied into the event storage before each step; the printer shows the
storage's ``iter`` and detectron2's TensorBoard writer writes each scalar at the iteration
it was put at, so both count as a 0-based loop does.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step
from analyzer.model import StepAxis

_ITER = re.compile(r"iter: (" + STEP + r")(?![\d/])")
_FPE = re.compile(r"Loss became infinite or NaN at iteration=(" + STEP + r")")
_LOSS_DICT = re.compile(r"loss_dict ?+= ?+\{")
_ITEM = re.compile(r"'([^'\\]*+)': ++(?:tensor\()?+(" + NUM + r")")
_SKIP = frozenset({"eta", "iter", "max_mem"})
ITER = StepAxis("counter", base=0, counts_skipped=True, label="iter")
"""detectron2's trainer iteration, from 0."""


class Detectron2Parser:
    framework = "detectron2"
    repeats = True
    triggers: tuple[str, ...] = ("iter: ", "Loss became infinite", "loss_dict")

    def __init__(self) -> None:
        self.error_step: int | None = None
        self.error_line = 0

    def parse(self, text: str, ctx: Context) -> bool:
        m = _FPE.search(text)
        if m is not None:
            self.error_step, self.error_line = to_step(m.group(1)), ctx.line
            ctx.axis = ITER
            ctx.nonfinite("total_loss", "nan-or-inf", self.error_step, text)
            self._loss_dict(text, ctx)
            ctx.votes["detectron2"] += 1
            return True
        near_error = self.error_step is not None and ctx.line - self.error_line <= 2
        if near_error and self._loss_dict(text, ctx):
            return True
        at = text.find("iter: ")
        if at < 0 or (at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_")):
            return False
        m = _ITER.match(text, at)
        if m is None:
            return False
        ctx.axis = ITER
        ctx.points_at(to_step(m.group(1)), colon_pairs(text[m.end() :], _SKIP))
        ctx.votes["detectron2"] += 1
        return True

    def _loss_dict(self, text: str, ctx: Context) -> bool:
        found = _LOSS_DICT.search(text)
        if found is None or self.error_step is None:
            return False
        for item in _ITEM.finditer(text, found.end()):
            value = to_float(item.group(2))
            if value is not None:
                ctx.point(item.group(1), self.error_step, value)
        return True
