"""``MetricLogger.log_every`` lines of the torchvision reference scripts and the
research code built on them (DETR, Deformable DETR, DeiT, MAE, DINO, BLIP, ...).

``Epoch: [3]  [ 120/7393]  eta: 0:59:39  lr: 0.000100  loss: 6.9140 (7.1033)
loss_ce: 4.1876 (4.3002)  time: 0.5055  data: 0.1168  max mem: 5210``

The header (``Epoch: [e]``, ``Epoch: [e/E]``, ``Test:``, ``Test: EMA`` or none), the iteration
within the pass and its length, then ``eta``, the meters, the timers. The fields are
joined by the logger's delimiter: a tab by default, two blanks in most copies. A
meter prints ``median (global average)`` by default, or one value (``lr``): the
first number is kept, since the median over its window goes NaN at the first print
after a NaN update, while the global average stays NaN for good.

Training steps are ``epoch * length + i``. Without an epoch in the header, a count
that goes back starts another pass. Lines of another header (``Test:``) are
evaluation: their tags get the header word as a prefix (``test/loss``, ``test_ema/loss``
for ``Test: EMA``) and their step is the last training step read, when there was one.
The ``Averaged stats:`` line after a pass holds global averages, and DeiT-style scripts
end an evaluation with ``* Acc@1 81.2 Acc@5 95.3 loss 0.80``: both are kept under
``avg/`` (``avg/test/`` after an evaluation pass) at the last training step. A line
with no meter to read is left to the other parsers, and so is a count without a
header that does not start the record (mmengine's ``Epoch(test) [ 50/500]  eta: ...``).
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.base import colon_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, to_float

_LINE = re.compile(
    r"(?:(?P<head>[A-Za-z][\w ]{0,40}+):(?:[ \t]{1,8}+(?P<suffix>[A-Za-z]\w{0,20}+))?+"
    r"[ \t]{0,8}+(?:\[(?P<epoch>\d{1,9}+)(?:/\d{1,9}+)?+\](?=[ \t]{0,8}+\[))?+)?+"
    r"[ \t]{0,8}+\[[ \t]{0,12}+(?P<i>\d{1,12}+)/(?P<n>\d{1,12}+)\][ \t]{1,8}+eta: "
)
"""Header (a word and a colon, maybe a suffix word such as ``Test: EMA``, maybe the
epoch), the count, ``eta``. Every repeat is bounded, blank runs too: a search restarts
at each position, and an unbounded run would be scanned again from each of its blanks."""
_SUMMARY = re.compile(
    r"\* Acc@1 (" + NUM + r") Acc@5 (" + NUM + r")(?: loss (" + NUM + r"))?+(?![\w.])"
)
_SKIP = frozenset({"eta", "time", "data", "mem", "img/s"})
"""Timers, memory and throughput: never where a NaN shows."""


class MetricLoggerParser:
    framework = "metric_logger"
    repeats = True
    triggers: tuple[str, ...] = ("eta: ", "Averaged stats:", "* Acc@")

    def __init__(self) -> None:
        self.passes = 0
        self.last_i = -1
        self.train_step: int | None = None
        self.mode: str | None = None
        """The header word of the last evaluation pass; None after a training line."""

    def parse(self, text: str, ctx: Context) -> bool:
        m = _LINE.search(text)
        if m is None:
            return self._averages(text, ctx)
        head = (m.group("head") or "").strip()
        if not head and text[: m.start()].strip():
            # A bare count must start the record: ``Epoch(test) [ 50/500]  eta: ...`` is
            # mmengine's, whatever its parser made of it.
            return False
        pairs = colon_pairs(text[m.end() - len("eta: ") :], _SKIP)
        if not pairs:
            return False  # no meter to read: perhaps another script's line
        i, n = int(m.group("i")), int(m.group("n"))
        epoch = m.group("epoch")
        if epoch is not None or not head:
            if epoch is not None:
                step = int(epoch) * n + i
            else:
                if i < self.last_i:
                    self.passes += 1
                self.last_i = i
                step = self.passes * n + i
            self.train_step, self.mode = step, None
        else:
            suffix = m.group("suffix")
            self.mode = head.split()[-1].lower() + (f"_{suffix.lower()}" if suffix else "")
            pairs = [(f"{self.mode}/{name}", value) for name, value in pairs]
            step = self.train_step if self.train_step is not None else i
        ctx.points_at(step, pairs)
        ctx.votes["metric_logger"] += 1
        return True

    def _averages(self, text: str, ctx: Context) -> bool:
        if self.train_step is None:
            return False
        at = text.find("Averaged stats:")
        if at >= 0:
            pairs = colon_pairs(text[at + len("Averaged stats:") :], _SKIP)
        else:
            m = _SUMMARY.search(text)
            if m is None:
                return False
            names = ("acc1", "acc5", "loss")
            pairs = [
                (name, value)
                for name, raw in zip(names, m.groups(), strict=True)
                if raw is not None and (value := to_float(raw)) is not None
            ]
        prefix = "avg/" if self.mode is None else f"avg/{self.mode}/"
        ctx.points_at(self.train_step, [(prefix + name, value) for name, value in pairs])
        ctx.votes["metric_logger"] += 1
        return True
