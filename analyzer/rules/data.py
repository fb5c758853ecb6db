"""The batch itself: NaN or Inf already in it (inputs far from unit scale: rules.inputs)."""

from __future__ import annotations

from analyzer.model import Evidence, Finding
from analyzer.rules import evidence_sudden
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence


@rule("NF401", "nan-in-batch", "NaN or Inf already in the input batch or labels",
      needs=("replay", "loss"))
def nan_in_batch(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A batch that already holds NaN or Inf when it reaches the model: a corrupt sample, a
    division in preprocessing, a missing value read as NaN, a label out of range turned into
    a NaN by a lookup.

    ## Why it produces NaN/Inf
    Any arithmetic with NaN gives NaN: the first layer passes it on, the loss averages it in,
    the gradient spreads it to every parameter and one update ruins the model.

    ## Evidence
    The replay's check of the captured batch: which inputs or targets are non-finite, and
    the first module that received them (high). Without a capture, from the curves alone
    (low): a loss that becomes NaN at once after steady finite values, with no growth of the
    loss or the gradient norm, no AMP skips and no change of learning rate. A 0/0 in the loss
    (division-by-zero), and a zero-variance normalisation or a fully masked softmax where
    the model may have them, leave the same curve: the finding is tied with them and says
    what would decide (`torch.isfinite(x).all()` on the batch, or a capture).

    ## Fix
    Validate data at the boundary and find the sample:
    ```python
    def check(batch, idx):
        for name, t in batch.items():
            if torch.is_floating_point(t) and not torch.isfinite(t).all():
                raise ValueError(f"non-finite {name} in samples {idx.tolist()}")
    # in Dataset.__getitem__: np.nan_to_num(x) only if NaN is a legitimate 'missing' marker
    ```

    ## Known false positives
    None known: a non-finite batch is a fault by itself, even when the model happens to
    mask it.
    """
    replay = ev.replay
    if replay is None:
        return evidence_sudden.findings(r, ev)
    bad = tuple(replay.forward.bad_inputs)
    if not bad and replay.verdict.kind != "bad-input":
        return []
    evidence = [Evidence(f"captured batch of step {replay.step}: non-finite "
                         f"{', '.join(bad) or 'inputs'}", step=replay.step,
                         subject=", ".join(bad) or "batch")]
    frame = replay.forward.first_nonfinite
    if frame is not None:
        evidence.append(Evidence(f"first module with a non-finite output: {frame.name} "
                                 f"({frame.type})", step=replay.step, subject=frame.name))
    # the step started from non-finite values: no op of the model made them, so this
    # outweighs any reading of what the model did with them
    return [r.finding("high" if bad else "medium", evidence, 1.0 if bad else 0.5)]


RULES = (nan_in_batch,)
