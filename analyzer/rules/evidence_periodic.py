"""Non-finite steps that come back at one position of every epoch: a bad record, read post hoc.

A run that survives its non-finite steps shows where they come from. A dynamic loss scaler
skips every step whose gradients are Inf or NaN and halves its scale; loops that skip a
non-finite loss (``if not torch.isfinite(loss): continue``), Lightning's
``on_before_optimizer_step`` guards and DeepSpeed do the same. When one record of the data
set is bad and the loader does not shuffle, the step that reads it fails in every epoch, at
the same position: ``step % steps_per_epoch`` is constant and the bad steps are one epoch
apart. No overflow of the scaler's own making looks like that:

- a scaler's own overflow is of the scaled gradients: the loss it logs is finite. A step
  whose loss was logged finite is never taken for a bad record, however regular: a
  scaler that regrows every ``growth_interval`` steps overflows again at the batch with the
  largest gradients, which can lock to the epoch too. A bad record poisons the loss;
- warm-up skips come in a block at the start (one after another, each halving the scale),
  and collapse skips are dense: a bad record's step stands alone, the steps beside it
  finite;
- a step where the learning rate jumped (a schedule restarting each epoch) fails by the
  schedule's doing: a bad step there, or just after it, is left out.

The period is the run's steps per epoch where its metadata gives it (an ``epoch`` scalar,
the Hugging Face Trainer's ``max_steps`` over ``num_train_epochs`` when it divides, saves
that name their epoch and step a whole number of epochs apart, a length the logs printed:
a Lightning bar's total, the Trainer's training header, put on the loss' steps by
:mod:`analyzer.rules.evidence_epoch`), and
the bad steps must then fall at one position of at least two epochs and of every epoch
after the first one. Without it, the recurrence alone must show it: at least three
isolated bad steps one fixed period apart, in every period from the first to the end of
the run. A loop with no scaler that printed a skip line for a step and logged no loss
there (``if not torch.isfinite(loss): continue``) counts as a non-finite loss at it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_ckpt import saved_scales
from analyzer.rules.evidence_epoch import log_steps_per_epoch
from analyzer.rules.evidence_sudden import LR_CHANGE

MIN_META = 2
"""Epochs bad at one position, where the metadata gives the period."""
MIN_RECURRENCE = 3
"""Bad steps one fixed period apart, where only the recurrence gives it."""
MAX_CANDIDATES = 400
"""Isolated bad steps looked at for a period (a run with more is collapsing, not periodic)."""


@dataclass(frozen=True)
class Periodic:
    """Bad steps at one position of every epoch."""

    period: int
    position: int
    """The bad batch's index within its epoch, counting from 0."""
    steps: tuple[int, ...]
    source: str
    """Where the period came from, in words."""
    nonfinite_loss: tuple[int, ...]
    """Those of ``steps`` whose logged loss is non-finite."""
    skipped: tuple[int, ...]
    """Those of ``steps`` a scaler or the loop skipped."""

    def describe(self) -> str:
        shown = ", ".join(map(str, self.steps[:8])) + (
            f" and {len(self.steps) - 8} more" if len(self.steps) > 8 else "")
        what = []
        if self.nonfinite_loss:
            what.append(f"a non-finite loss at {len(self.nonfinite_loss)}")
        if self.skipped:
            what.append(f"a skipped step at {len(self.skipped)}")
        return (f"non-finite steps {shown} recur every {self.period} steps, at batch "
                f"{self.position} of each epoch ({' and '.join(what)} of them; their "
                f"neighbours finite); {self.source}")


def _first_step(ev: RunEvidence) -> int:
    """The step number of an epoch's first batch: 1 for loops that count from 1."""
    loss = ev.loss
    return 1 if loss is not None and len(loss) and int(loss.steps[0]) == 1 else 0


