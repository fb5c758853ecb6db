"""``timm``'s ``train.py`` (pytorch-image-models) and the many scripts copied from it.

``Train: 3 [ 120/1251 ( 10%)]  Loss: 6.94 (6.93)  Time: 0.312s, 3280.12/s  (0.320s,
3200.00/s)  LR: 1.000e-04  Data: 0.011 (0.020)``
``Test: [  10/48]  Time: 0.231 (0.260)  Loss:  0.831 (0.842)  Acc@1: 86.719 (85.938)
Acc@5: 97.266 (97.070)``, and ``Test (EMA): [...]`` for the EMA weights.

Each meter prints its current value, then its running average in brackets: the
current value is kept. timm trains on through a NaN loss, so the first non-finite
``Loss`` is where it went. Training steps are ``epoch * updates_per_epoch + index``
(:data:`UPDATE`): epochs from 0 and the update's index within its epoch from 0, so the
count is a 0-based loop's, the global step a script's SummaryWriter writes at;
evaluation lines sit at the last training step read, their tags prefixed ``test/``
(``test_ema/`` for the EMA weights).
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.model import StepAxis

_TRAIN = re.compile(
    r"(?<![\w])Train: (\d{1,9}+) \[ {0,12}+(\d{1,12}+)/(\d{1,12}+) \( {0,3}+[\d.]{1,8}+%\)\]"
)
_TEST = re.compile(r"(?<![\w])Test( \(EMA\))?+: \[ {0,12}+(\d{1,12}+)/(\d{1,12}+)\]")
_SKIP = frozenset({"Time", "Data"})
_RENAME = {"Loss": "loss", "LR": "lr", "Acc@1": "acc1", "Acc@5": "acc5"}
UPDATE = StepAxis("counter", base=0, counts_skipped=True, label="update")
"""``epoch * updates_per_epoch + index``: timm's updates over the epochs, from 0."""


class TimmParser:
    framework = "timm"
    repeats = True
    triggers: tuple[str, ...] = ("Train: ", "Test: [", "Test (EMA): [")

    def __init__(self) -> None:
        self.train_step: int | None = None

    def parse(self, text: str, ctx: Context) -> bool:
        m = _TRAIN.search(text)
        test = None if m is not None else _TEST.search(text)
        found = m or test
        if found is None:
            return False
        pairs = colon_pairs(text[found.end() :], _SKIP)
        if not pairs:
            # ``Test: [ 10/196]\tTime ...\tLoss nan (nan)`` is pytorch/examples' ImageNet
            # script (no colons), not timm: left to the parsers after this one.
            return False
        if m is not None:
            epoch, index, per_epoch = (int(g) for g in m.groups())
            step = self.train_step = epoch * per_epoch + index
            prefix = ""
        else:
            assert test is not None
            prefix = "test_ema/" if test.group(1) else "test/"
            step = self.train_step if self.train_step is not None else int(test.group(2))
        ctx.axis = UPDATE
        ctx.points_at(step, [(prefix + _RENAME.get(name, name), value) for name, value in pairs])
        ctx.votes["timm"] += 1
        return True
