"""Gradient clipping applied to gradients the AMP scaler has not unscaled yet."""

from __future__ import annotations

import math

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import Curve, RunEvidence

MIN_CHANGES = 2
"""Loss-scale changes the gradient norm must be seen to follow: one could be chance."""
TRACKED_SHARE = 0.8
"""Share of the scale's changes the gradient norm must follow."""
SIDE = 8
"""Points on each side of a scale change (within its level) whose median gradient norm is
compared: a single step's norm moves by 2x or more by itself, and batches differ in a
pattern that repeats every epoch (a median over a few of them catches the pattern, not the
scale); a median over the level's points, up to 8, does neither."""


def _paired(grad: Curve, scale: Curve) -> tuple[np.ndarray, np.ndarray]:
    """Finite, positive (gradient norm, loss scale) pairs at the steps both logged."""
    _, gi, si = np.intersect1d(grad.steps, scale.steps, return_indices=True)
    g, s = grad.values[gi], scale.values[si]
    keep = np.isfinite(g) & np.isfinite(s) & (g > 0) & (s > 0)
    return g[keep], s[keep]


def tracking(grad: Curve, scale: Curve) -> tuple[int, int, float] | None:
    """How many of the loss scale's changes (by a factor of 2 or more) the gradient norm
    followed, of how many, and the median of norm / scale; None when the scale never
    changed. The norm follows a change when the median of its log over up to :data:`SIDE`
    points after the change (within the new level) moved from the median over the points
    before (within the old one) by nearer the scale's log-factor than nothing (an unscaled
    norm does not move with the scale)."""
    g, s = _paired(grad, scale)
    if g.size < 3:
        return None
    lg, ls = np.log(g), np.log(s)
    cuts = np.flatnonzero(np.abs(np.diff(ls)) >= math.log(2) - 1e-9) + 1
    if cuts.size == 0:
        return None
    bounds = [0, *cuts.tolist(), int(g.size)]
    followed = 0
    for k, cut in enumerate(cuts.tolist()):
        before = lg[max(bounds[k], cut - SIDE):cut]
        after = lg[cut:min(bounds[k + 2], cut + SIDE)]
        moved = float(np.median(after) - np.median(before))
        factor = float(ls[cut] - ls[cut - 1])
        followed += abs(moved - factor) < abs(factor) / 2
    return followed, int(cuts.size), float(np.median(g / s))


@rule("NF305", "clip-before-unscale", "gradients clipped before the AMP scaler unscaled them",
      role="warning", needs=("grad_norm",))
def clip_before_unscale(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A mixed-precision loop that calls `clip_grad_norm_` (and logs the norm it returns) on
    gradients still multiplied by the GradScaler's loss scale, because
    `scaler.unscale_(optimizer)` was not called before clipping.

    ## Why it produces NaN/Inf
    Scaled gradients are the true ones times the scale (65536 at the start): their norm is
    huge, so clipping to `max_norm` shrinks every update by about the scale and training
    stalls; `scaler.step` then divides the already clipped gradients again. With float16
    gradients the scaled norm itself overflows to Inf, the clip coefficient is 0 and
    `0 * Inf` writes NaN into the gradients: the scaler skips those steps and halves its
    scale, so the run looks like one long overflow warm-up. It rarely kills a run by itself,
    hence a warning, but every update it lets through is wrong.

    ## Evidence
    A logged gradient norm and loss scale: at least 2 of the scale's changes (each a factor
    of 2 or more), and 80% of them, are followed by the gradient norm: the median of its
    log over the few points after the change differs from the median over the few points
    before by nearer the scale's factor than nothing. An unscaled gradient norm has no
    reason to halve when the scaler halves, nor to double when it grows. Medium from 4
    followed changes on, low with 2 or 3.

    ## Fix
    Unscale first, then clip, then step:
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)                      # gradients are now the true ones
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)                          # skips the step if norm is inf/NaN
    scaler.update()
    # Lightning and the Hugging Face Trainer do this order themselves (gradient_clip_val,
    # max_grad_norm); Accelerate: accelerator.clip_grad_norm_ unscales for you.
    ```

    ## Known false positives
    A gradient norm that really does double or halve in step with the scale's rare
    changes, over a run too short to show more than a couple of them; and a loop that logs
    the scaled norm on purpose while clipping after unscaling.
    """
    grad, scale = ev.grad_norm, ev.loss_scale
    if grad is None or scale is None:
        return []
    found = tracking(grad, scale)
    if found is None:
        return []
    followed, changes, ratio = found
    if changes < MIN_CHANGES or followed < TRACKED_SHARE * changes:
        return []
    evidence = [Evidence(f"{grad.tag} changed by the loss scale's factor at {followed} of its "
                         f"{changes} changes ({followed / changes:.0%}, {scale.tag}): the "
                         "logged norm is of scaled gradients", subject=grad.tag,
                         value=float(followed), ratio=followed / changes,
                         location=grad.location_at(int(grad.steps[0]))),
                Evidence(f"median {grad.tag} / {scale.tag} = {ratio:.3g}: the norm of the "
                         "gradients once unscaled", subject=scale.tag, value=ratio)]
    confidence = "medium" if changes >= 4 else "low"
    return [r.finding(confidence, evidence, min(1.0, 0.4 + 0.1 * changes))]


RULES = (clip_before_unscale,)