def _epoch_periods(ev: RunEvidence) -> tuple[list[int], str] | None:
    """Steps per epoch from an ``epoch`` scalar: ``step / epoch`` for the fractional epoch
    the Trainer logs, else the steps between the first steps of consecutive epochs."""
    series = [s for s in ev.result.run.global_series
              if s.tag.rsplit("/", 1)[-1].lower() == "epoch" and len(s) >= 2]
    if not series:
        return None
    s = max(series, key=len)
    steps, values = s.steps.astype(np.int64), s.values.astype(np.float64)
    keep = np.isfinite(values) & (values >= 0)
    steps, values = steps[keep], values[keep]
    if not steps.size:
        return None
    whole = bool(np.all(values == np.round(values)))
    if not whole:
        pos = values > 0
        ratios = steps[pos] / values[pos]
        if not ratios.size:
            return None
        p = round(float(np.median(ratios)))
        return ([p], f"the period is the run's steps per epoch ({s.tag}: step / epoch = "
                     "{p})") if p >= 2 else None
    firsts = [int(steps[np.flatnonzero(values == e)[0]]) for e in np.unique(values)]
    lasts = [int(steps[np.flatnonzero(values == e)[-1]]) for e in np.unique(values)]
    # the epoch changed somewhere between the last step logged with e and the first with
    # e + 1: every period within those bounds fits
    lo = max((firsts[i + 1] - firsts[i] for i in range(len(firsts) - 1)
              if lasts[i] + 1 == firsts[i + 1]), default=0)
    spans = [(firsts[i + 1] - lasts[i], firsts[i + 1] - firsts[i]) for i in range(len(firsts) - 1)]
    if not spans:
        return None
    if lo:
        periods = [lo]
    else:
        low = max(1, max(a for a, _ in spans))
        high = min(b for _, b in spans) + (lasts[-1] - firsts[-1])
        periods = list(range(max(2, low), high + 1))[:64]
    within = "" if len(periods) == 1 else f", within {periods[0]} to {periods[-1]}"
    return (periods, "the period is the run's steps per epoch ({p}" + within +
            f", from its {s.tag} scalar)") if periods else None


