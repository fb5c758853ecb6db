"""Reduced precision: float16 overflow, a loss scaler that collapses, and one that recovers."""

from __future__ import annotations

import math

import numpy as np

from analyzer.model import Evidence, Finding, Location
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence, lacking, rose
from analyzer.rules.evidence_ckpt import (
    first_bad_save,
    histogram_peaks,
    near_limit,
    saved_scales,
)
from analyzer.rules.evidence_periodic import periodic
from analyzer.rules.evidence_precision import precision
from analyzer.scaler import read_scale
from analyzer.wording import step_words

FP16_MAX = 65504.0
SCALE_FLOOR = 1.0
"""torch's GradScaler's floor: at or below 1 gradients are no longer scaled up (it has no
configured minimum and keeps halving)."""
FAIRSEQ_FLOOR = 1e-4
"""fairseq's default ``--min-loss-scale``."""
TAIL = 8
"""The last logged scale points looked at for a collapse that has not reached the floor."""
MIN_FALL = 8.0
"""A scale that never fell by this factor was not collapsing (a constant 1.0 is fp32)."""


@rule("NF301", "fp16-overflow", "float16 overflow (activations beyond 65504)",
      needs=("replay", "capture", "loss"))
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
    dtype (float16 parameters) and autocast setting. Without a capture: a model shown to
    compute in float16 (a configured precision of 16-true, or logged losses and gradient
    norms that are all exactly float16 values, or checkpoints whose weights are float16)
    whose loss or gradient norm rose into the failure (the gradient norm, for a failure that
    began in the backward pass), or whose float16 weights in the last finite save or
    logged histograms came within 16 times of 65504, with no dynamic loss scaling: no
    loss scale logged, or one that is exactly 1.0 throughout, which is what a GradScaler
    built with `enabled=False` reports. The first non-finite save, where there is one, says
    which layers held the overflow.

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
    if op is None and replay is None:
        return _posthoc(r, ev)
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


def _posthoc(r: Rule, ev: RunEvidence) -> list[Finding]:
    """A float16 model whose values rose into a forward (or backward) failure, without
    dynamic loss scaling."""
    o = ev.onset
    reading = precision(ev)
    why, weights = reading.model, reading.weights
    if o is None or not reading.half_model:
        return []
    disabled = reading.scaler.state == "disabled"
    if not disabled and reading.scaler.state != "none":
        return []  # a dynamic scaler skips overflowing steps: NF302/NF303 read it
    curves = {"forward": (ev.loss, ev.grad_norm), "backward": (ev.grad_norm,)}.get(o.phase, ())
    risen = [c for c in curves if c is not None and rose(c.before(o.step).values)]
    near = [n.evidence() for n in near_limit(ev)]
    near += histogram_peaks(ev, "float16", o.step)
    if not (risen or near):
        return []
    evidence = [Evidence(why, subject="dtype")] if why is not None else []
    if weights is not None:
        evidence.append(weights.evidence())
    if risen:
        c = risen[-1]
        last = c.before(o.step)
        peak = float(np.max(np.abs(last.values[np.isfinite(last.values)])))
        evidence.append(Evidence(
            f"{c.tag} rose to {peak:.4g} by step {int(last.steps[-1])}, just before the "
            f"failure {step_words(o.step, form='at')} (float16 max {FP16_MAX:g}; activations "
            "and sums are larger than the norms logged)",
            location=c.location_at(int(last.steps[-1])), step=int(last.steps[-1]),
            subject=c.tag, value=peak))
    evidence.extend(near)
    if disabled:
        assert ev.loss_scale is not None
        evidence.append(Evidence(
            f"{ev.loss_scale.tag} is 1.0 at every logged step: what a disabled GradScaler "
            "reports (get_scale() is 1.0 when enabled=False), so no dynamic loss scaling "
            "skipped the overflowing steps", subject=ev.loss_scale.tag, value=1.0))
    else:
        evidence.append(Evidence("no loss scale logged: no GradScaler, so nothing skipped the "
                                 "overflowing steps", subject="loss_scale"))
    bad = first_bad_save(ev)
    if bad is not None:
        evidence.append(bad)
    evidence.append(Evidence(lacking(o.step, "the op that overflowed"), step=o.step))
    return [r.finding("medium", evidence, 0.7 + 0.05 * bool(near))]


@rule("NF302", "loss-scale-collapse", "AMP loss scale collapsed to its floor",
      needs=("loss_scale", "checkpoints"))
