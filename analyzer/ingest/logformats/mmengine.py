"""OpenMMLab loggers: mmengine's ``LogProcessor`` and the older mmcv ``TextLoggerHook``.

``Epoch(train)  [1][  50/1509]  base_lr: 2.0e-04 lr: 2.1e-06  eta: 8:27:55  time: 0.25
... grad_norm: nan  loss: 59.17  loss_cls: 21.07`` and ``Iter(train) [  50/80000] ...``;
mmcv: ``Epoch [1][50/500]\tlr: 2.000e-02, eta: ..., loss: nan`` and ``Iter [50/80000]``.

By-epoch steps are ``(epoch - 1) * iterations_per_epoch + i``; validation lines get
their tags prefixed with ``val/``.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs
from analyzer.ingest.logformats.context import Context

_EPOCH = re.compile(r"Epoch(?:\((\w++)\))?+\s*+\[(\d{1,15}+)\]\s*+\[\s*+(\d{1,15}+)/(\d{1,15}+)\]")
_ITER = re.compile(r"Iter(?:\((\w++)\))?+\s*+\[\s*+(\d{1,15}+)/(\d{1,15}+)\]")
_SKIP = frozenset({"eta", "time", "data_time"})
"""Timing fields: never where a NaN shows, and a third of every line."""


class MMEngineParser:
    framework = "mmengine"
    repeats = True
    triggers: tuple[str, ...] = ("Epoch(", "Iter(", "Epoch [", "Iter [")

    def parse(self, text: str, ctx: Context) -> bool:
        m = _EPOCH.search(text)
        if m is not None:
            mode = m.group(1) or "train"
            per_epoch = int(m.group(4))
            step = (int(m.group(2)) - 1) * per_epoch + int(m.group(3))
        else:
            m = _ITER.search(text)
            if m is None:
                return False
            mode = m.group(1) or "train"
            step = int(m.group(2))
        pairs = colon_pairs(text[m.end() :], _SKIP)
        if mode != "train":
            pairs = [(f"{mode}/{name}", value) for name, value in pairs]
        ctx.points_at(step, pairs)
        ctx.votes["mmengine"] += 1
        return True
