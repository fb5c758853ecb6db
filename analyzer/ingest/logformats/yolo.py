"""YOLOv5 / ultralytics training rows under their column header.

``      Epoch    GPU_mem   box_loss   obj_loss   cls_loss  Instances       Size``
``       0/299      3.91G    0.1134    0.07097    0.03614        232        640:  12%|█▏ | 14/118``

Columns after GPU memory are named by the header; the step is
``(epoch - first_epoch) * batches + batch`` (YOLOv5 counts epochs from 0,
ultralytics from 1, and the first row shows which).
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import number_value

_ROW = re.compile(r"\s*+(\d{1,15}+)/(\d{1,15}+)\s++(\d[\d.]*+[GMK]?+B?+)\s++")
_BAR = re.compile(r"\|\s*+(\d{1,15}+)/(\d{1,15}+)")
_DEFAULT = ("epoch", "gpu_mem", "box_loss", "obj_loss", "cls_loss", "instances", "size")
_NOT_METRICS = frozenset({"instances", "labels", "size", "img_size", "targets"})


class YoloParser:
    framework = "yolo"
    repeats = True
    triggers: tuple[str, ...] = ("GPU_mem", "gpu_mem", "G ")

    def __init__(self) -> None:
        self.columns: tuple[str, ...] | None = None
        self.first_epoch: int | None = None

    def parse(self, text: str, ctx: Context) -> bool:
        if "GPU_mem" in text or "gpu_mem" in text:
            words = text.split()
            if words and words[0].lower() == "epoch":
                self.columns = tuple(w.lower() for w in words)
                ctx.votes["yolo"] += 1
                return True
        m = _ROW.match(text)
        if m is None:
            return False
        columns = self.columns or _DEFAULT
        epoch = int(m.group(1))
        if self.first_epoch is None:
            self.first_epoch = 0 if epoch == 0 else 1
        head, _, tail = text[m.end() :].partition(":")
        bar = _BAR.search(tail)
        if bar is None:
            return False
        step = (epoch - self.first_epoch) * int(bar.group(2)) + int(bar.group(1))
        for name, token in zip(columns[2:], head.split(), strict=False):
            if name in _NOT_METRICS:
                continue
            value = number_value(token)
            if value is not None:
                ctx.point(name if name.endswith("loss") else f"{name}_loss", step, value)
        ctx.votes["yolo"] += 1
        return True
