"""The fallback for hand-written loops: ``step 12 loss 2.3``, ``step=12 loss=2.3``,
``Step: 12, Loss: 2.3``.

Only metric-like names are taken (loss, norm, lr, scale, ...), and a bare
``name value`` pair only for loss and norm names, so prose such as ``improved from
inf`` is not read as a metric; nor is the argparse ``Namespace(lr=0.1, ...)`` many
scripts print at start-up. Without a step on the line the record's position
among such lines stands in for it, on a numbering of its own (:data:`RECORD`).
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step
from analyzer.model import StepAxis

RECORD = StepAxis("record", base=1, label="record")
"""The position of a metric line that names no step among such lines: not a step."""

_METRIC = re.compile(r"(?i)loss|norm|lr|learning.rate|scale|ppl|perplexity|reward|grad")
_STEP = re.compile(
    r"(?i)(?<![\w.])(?:global_step|steps?+|iter(?:ation)?+|it|update|num_updates|batch)"
    r"[ \t]*+[:=#]?+[ \t]*+(" + STEP + r")(?![\w.])"
)
_PAIR = re.compile(
    r"(?<![\w/.\-])([A-Za-z_][\w/.\-]*+)(?:[ \t]*+[:=][ \t]*+|[ \t]++)"
    r"(?:tensor\()?+(" + NUM + r")(?![\w.])"
)
_METRIC_WORDS = ("loss", "norm", "lr", "learning", "scale", "ppl", "perplexity", "reward", "grad")
"""What _METRIC needs in lower-cased ASCII text ('learning' stands for 'learning.rate')."""


def _may_name_a_metric(text: str) -> bool:
    """False only when _METRIC cannot match. Most lines reaching the fallback are prose,
    and substring tests rule them out faster than a case-blind regex search. Only ASCII
    text is ruled out: case-blind matching pairs some other letters with ASCII ones."""
    if not text.isascii():
        return True
    low = text.lower()
    return any(word in low for word in _METRIC_WORDS)


_BARE_OK = re.compile(r"(?i)loss|norm")
_REJECT = ("best", "min_", "max_", "prev", "from")
_RENAME = {"learning_rate": "lr", "learning rate": "lr", "gnorm": "grad_norm"}


class GenericParser:
    framework = "generic"
    repeats = True
    triggers: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.records = 0

    def wants(self, text: str) -> bool:
        # An argparse Namespace printed at start-up holds lr=... and the like: settings,
        # not measurements.
        return (
            _may_name_a_metric(text)
            and _METRIC.search(text) is not None
            and "Namespace(" not in text
        )

    def parse(self, text: str, ctx: Context) -> bool:
        if not self.wants(text):
            return False
        values: list[tuple[str, float]] = []
        for m in _PAIR.finditer(text):
            key = m.group(1)
            low = key.lower()
            if _METRIC.search(key) is None or low.startswith(_REJECT):
                continue
            sep = text[m.end(1) : m.start(2)]
            if ":" not in sep and "=" not in sep and _BARE_OK.search(key) is None:
                continue
            value = to_float(m.group(2))
            if value is not None:
                values.append((_RENAME.get(low, low), value))
        if not values:
            return False
        self.records += 1
        s = _STEP.search(text)
        if s is not None:
            ctx.points_at(to_step(s.group(1)), values)
        else:
            ctx.note(
                "generic-order",
                "Some metric lines carry no step: their position among such lines "
                "stands in for it.",
            )
            ctx.points_on(RECORD, self.records, values)
        ctx.votes["generic"] += 1
        return True
