"""The batch itself: NaN or Inf already in it, or inputs far from unit scale."""

from __future__ import annotations

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence

UNNORMALIZED_ABSMAX = 20.0
"""Network inputs are usually scaled to about unit range; beyond this they were not."""


@rule("NF401", "nan-in-batch", "NaN or Inf already in the input batch or labels",
      needs=("replay",))
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
    the first module that received them.

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
        return []
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
    return [r.finding("high" if bad else "medium", evidence, 0.9 if bad else 0.5)]


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


RULES = (nan_in_batch, unnormalized_inputs)
