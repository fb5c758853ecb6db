"""``ProgressMeter`` lines of pytorch/examples' ImageNet script and the many research
repositories copied from it (MoCo, SimSiam, SwAV-style loops, ...).

``Epoch: [3][ 120/5005]\tTime  0.312 ( 0.400)\tData  0.011 ( 0.020)\tLoss 6.9107e+00
(6.9191e+00)\tAcc@1   0.00 (  0.10)\tAcc@5   0.39 (  0.49)``
``Test: [ 10/196]\tTime  0.231 ( 0.260)\tLoss nan (nan)\tAcc@1 ...``

Tab-separated entries, each ``Name value (average)``. The current value is kept.
Training steps are ``epoch * batches + batch``; ``Test:`` lines sit at the last
training step read, their tags prefixed ``test/``.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import number_value

_HEAD = re.compile(r"(?:Epoch: \[(\d{1,9}+)\]|(Test): ?+)\[ {0,12}+(\d{1,12}+)/(\d{1,12}+)\]\t")
_SKIP = frozenset({"Time", "Data"})
_RENAME = {"Loss": "loss", "Acc@1": "acc1", "Acc@5": "acc5", "LR": "lr", "Lr": "lr"}


class ProgressMeterParser:
    framework = "progress_meter"
    repeats = True
    triggers: tuple[str, ...] = ("Epoch: [", "Test: [", "Test:[")

    def __init__(self) -> None:
        self.train_step: int | None = None

    def parse(self, text: str, ctx: Context) -> bool:
        m = _HEAD.search(text)
        if m is None:
            return False
        pairs: list[tuple[str, float]] = []
        for entry in text[m.end() :].split("\t"):
            # "Loss 6.9107e+00 (6.9191e+00)": the name, the value, the average in brackets.
            current, bracket, _ = entry.rpartition(" (")
            name, _, raw = (current if bracket else entry).strip().rpartition(" ")
            name = name.strip()
            if not name or name in _SKIP:
                continue
            value = number_value(raw)
            if value is not None:
                pairs.append((_RENAME.get(name, name), value))
        if not pairs:
            return False
        if m.group(1) is not None:
            step = self.train_step = int(m.group(1)) * int(m.group(4)) + int(m.group(3))
            prefix = ""
        else:
            step = self.train_step if self.train_step is not None else int(m.group(3))
            prefix = "test/"
        ctx.points_at(step, [(prefix + name, value) for name, value in pairs])
        ctx.votes["progress_meter"] += 1
        return True
