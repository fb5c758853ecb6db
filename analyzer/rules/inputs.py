"""The inputs' scale: features far from unit range, such as raw 0-255 pixels."""

from __future__ import annotations

import math

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RECORD_ONE, RunEvidence
from analyzer.rules.evidence_precision import precision
from analyzer.rules.evidence_scale import (
    UNNORMALIZED_RMS,
    input_scale,
    oversized,
)
from analyzer.rules.gradients import (
    EARLY_STEPS,
    TIED_SCORE,
    blew_up,
    early_burst,
)

UNNORMALIZED_ABSMAX = 20.0
"""Network inputs are usually scaled to about unit range; beyond this they were not."""


@rule("NF402", "unnormalized-inputs", "unnormalized inputs (e.g. raw 0-255 pixels)",
      needs=("replay", "layer_norms", "checkpoints", "grad_norm"))
def unnormalized_inputs(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    Input features far from unit scale, such as raw 0-255 pixel values or unscaled physical
    quantities, in a run that failed.

    ## Why it produces NaN/Inf
    The first layer's pre-activations scale with the input, so do its gradients, and the
    weights' updates with them; with inputs a hundred times too large, a learning rate that
    suits normalized data makes the first layer's weights grow until a matmul overflows.

    ## Evidence
    Statistics of the captured batch's floating inputs from the replay: the largest
    magnitude and the range (a range starting at 0 and reaching ~255 is image data that was
    not divided and standardized).

    Without a capture, the first layer's gradients: for ``y = W x + b`` the weight gradient
    sums ``δ xᵀ`` where the bias gradient sums ``δ``, so ``‖∇W‖ / ‖∇b‖`` over
    ``sqrt(fan_in)`` estimates the inputs' RMS (about 1 standardized, ~100 for raw pixels;
    above 20 counts). The norms come from per-layer gradient tags (the first weight in the
    order the file wrote them, and its bias), else from the optimizer's momentum or first
    moment in a checkpoint; ``fan_in`` from the checkpoint's shapes, else from ``‖W‖/‖b‖``
    at the first logged step, which the default init makes ``sqrt(fan_in)``. The run must
    have blown up (gradients or the loss growing into the failure, or huge from the start):
    medium confidence, ranked above a learning rate, whose growth this is; low in a model
    that computes in float16 (its weights, its logged values, or a loss scaler under
    autocast), whose range is then the nearer cause. A total gradient
    norm above 1e5 within the first three steps (bad-initialisation's signature), with no
    per-layer reading, is as much inputs too large as weights too large: the two are
    reported tied.

    ## Fix
    Normalize in the data pipeline:
    ```python
    x = x.float() / 255.0
    x = (x - mean) / std           # per-channel statistics of the training set
    # torchvision: transforms.ToTensor() then transforms.Normalize(mean, std)
    ```

    ## Known false positives
    Inputs that go straight into an embedding, a normalization layer or a log: their scale
    does not reach the weights' updates the same way.
    """
    if not ev.failed:
        return []
    replay = ev.replay
    if replay is None:
        return _post_hoc(r, ev)
    # A 0-dim tensor of the batch is a count or a scale (an HF batch's num_items_in_batch),
    # not samples whose scale the model sees.
    stats = [s for s in replay.forward.batch
             if s.absmax is not None and "float" in s.dtype and s.shape]
    if not stats:
        return []
    widest = max(stats, key=lambda s: s.absmax or 0.0)
    peak = widest.absmax or 0.0
    if peak < UNNORMALIZED_ABSMAX:
        return []
    pixel_like = widest.min is not None and widest.min >= 0 and 100 <= peak <= 256
    evidence = [Evidence(f"captured batch of step {replay.step}: inputs {widest.brief()}",
                         step=replay.step, subject="inputs", value=peak)]
    if pixel_like:
        evidence.append(Evidence("values span 0 to ~255: raw pixel intensities",
                                 subject="inputs"))
    first = replay.forward.producer
    if first is not None:
        evidence.append(Evidence(f"the failure started in {first.name} ({first.type})",
                                 step=replay.step, subject=first.name))
    confidence = "high" if pixel_like else "medium"
    return [r.finding(confidence, evidence, min(1.0, 0.5 + peak / 1000))]


def _post_hoc(r: Rule, ev: RunEvidence) -> list[Finding]:
    """The inputs' scale from the first layer's gradients, in a run that blew up; a huge
    first gradient norm with nothing to read the scale from, tied with bad-initialisation."""
    scale = input_scale(ev)
    blown = blew_up(ev)
    step = ev.failure_step if ev.failure_step is not None else 0
    if scale is not None:
        if scale.rms < UNNORMALIZED_RMS or blown is None:
            return []
        evidence = [Evidence(scale.text(), location=scale.location, step=scale.step,
                             subject=scale.param, value=scale.rms),
                    blown,
                    Evidence(f"not seen: the inputs themselves; a capture of {ev.unit} {step} "
                             f"would show the batch's values. {RECORD_ONE}", subject="inputs")]
        score = min(0.9, 0.75 + 0.1 * math.log10(scale.rms / UNNORMALIZED_RMS))
        half = precision(ev).half_words()
        if half is not None:
            # float16's range is the nearer cause: in float32 these inputs still train
            evidence.append(Evidence(f"{half}: its range overflowed first (fp16-overflow)",
                                     subject="dtype"))
            return [r.finding("low", evidence, score)]
        return [r.finding("medium", evidence, score)]
    burst = early_burst(ev)
    if burst is None or oversized(ev):
        return []
    curve, _, first, value = burst
    evidence = [Evidence(f"{curve.tag} = {value:.3g} at {ev.unit} {first}, within the first "
                         f"{EARLY_STEPS} logged steps: the scale of the inputs or of the "
                         "initial weights",
                         location=curve.location_at(first), step=first, subject=curve.tag,
                         value=value),
                Evidence("not seen: the first layer's weight and bias gradient norms "
                         "(per-layer tags), whose quotient reads the inputs' scale",
                         subject="inputs")]
    return [r.finding("medium", evidence, TIED_SCORE)]


RULES = (unnormalized_inputs,)
