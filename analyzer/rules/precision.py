"""Reduced precision: float16 overflow, and a loss scaler that collapses."""

from __future__ import annotations

import math

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.wording import step_words

FP16_MAX = 65504.0
SCALE_FLOOR = 1.0
"""A dynamic loss scale at or below this has collapsed: gradients are no longer scaled up."""
MIN_FALL = 8.0
"""A scale that never fell by this factor was not collapsing (a constant 1.0 is fp32)."""


@rule("NF301", "fp16-overflow", "float16 overflow (activations beyond 65504)",
      needs=("replay", "capture"))
def fp16_overflow(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A value that overflowed float16's range (largest finite value 65504) in a run that
    computes in half precision, most often a model cast with `.half()` and trained without
    autocast, where matmul outputs, activations or sums exceed 65504.

    ## Why it produces NaN/Inf
    float16 has 5 exponent bits: anything above 65504 rounds to Inf, and values below ~6e-5
    lose precision until they flush to 0. Inf then meets a subtraction or a zero and becomes
    NaN. Autocast keeps reductions, softmax and losses in float32; a bare `.half()` model
    does not.

    ## Evidence
    A replay whose failing op ran in float16 and whose float64 re-run is finite (a range
    overflow, not a math fault), with the op's inputs or outputs near 65504; the capture's
    dtype (float16 parameters) and autocast setting.

    ## Fix
    Keep the parameters in float32 and let autocast choose per op, with a gradient scaler:
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):   # or dtype=torch.bfloat16
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    bfloat16 has float32's range and avoids overflow altogether where supported.

    ## Known false positives
    A float16 run that overflows because its inputs are unnormalized: that rule ranks this
    one as a consequence when the batch's scale is the larger anomaly.
    """
    replay = ev.replay
    op = replay.op if replay is not None else None
    meta = ev.capture_meta
    if op is None or not ev.failed:
        return []
    half_params = meta is not None and meta.dtype == "float16"
    autocast_half = meta is not None and meta.amp.autocast_dtype == "float16"
    op_half = any(s.dtype.endswith("float16") and "b" not in s.dtype.split(".")[-1][:1]
                  for s in (*op.inputs, *op.outputs))
    if not (half_params or autocast_half or op_half):
        return []
    if replay.verdict.kind not in ("range-overflow", "not-reproducible") and \
            op.float64_finite is not True:
        return []
    peak = max((s.absmax or 0.0 for s in (*op.inputs, *op.outputs)), default=0.0)
    evidence = [Evidence(f"replay of step {replay.step}: {op.phase} op {op.op} in "
                         f"{op.module or 'the model'} overflowed in float16 and is finite in "
                         "float64", step=replay.step, subject=op.module or op.op,
                         tensor=op.parameter),
                Evidence(f"largest finite magnitude around the op: {peak:.4g} "
                         f"(float16 max {FP16_MAX:g})", subject=op.op, value=peak)]
    if half_params and not autocast_half:
        evidence.append(Evidence("the model's parameters are float16 and no autocast was "
                                 "used (a bare .half() model)", subject="dtype"))
    near = peak >= FP16_MAX / 16
    confidence = "high" if half_params or (near and autocast_half) else "medium"
    return [r.finding(confidence, evidence, 0.6 + 0.2 * near + 0.2 * half_params)]


@rule("NF302", "loss-scale-collapse", "AMP loss scale collapsed to its floor",
      needs=("loss_scale",))
def loss_scale_collapse(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A dynamic loss scaler (torch GradScaler, apex, DeepSpeed, fairseq) that keeps seeing
    overflow and halves its scale again and again until it reaches its floor (1 or the
    configured minimum), after which the run fails. A few skipped steps early in training
    that the scaler recovers from are normal and are not reported.

    ## Why it produces NaN/Inf
    The scale is halved on every step whose gradients overflow. When overflow persists at
    every scale, the cause is not the scaling but a forward pass that overflows in float16
    by itself (or a real NaN): the scale collapses, every step is skipped, and the loss
    itself turns non-finite.

    ## Evidence
    The loss-scale series or the logs' overflow messages: the number of skipped steps, the
    smallest scale reached, whether the skips continued up to the failure.

    ## Fix
    Find the overflowing op (replay the captured step), keep it in float32, or switch to
    bfloat16:
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):   # no loss scaling needed
        loss = loss_fn(model(x), y)
    # or keep the sensitive part in float32:
    with torch.autocast("cuda", enabled=False):
        logits = head(h.float())
    ```

    ## Known false positives
    Runs that deliberately start with a tiny scale; the rule asks for the floor to be
    reached and for the run to fail.
    """
    if not ev.failed:
        return []
    skips = sorted(ev.result.overflow_skips)
    evidence: list[Evidence] = []
    floor = None
    curve = ev.loss_scale
    if curve is not None and len(curve):
        values = curve.values[np.isfinite(curve.values)]
        if values.size:
            floor, peak = float(values.min()), float(values.max())
            k = int(np.flatnonzero(curve.values == floor)[0])  # argmin would stop at a NaN
            evidence.append(Evidence(
                f"{curve.tag} fell from {peak:g} to {floor:g} "
                f"(step {int(curve.steps[k])})", location=curve.location_at(int(curve.steps[k])),
                step=int(curve.steps[k]), subject=curve.tag, value=floor,
                ratio=floor / peak if peak > 0 else None))
    log_floor = ev.events("min_loss_scale")
    if log_floor:
        at = log_floor[0].step
        when = f" {step_words(at, form='at')}" if at is not None else ""
        evidence.append(Evidence(f"the log says the minimum loss scale was reached{when}",
                                 location=log_floor[0].location, step=at))
    skip_events = ev.events("overflow_skip")
    count = max(len(skips), len(skip_events))
    if count:
        evidence.append(Evidence(f"{count} steps skipped for overflow", subject="loss scale"))
    fell = curve is not None and floor is not None and floor > 0 and \
        float(np.nanmax(curve.values)) / floor >= MIN_FALL
    collapsed = (fell and floor is not None and floor <= SCALE_FLOOR) or bool(log_floor)
    persistent = count >= 5 and _late(skips, ev.failure_step)
    if not (collapsed or persistent):
        return []
    confidence = "high" if collapsed and persistent else "medium"
    score = 0.6 + 0.2 * collapsed + 0.2 * persistent
    if floor is not None and floor > 0:
        score += 0.01 * min(10.0, -math.log2(floor / 65536.0)) if floor < 65536 else 0.0
    return [r.finding(confidence, evidence, score)]


def _late(skips: list[int], failure: int | None) -> bool:
    """Skips that went on into the second half of the run before the failure."""
    if not skips or failure is None or failure <= 0:
        return bool(skips)
    return max(skips) >= failure / 2


RULES = (fp16_overflow, loss_scale_collapse)
