"""The stop message of reference training loops (DETR, DeiT, MAE and many timm-style
``engine.py`` files): when ``math.isfinite(loss_value)`` fails they print
``"Loss is {}, stopping training".format(loss_value)`` and exit, so the log shows
``Loss is nan, stopping training``. Copies vary: ``Loss is inf at step 23, stopping
training.``, a tensor (``Loss is tensor(nan, device='cuda:0'), stopping training``), a
logger prefix. The line becomes a ``nonfinite`` event for ``loss``; its step is the one
the line names, if any: the script's own, a global step even in a file whose progress
bars count something else.

DETR and the torchvision detection references then print the reduced loss dict,
``{'loss_ce': tensor(nan, device='cuda:0'), 'loss_bbox': tensor(0.9511, ...), ...}``:
it names the term that went non-finite. Read within a few lines of the stop message,
each non-finite term becomes a ``nonfinite`` event of its own, at the same step, with
every term's value in ``detail["terms"]``.

Lightning's ``EarlyStopping(check_finite=True, verbose=True)`` stops on a non-finite
monitored metric with ``Monitored metric val_loss = nan is not finite. Previous best
value was 0.123. Signaling Trainer to stop.``: a ``nonfinite`` event for that metric,
after the last step logged.
"""

from __future__ import annotations

import math
import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, to_float, to_step

LOSS_IS = re.compile(
    r"(?i)(?<![\w.])loss(?:_value)?+ is:?+ ++(?:tensor\(\[?+)?+(" + NUM + r")(?![\w.])"
)
STEP_NAMED = re.compile(
    r"(?i)(?<![\w.])(?:global[ _])?+(?:step|iteration|iter|update)"
    r"[ \t]*+[:=#]?+[ \t]*+(\d{1,3}+(?:,\d{3}){1,4}+|\d{1,15}+)(?!,?+\d)(?![\w.])"
)
"""``numbers.STEP`` refuses ``1,200,`` (the comma could start another group); here the
step is followed by ``, stopping training``."""
_TERM = re.compile(r"'([^'\\]{1,200}+)': tensor\(\[?+(" + NUM + r")(?![\w.])")
_MONITORED = re.compile(r"Monitored metric (\S{1,200}+) = (" + NUM + r") is not finite\.")
_DICT_LINES = 3
"""The loss dict is read this many lines after the stop message at most."""


class StoppingParser:
    framework = "pytorch"
    repeats = False  # a one-off message; nothing follows it in the same shape
    triggers: tuple[str, ...] = (
        "stopping training", "Stopping training", "': tensor(", "is not finite."
    )

    def __init__(self) -> None:
        self.stop: tuple[int, int | None] | None = None
        """Line and step of the last stop message."""

    def parse(self, text: str, ctx: Context) -> bool:
        if "is not finite." in text:
            return self._monitored(text, ctx)
        m = LOSS_IS.search(text)
        if m is None:
            return self._terms(text, ctx)
        value = to_float(m.group(1))
        if value is None or not (math.isnan(value) or math.isinf(value)):
            # A finite loss stopped by some other rule (a divergence threshold) is not
            # this message.
            return False
        kind = "nan" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
        s = STEP_NAMED.search(text)
        step = to_step(s.group(1)) if s is not None else None
        ctx.nonfinite("loss", kind, step, text, global_step=True)
        ctx.votes["pytorch"] += 1
        self.stop = (ctx.line, step)
        return True

    def _monitored(self, text: str, ctx: Context) -> bool:
        m = _MONITORED.search(text)
        value = None if m is None else to_float(m.group(2))
        if m is None or value is None or math.isfinite(value):
            return False
        kind = "nan" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
        ctx.nonfinite(m.group(1), kind, None, text, monitor="EarlyStopping")
        ctx.votes["lightning"] += 1
        return True

    def _terms(self, text: str, ctx: Context) -> bool:
        if self.stop is None or not 0 < ctx.line - self.stop[0] <= _DICT_LINES:
            return False
        terms = {}
        for m in _TERM.finditer(text):
            value = to_float(m.group(2))
            if value is not None:
                terms[m.group(1)] = value
        bad = [name for name, value in terms.items() if not math.isfinite(value)]
        if not bad:
            return False
        step = self.stop[1]
        for name in bad:
            value = terms[name]
            kind = "nan" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
            ctx.nonfinite(name, kind, step, text, global_step=True, terms=terms)
        ctx.note(
            "stop-loss-terms",
            f"{ctx.source}:{ctx.line}: the loss terms printed at the stop: "
            + ", ".join(f"{name} = {value:g}" for name, value in terms.items())
            + ".",
        )
        self.stop = None
        return True
