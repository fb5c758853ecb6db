"""Steps per epoch as the run's text logs print it, on the steps its loss is read on.

A log that shows an epoch's length says it in its own unit: a Lightning progress bar's
total counts the epoch's batches, the Hugging Face Trainer's training header its optimizer
steps (``Num update steps per epoch``, which already holds the gradient accumulation). The
rules read the loss on one numbering, the global step (the optimizer's), unless the log is
the run's only numbering and was left on its own counter. So the length is put in the loss'
unit before use:

- a length in batches, over a loss on the bar's own batch counter: as printed;
- a length in batches, over a loss on optimizer steps: ``ceil(batches / k)`` with ``k``
  the batches per optimizer step: Lightning steps the optimizer every ``k`` batches and
  once more at the epoch's end on a short remainder. ``k`` is the log's alignment divisor
  (found by its values against the event files), else a Lightning save's batches done
  over its ``global_step`` (as the align stage reads them), else the run's
  ``gradient_accumulation_steps`` setting, else 1: a run that accumulated without saying
  so gets a period the bad steps do not follow, and no periodic reading;
- a length in optimizer steps, over a loss on optimizer steps: as printed; over a batch
  counter it would need the same ``k`` the other way, and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.align import _saved_accumulation
from analyzer.model import GLOBAL
from analyzer.model.runs import EpochUnit, LogSource
from analyzer.rules.evidence import RunEvidence
from analyzer.wording import relative_path


@dataclass(frozen=True)
class StepsPerEpoch:
    """An epoch's length on the loss' steps, and where it was read, in words."""

    steps: int
    unit: EpochUnit
    """The unit of ``steps``: that of the loss series the rules read."""
    source: str


def _accumulation(ev: RunEvidence, log: LogSource) -> tuple[int, str]:
    run = ev.result.run
    aligned = [a for a in run.alignments if a.source == log.path and a.aligned]
    divisor = max((a.divisor for a in aligned), default=1)
    if divisor > 1:
        return divisor, f"{divisor} batches per optimizer step, from its alignment"
    saved = _saved_accumulation(run)
    if saved is not None:
        return saved[0][0], f"{saved[0][0]} batches per optimizer step ({saved[1]})"
    meta = run.metadata
    k = meta.gradient_accumulation_steps if meta is not None else None
    if k is not None and k > 1:
        src = meta.setting("gradient_accumulation_steps") if meta is not None else None
        where = f" ({relative_path(src.source, run.path)})" if src is not None else ""
        return k, f"gradient_accumulation_steps {k}{where}"
    return 1, ""


def log_steps_per_epoch(ev: RunEvidence) -> list[StepsPerEpoch]:
    """The epoch lengths the run's logs printed, each on the loss' steps."""
    return ev.cached("log_steps_per_epoch", lambda: _readings(ev))


def _readings(ev: RunEvidence) -> list[StepsPerEpoch]:
    loss = ev.loss
    if loss is None:
        return []
    axis = loss.source.axis
    if axis != GLOBAL and axis.kind != "counter":
        return []  # record numbers, or batches within an epoch of unknown length
    on_batches = axis != GLOBAL and axis.label == "batch"
    out = []
    for log in ev.result.run.logs:
        length = log.epoch_length
        if length is None or length.length < 1:
            continue
        where = f"{relative_path(log.path, ev.result.run.path)}:{length.line}"
        said = f"{length.how}, {where}"
        if length.unit == "batch" and on_batches:
            if loss.source.source != log.path:
                continue  # another log's counter
            out.append(StepsPerEpoch(length.length, "batch", said))
        elif length.unit == "batch":
            k, why = _accumulation(ev, log)
            steps = -(-length.length // k)
            if k > 1:
                said += f"; {steps} optimizer steps at {why}"
            out.append(StepsPerEpoch(steps, "optimizer_step", said))
        elif not on_batches:
            out.append(StepsPerEpoch(length.length, "optimizer_step", said))
    return out
