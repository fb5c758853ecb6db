"""When a run went non-finite: the first incident per tag, per layer and per run.

Pure numpy over the records of :mod:`analyzer.model`; no file access.

The run's first incident is the earliest step at which any tag was non-finite. Several tags
often go non-finite at the same step (a NaN loss makes every gradient NaN); the tie is broken
by what the tag measures (``analyzer.tags.TIE_ORDER``: loss first, then gradient norms, then
the rest), and the incident says which rule decided.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import replace
from typing import cast

import numpy as np

from analyzer.capture.folder import META_FILE
from analyzer.model import (
    Event,
    Histogram,
    Incident,
    Location,
    NonFiniteKind,
    Run,
    RunResult,
    Series,
    nonfinite_kind,
)
from analyzer.place import read_place
from analyzer.scaler import read_scale
from analyzer.tags import TagRole, layer_from_tag, role, tie_rank
from analyzer.wording import step_words

_KINDS = ("nan", "+inf", "-inf", "nan-or-inf")


def overflow_skip_steps(run: Run) -> frozenset[int]:
    """Steps that a dynamic loss scaler skipped for overflow.

    A scaler halves its scale after a step whose gradients overflowed and skips that
    step's update, so the gradients logged at such a step are Inf or NaN by design. The
    steps come from overflow events in logs and from the loss-scale series, read before or
    after ``scaler.update()`` as the run's gradients show (:mod:`analyzer.scaler`).
    """
    return read_scale(run).skips


def first_nonfinite(steps: np.ndarray, values: np.ndarray) -> tuple[int, int | None] | None:
    """Index of the first non-finite value and of the last finite one before it."""
    bad = np.flatnonzero(~np.isfinite(values))
    if not bad.size:
        return None
    i = int(bad[0])
    return i, (i - 1 if i > 0 else None)


_GUARD_KEEPS = (TagRole.LAYER_WEIGHT, TagRole.LEARNING_RATE, TagRole.LOSS_SCALE)
"""What a step the guard refused the update of still answers for: the weights it kept."""


def _masked(tag: str, skips: frozenset[int], guarded: frozenset[int]) -> frozenset[int]:
    """Steps at which ``tag`` being non-finite is no incident: a scaler's overflow skips
    for gradients; steps a guarded step refused and the run went on from
    (:func:`analyzer.scaler.guard_skips`) for everything but weights, learning rates and
    loss scales."""
    r = role(tag)
    out = skips if skips and r.is_gradient else frozenset()
    return out | guarded if guarded and r not in _GUARD_KEEPS else out


def series_incident(series: Series, skips: frozenset[int] = frozenset(),
                    guarded: frozenset[int] = frozenset()) -> Incident | None:
    """The first non-finite point of a series; ``skips`` are steps whose gradients are
    expected to be non-finite (overflow skips), ignored for gradient tags; ``guarded``
    steps a guarded step refused the update of, ignored but for weights."""
    values = series.values
    masked = _masked(series.tag, skips, guarded)
    if masked:
        values = values.copy()
        values[np.isin(series.steps, list(masked))] = 0.0
    found = first_nonfinite(series.steps, values)
    if found is None:
        return None
    i, _ = found
    finite_before = np.flatnonzero(np.isfinite(series.values[:i]))
    last = int(finite_before[-1]) if finite_before.size else None
    kind = nonfinite_kind(float(series.values[i]))
    assert kind is not None
    return Incident(step=int(series.steps[i]), tag=series.tag, kind=kind,
                    last_finite_step=int(series.steps[last]) if last is not None else None,
                    location=series.location(i), layer=layer_from_tag(series.tag),
                    origin="log" if series.position_unit == "line" else "scalar",
                    rank=series.rank)


def histogram_incident(hist: Histogram, skips: frozenset[int] = frozenset(),
                       guarded: frozenset[int] = frozenset()) -> Incident | None:
    mask = hist.nonfinite_mask()
    masked = _masked(hist.tag, skips, guarded)
    if masked:
        mask &= ~np.isin(hist.steps, list(masked))
    bad = np.flatnonzero(mask)
    if not bad.size:
        return None
    i = int(bad[0])
    kind = _histogram_kind(hist, i)
    return Incident(step=int(hist.steps[i]), tag=hist.tag, kind=kind,
                    last_finite_step=int(hist.steps[i - 1]) if i > 0 else None,
                    location=hist.location(i), layer=layer_from_tag(hist.tag),
                    origin="histogram")


def _histogram_kind(hist: Histogram, i: int) -> NonFiniteKind:
    for v in (hist.sums[i], hist.mins[i], hist.maxs[i], hist.sum_squares[i]):
        kind = nonfinite_kind(float(v))
        if kind == "nan":
            return "nan"
    lo, hi = float(hist.mins[i]), float(hist.maxs[i])
    if np.isneginf(lo):
        return "-inf"
    if np.isposinf(hi):
        return "+inf"
    return nonfinite_kind(float(hist.sums[i])) or "nan"


FLOOR_TAG = "gradients"
"""The tag of the incident a loss scaler's floor makes: what overflowed at every step."""


