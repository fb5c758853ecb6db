"""The loss curve itself: spikes before the failure."""

from __future__ import annotations

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.signals import robust_z

SPIKE_Z = 6.0
WINDOW = 50
TAIL = 2000
"""Only the last logged values before the failure are scored: spikes long before it are
history, not a lead-up."""


@rule("NF208", "loss-spike", "loss spikes before the failure", role="symptom",
      needs=("loss",))
def loss_spike(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    Sudden jumps of the loss far outside its recent range (a robust z-score above 6 against
    the median and MAD of the previous 50 logged values) in the stretch before the failure.

    ## Why it produces NaN/Inf
    A spike is a step whose update overshot: an outlier batch, a learning rate at the edge
    of stability, or an attention logit that grew too large. Each spike throws the weights
    further, and a run that spikes repeatedly usually ends in overflow.

    ## Evidence
    The training-loss series up to the first non-finite step: the steps and sizes of the
    spikes.

    ## Fix
    Damp the overshoot and find the batches that cause it:
    ```python
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    # lower the peak learning rate or lengthen warmup; log per-batch loss with sample ids
    if loss.item() > 5 * running_median:
        print("spike", step, batch_ids)
    ```

    ## Known false positives
    The start of training and curriculum switches move the loss by design; the rule needs
    ten points of history before it scores a value.
    """
    curve = ev.loss
    if curve is None or not ev.failed:
        return []
    before = curve.before(ev.failure_step)
    if len(before) < 15:
        return []
    before = before.tail(TAIL)
    z = robust_z(before.values, WINDOW)
    spikes = np.flatnonzero(z > SPIKE_Z)
    if not spikes.size:
        return []
    top = int(spikes[np.argmax(z[spikes])])
    step = int(before.steps[top])
    evidence = [Evidence(f"{spikes.size} loss spike(s) before the failure; the largest at "
                         f"step {step}: {before.values[top]:.4g}, {z[top]:.1f} MADs above "
                         "the recent median", location=before.location_at(step), step=step,
                         subject=curve.tag, value=float(before.values[top]))]
    confidence = "medium" if spikes.size >= 3 else "low"
    return [r.finding(confidence, evidence, min(1.0, float(z[top]) / 50))]


RULES = (loss_spike,)
