"""Keras ``Progbar`` lines and the ``TerminateOnNaN`` callback.

Keras 2: ``120/1875 [>.....] - ETA: 5s - loss: nan - accuracy: 0.1``
Keras 3: ``120/1875 ━━━━━━━━━━━━━━━━━━━━ 5s 3ms/step - accuracy: 0.1 - loss: nan``
``verbose=2``: ``1875/1875 - 4s - 2ms/step - accuracy: 0.87 - loss: nan``
An epoch header ``Epoch 2/10`` follows on its own line, or glued to the last bar when
the bar ended without a newline (``- loss: nanEpoch 2/10``).
``Batch 41: Invalid loss, terminating training`` names the 0-based batch.

Steps are ``(epoch - 1) * batches_per_epoch + batch``, counting batches from 1 as
the bar does (``Progbar.update(batch + 1)``); ``Batch N`` names the callback's 0-based
index, so it is step ``(epoch - 1) * batches_per_epoch + N + 1`` (:data:`BATCH`). A
writer counting batches from 0, as ``optimizer.iterations`` does before the first
update, logs that batch one lower.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.model import StepAxis

_EPOCH = re.compile(r"Epoch (\d{1,15}+)/(\d{1,15}+)[ \t]*+$")
_BAR = re.compile(r"(?<![\d/])(\d{1,15}+)/(\d{1,15}+) ++(?:\[[=>.]*+\]|━|- )")
_INVALID = re.compile(r"Batch (\d{1,15}+): Invalid loss, terminating training")
BATCH = StepAxis("counter", base=1, counts_skipped=True, label="batch")
"""The progress bar's batch count over the epochs, from 1."""


class KerasParser:
    framework = "keras"
    repeats = True
    triggers: tuple[str, ...] = ("Epoch ", "/step", " - ", "Invalid loss")

    def __init__(self) -> None:
        self.epoch = 1
        self.per_epoch: int | None = None

    def parse(self, text: str, ctx: Context) -> bool:
        m = _INVALID.search(text)
        if m is not None:
            batch = int(m.group(1))
            step = None
            if self.per_epoch is not None:
                step = (self.epoch - 1) * self.per_epoch + batch + 1
            ctx.nonfinite("loss", "nan-or-inf", step, text, batch=batch, epoch=self.epoch)
            ctx.votes["keras"] += 1
            return True
        header = _EPOCH.search(text)
        if header is not None:
            if text[: header.start()].strip():
                self._bar(text[: header.start()], ctx)
            self.epoch = int(header.group(1))
            ctx.votes["keras"] += 1
            return True
        return self._bar(text, ctx)

    def _bar(self, text: str, ctx: Context) -> bool:
        bar = _BAR.search(text)
        if bar is None:
            return False
        batch, total = int(bar.group(1)), int(bar.group(2))
        self.per_epoch = total
        ctx.axis = BATCH
        step = (self.epoch - 1) * total + batch
        tail = text[bar.end() :]
        dash = tail.find(" - ")
        if dash >= 0:
            ctx.points_at(step, colon_pairs(tail[dash:]))
        ctx.votes["keras"] += 1
        return True
