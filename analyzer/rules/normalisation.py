"""Normalisation of a feature whose variance is zero: a norm layer with eps 0, or a std
taken of a constant, seen in an autograd anomaly message or a capture's replay."""

from __future__ import annotations

from analyzer.model import Evidence, Finding
from analyzer.rules import evidence_sudden
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.wording import step_words

_NORM_OPS = {"native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm",
             "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
             "native_group_norm", "group_norm", "instance_norm", "rms_norm", "_fused_rms_norm"}
_NORM_BACKWARD = ("NativeLayerNormBackward", "NativeBatchNormBackward",
                  "NativeGroupNormBackward", "CudnnBatchNormBackward",
                  "MiopenBatchNormBackward", "BatchNormBackward", "FusedRmsNormBackward")


def _replayed(ev: RunEvidence) -> list[Evidence]:
    replay = ev.replay
    op = replay.op if replay is not None else None
    if op is None:
        return []
    names = {str(op.forward_op)} if op.phase == "backward" and op.forward_op else set(op.names)
    if not {n.split("::")[-1] for n in names} & _NORM_OPS:
        return []
    if op.float64_finite:
        # The same op on the same inputs is finite in float64: the variance overflowed the
        # run's dtype (inputs of 1e26 after a divergence), it was not zero.
        return []
    where = f" in {op.module}" if op.module else ""
    return [Evidence(f"replay of step {replay.step}: {op.phase} op {op.op}{where} turned finite "
                     "inputs non-finite: a normalisation divided by a zero standard deviation",
                     step=replay.step, subject=op.module or op.op, tensor=op.parameter),
            Evidence(f"differential replay: {replay.verdict.summary}", step=replay.step)]


def _anomaly(ev: RunEvidence) -> list[Evidence]:
    out = []
    for e in ev.events("nonfinite"):
        fn = str(e.detail.get("function", ""))
        if not fn.startswith(_NORM_BACKWARD):
            continue
        frames = e.detail.get("user_frames") or []
        where = f"; the norm was called at {frames[-1]}" if isinstance(frames, list) and frames \
            else ""
        when = f" {step_words(e.step, form='at')}" if e.step is not None else ""
        out.append(Evidence(f"autograd anomaly{when}: {fn} returned non-finite values{where}",
                            location=e.location, step=e.step, subject=fn))
    return out


@rule("NF105", "zero-variance-normalisation",
      "normalisation of a feature with zero variance (eps 0, std of a constant)",
      needs=("replay", "anomaly_log", "loss"))
def zero_variance_normalisation(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A batch, layer, group or RMS norm, or a hand-written `(x - x.mean()) / x.std()`, applied
    to a feature whose variance is exactly zero (a blank image, an all-padding sequence of
    zero embeddings, a constant column) with no epsilon, or an epsilon of 0.

    ## Why it produces NaN/Inf
    The norm divides by sqrt(var + eps). With var = 0 and eps = 0 that is 0/0 = NaN in the
    forward pass, and the backward's 1/std term is Inf; one constant sample in a batch is
    enough to write NaN into every weight it reaches. The run is healthy until the first
    batch that holds such a sample.

    ## Evidence
    A capture's replay whose first non-finite op is a normalisation (high), or an autograd
    anomaly message naming NativeLayerNormBackward0, NativeBatchNormBackward0 or
    NativeGroupNormBackward0, with the user frame that called the norm (medium). A std
    written by hand shows up as a division (DivBackward0): the division-by-zero rule names it.
    Without either, from the curves alone: a loss that becomes NaN at once after steady
    finite values (no growth, no AMP skips, no change of learning rate), in a model that has
    a normalisation layer: low and tied with nan-in-batch, division-by-zero, log-of-zero
    and, in a model with attention, softmax-all-masked (the same curve), unless the run
    records a normalisation with eps 0, which makes it medium and decides it. In a run that
    names none of its modules it ranks below those (it rests on a layer nobody saw); in one
    whose modules include no normalisation it is ruled out.

    ## Fix
    Keep an epsilon inside the root, and guard constant inputs:
    ```python
    norm = torch.nn.LayerNorm(d_model, eps=1e-5)          # never eps=0
    x = (x - x.mean(dim=(1, 2, 3), keepdim=True)) / (x.std(dim=(1, 2, 3), keepdim=True) + 1e-6)
    # or drop blank samples in the dataset: keep = x.flatten(1).std(1) > 0
    ```

    ## Known false positives
    A norm whose variance overflowed the dtype (inputs of 1e20 and more after a divergence)
    fails in float32 too; the replay reruns the op in float64, where it is finite, and this
    rule then stays silent (the overflow and learning-rate rules speak). A norm whose input
    was already NaN (a bad batch, an earlier overflow): the anomaly names
    the norm's backward though the NaN came in from upstream; the nan-in-batch and overflow
    rules look at the inputs.
    """
    if not ev.failed:
        return []
    replayed = _replayed(ev)
    if replayed:
        op = ev.replay.op
        return [r.finding("high" if op.inputs_finite else "medium", replayed, 0.9)]
    found = _anomaly(ev)
    if found:
        return [r.finding("medium", found, 0.6)]
    return evidence_sudden.findings(r, ev)


RULES = (zero_variance_normalisation,)