def event_incident(event: Event) -> Incident | None:
    """An incident from a line that reports non-finiteness without a number (logs).

    A line that names no step is placed after the last step the log numbered before it
    (``Incident.after``); without one, the incident has no step. A loss scaler that
    reached its floor (``min_loss_scale``: DeepSpeed's "Current loss scale already at
    minimum", fairseq's "Minimum loss scale reached") is an incident too: the gradients
    overflowed at every step on the way down, and the run stops or trains on nothing.
    The rank a line was printed by (its prefix, or the elastic agent's table) is the
    incident's.
    """
    if event.kind == "min_loss_scale":
        event = replace(event, detail={**event.detail, "tag": FLOOR_TAG, "kind": "nan-or-inf"})
    elif event.kind != "nonfinite":
        return None
    step, decided_by, placed_after = event.step, None, False
    if step is None:
        after = event.detail.get("after_step")
        if isinstance(after, int):
            step, placed_after = after, True
            decided_by = f"the line names no step; the last step logged before it is {after}"
        else:
            decided_by = "the line names no step and the log numbered none before it"
    tag = str(event.detail.get("tag", "loss"))
    kind = str(event.detail.get("kind", "nan-or-inf"))
    if kind not in _KINDS:
        kind = "nan-or-inf"
    rank = event.detail.get("rank")
    return Incident(step=step, tag=tag, kind=cast(NonFiniteKind, kind), last_finite_step=None,
                    location=event.location, layer=layer_from_tag(tag), decided_by=decided_by,
                    origin="log", after=placed_after,
                    rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None)


def _checkpoint_incident(run: Run) -> Incident | None:
    if run.checkpoints is None:
        return None
    from analyzer.ingest.checkpoints import checkpoint_incident

    return checkpoint_incident(run.checkpoints)


def capture_incident(run: Run) -> Incident | None:
    """The first non-finite value the flight recorder saw, from its earliest capture's
    trigger: the loss (tag ``train/loss`` or the loop's own), a parameter's gradient or
    weight, or an exception that stopped the step on one (``FloatingPointError``, anomaly
    mode's error). It is a source like the others: a run whose only evidence of its failure
    is the capture (an anomaly error raised before anything was logged) is a failed run."""
    if not run.capture_metas:
        return None
    meta = run.capture_metas[0]  # the earliest step
    trigger = meta.trigger
    kind = trigger.kind if trigger.kind in _KINDS else "nan-or-inf"
    what = trigger.what or "loss"
    if what in ("grad", "param") and trigger.name:
        prefix = "grad_norm" if what == "grad" else "weight_norm"
        tag = f"{prefix}/{trigger.name}"
    else:
        tag = trigger.name if what == "loss" and trigger.name else f"capture/{what}"
    return Incident(step=meta.step, tag=tag, kind=cast(NonFiniteKind, kind),
                    last_finite_step=None,
                    location=Location(os.path.join(meta.folder, META_FILE)),
                    layer=layer_from_tag(tag), origin="capture")


def tag_incidents(run: Run, skips: frozenset[int] = frozenset(),
                  guarded: frozenset[int] = frozenset()) -> list[Incident]:
    """The first incident of every tag that has one, earliest first.

    A tag read from several files (a restarted writer, several ranks) keeps its earliest
    step; on a tie, the file read first. ``skips`` and ``guarded`` as for
    :func:`series_incident`; a log line at a guarded step is passed over alike.
    """
    best: dict[str, Incident] = {}
    # Each incident is on the numbering of the series or event it came from: one file may
    # hold lines placed on the global step beside lines that are not.
    on = [run.is_aligned(s.source, s.axis) for s in run.series]
    candidates: Iterable[tuple[Incident | None, bool]] = (
        [(series_incident(s, *((skips, guarded) if aligned else ())), aligned)
         for s, aligned in zip(run.series, on, strict=True)]
        + [(histogram_incident(h, skips, guarded), True) for h in run.histograms]
        + [(_unless_guarded(event_incident(e), guarded if aligned else frozenset()), aligned)
           for e, aligned in ((e, run.is_aligned(e.location.file, e.axis)) for e in run.events)]
        + [(_checkpoint_incident(run), True), (capture_incident(run), True)]
    )
    for inc, aligned in candidates:
        if inc is None:
            continue
        if not aligned:
            inc = replace(inc, aligned=False)
        held = best.get(inc.tag)
        if held is None or (not inc.aligned, _step_key(inc)) < (not held.aligned,
                                                                 _step_key(held)):
            best[inc.tag] = inc
    return sorted(best.values(), key=_rank)


_ORIGIN_ORDER = {"scalar": 0, "log": 1, "histogram": 2, "checkpoint": 3, "capture": 4}


def _step_key(inc: Incident) -> float:
    """Steps in order. An incident placed after a step counts as the next step, the
    earliest it can be: a value seen at that step, which it may well be, goes first on
    the tie, being more precise. An incident without a step comes after every numbered
    one: it is evidence of a failure, but of none placed before the others."""
    earliest = inc.earliest_step
    return math.inf if earliest is None else earliest


