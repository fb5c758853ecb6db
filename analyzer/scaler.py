"""Which steps a dynamic loss scaler skipped, read from the run's own numbers.

Pure numpy over the records of :mod:`analyzer.model`; no file access.

A dynamic loss scaler (torch's GradScaler, apex, DeepSpeed, fairseq) that finds non-finite
unscaled gradients skips that step's update and halves its scale, so the gradients logged
at a skipped step are Inf or NaN by design. Where the halving shows depends on when the
training loop logged the scale:

- before ``scaler.update()``: the scale logged at step N is the one step N used, and the
  halving shows at the next logged step; a drop from step N to N+1 marks N as skipped;
- after ``scaler.update()``: the scale logged at step N is the one step N+1 will use, and
  the drop shows at N itself; a drop from step N-1 to N marks N as skipped.

One skip per series is out of sight either way: the last logged step's (before) or the
first's (after), whose halving falls outside the logged points. A scaler skips every step
whose gradients are non-finite, so where the gradients decided the reading such a step
with non-finite gradients is a skip too.

Which of the two a run did is decided where it logged gradient norms at consecutive
steps, by what each reading would contradict: a step with non-finite gradients and no
halving across it, or a halving across a step whose gradients were finite. In a block of
consecutive skips both readings agree in the middle; its edges tell them apart. The reading
with fewer contradictions wins, when it explains a drop by non-finite gradients or is not
contradicted at all (a scale that never moves while the gradients go NaN, such as a
constant 1.0, is no scaler answering overflow, and decides nothing). Where neither reading
is contradicted but gradients were non-finite, every logged step was skipped and both
readings are taken together. Otherwise (no gradient series, a scale logged every k steps,
or as many contradictions each way) the before reading is kept and said to be assumed.
Overflow events from logs that name their step are skips whatever the scale series says.

A guarded step (``analyzer.capture.StepGuard`` with ``skip_nonfinite``) refuses the update
of a step whose gradients are non-finite and logs its count of refusals,
``guard/skipped_steps``, at each step it grows: those steps are read from the counter
(:func:`guard_skips`). Unlike a scaler's, such a step's loss is often non-finite too (a NaN
in the batch); it is the run's failure only when the run did not go on from it: the
refusals after the last step the run logged without one are kept as incidents.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from analyzer.model import FloatArray, IntArray, Run, ScaleConvention, ScaleReading, Series
from analyzer.tags import is_guard_skips_tag, is_loss_scale_tag, role


def _scale_points(s: Series) -> tuple[IntArray, FloatArray]:
    """Steps ascending and their finite scale values."""
    order = np.argsort(s.steps, kind="stable")
    st, val = s.steps[order], s.values[order]
    keep = np.isfinite(val)
    return st[keep], val[keep]


def gradient_steps(run: Run) -> tuple[IntArray, IntArray]:
    """Steps at which a gradient tag (total or per layer) was logged, and those at which
    one of them was non-finite; both sorted and unique."""
    grads = [s for s in run.global_series if len(s) and role(s.tag).is_gradient]
    if not grads:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    logged = _sorted_unique(np.concatenate([s.steps for s in grads]))
    bad = _sorted_unique(np.concatenate([s.steps[~np.isfinite(s.values)] for s in grads]))
    return logged, bad


def _sorted_unique(x: IntArray) -> IntArray:
    # A stable sort is near linear on steps that are already ascending, as logged.
    x = np.sort(x, kind="stable")
    return x[np.concatenate(([True], x[1:] != x[:-1]))] if x.size else x


def _member(x: IntArray, sorted_unique: IntArray) -> npt.NDArray[np.bool_]:
    """``np.isin`` for a sorted, unique right-hand side: one binary search per element."""
    at = np.searchsorted(sorted_unique, x)
    inside = at < sorted_unique.size
    out = np.zeros(x.shape, dtype=bool)
    out[inside] = sorted_unique[at[inside]] == x[inside]
    return out


def _contradictions(curves: list[tuple[IntArray, FloatArray]], logged: IntArray,
                    bad: IntArray) -> tuple[int, int, int]:
    """Steps whose gradients contradict the before-update and the after-update reading,
    and how many pairs of consecutive steps had a gradient to check.

    A pair of points logged at consecutive steps (a, a+1) that drops says a was skipped
    (before) or a+1 was (after); one that does not drop says the same step was not. Only
    steps with a gradient logged can contradict; the last point's pair (before) and the
    first point's (after) were never logged. A scale logged every k steps (fairseq's
    ``--log-interval``) pins no skip to one step and decides nothing.
    """
    before = after = checked = 0
    for st, val in curves:
        a, b, drop = st[:-1], st[1:], val[1:] < val[:-1]
        a_seen, b_seen = _member(a, logged), _member(b, logged)
        pair = (b == a + 1) & (a_seen | b_seen)
        checked += int(pair.sum())
        before += int((pair & a_seen & (drop != _member(a, bad))).sum())
        after += int((pair & b_seen & (drop != _member(b, bad))).sum())
    return before, after, checked


def read_scale(run: Run) -> ScaleReading:
    """The steps a loss scaler skipped, and which logging convention found them."""
    # Only sources on the global step: an unaligned log's numbers are its own.
    logged_skips = {e.step for e in run.global_events
                    if e.kind == "overflow_skip" and e.step is not None}
    curves = [_scale_points(s) for s in run.global_series if is_loss_scale_tag(s.tag)]
    curves = [(st, val) for st, val in curves if st.size >= 2]
    guarded = guard_skips(run)
    if not curves:
        return ScaleReading(skips=frozenset(logged_skips), convention=None, guarded=guarded)
    logged, bad = gradient_steps(run)
    # Each drop between consecutive logged points: its earlier and its later step.
    drops = [(st[:-1][val[1:] < val[:-1]], st[1:][val[1:] < val[:-1]]) for st, val in curves]
    earlier = np.concatenate([d[0] for d in drops])
    later = np.concatenate([d[1] for d in drops])
    against_before, against_after, checked = _contradictions(curves, logged, bad)
    after = against_after < against_before
    convention: ScaleConvention = "after_update" if after else "before_update"
    agree = int(_member(later if after else earlier, bad).sum())
    inferred = against_after != against_before and \
        (agree > 0 or min(against_after, against_before) == 0)
    every = bool(checked) and not against_after and not against_before and \
        any(_member(st, bad).any() for st, _ in curves)
    marked = [earlier, later] if every else [later if after else earlier]
    sides = (True, False) if every else (after,) if inferred else ()
    edges = [e for st, _ in curves for e in (_edge_skip(st, bad, side) for side in sides)
             if e is not None]
    skips = set(logged_skips) | {int(x) for m in marked for x in np.unique(m)} | set(edges)
    return ScaleReading(skips=frozenset(skips), convention=convention,
                        inferred=inferred, drops=int(earlier.size), agree=agree,
                        against_before=against_before, against_after=against_after,
                        guarded=guarded)


def guard_skips(run: Run) -> frozenset[int]:
    """Steps whose update a guarded step refused, and that the run went on from: a step
    at which a ``guard/skipped_steps`` count grew, before the last step logged (by any
    source on the global step) without such a refusal."""
    counters = [s for s in run.global_series if is_guard_skips_tag(s.tag) and len(s)]
    if not counters:
        return frozenset()
    refused: set[int] = set()
    for s in counters:
        st, val = _scale_points(s)
        grew = val > np.concatenate(([0.0], val[:-1]))
        refused.update(int(x) for x in st[grew])
    if not refused:
        return frozenset()
    logged = _sorted_unique(np.concatenate([s.steps for s in run.global_series if len(s)]))
    went_on = logged[~_member(logged, np.array(sorted(refused), dtype=np.int64))]
    last = int(went_on[-1]) if went_on.size else None
    return frozenset(x for x in refused if last is not None and x < last)


def _edge_skip(st: IntArray, bad: IntArray, after: bool) -> int | None:
    """The skip whose halving falls outside the logged points: the first step's (after) or
    the last's (before), when it has non-finite gradients and the scale was logged at every
    step there."""
    i, j = (0, 1) if after else (-1, -2)
    edge = st[[i]]
    if abs(int(st[i]) - int(st[j])) != 1 or not _member(edge, bad)[0]:
        return None
    return int(st[i])
