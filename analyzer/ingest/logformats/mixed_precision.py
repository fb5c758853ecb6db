"""Loss-scale messages of mixed-precision trainers: DeepSpeed, apex, fairseq.

A skipped step is an ``overflow_skip`` event, a scale change without a skip a
``loss_scale`` event, a scale stuck at its floor ``min_loss_scale``. DeepSpeed's
``step=N, skipped=M, lr=[...]`` progress line gives ``lr`` and ``skipped`` points.

The messages, as their sources print them:

- DeepSpeed ``runtime/fp16/loss_scaler.py``: "[deepspeed] OVERFLOW! Rank 0 Skipping step.
  Attempted loss scale: 65536, reducing to 32768"; with hysteresis left, "... Attempted
  loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1" (a skip that keeps the
  scale); "Current loss scale already at minimum - cannot decrease scale anymore. Exiting
  run." At its configured ``min_loss_scale`` it prints "reducing to" the same scale: with
  ``raise_error_at_min_scale`` off it goes on skipping there, and a second such skip is a
  ``min_loss_scale`` event (the first may be followed by the exception, the incident).
  ``runtime/fp16/fused_optimizer.py``: "Grad overflow on iteration N", "Reducing dynamic
  loss scale from 65536 to 32768.0", "Overflow detected. Skipping step. Attempted loss
  scale: ...".
- apex ``amp/handle.py``: "Gradient overflow.  Skipping step, loss scaler 0 reducing loss
  scale to 32768.0".
- fairseq ``trainer.py``/``optim/dynamic_loss_scaler.py``: "NOTE: gradient overflow
  detected, ignoring gradient, setting loss scale to: 64.0" (older: "NOTE: overflow
  detected, setting loss scale to: ..."), and "Minimum loss scale reached (0.0001)".

Steps: DeepSpeed's engine prints ``step={global_steps + 1}`` before it counts the step it
just took, skipped steps included: a counter from 1 (:data:`DS_STEPS`). The fused
optimizer's "Grad overflow on iteration N" names its own 0-based ``cur_iter``, the index of
the step (a global step as a 0-based writer counts it). A message naming no step follows
the last step line.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats import fast
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import NUM, STEP, to_float, to_step
from analyzer.ingest.logformats.store import Block, Row
from analyzer.model import StepAxis

_DS_RANK = re.compile(r"OVERFLOW! Rank (\d{1,15}+) Skipping step\.")
_ATTEMPT = re.compile(
    r"Skipping step\. ?+Attempted loss scale: (" + NUM + r"), reducing to (" + NUM + r")"
)
_GRAD_OVERFLOW = re.compile(r"Grad overflow on iteration:? ++(" + STEP + r")")
_SCALE_CHANGE = re.compile(
    r"(Reducing|Increasing) dynamic loss scale from (" + NUM + r") to (" + NUM + r")"
)
_DS_STEP_FAST = re.compile(
    r"(?<![\w])step=(\d{1,15}+)(?!,?+\d), skipped=(\d{1,15}+)(?!,?+\d), lr=\[("
    + fast.DECIMAL
    + r")(?:,[^\]]*+)?+\]"
)
"""The common ``_DS_STEP`` line: counters without thousands separators (a comma
followed by a digit), a first lr that is a plain decimal right after the bracket."""
_DS_TAGS = ("skipped", "lr")
_DS_MIN = "Current loss scale already at minimum"
_DS_STEP = re.compile(r"(?<![\w])step=(" + STEP + r"), skipped=(" + STEP + r"), lr=\[([^\]]*+)\]")
_APEX = re.compile(
    r"Gradient overflow\. ++Skipping step, loss scaler (\d{1,15}+) reducing loss scale to ("
    + NUM
    + r")"
)
_FAIRSEQ = re.compile(
    r"overflow detected, (?:ignoring gradient, )?+setting (?:loss )?+scale to(?: to)?+:? ("
    + NUM
    + r")"
)
_MIN_REACHED = re.compile(r"Minimum loss scale reached \((" + NUM + r")\)")

DS_STEPS = StepAxis("counter", base=1, counts_skipped=True, label="step")
"""DeepSpeed's ``step=N`` progress counter: from 1, skipped steps counted."""

_PENDING_LINES = 4
"""A 'Grad overflow on iteration N' line names the step of a skip printed this soon after."""