def _rank(inc: Incident) -> tuple[bool, float, bool, int, int, str, int, str]:
    """Incidents on the global step before those of sources not placed on it; then the
    earliest step; then a value seen at the step before one placed after the step
    before; then what the tag measures; then scalars before other sources; then the
    order the values were written in (the same step's tags in one file), then name."""
    file, position = _position(inc)
    return (not inc.aligned, _step_key(inc), inc.after, tie_rank(inc.tag),
            _ORIGIN_ORDER.get(inc.origin, 9), file, position, inc.tag)


UNALIGNED_ONLY = ("no source placed on the run's global step holds a non-finite value; this "
                  "one is in its source's own numbering")


def run_incident(incidents: list[Incident]) -> Incident | None:
    """The earliest incident of the run, saying how a tie at that step was broken."""
    if not incidents:
        return None
    ordered = sorted(incidents, key=_rank)
    first = ordered[0]
    if first.step is None:
        return first  # its decided_by says why it has no step
    if not first.aligned:
        return replace(first, decided_by=UNALIGNED_ONLY)
    tied = [i for i in ordered if i.aligned and _step_key(i) == _step_key(first)]
    where = step_words(first.step, first.after, "at")
    if len(tied) == 1:
        if first.after:
            return first  # its decided_by says where it was placed
        rule = "earliest step"
    elif tied[1].after and not first.after:
        rule = (f"{len(tied)} tags at step {first.step}: a value logged at that step before a "
                f"line that names no step but follows step {first.step - 1}")
    elif tie_rank(tied[1].tag) != tie_rank(first.tag):
        rule = (f"{len(tied)} tags {where}: loss before total gradient norm "
                "before per-layer gradients before other tags")
    elif tied[1].origin != first.origin:
        rule = (f"{len(tied)} tags {where}: event-file scalars before log lines "
                "before histograms before checkpoints")
    else:
        rule = f"{len(tied)} tags of equal priority {where}: the one written first"
    return replace(first, decided_by=rule)


def layer_incident(incidents: list[Incident]) -> Incident | None:
    """The first incident on a per-layer tag; on a tie, the layer logged first at that step."""
    layered = [i for i in incidents if i.layer is not None]
    if any(i.aligned for i in layered):
        layered = [i for i in layered if i.aligned]
    if not layered:
        return None
    key = min(map(_step_key, layered))
    tied = sorted((i for i in layered if _step_key(i) == key),
                  key=lambda i: (i.after, _position(i)))
    first = tied[0]
    where = step_words(first.step, first.after, "at")
    layers = sorted({i.layer for i in tied if i.layer})
    rule = ("earliest step" if len(layers) == 1 else
            f"{len(layers)} layers {where} ({', '.join(layers[:6])}"
            f"{', ...' if len(layers) > 6 else ''}): logged values cannot tell them apart, "
            "the one logged first is shown; a replay names the producer")
    return replace(first, decided_by=rule)


def _position(inc: Incident) -> tuple[str, int]:
    loc = inc.location
    return (loc.file, loc.offset if loc.offset is not None else (loc.line or 0))


def _with_last_finite(inc: Incident, run: Run) -> Incident:
    """A log line's or a capture's incident names no series, so no last finite step of its
    own: take the last step at which a series of the same tag was finite, up to the
    incident's step (through it, for a line placed after that step). A capture's loss may
    be logged under another name than the recorder's (``train_loss``): any loss series then."""
    if inc.origin not in ("log", "capture") or inc.last_finite_step is not None \
            or inc.step is None:
        return inc
    last: int | None = None
    # From sources on the same numbering as the incident: the global step, or its own file.
    same = run.global_series if inc.aligned else [s for s in run.series
                                                   if s.source == inc.location.file]
    tags = {s.tag for s in same}
    if inc.origin == "capture" and inc.tag not in tags and role(inc.tag) is TagRole.LOSS:
        tags = {t for t in tags if role(t) is TagRole.LOSS}
    else:
        tags = {inc.tag}
    for s in same:
        if s.tag not in tags:
            continue
        ok = np.isfinite(s.values) & ((s.steps <= inc.step) if inc.after else (s.steps < inc.step))
        if ok.any():
            found = int(s.steps[ok].max())
            last = found if last is None else max(last, found)
    return inc if last is None else replace(inc, last_finite_step=last)


def _unless_guarded(inc: Incident | None, guarded: frozenset[int]) -> Incident | None:
    if inc is None or inc.after or inc.step not in guarded:
        return inc
    return inc if not _masked(inc.tag, frozenset(), guarded) else None


def locate(run: Run) -> RunResult:
    scale = read_scale(run)
    incidents = [_with_last_finite(i, run)
                 for i in tag_incidents(run, scale.skips, scale.guarded)]
    first = run_incident(incidents)
    return RunResult(run=run, incident=first, tag_incidents=tuple(incidents),
                     layer_incident=layer_incident(incidents),
                     place=read_place(run, incidents, first),
                     overflow_skips=tuple(sorted(scale.skips)), scale=scale)
