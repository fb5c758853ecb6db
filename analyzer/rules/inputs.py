"""The inputs' scale: features far from unit range, such as raw 0-255 pixels."""

from __future__ import annotations

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence

UNNORMALIZED_ABSMAX = 20.0
"""Network inputs are usually scaled to about unit range; beyond this they were not."""


@rule("NF402", "unnormalized-inputs", "unnormalized inputs (e.g. raw 0-255 pixels)",
      needs=("replay",))
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
    replay = ev.replay
    if replay is None or not ev.failed:
        return []
    stats = [s for s in replay.forward.batch if s.absmax is not None and "float" in s.dtype]
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


RULES = (unnormalized_inputs,)