def _save_periods(ev: RunEvidence) -> tuple[list[int], str] | None:
    """Steps per epoch from the saves that name both their epoch and their step (Lightning's
    ``epoch=3-step=120.ckpt`` and its ``epoch``/``global_step`` keys): saves made at one
    point of their epochs (ModelCheckpoint saves at each epoch's end) lie a whole number
    of epochs apart, so every pair gives the same steps per epoch."""
    history = ev.result.run.checkpoints
    if history is None:
        return None
    pairs = sorted({(s.meta.epoch, s.step) for s in history.scans
                    if s.meta is not None and s.meta.epoch is not None and s.step is not None})
    if len(pairs) < 2:
        return None
    (e0, s0), rest = pairs[0], pairs[1:]
    periods = {(s - s0) // (e - e0) for e, s in rest if e > e0 and (s - s0) % (e - e0) == 0}
    if len(periods) != 1 or any(e <= e0 for e, _ in rest):
        return None
    p = periods.pop()
    return ([p], "the period is the run's steps per epoch ({p}, from the epochs and steps "
                 f"its {len(pairs)} saves name)") if p >= 2 else None


def _meta_periods(ev: RunEvidence) -> list[tuple[list[int], str]]:
    out = []
    for found in (_epoch_periods(ev), _save_periods(ev)):
        if found is not None:
            out.append(found)
    for printed in log_steps_per_epoch(ev):
        if printed.steps >= 2:
            out.append(([printed.steps], "the period is the run's steps per epoch ({p}: "
                                         f"{printed.source})"))
    meta = ev.result.run.metadata
    if meta is not None:
        total, epochs = meta.integer("max_steps"), meta.integer("num_train_epochs")
        if total and epochs and total % epochs == 0 and total // epochs >= 2:
            p = total // epochs
            src = meta.setting("max_steps")
            where = f" ({src.source})" if src is not None else ""
            out.append(([p], "the period is the run's steps per epoch ({p}: max_steps "
                             f"{total} over num_train_epochs {epochs}{where})"))
    return out


def _scaler(ev: RunEvidence) -> bool:
    """Whether a loss scaler ran: a scale logged, printed, or saved with the weights."""
    if ev.loss_scale is not None or saved_scales(ev):
        return True
    return any(k in e.detail for e in ev.events("overflow_skip")
               for k in ("new_scale", "attempted_scale"))


def periodic(ev: RunEvidence) -> Periodic | None:
    """The bad steps at one position of every epoch, or None."""
    if ev.replay is not None:
        return None
    loss = ev.loss
    if loss is None or len(loss) < 4:
        return None
    logged = {int(s): float(v) for s, v in zip(loss.steps, loss.values, strict=True)}
    bad_loss = {s for s, v in logged.items() if not math.isfinite(v)}
    skips = set(ev.result.overflow_skips) | {e.step for e in ev.events("overflow_skip")
                                              if e.step is not None}
    grad = ev.grad_norm
    bad_grad = set() if grad is None else {int(s) for s, v in zip(grad.steps, grad.values,
                                                                   strict=True)
                                           if not math.isfinite(float(v))}
    bad = bad_loss | skips | bad_grad
    # A bad record poisons the loss itself: a step whose loss was logged finite had only
    # its (scaled) gradients overflow, which a batch of large but finite values does at a
    # high scale, in step with the epoch too. A skip with no loss logged is a loop's own
    # guard over a non-finite loss, where no scaler ran to overflow.
    guard = not _scaler(ev)
    own = {s for s in bad if s in bad_loss or (guard and s in skips and s not in logged)}
    jumps = _lr_jumps(ev)
    isolated = sorted(s for s in own if s - 1 not in bad and s + 1 not in bad
                      and s not in jumps and s - 1 not in jumps)
    if len(isolated) < MIN_META or len(isolated) > MAX_CANDIDATES:
        return None
    last = max(int(loss.steps[-1]), max(bad))
    origin = _first_step(ev)
    found: tuple[list[int], str, int] | None = None
    for periods, source in _meta_periods(ev):
        for p in periods:
            members = _recurring(isolated, p, last, MIN_META)
            if members is not None and (found is None or len(members) > len(found[0])):
                found = (members, source.replace("{p}", str(p)), p)
    if found is None:
        gaps = sorted({b - a for a, b in itertools.pairwise(isolated) if b - a >= 2})
        for p in gaps:
            members = _recurring(isolated, p, last, MIN_RECURRENCE)
            if members is not None and (found is None or len(members) > len(found[0])):
                found = (members, "no steps per epoch in the run's metadata: the period is "
                                  f"read from the {len(members)} recurrences themselves", p)
    if found is None:
        return None
    members, source, period = found
    return Periodic(period, (members[0] - origin) % period, tuple(members), source,
                    tuple(s for s in members if s in bad_loss),
                    tuple(s for s in members if s in skips))


def _lr_jumps(ev: RunEvidence) -> set[int]:
    """Steps at which the logged learning rate changed by LR_CHANGE or more from the point
    before: a schedule restarting each epoch fails at the epoch's start by its own doing."""
    lr = ev.lr
    if lr is None or len(lr) < 2:
        return set()
    a, b = lr.values[:-1], lr.values[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = b / a
    jumped = (a > 0) & (b > 0) & ((ratio >= LR_CHANGE) | (ratio <= 1 / LR_CHANGE))
    return {int(s) for s in lr.steps[1:][jumped]}


def _recurring(steps: list[int], period: int, last: int, least: int) -> list[int] | None:
    """The largest set of ``steps`` one ``period`` apart that holds every period from its
    first to the end of the run (the last logged step may lack its own), or None."""
    have = set(steps)
    best: list[int] | None = None
    for first in steps:
        if (first - period) in have:
            continue  # not the start of its chain
        chain: list[int] = []
        t = first
        while t <= last:
            if t not in have:
                if t < last:
                    chain = []
                break
            chain.append(t)
            t += period
        if len(chain) >= least and (best is None or len(chain) > len(best)):
            best = chain
    return best
