"""PyTorch Lightning progress bars, tqdm and rich flavours.

``Epoch 3:  45%|████▌     | 450/1000 [00:12<00:15, 36.50it/s, loss=nan, v_num=0]``
``Epoch 3/9  ━━━━━━━━━━ 450/1000 0:00:12 • 0:00:15 36.50it/s v_num: 0 train_loss: nan``

The bar counts batches within the epoch, from 1: ``TQDMProgressBar`` sets it to
``batch_idx + 1`` after each batch, and epochs from 0. The step is ``epoch * batches +
batch`` (:data:`BATCH`), one above the ``global_step`` Lightning's loggers write a
``training_step``'s values at when every batch steps the optimizer; with gradient
accumulation the two differ by its factor, and the values decide. When the total is
unknown (shown as ``?``) the step is the batch within its epoch alone (:data:`IN_EPOCH`),
which only matching values can place.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs, equals_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.model import StepAxis

_HEAD = re.compile(r"(?<![\w])Epoch (\d{1,15}+)(?:/\d++)?+:?+ ")
_COUNT = re.compile(r"(?<![\d/])(\d{1,15}+)/(\d{1,15}+|\?)(?![\d/])")
_SKIP = frozenset({"v_num"})
BATCH = StepAxis("counter", base=1, counts_skipped=True, label="batch")
"""``epoch * batches + batch``: the bar's count over the epochs, from 1."""
IN_EPOCH = StepAxis("epoch", base=1, counts_skipped=True, label="batch")
"""The bar's batch within an epoch whose length is unknown."""


class LightningParser:
    framework = "lightning"
    repeats = True
    triggers: tuple[str, ...] = ("Epoch ",)

    def __init__(self) -> None:
        self.seen_v_num = False

    def parse(self, text: str, ctx: Context) -> bool:
        head = _HEAD.search(text)
        if head is None:
            return False
        count = _COUNT.search(text, head.end())
        if count is None or ("%|" not in text and "━" not in text):
            return False
        epoch = int(head.group(1))
        batch = int(count.group(1))
        total = count.group(2)
        if total != "?":
            step = epoch * int(total) + batch
            if ctx.axis != IN_EPOCH:
                ctx.axis = BATCH
        else:
            step = batch
            ctx.axis = IN_EPOCH  # one bar of unknown length makes the file's numbers unplaced
        rest = text[count.end() :]
        if "v_num" in rest:
            self.seen_v_num = True
        pairs = equals_pairs(rest, _SKIP) if "=" in rest else colon_pairs(rest, _SKIP)
        ctx.points_at(step, pairs)
        ctx.votes["lightning" if self.seen_v_num else "tqdm"] += 1
        return True
