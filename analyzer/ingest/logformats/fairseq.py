"""fairseq progress output in its three shapes, plus its gradient error.

- json: ``| INFO | train_inner | {"epoch": 1, "update": 0.0, "loss": "16.475", ...,
  "num_updates": "1", "gnorm": "20.751", "loss_scale": "4", ...}``
- simple: ``epoch 001:    100 / 1000 loss=9.5, nll_loss=8.3, ..., num_updates=100``
  (also the tqdm bar ``epoch 001:  10%|...| 100/1000 [..., loss=9.5, ...]``)
- end of epoch (older releases): ``| epoch 001 | loss 9.5 | nll_loss 8.3 | ... |``

The step is ``num_updates`` (:data:`NUM_UPDATES`): the trainer counts an update only once
it is applied (``set_num_updates(get_num_updates() + 1)`` after a step without overflow),
so it starts at 1 and does not count the steps the loss scaler skipped; its TensorBoard
logging writes at that number. A line without it is numbered by its batch count over the
epochs (a numbering of its own). ``FloatingPointError: gradients are Nan/Inf`` is the
trainer refusing a non-finite gradient norm.
"""

from __future__ import annotations

import math
import re

from analyzer.ingest.logformats.base import equals_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import number_value
from analyzer.model import StepAxis

_JSON = re.compile(r"\| (train_inner|train|valid\w*+) \| \{")
_JSON_ITEM = re.compile(r'"([^"\\]*+)": "?+([^",}]*+)')
_SIMPLE = re.compile(r"(?<![\w])epoch (\d{1,15}+):")
_TABLE = re.compile(r"\|\s*+epoch (\d{1,15}+) \|")
_COUNT = re.compile(r"(\d{1,15}+) ?+/ ?+(\d{1,15}+)")
_RENAME = {"gnorm": "grad_norm"}
_STEP_KEYS = ("num_updates", "valid_num_updates", "train_num_updates")
_SKIP = frozenset({"epoch", "update", *_STEP_KEYS})
NUM_UPDATES = StepAxis("counter", base=1, counts_skipped=False, label="num_updates")
"""fairseq's ``num_updates``: applied updates, from 1, overflow-skipped ones not counted."""
BATCHES = StepAxis("counter", base=1, counts_skipped=True, label="batch")
"""The progress bar's batch count over the epochs, for lines that print no num_updates."""


class FairseqParser:
    framework = "fairseq"
    repeats = True
    triggers: tuple[str, ...] = ("epoch ", " | {", "gradients are Nan/Inf")

    def parse(self, text: str, ctx: Context) -> bool:
        if "gradients are Nan/Inf" in text:
            ctx.nonfinite("grad_norm", "nan-or-inf", None, text)
            ctx.votes["fairseq"] += 1
            return True
        m = _JSON.search(text)
        if m is not None:
            found: dict[str, float] = {}
            for item in _JSON_ITEM.finditer(text, m.end() - 1):
                value = number_value(item.group(2))
                if value is not None:
                    found[item.group(1)] = value
            return self._emit(found, None, ctx)
        m = _TABLE.search(text)
        if m is not None:
            prefix = "valid_" if "valid on " in text else ""
            values: dict[str, float] = {}
            for field in text[m.end() :].split("|"):
                name, _, raw = field.strip().rpartition(" ")
                value = number_value(raw)
                if name and value is not None:
                    name = name.strip()
                    values[name if name == "num_updates" else prefix + name] = value
            return self._emit(values, None, ctx)
        m = _SIMPLE.search(text)
        if m is None:
            return False
        count = _COUNT.search(text, m.end())
        values = dict(equals_pairs(text[m.end() :]))
        fallback = None
        if count is not None:
            fallback = (int(m.group(1)) - 1) * int(count.group(2)) + int(count.group(1))
        return self._emit(values, fallback, ctx)

    def _emit(self, values: dict[str, float], fallback: int | None, ctx: Context) -> bool:
        step_value = next((values[k] for k in _STEP_KEYS if k in values), None)
        counted = step_value is not None and math.isfinite(step_value)
        step = int(step_value) if counted and step_value is not None else fallback
        if step is None or not values:
            return False
        items = [(_RENAME.get(k, k), v) for k, v in values.items() if k not in _SKIP]
        if counted:
            ctx.axis = NUM_UPDATES
            ctx.points_at(step, items)
        else:
            ctx.points_on(BATCHES, step, items)
        ctx.votes["fairseq"] += 1
        return True
