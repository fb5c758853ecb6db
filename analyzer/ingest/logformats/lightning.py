"""PyTorch Lightning progress bars, tqdm and rich flavours.

``Epoch 3:  45%|████▌     | 450/1000 [00:12<00:15, 36.50it/s, loss=nan, v_num=0]``
``Epoch 3/9  ━━━━━━━━━━ 450/1000 0:00:12 • 0:00:15 36.50it/s v_num: 0 train_loss: nan``

The bar counts batches within the epoch; the step is ``epoch * batches + batch``
(the batch index alone when the total is unknown, shown as ``?``).
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs, equals_pairs
from analyzer.ingest.logformats.context import Context

_HEAD = re.compile(r"(?<![\w])Epoch (\d{1,15}+)(?:/\d++)?+:?+ ")
_COUNT = re.compile(r"(?<![\d/])(\d{1,15}+)/(\d{1,15}+|\?)(?![\d/])")
_SKIP = frozenset({"v_num"})


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
        step = epoch * int(total) + batch if total != "?" else batch
        rest = text[count.end() :]
        if "v_num" in rest:
            self.seen_v_num = True
        pairs = equals_pairs(rest, _SKIP) if "=" in rest else colon_pairs(rest, _SKIP)
        ctx.points_at(step, pairs)
        ctx.votes["lightning" if self.seen_v_num else "tqdm"] += 1
        return True