def loss_scale_collapse(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A dynamic loss scaler (torch GradScaler, apex, DeepSpeed, fairseq) that keeps seeing
    overflow and halves its scale again and again until it reaches its floor, or halves it on
    most of the last logged steps until the run ends with a non-finite loss. The floor is 1
    for torch's GradScaler, else the configured minimum (DeepSpeed's `min_loss_scale` and its
    "Current loss scale already at minimum", fairseq's `--min-loss-scale`, 1e-4 by default,
    and its "Minimum loss scale reached"). A scale that drops in the first steps and then
    holds or grows again is the scaler's warm-up, not a collapse: see NF303.

    ## Why it produces NaN/Inf
    The scale is halved on every step whose gradients overflow. When overflow persists at
    every scale, the cause is not the scaling but a forward pass that overflows in float16
    by itself (or a real NaN): the scale collapses, every step is skipped, and the loss
    itself turns non-finite.

    ## Evidence
    The loss-scale series or the logs' overflow messages: the smallest scale reached and the
    floor, how many of the last logged steps were skipped, the loss at the end, and whether
    the scale was logged before or after `scaler.update()` (decided from where non-finite
    gradients and scale drops coincide). Where no scale was logged, the scaler's state saved
    in the checkpoints: a scale that fell at least 8 times to the floor, or was still
    halving over the last three saves of a run whose loss ended non-finite (medium: saves
    are a sparse view of the scale).

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
    Runs that deliberately start with a tiny scale; the rule asks for the floor or a falling
    tail, and for the run to fail.
    """
    if not ev.failed:
        return []
    seen = _collapse(ev)
    if not seen.collapsed:
        return []
    logged = ev.loss_scale is not None or bool(ev.events("min_loss_scale"))
    # a few saves are a sparse view of the scale: decisive only where it was logged
    confidence = "high" if seen.at_floor and seen.falling and logged else "medium"
    score = 0.6 + 0.2 * seen.at_floor + 0.2 * seen.falling
    low = seen.lowest
    if low is not None and 0 < low < 65536:
        score += 0.01 * min(10.0, -math.log2(low / 65536.0))
    return [r.finding(confidence, list(seen.evidence), score)]


@rule("NF303", "loss-scale-warm-up", "AMP steps skipped for overflow, and the scaler recovered",
      role="warning")
def loss_scale_warm_up(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A dynamic loss scaler that skipped steps for overflow and lowered its scale, after which
    the scale held or grew again: the scaler finding a scale that fits float16, early in
    training or now and then afterwards. Not a failure: it says which steps were skipped and
    how the loss-scale series was read.

    ## Why it produces NaN/Inf
    It does not: a skipped step's gradients are Inf or NaN by design (the scaled gradients
    overflowed float16), the optimizer leaves the weights alone, and the scale is halved.
    Those non-finite gradients are never reported as the run's failure.

    ## Evidence
    The skipped steps, the scale's lowest value and its floor, and whether the scale
    was logged before or after `scaler.update()`: a skipped step has non-finite unscaled
    gradients and the scale halves across it; where drops and non-finite gradients coincide
    decides which logged step a drop belongs to. A scale of exactly 1.0 at every logged
    step is a disabled GradScaler (its `get_scale()` is 1.0 when `enabled=False`), which
    skips nothing: no note is made from it. Skips that recur at one position of every epoch
    are no warm-up but a bad batch read each epoch: nan-in-batch (NF401) reads them, and no
    note is made.

    ## Fix
    Nothing to fix. To skip fewer steps at the start, begin at a scale that fits:
    ```python
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12)
    ```

    ## Known false positives
    None known: the rule is a note, and a collapse (NF302) takes precedence.
    """
    if precision(ev).scaler.state == "disabled":
        return []  # a disabled scaler skips nothing: NaN gradients under it are the failure
    seen = _collapse(ev)
    if seen.collapsed or not seen.count or periodic(ev) is not None:
        return []
    which = f" ({_steps(seen.skips)})" if seen.skips else ""
    then = ("then the scale held or grew again" if ev.loss_scale is not None
            else "none of them at the scaler's floor")
    held = Evidence(f"{_count(seen.count)} skipped for overflow{which}, {then}",
                    subject="loss scale", value=float(seen.count))
    return [r.finding("medium", [held, *(e for e in seen.evidence if e is not seen.counted)],
                      0.5)]


class _Seen:
    """What the loss scale shows, for both rules."""

    def __init__(self) -> None:
        self.evidence: list[Evidence] = []
        self.skips: list[int] = []
        self.count = 0
        self.counted: Evidence | None = None
        self.lowest: float | None = None
        self.at_floor = False
        self.falling = False

    @property
    def collapsed(self) -> bool:
        return self.at_floor or self.falling


def _floor(ev: RunEvidence) -> float:
    """The scaler's floor: a configured minimum the logs printed, else the framework's."""
    for e in ev.events("min_loss_scale"):
        value = e.detail.get("min_scale")
        if isinstance(value, float) and value > 0:
            return value
    if any(g.framework and "fairseq" in g.framework for g in ev.result.run.logs):
        return FAIRSEQ_FLOOR
    return SCALE_FLOOR


