"""Megatron-LM ``training_log`` lines.

`` iteration      120/  500000 | consumed samples: 3840 | ... | lm loss: 2.304E+00 |
loss scale: 65536.0 | grad norm: 1.234 | number of skipped iterations:   0 |
number of nan iterations:   0 |``

Megatron prints a loss only when its interval average is > 0, and NaN > 0 is false:
a NaN loss vanishes from the line while ``number of nan iterations`` counts it. So a
rising nan counter is a ``nonfinite`` event for the loss that went missing.

Steps are Megatron's ``iteration``: incremented before the line is printed, so the first
is 1, and incremented for a skipped iteration too; its TensorBoard writer logs at that
same number (:data:`ITERATION`).
"""

from __future__ import annotations

import math
import re

import numpy as np

from analyzer.ingest.logformats import fast
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import STEP, number_value, to_step
from analyzer.ingest.logformats.store import Row, counter
from analyzer.model import StepAxis

_HEAD = r"iteration\s++(" + STEP + r")/\s*+(" + STEP + r")\s*+\|"
_ITERATION = re.compile(_HEAD)
_FIELD = re.compile(r" ?+([^|:]++):[ \t]*+([^|]*+)\|")
"""What ``fields_of`` finds; the tests hold it to this pattern."""
SKIP = frozenset(
    {
        "consumed samples",
        "consumed tokens",
        "global batch size",
        "elapsed time per iteration (ms)",
        "elapsed time per iteration (s)",
        "throughput per GPU (TFLOP/s/GPU)",
        "samples per second",
        "TFLOPs",
    }
)
"""Bookkeeping and speed fields: never the seat of a NaN, and half of every line."""
RENAME = {
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "learning rate": "lr",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "params norm": "params_norm",
    "num zeros": "num_zeros",
}


def fields_of(tail: str) -> list[tuple[str, str]]:
    """The ``name: value |`` fields of a tail, exactly as ``_FIELD.findall`` finds them,
    in time linear in the tail. A findall scan restarts at every character of a segment
    that holds no colon, and so takes quadratic time on a long one; here each segment
    between pipes is looked at once. A match starts at the first position of a segment
    from which, after at most one blank, a non-empty name runs up to a colon."""
    out: list[tuple[str, str]] = []
    for segment in tail.split("|")[:-1]:
        at = 0
        while True:
            start = at + 1 if segment.startswith(" ", at) else at
            colon = segment.find(":", start)
            if colon < 0:
                break
            if colon > start:
                out.append((segment[start:colon], segment[colon + 1 :].lstrip(" \t")))
                break
            at += 1
    return out


ITERATION = StepAxis("counter", base=1, counts_skipped=True, label="iteration")
"""Megatron's ``iteration`` counter: from 1, skipped iterations counted."""