class MixedPrecisionParser:
    framework = "deepspeed"
    repeats = True
    triggers: tuple[str, ...] = ("Skipping step", "overflow", "loss scale", "skipped=", _DS_MIN)

    def __init__(self) -> None:
        self.pending_step: int | None = None
        self.pending_line = 0
        self.fast = fast.ENABLED
        self.layouts: dict[bytes, fast.Getter] = {}
        self.block: Block | None = None
        self.at_floor: float | None = None
        """The scale DeepSpeed last skipped at without lowering it (its minimum)."""
        self.floor_said = False

    def _step_hint(self, ctx: Context) -> int | None:
        if self.pending_step is not None and ctx.line - self.pending_line <= _PENDING_LINES:
            return self.pending_step
        return None

    def parse(self, text: str, ctx: Context) -> bool:
        # Plain substring tests first: most lines that reach here are step lines.
        if "skipped=" in text:
            return self._step_line(text, ctx)
        if "Skipping step" in text or "OVERFLOW!" in text:
            return self._skip(text, ctx)
        if "overflow on iteration" in text:
            m = _GRAD_OVERFLOW.search(text)
            if m is not None:
                self.pending_step, self.pending_line = to_step(m.group(1)), ctx.line
                ctx.votes["deepspeed"] += 1
                return True
        if "dynamic loss scale from" in text:
            m = _SCALE_CHANGE.search(text)
            if m is not None:
                detail = {"old_scale": to_float(m.group(2)), "new_scale": to_float(m.group(3))}
                hint = self._step_hint(ctx)
                ctx.event("loss_scale", hint, text, detail, global_step=hint is not None)
                ctx.votes["deepspeed"] += 1
                return True
        if _DS_MIN in text:
            ctx.event("min_loss_scale", None, text, {})
            ctx.votes["deepspeed"] += 1
            return True
        return self._others(text, ctx)

    def _skip(self, text: str, ctx: Context) -> bool:
        detail: dict[str, object] = {}
        m = _ATTEMPT.search(text)
        if m is not None:
            detail["attempted_scale"] = to_float(m.group(1))
            detail["new_scale"] = to_float(m.group(2))
        rank = _DS_RANK.search(text)
        if rank is not None:
            detail["reporting_rank"] = int(rank.group(1))
        if not detail:
            return self._others(text, ctx)
        step = self._step_hint(ctx)
        ctx.event("overflow_skip", step, text, detail, global_step=step is not None)
        ctx.votes["deepspeed"] += 1
        self._floor(detail, step, text, ctx)
        return True

    def _floor(self, detail: dict[str, object], step: int | None, text: str,
               ctx: Context) -> None:
        """A second skip "reducing to" the scale it attempted: the scaler is at its minimum
        and goes on skipping every step there."""
        old, new = detail.get("attempted_scale"), detail.get("new_scale")
        if not isinstance(old, float) or old != new:
            self.at_floor, self.floor_said = None, False
            return
        if self.at_floor == old and not self.floor_said:
            ctx.event("min_loss_scale", step, text, {"min_scale": old},
                      global_step=step is not None)
            self.floor_said = True
        self.at_floor = old

    def _step_line(self, text: str, ctx: Context) -> bool:
        at = text.find("step=")
        if at < 0 or (at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_")):
            return False
        ctx.axis = DS_STEPS
        if self.fast:
            # The pattern's literals hold no digit: a record of a layout seen is sliced
            # (see fast.Shape).
            key = fast.record_key(text, ctx)
            get = None if key is None else self.layouts.get(key)
            row: Row | None = None
            if get is not None:
                row = get(text)
            else:
                f = _DS_STEP_FAST.match(text, at)
                if f is not None:
                    row = f.groups()
                    if key is not None:
                        fast.remember(f, self.layouts, key)
            if row is not None:
                # Plain counters and a decimal first lr: the points the plain path
                # stores, kept as strings for the store to convert in bulk.
                step = int(row[0])  # type: ignore[arg-type]
                block = self.block
                if block is None or block.rank != ctx.rank:
                    block = self.block = ctx.store.block(_DS_TAGS, ctx.rank, 1)
                ctx.store.add(block, step, ctx.line, row)
                ctx.last_step = step
                ctx.votes["deepspeed"] += 1
                return True
        m = _DS_STEP.match(text, at)
        if m is None:
            return False
        step = to_step(m.group(1))
        items = [("skipped", float(to_step(m.group(2))))]
        first = m.group(3).split(",")[0].strip()
        lr = to_float(first) if first else None
        if lr is not None:
            items.append(("lr", lr))
        ctx.points_at(step, items)
        ctx.votes["deepspeed"] += 1
        return True

    def _others(self, text: str, ctx: Context) -> bool:
        m = _APEX.search(text)
        if m is not None:
            ctx.event(
                "overflow_skip",
                None,
                text,
                {"new_scale": to_float(m.group(2)), "scaler": int(m.group(1))},
            )
            ctx.votes["apex"] += 1
            return True
        m = _FAIRSEQ.search(text)
        if m is not None:
            ctx.event("overflow_skip", None, text, {"new_scale": to_float(m.group(1))})
            ctx.votes["fairseq"] += 1
            return True
        m = _MIN_REACHED.search(text)
        if m is not None:
            ctx.event("min_loss_scale", None, text, {"min_scale": to_float(m.group(1))})
            ctx.votes["fairseq"] += 1
            return True
        return False