def _collapse(ev: RunEvidence) -> _Seen:
    seen = _Seen()
    reading = ev.result.scale or read_scale(ev.result.run)  # read once, by the locator
    seen.skips = sorted(ev.result.overflow_skips)
    seen.count = max(len(seen.skips), len(ev.events("overflow_skip")))
    floor = _floor(ev)
    curve = ev.loss_scale
    if curve is not None and len(curve):
        finite = np.isfinite(curve.values)
        if finite.any():
            low, peak = float(curve.values[finite].min()), float(curve.values[finite].max())
            k = int(np.flatnonzero(curve.values == low)[0])  # argmin would stop at a NaN
            at = int(curve.steps[k])
            seen.lowest = low
            seen.evidence.append(Evidence(
                (f"{curve.tag} fell from {peak:g} to {low:g}" if low < peak else
                 f"{curve.tag} held at {low:g}") + f" against a floor of {floor:g} (step {at})",
                location=curve.location_at(at), step=at,
                subject=curve.tag, value=low, ratio=low / peak if peak > 0 else None))
            # A constant scale of 1 is no scaler at all: the floor counts after a real fall.
            seen.at_floor = low <= floor and low > 0 and peak / low >= MIN_FALL
            seen.falling = _falling_tail(ev, curve.steps, curve.values, set(seen.skips), seen)
    elif saves := saved_scales(ev):
        _from_saves(ev, saves, floor, seen)
    log_floor = ev.events("min_loss_scale")
    if log_floor:
        seen.at_floor = True
        at_step = log_floor[0].step
        when = f" {step_words(at_step, form='at')}" if at_step is not None else ""
        seen.evidence.append(Evidence(f"the log says the minimum loss scale was reached{when}",
                                      location=log_floor[0].location, step=at_step))
    if seen.count:
        seen.counted = Evidence(f"{_count(seen.count)} skipped for overflow",
                                subject="loss scale", value=float(seen.count))
        seen.evidence.append(seen.counted)
    if reading.statement is not None:
        seen.evidence.append(Evidence(reading.statement, subject="loss scale"))
    return seen


def _from_saves(ev: RunEvidence, saves: list[tuple[int, float, str]], floor: float,
                seen: _Seen) -> None:
    """The scaler's scale as its checkpoints saved it, where no scale series was logged:
    a fall of MIN_FALL or more to the floor, or one still going at the last two intervals
    of a run whose loss ended non-finite (a scaler that settled stops falling)."""
    scales = [scale for _, scale, _ in saves]
    low, peak = min(scales), max(scales)
    at, _, path = saves[scales.index(low)]
    seen.lowest = low
    seen.evidence.append(Evidence(
        f"the loss scaler's scale saved in the checkpoints went from {peak:g} to {low:g} "
        f"(step {at}) over {len(saves)} saves (steps {saves[0][0]} to {saves[-1][0]}), "
        f"against a floor of {floor:g}", location=Location(path), step=at,
        subject="loss scale", value=low, ratio=low / peak if peak > 0 else None))
    fell = peak / low >= MIN_FALL if low > 0 else False
    seen.at_floor = fell and 0 < low <= floor
    loss = ev.loss
    ended_bad = loss is not None and len(loss) > 0 and not math.isfinite(float(loss.values[-1]))
    seen.falling = (ev.failed and ended_bad and fell and len(scales) >= 3
                    and scales[-1] < scales[-2] < scales[-3])
    if seen.falling:
        seen.evidence.append(Evidence(
            f"the saved scale was still falling at the last saves (steps {saves[-3][0]}, "
            f"{saves[-2][0]}, step {saves[-1][0]}: {scales[-1]:g}) and the loss is non-finite "
            "at the end",
            location=Location(saves[-1][2]), step=saves[-1][0], subject="loss scale",
            value=scales[-1]))
    seen.evidence.append(Evidence(
        "not seen: the scale and the skipped steps between the saves; logging "
        "`scaler.get_scale()` every step (`writer.add_scalar('train/loss_scale', "
        "scaler.get_scale(), step)`) would show each halving", subject="loss scale"))


def _falling_tail(ev: RunEvidence, steps: np.ndarray, values: np.ndarray, skips: set[int],
                  seen: _Seen) -> bool:
    """Most of the last logged scale points are skips, the scale was still halving at the
    last one, and the loss is non-finite at the end: a collapse caught before the floor. A
    scale that fell early and then held ends flat, however many skips the tail holds."""
    if not ev.failed or len(steps) < 3:
        return False
    tail_steps, tail_values = steps[-TAIL:], values[-TAIL:]
    skipped = sum(int(s) in skips for s in tail_steps)
    if skipped * 2 <= len(tail_steps) or not tail_values[-1] < tail_values[-2]:
        return False
    loss = ev.loss
    if loss is not None and len(loss) and math.isfinite(float(loss.values[-1])):
        return False
    first, last = int(tail_steps[0]), int(tail_steps[-1])
    seen.evidence.append(Evidence(
        f"{skipped} of the last {len(tail_steps)} logged steps were skipped (from step "
        f"{first} on), the scale still halving at step {last} and the loss non-finite at the "
        "end", step=last, subject="loss scale",
        value=float(skipped)))
    return True


def _count(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _steps(steps: list[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    shown = ", ".join(map(str, steps[:8]))
    return f"steps {shown}" + (f" and {len(steps) - 8} more" if len(steps) > 8 else "")


RULES = (fp16_overflow, loss_scale_collapse, loss_scale_warm_up)
