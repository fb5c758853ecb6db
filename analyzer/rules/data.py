"""The batch itself: NaN or Inf already in it (inputs far from unit scale: rules.inputs)."""

from __future__ import annotations

from analyzer.model import Evidence, Finding
from analyzer.rules import evidence_periodic, evidence_sudden
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

    A run that survives its non-finite steps (a GradScaler, a loop that skips a non-finite
    loss, DeepSpeed) shows more (medium): a non-finite loss that recurs at one position of
    every epoch, `step % steps_per_epoch` constant, the steps beside it finite. That is a
    bad record read again each epoch by a loader that does not shuffle, not the model's
    numerics: a scaler's own overflows leave the loss finite (only the scaled gradients
    overflow) and come in a block at the start or densely in a collapse. The period is the
    run's steps per epoch where its metadata gives it (an `epoch` scalar, `max_steps` over
    `num_train_epochs`, the epochs and steps its saves name), with at least two epochs bad
    at that position and every epoch after the first; otherwise at least three recurrences
    one fixed period apart. A loop with no scaler that prints a skip line and logs nothing
    else for the step counts as a non-finite loss there. The finding names the steps, the
    period, the batch's position and what decides: that batch's records (`dataset[i]`).

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
    A non-finite batch is a fault by itself, even when the model happens to mask it. The
    recurrence reading cannot tell a record holding NaN from a finite one that makes a 0/0
    (a selection empty for that batch): both are that batch's doing, and the check of its
    records decides. A schedule that raises the learning rate at that position of each
    epoch explains the recurrence as well: such steps are left out.
    """
    replay = ev.replay
    if replay is None:
        return _periodic(r, ev) or evidence_sudden.findings(r, ev)
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


def _periodic(r: Rule, ev: RunEvidence) -> list[Finding]:
    """Non-finite steps at one position of every epoch (rules.evidence_periodic)."""
    p = evidence_periodic.periodic(ev)
    if p is None:
        return []
    loss = ev.loss
    first = p.steps[0]
    evidence = [Evidence(p.describe(), location=loss.location_at(first) if loss else None,
                         step=first, subject="batch", value=float(p.period))]
    meta = ev.result.run.metadata
    batch = meta.integer("batch_size") if meta is not None else None
    # an optimizer step reads `accumulation` batches: the step's records span all of them
    per_step = (batch or 0) * ((meta.gradient_accumulation_steps if meta else None) or 1)
    records = (f"`dataset[i]` for i in range({p.position * per_step}, "
               f"{(p.position + 1) * per_step}) on one process" if per_step else
               f"`dataset[i]` for the indices of batch {p.position}")
    evidence.append(Evidence(
        "a model's own numerics do not fail at one position of each epoch: a scaler's own "
        "overflows leave the loss finite and come in a block at the start or densely in a "
        "collapse, so the batch read there is bad (a NaN or Inf in a record, or one that "
        "makes a 0/0 such as an empty selection)", subject="batch"))
    evidence.append(Evidence(
        f"not seen: the batch itself; would decide: check the batch at position "
        f"{p.position} of the epoch ({records}, with the loader's shuffle off), e.g. "
        "`torch.isfinite(x).all()` on each of its tensors", step=first, subject="batch"))
    return [r.finding("medium", evidence, 0.75)]


RULES = (nan_in_batch,)
