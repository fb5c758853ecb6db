"""The learning rate: too high from the start, or jumping up before the failure."""

from __future__ import annotations

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.gradients import BAD_INIT_NORM, gradient_growth, growth_evidence

JUMP = 5.0
WARMUP_HORIZON = 2000
"""A run that fails later than this many steps in did not fail for lack of warmup."""
EARLY_SHARE = 0.2
"""Growth that starts within this share of the steps before the failure started early."""
FAST_DOUBLING = 10.0
"""Growth that doubles within this many steps is the optimizer overshooting, not drift."""
"""A learning rate that rises by this factor between two logged steps has jumped."""


@rule("NF202", "learning-rate-too-high", "learning rate too high",
      needs=("grad_norm", "loss"))
def learning_rate_too_high(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    Divergence with a steady learning rate: the loss and the gradient norm grow
    exponentially from early in training, every layer's weights grow with them, and
    nothing else (initialisation, a recurrent layer, a log or a division) explains it.

    ## Why it produces NaN/Inf
    With a step size beyond 2/λmax of the loss's curvature, each update overshoots the
    minimum by more than it corrects, so the error grows geometrically; the weights and the
    gradients overflow float32 within tens of steps.

    ## Evidence
    Fast exponential growth of the gradient norm (or loss) before the failure, doubling
    within ten steps; a learning-rate series that did not jump (else learning-rate-jump
    applies); a first gradient norm below the bad-initialisation threshold; weight norms
    growing in several layers; the optimizer's learning rate from the capture.

    ## Fix
    Lower the learning rate (by 3-10x), add a warmup, and clip gradients while tuning:
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=lr / 10, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01,
                                                  total_iters=500)
    ```

    ## Known false positives
    A bad initialisation or an exploding recurrent layer shows the same growth; those rules
    rank above this one when their evidence is present.
    """
    if not ev.failed:
        return []
    found = gradient_growth(ev)
    if found is None:
        return []
    curve, g = found
    evidence = growth_evidence(curve, g)
    fast = g.doubling_steps <= FAST_DOUBLING
    grad = ev.grad_norm
    head = grad.values[:3] if grad is not None else np.zeros(0)
    if head.size and float(np.nanmax(np.where(np.isfinite(head), head, 0))) > BAD_INIT_NORM:
        return []  # huge from the first step: initialisation, not the step size
    if ev.lr is not None and _jump(ev) is not None:
        return []
    lr = _lr_value(ev)
    if lr is not None:
        evidence.append(Evidence(f"learning rate {lr:g}, steady until the failure",
                                 subject="lr", value=lr))
    grow = _weights_growing(ev)
    if grow:
        evidence.append(Evidence(f"weight norms of {grow} layers grew before the failure",
                                 subject="weights"))
    confidence = "medium" if fast else "low"
    return [r.finding(confidence, evidence, 0.4 + 0.1 * min(g.decades, 4) / 4 + 0.1 * bool(grow))]


@rule("NF203", "learning-rate-jump", "learning-rate jump or missing warmup", needs=("lr",))
def learning_rate_jump(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A learning rate that rises sharply (5x or more between two logged steps) shortly before
    the failure: a scheduler restart, a misconfigured warmup that ends in a jump, or a
    resumed run that forgot its schedule.

    ## Why it produces NaN/Inf
    The curvature the model has settled into tolerates the old step size, not one several
    times larger: the next updates overshoot and the loss diverges.

    ## Evidence
    The learning-rate series: the largest rise between consecutive logged values in the
    window before the first non-finite step. Without a jump, a missing warmup: a rate at its
    peak from the first logged step, in a run whose gradients grew exponentially from its
    first fifth and that failed within 2,000 steps (low confidence: the learning rate may
    simply be too high, which that rule reports).

    ## Fix
    Make the schedule continuous and warm up after restarts:
    ```python
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=1000)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[1000])
    # on resume, load the scheduler's state_dict too
    ```

    ## Known false positives
    Cyclical schedules jump by design; they fail this way only when the peak is too high.
    """
    if not ev.failed:
        return []
    found = _jump(ev)
    if found is None:
        return _missing_warmup(r, ev)
    step, before, after = found
    curve = ev.lr
    assert curve is not None and ev.failure_step is not None
    evidence = [Evidence(f"{curve.tag} rose from {before:.3g} to {after:.3g} at step {step} "
                         f"(x{after / before:.3g}), {ev.failure_step - step} steps before "
                         f"the failure", location=curve.location_at(step), step=step,
                         subject=curve.tag, onset=step, value=after, ratio=after / before)]
    return [r.finding("medium", evidence, min(1.0, 0.5 + 0.05 * after / before))]


def _missing_warmup(r: Rule, ev: RunEvidence) -> list[Finding]:
    """A schedule that starts at its peak in a run that diverged from its first steps."""
    curve = ev.lr
    if curve is None or ev.failure_step is None:
        return []
    lr = curve.before(ev.failure_step + 1).values
    lr = lr[np.isfinite(lr)]
    start = int(curve.steps[0]) if len(curve) else 0
    span = ev.failure_step - start
    if lr.shape[0] < 3 or span > WARMUP_HORIZON or lr[0] < 0.9 * float(lr.max()):
        return []
    found = gradient_growth(ev)
    if found is None or found[1].onset_step - start > EARLY_SHARE * span:
        return []
    curve_g, g = found
    evidence = [Evidence(f"{curve.tag} was {lr[0]:.3g} from the first logged step (step "
                         f"{start}): no warmup", location=curve.location_at(start), step=start,
                         subject=curve.tag, value=float(lr[0])),
                *growth_evidence(curve_g, g)]
    return [r.finding("low", evidence, 0.3,
                      title="missing learning-rate warmup: divergence from the first steps")]


def _jump(ev: RunEvidence) -> tuple[int, float, float] | None:
    curve = ev.lr
    if curve is None or ev.failure_step is None:
        return None
    before = curve.before(ev.failure_step + 1)
    v = before.values
    if v.shape[0] < 2:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(v[:-1] > 0, v[1:] / v[:-1], 1.0)
    window = max(0, ratio.shape[0] - 50)
    k = int(np.argmax(ratio[window:])) + window
    if not np.isfinite(ratio[k]) or ratio[k] < JUMP:
        return None
    return int(before.steps[k + 1]), float(v[k]), float(v[k + 1])


def _lr_value(ev: RunEvidence) -> float | None:
    meta = ev.capture_meta
    if meta is not None and meta.lr is not None:
        return meta.lr
    if ev.lr is not None and len(ev.lr):
        return float(ev.lr.values[-1])
    return None


def _weights_growing(ev: RunEvidence) -> int:
    count = 0
    for curve in ev.layer_weight_norms.values():
        v = curve.before(ev.failure_step).values
        v = v[np.isfinite(v)]
        if v.shape[0] >= 2 and v[0] > 0 and v[-1] / v[0] > 10:
            count += 1
    return count


RULES = (learning_rate_too_high, learning_rate_jump)