class MegatronParser:
    framework = "megatron"
    repeats = True
    triggers: tuple[str, ...] = ("iteration",)

    def __init__(self) -> None:
        self.loss_names: list[str] = []
        self.scale: float | None = None
        self.shape: fast.Shape | None = None
        self.learn = fast.ENABLED

    def parse(self, text: str, ctx: Context) -> bool:
        at = text.find("iteration")
        if at < 0 or (at > 0 and text[at - 1] not in " \t]"):
            return False
        shape = self.shape
        if shape is not None:
            row = shape.match(text, at, ctx)
            if row is not None:
                shape.take(row, ctx, "megatron")
                return True
        m = _ITERATION.match(text, at)
        if m is None:
            return False
        ctx.axis = ITERATION  # a shape is learned only after a line got here
        step = to_step(m.group(1))
        tail = text[m.end() :]
        cut = tail.find("| time (ms) |")
        if cut >= 0:
            tail = tail[: cut + 1]  # the per-timer breakdown after it is not training metrics
        values: dict[str, float] = {}
        fields = fields_of(tail if tail.endswith("|") else tail + "|")
        for name, raw in fields:
            if name in SKIP:
                continue
            try:
                values[RENAME.get(name, name)] = float(raw)  # inline: the common case
            except ValueError:
                value = number_value(raw)
                if value is not None:
                    values[RENAME.get(name, name)] = value
        ctx.points_at(step, list(values.items()))
        for name in values:
            if "loss" in name and name != "loss_scale" and name not in self.loss_names:
                self.loss_names.append(name)
        self._events(values, step, text, ctx)
        ctx.votes["megatron"] += 1
        if self.learn and len(text) <= fast.LEARN_CHARS:
            self.shape = _learn(fields, values, cut < 0, ctx)
        return True

    def bulk(self, lines: list[str], start: int, before: int, ctx: Context) -> int:
        if self.shape is None:
            return start
        return self.shape.bulk(lines, start, before, ctx, "megatron")

    def _events(self, values: dict[str, float], step: int, text: str, ctx: Context) -> None:
        nan_iters = values.get("nan_iterations", 0.0)
        if nan_iters > 0 and math.isfinite(nan_iters):
            missing = [n for n in self.loss_names if n not in values] or ["lm loss"]
            ctx.nonfinite(
                missing[0], "nan-or-inf", step, text, nan_iterations=int(nan_iters), missing=missing
            )
            ctx.note(
                "megatron-missing-loss",
                f"{ctx.source}:{ctx.line}: Megatron counted {int(nan_iters)} NaN iteration(s) "
                f"at iteration {step}; it leaves a NaN loss out of the line, so the "
                "missing loss field is the evidence.",
            )
        skipped = values.get("skipped_iterations", 0.0)
        scale = values.get("loss_scale")
        if skipped > 0 and math.isfinite(skipped):
            ctx.event("overflow_skip", step, text, {"skipped": int(skipped), "new_scale": scale})
        if scale is not None and self.scale is not None and scale != self.scale:
            ctx.event("loss_scale", step, text, {"old_scale": self.scale, "new_scale": scale})
        if scale is not None:
            self.scale = scale


_FIXED = frozenset({"skipped_iterations", "nan_iterations", "loss_scale"})
"""Fields whose change makes an event: the pattern holds the value just seen as printed
(the counters only when zero), so a line that changes one goes to the plain parser."""


def _learn(
    fields: list[tuple[str, str]], values: dict[str, float], plain_tail: bool, ctx: Context
) -> fast.Shape | None:
    """The shape of a line just read, when every later line of that shape is sure to
    give the same points and no event: each kept field is a finite decimal, the event
    counters are zero, the loss scale is the one just seen, and no name repeats."""
    if not plain_tail or not values:
        return None
    parts = [_FAST_HEAD]
    tags: list[str] = []
    literals = ["iteration"]
    fixed: dict[int, str] = {}
    for name, raw in fields:
        parts.append(r" ?+" + re.escape(name) + r":[ \t]*+")
        literals.append(name)
        if name in SKIP:
            parts.append(r"[^|]*+\|")
            continue
        tag = RENAME.get(name, name)
        if tag in tags or re.fullmatch(fast.DECIMAL + r"[ \t]*+", raw) is None:
            return None
        tags.append(tag)
        if tag in _FIXED:
            if tag != "loss_scale" and values[tag] != 0:
                return None
            fixed[1 + len(tags)] = raw.strip()  # after the two counters
            parts.append("(" + re.escape(raw.strip()) + r")[ \t]*+\|")
        else:
            parts.append("(" + fast.DECIMAL + r")[ \t]*+\|")
    if not tags:
        return None
    parts.append(r"[ \t]*+")
    block = ctx.store.block(tuple(tags), ctx.rank, 2, _steps)
    return fast.Shape(
        _FIRST_WORD, "".join(parts), block, _step, " ".join(literals), fixed, ((0,), _steps_of)
    )


def _step(row: Row) -> int:
    return int(row[0])  # type: ignore[arg-type]


def _steps(columns: list[tuple[str, ...]]) -> np.ndarray:
    return counter(columns[0])  # the second counter is the run's length


def _steps_of(counts: list[np.ndarray]) -> np.ndarray:
    return counts[0]


_FAST_HEAD = r"iteration\s++(\d{1,15}+)(?![\d,])/\s*+(" + STEP + r")\s*+\|"
"""The plain header without thousands separators in the iteration number."""
_FIRST_WORD = r"[^i]*+(?:i(?!teration)[^i]*+)*+(?<![^ \t\]])"
"""Up to the first 'iteration' of the line, which must follow a blank, a ']' or nothing."""
