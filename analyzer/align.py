"""The align stage: every source's steps placed on the run's global step.

Event files count the run's global step; a text log may count something else: its records
(the Hugging Face Trainer's dict lines print no step), a framework's counter from 0 or 1, or
the same global step shifted. Each source that is not an event file gets an
:class:`Alignment` that says how its numbers map to the global step (``global = offset +
stride * own``), by which method and how sure it is:

1. **its own numbers** (``exact``): a source whose numbers are global steps by what it says
   (a log line naming the step, ``trainer_state.json``'s ``step``), or a framework's
   counter (Megatron's ``iteration`` and mmengine's ``iter`` from 1, nanoGPT's ``iter``
   from 0, Lightning's and Keras' bar counts from 1), checked against the event files
   where both hold one metric: numbers that disagree with the values give way to the
   values. A counter from 1 is placed at ``counter - 1`` (the step a 0-based writer logs
   at) or, where the values say so, at the counter itself (the frameworks' own TensorBoard
   logging writes at it: Megatron, mmengine); unchecked, ``counter - base`` stands, and
   in a run without event files the counter as printed;
2. **value matching** (``inferred``): where the source and the event files hold one metric
   (the loss, the gradient norm, the learning rate, printed rounded), the offset and stride
   that make their values agree, with the share that agrees and how many were compared; a
   match that two placements fit as well (a constant learning rate) decides nothing;
3. **the checkpoints it saved** (``inferred``): a log that announces its saves (the
   Trainer's "Saving model checkpoint to .../checkpoint-N", right after logging step N)
   pairs the record before each save with global step N; two saves that one offset and
   stride fit place it, where no value placed it;
4. otherwise ``unaligned``: the source's steps stay its own, and the locator never orders
   them against global steps.

The Trainer's ``trainer_state.json`` counts the global step as event files do and serves
as they do. A run with neither has no global series to match against: its sources keep
their own numbers, and records are placed only by the checkpoints they announce. Aligned
sources have their series' and events' steps rewritten onto the global step; the
alignment keeps the way back.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from analyzer.curves import last_per_step, most_points, training
from analyzer.ingest.tb import is_event_file
from analyzer.model import GLOBAL, Alignment, Event, Run, Series, StepAxis
from analyzer.tags import TagRole

MATCHED_ROLES = (TagRole.LOSS, TagRole.GRAD_NORM, TagRole.LEARNING_RATE)
"""The metrics a log and an event file both print, most telling first."""
AGREEMENT = 0.9
"""Share of compared values that must agree for a placement to be taken."""
MIN_POINTS = 3
"""Values that must be compared for a placement to be taken."""
RTOL = 1e-5
"""Beside half a unit of the last decimal a log printed (:func:`printed_atol`: ``0.6931``
for 0.693147...), the relative difference that still agrees: an event file holds float32."""
_STRIDES = 8
_OFFSETS = 32
_TRIED = 64
"""The source's first finite values looked up in the reference, to start candidates from."""
_RIVAL_MARGIN = 0.05
_RIVAL_SHARE = 0.5
"""A placement agreeing within _RIVAL_MARGIN of the best over at least this share of its
points makes the match undecided."""
_SAMPLE = 2048
"""Points of a source each candidate placement is scored on first."""
_RESCORED = 4

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


_OWNERS = {"megatron": "Megatron's", "mmengine": "mmengine's", "lightning": "Lightning's",
           "tqdm": "the tqdm bar's", "keras": "Keras'", "nanogpt": "nanoGPT's",
           "transformers": "the Trainer's", "deepspeed": "DeepSpeed's",
           "fairseq": "fairseq's", "detectron2": "detectron2's", "timm": "timm's"}
"""How the report names a framework whose numbers placed a source."""
_COUNTERS = {"megatron": "iteration", "mmengine": "iter", "nanogpt": "iter",
             "lightning": "batch", "tqdm": "batch", "keras": "batch", "deepspeed": "step",
             "fairseq": "num_updates", "detectron2": "iter", "timm": "update"}
"""The counter each framework prints: in a log of two (``transformers+deepspeed``), which
of them a block's counter is."""


def align(run: Run) -> Run:
    """``run`` with every non-event-file source placed on the global step: each of its
    numberings apart (a file may hold the Trainer's dict lines, numbered by their order,
    and DeepSpeed's ``step=N`` lines, on the global step), each by its own numbers."""
    keys = {(s.source, s.axis) for s in run.series if not is_event_file(s.source)} | {
        (e.location.file, e.axis) for e in run.events
        if e.step is not None and not is_event_file(e.location.file)}
    if not keys:
        return run
    points: dict[tuple[str, StepAxis], int] = {}
    for s in run.series:
        points[(s.source, s.axis)] = points.get((s.source, s.axis), 0) + len(s)
    # Steps a line named as global steps (a stop message) in a file that numbers its
    # other lines otherwise need no placing of their own: they stay where they are.
    numbered = {source for source, axis in keys if axis != GLOBAL}
    keys = {(source, axis) for source, axis in keys
            if axis != GLOBAL or (source, axis) in points or source not in numbered}
    reference = [s for s in run.series if is_reference(s.source)]
    frameworks = {log.path: log.framework for log in run.logs}
    accumulation = _accumulation(run)
    found: list[Alignment] = []
    # A source's numberings in the order of their points, most first: the report's first
    # line for a file is about most of its lines.
    for source, axis in sorted(keys, key=lambda k: (k[0], -points.get(k, 0), k[1].label)):
        mine = [s for s in run.series if s.source == source and s.axis == axis]
        others = [s for s in reference if s.source != source]
        placed = place(source, axis, mine, others, framework=frameworks.get(source))
        if placed.aligned and placed.agreement is None and others:
            placed = by_batches(placed, mine, others, accumulation) or placed
        if not placed.aligned:
            saves = [e for e in run.events if e.location.file == source
                     and e.axis == axis and e.kind == "checkpoint_save"]
            placed = by_saves(placed, saves) or placed
        found.append(placed)
    by_key = {(a.source, a.axis): a for a in found}
    series = tuple(_moved(s, by_key.get((s.source, s.axis))) for s in run.series)
    events = tuple(_moved_event(e, by_key.get((e.location.file, e.axis))) for e in run.events)
    return replace(run, series=series, events=events, alignments=tuple(found))


TRAINER_STATE = "trainer_state.json"


def is_reference(source: str) -> bool:
    """Whether a source counts the run's global step by what it is: an event file, or the
    Hugging Face Trainer's ``trainer_state.json`` (its ``log_history[].step`` is the
    Trainer's ``global_step``), which places the Trainer's console log where the run
    wrote no event file."""
    return is_event_file(source) or os.path.basename(source) == TRAINER_STATE


def reference_words(reference: Sequence[Series]) -> str:
    """How the method names the series a source was placed against."""
    if any(is_event_file(s.source) for s in reference):
        return "the event files"
    return "trainer_state.json"


def place(source: str, axis: StepAxis, mine: Sequence[Series],
          reference: Sequence[Series], *, framework: str | None = None) -> Alignment:
    """The alignment of one source whose series are ``mine``, against the global series
    ``reference`` (the run's event files and trainer_state.json); ``framework`` (the
    log's, when known) names the numbers in the method."""
    numbered = axis.kind in ("global", "counter")
    theirs = reference_words(reference)
    offsets = own_offsets(axis)
    words = own_words(axis, framework)
    own = Alignment(source, axis, "exact", words, offset=offsets[0])
    if not reference:
        if numbered:  # nothing counts the run's steps but the source: its numbers stand
            return replace(own, offset=0) if len(offsets) == 1 else replace(
                own, offset=0, method=f"{words}, as printed: no event file to count from")
        return Alignment(source, axis, "unaligned", f"no event file to place its {axis.label}s")
    matched = _match(mine, reference, offsets)
    if matched is None or isinstance(matched, str):
        if numbered:
            return own
        why = (f"the values it shares with {theirs} fit several placements of its "
               f"{axis.label}s" if matched == AMBIGUOUS else
               f"no value it shares with {theirs} placed its {axis.label}s")
        return Alignment(source, axis, "unaligned", why)
    tag, ref_tag, off, stride, agree, points, at_own = matched
    if numbered:
        checked = _own_checked(offsets, at_own, (off, stride), (agree, points))
        if checked is not None:
            at, agreement, compared = checked
            counted = "" if at == offsets[0] else f", as {theirs} count it"
            return replace(own, offset=at, agreement=agreement, points=compared,
                           method=f"{words}{counted}, which {tag} agrees with {ref_tag} on")
    return Alignment(source, axis, "inferred",
                     f"matching {tag} with " + (f"the event files' {ref_tag}"
                                                if theirs == "the event files"
                                                else f"{ref_tag} in {theirs}"), offset=off,
                     stride=stride, agreement=agree, points=points)


DIVISORS = (2, 4, 8, 16, 3, 5, 6, 10, 12, 32)
"""Batches per optimizer step tried where the run's metadata names none."""


def _accumulation(run: Run) -> tuple[tuple[int, ...], str | None]:
    """The batches per optimizer step to try, and where they were read: the run's
    ``gradient_accumulation_steps`` (``accumulate_grad_batches``) when its metadata gives
    one above 1, else the usual factors, for the values to decide."""
    metadata = getattr(run, "metadata", None)
    setting = None if metadata is None else metadata.setting("gradient_accumulation_steps")
    k = None if metadata is None else metadata.gradient_accumulation_steps
    if isinstance(k, int) and k > 1 and setting is not None:
        where = os.path.basename(setting.source)
        return (k,), f"{setting.key} = {k} in {where}"
    return _saved_accumulation(run) or (DIVISORS, None)


_BATCHES_DONE = "fit_loop.epoch_loop.batch_progress.total.completed"
"""Lightning's count of training batches completed, in a checkpoint's loop state."""


def _saved_accumulation(run: Run) -> tuple[tuple[int, ...], str] | None:
    """Batches per optimizer step from a Lightning checkpoint: the batches its fit loop
    had completed over its ``global_step`` (optimizer steps), where they divide."""
    scans = run.checkpoints.scans if run.checkpoints is not None else ()
    for scan in scans:
        meta = getattr(scan, "meta", None)
        if meta is None or not meta.global_step:
            continue
        done = next((v for key, v in meta.counters.items() if key.endswith(_BATCHES_DONE)),
                    None)
        if done is None:
            continue
        k, rest = divmod(done, meta.global_step)
        if k > 1 and not rest:
            return (k,), (f"{done} batches over global_step {meta.global_step} in "
                          f"{os.path.basename(scan.path)}")
    return None


def by_batches(own: Alignment, mine: Sequence[Series], reference: Sequence[Series],
               accumulation: tuple[tuple[int, ...], str | None]) -> Alignment | None:
    """A counter of batches placed on optimizer steps: with gradient accumulation the run
    steps its optimizer once every ``k`` batches, and the event files log the step's value
    once (the last batch's), so ``step = (counter - base) // k``. Tried on a source whose
    own numbers the values could not check; taken where the values agree."""
    if own.axis.kind != "counter":
        return None
    divisors, said = accumulation
    for wanted in MATCHED_ROLES:
        src, ref = _curve(mine, wanted), _curve(reference, wanted)
        if src is None or ref is None:
            continue
        atol = printed_atol(src[2])
        fits = [(got[0], got[1], offset, k) for k in divisors for offset in own_offsets(own.axis)
                if (got := _agreement_by(src[1], src[2], ref[1], ref[2], offset, k, atol))
                is not None and got[0] >= AGREEMENT]
        if len(fits) != 1:
            continue  # none, or values that several factors fit alike (a constant rate)
        ((agreement, compared, offset, k),) = fits
        source = said or f"{k} batches per step, found by the values"
        return replace(own, offset=offset, divisor=k, agreement=agreement, points=compared,
                       method=f"{own.method}, {k} batches per optimizer step ({source}), "
                              f"which {src[0]} agrees with {ref[0]} on")
    return None


def _agreement_by(steps: IntArray, values: FloatArray, ref_steps: IntArray,
                  ref_values: FloatArray, offset: int, k: int, atol: float
                  ) -> tuple[float, int] | None:
    """:func:`agreement_at` of the batches ``steps`` mapped to ``(offset + step) // k``,
    each optimizer step's last batch compared (what its writer logged)."""
    mapped = (offset + steps) // k
    last = np.ones(mapped.shape, dtype=bool)
    last[:-1] = mapped[1:] != mapped[:-1]
    if int(last.sum()) * 4 > mapped.size * 3:
        return None  # about one batch per step: not accumulation
    return agreement_at(mapped[last], values[last], ref_steps, ref_values, 0, 1, atol)


def by_saves(unplaced: Alignment, saves: Sequence[Event]) -> Alignment | None:
    """A source placed by the checkpoints it announced saving (the Trainer saves
    ``checkpoint-N`` right after logging step N): each save pairs the record before it with
    global step N; two saves or more that one offset and stride fit place the records."""
    # Lightning saves after the batch whose values its loggers wrote one step lower
    # (``last_logged_step``); the Trainer's checkpoint-N right after logging step N.
    pairs = sorted({(after, step) for e in saves
                    if isinstance(after := e.detail.get("after_step"), int)
                    and isinstance(step := e.detail.get("last_logged_step",
                                                        e.detail.get("global_step")), int)})
    if len(pairs) < 2:
        return None
    (own_a, glob_a), (own_b, glob_b) = pairs[0], pairs[-1]
    if own_b == own_a:
        return None
    stride, rest = divmod(glob_b - glob_a, own_b - own_a)
    offset = glob_a - stride * own_a
    if rest or stride < 1 or any(offset + stride * own != glob for own, glob in pairs):
        return None
    label = unplaced.axis.label
    lightning = any("last_logged_step" in e.detail for e in saves)
    shown = ", ".join((f"global step {glob + 1} after {label} {own}" if lightning else
                       f"checkpoint-{glob} after {label} {own}") for own, glob in pairs[:3])
    more = f" and {len(pairs) - 3} more" if len(pairs) > 3 else ""
    return Alignment(unplaced.source, unplaced.axis, "inferred",
                     f"the checkpoints it saved ({shown}{more})", offset=offset,
                     stride=stride, points=len(pairs))


def own_offsets(axis: StepAxis) -> tuple[int, ...]:
    """The offsets a source's own numbers may be placed at, the one taken unchecked first.

    A global step is itself. A counter from ``base`` is ``counter - base`` on a writer that
    counts from 0 (a script's SummaryWriter at its loop index; Lightning's loggers at
    ``global_step``), or the counter itself on one that writes at the framework's number
    (Megatron's TensorBoard at ``iteration``, mmengine's visualizer at ``iter + 1``)."""
    if axis.kind != "counter" or not axis.base:
        return (0,)
    return (-axis.base, 0)


def own_words(axis: StepAxis, framework: str | None) -> str:
    """The method's words for a source's own numbers: ``Megatron's iteration counter (from
    1)``, ``the Trainer's global_step``, ``its own step numbers``."""
    parts = (framework or "").split("+")
    if len(parts) > 1:
        parts = [p for p in parts if _COUNTERS.get(p) == axis.label] or parts
    owner = _OWNERS.get(parts[0])
    if axis.kind == "counter":
        return f"{owner or 'its own'} {axis.label} counter (from {axis.base})"
    if owner is None or axis.label == "step":
        return f"its own {axis.label} numbers"
    return f"{owner} {axis.label}"


def _own_checked(offsets: tuple[int, ...], at_own: Sequence[tuple[float, int] | None],
                 placed: tuple[int, int], best: tuple[float, int]
                 ) -> tuple[int, float, int] | None:
    """The own offset the values agree with, as (offset, agreement, compared): the one
    agreeing best, the first on a tie; else the value match's own placement when it is
    one of them; None when the values place the source elsewhere."""
    good = [(got[0], -i, offsets[i], got[1]) for i, got in enumerate(at_own)
            if got is not None and got[0] >= AGREEMENT]
    if good:
        agreement, _, at, compared = max(good)
        return at, agreement, compared
    off, stride = placed
    if stride == 1 and off in offsets:
        return off, best[0], best[1]
    return None


def _match(mine: Sequence[Series], reference: Sequence[Series], own: tuple[int, ...]
           ) -> tuple[str, str, int, int, float, int, list[tuple[float, int] | None]] | str | None:
    """The first metric whose values place ``mine`` unambiguously: (its tag, the reference
    tag, offset, stride, agreement, points compared, and (agreement, compared) at each of
    the ``own`` offsets with stride 1); AMBIGUOUS when some metric fit several placements
    and none placed it; None when none fit."""
    undecided = False
    for wanted in MATCHED_ROLES:
        src = _curve(mine, wanted)
        ref = _curve(reference, wanted)
        if src is None or ref is None:
            continue
        placed = best_placement(src[1], src[2], ref[1], ref[2])
        if placed is None or placed == AMBIGUOUS:
            undecided = undecided or placed == AMBIGUOUS
            continue
        assert not isinstance(placed, str)
        off, stride, agree, points = placed
        atol = printed_atol(src[2])
        at_own = [agreement_at(src[1], src[2], ref[1], ref[2], at, 1, atol) for at in own]
        return src[0], ref[0], off, stride, agree, points, at_own
    return AMBIGUOUS if undecided else None


def _curve(series: Sequence[Series], wanted: TagRole
           ) -> tuple[str, IntArray, FloatArray] | None:
    """The training series of one role with the most points, as (tag, steps, values), the
    last value kept where a step repeats (as the rules take their curves)."""
    pick = most_points(training(series, wanted))
    if not pick:
        return None
    return (pick[0].tag, *last_per_step(pick))


def _close(a: FloatArray, b: FloatArray, atol: float = 0.0) -> npt.NDArray[np.bool_]:
    """``a`` (a log's values, printed with ``atol`` of rounding) agrees with ``b``."""
    same_nonfinite = (~np.isfinite(a)) & (~np.isfinite(b)) & (
        np.isnan(a) & np.isnan(b) | (a == b))
    with np.errstate(invalid="ignore"):
        near = np.abs(a - b) <= atol * 1.01 + RTOL * np.abs(b) + 1e-12
    return np.asarray(near | same_nonfinite, dtype=bool)


def agreement_at(steps: IntArray, values: FloatArray, ref_steps: IntArray,
                 ref_values: FloatArray, offset: int, stride: int, atol: float = 0.0
                 ) -> tuple[float, int] | None:
    """(share of agreeing values, values compared) when ``steps`` map to ``offset + stride *
    step``; None when fewer than MIN_POINTS map onto a reference step. Pairs where neither
    value is finite are not compared: a run's NaN tail agrees with any placement that
    overlaps it, whatever came before."""
    mapped = offset + stride * steps
    at = np.searchsorted(ref_steps, mapped)
    inside = at < ref_steps.size
    hit = np.zeros(mapped.shape, dtype=bool)
    hit[inside] = ref_steps[at[inside]] == mapped[inside]
    hit[hit] = np.isfinite(values[hit]) | np.isfinite(ref_values[at[hit]])
    compared = int(hit.sum())
    if compared < min(MIN_POINTS, steps.size) or compared < 2:
        return None
    agree = _close(values[hit], ref_values[at[hit]], atol)
    return float(agree.mean()), compared


AMBIGUOUS = "ambiguous"
"""What :func:`best_placement` says when two placements fit the values as well."""


def best_placement(steps: IntArray, values: FloatArray, ref_steps: IntArray,
                   ref_values: FloatArray) -> tuple[int, int, float, int] | str | None:
    """The (offset, stride, agreement, compared) that makes ``values`` agree best with the
    reference; AMBIGUOUS when another placement fits about as well over about as many
    points (a constant or slowly moving value fits many); None when none fits."""
    atol = printed_atol(values)
    hits = _hits(values, ref_steps, ref_values, atol)
    # Candidates are scored on a sample of the source's points (its head and points spread
    # over the rest), the best few again on all of them: a log of millions of lines costs
    # a few passes, not one per candidate.
    sample = _sample(steps.size)
    some_steps, some_values = steps[sample], values[sample]
    scored: list[tuple[float, int, int, int]] = []
    for stride in _strides(steps, ref_steps, hits):
        for offset in _offsets(steps, hits, stride):
            got = agreement_at(some_steps, some_values, ref_steps, ref_values, offset, stride,
                               atol)
            if got is not None and got[0] >= AGREEMENT:
                scored.append((got[0], got[1], offset, stride))
    if sample.size < steps.size:
        scored.sort(key=lambda s: (-s[0], -s[1], s[3], abs(s[2])))
        scored = [(*got, offset, stride) for _, _, offset, stride in scored[:_RESCORED]
                  if (got := agreement_at(steps, values, ref_steps, ref_values, offset,
                                          stride, atol)) is not None and got[0] >= AGREEMENT]
    if not scored:
        return None
    scored.sort(key=lambda s: (-s[0], -s[1], s[3], abs(s[2])))
    agree, compared, offset, stride = scored[0]
    # A rival need not overlap the reference on as many points: a log that overlaps a cut
    # event file less at the right offset than at a wrong one must not lose to it.
    rivals = [s for s in scored[1:] if s[0] >= agree - _RIVAL_MARGIN
              and s[1] >= max(MIN_POINTS, compared * _RIVAL_SHARE)]
    if rivals:
        return AMBIGUOUS
    return offset, stride, agree, compared


def printed_atol(values: FloatArray) -> float:
    """Half a unit of the last decimal the source printed its values with (``0.6931``:
    5e-5), found from the values themselves; 0 when they carry more than 8 decimals."""
    finite = values[np.isfinite(values)][:256]
    if not finite.size:
        return 0.0
    for places in range(9):
        scaled = finite * 10.0**places
        if np.all(np.abs(scaled - np.round(scaled)) <= 1e-6 * np.maximum(1.0, np.abs(scaled))):
            return 0.5 * 10.0**-places
    return 0.0


def _sample(n: int) -> IntArray:
    """Indices of at most _SAMPLE points: the first half of them, the rest spread evenly."""
    if n <= _SAMPLE:
        return np.arange(n, dtype=np.int64)
    head = np.arange(_SAMPLE // 2, dtype=np.int64)
    spread = np.linspace(_SAMPLE // 2, n - 1, _SAMPLE // 2).astype(np.int64)
    return np.unique(np.concatenate([head, spread]))


def _hits(values: FloatArray, ref_steps: IntArray, ref_values: FloatArray, atol: float
          ) -> list[tuple[int, IntArray]]:
    """For the most telling of the source's first finite values (those the reference holds
    at the fewest steps, so that a log starting late is matched where it starts): (its
    index, the reference steps holding the same value), in the source's order."""
    found = []
    # What _close says of one finite value against every reference value, in three
    # passes over the reference with its tolerance worked out once (_close on a full
    # array of the value made a dozen, for each value tried).
    with np.errstate(invalid="ignore"):
        tol = atol * 1.01 + RTOL * np.abs(ref_values) + 1e-12
    gap = np.empty_like(ref_values)
    near = np.empty(ref_values.shape, dtype=bool)
    for i in np.flatnonzero(np.isfinite(values))[:_TRIED]:
        with np.errstate(invalid="ignore"):
            np.subtract(values[i], ref_values, out=gap)
            np.abs(gap, out=gap)
            np.less_equal(gap, tol, out=near)
        same = ref_steps[near]
        if same.size:
            found.append((same.size, int(i), same[:_OFFSETS * 8]))
    found.sort()
    return sorted((i, at) for _, i, at in found[:4])


def _strides(steps: IntArray, ref_steps: IntArray, hits: list[tuple[int, IntArray]]
             ) -> list[int]:
    """1, the reference's usual spacings, and the spacings that carry two of the source's
    first finite values onto reference steps holding the same values."""
    out = {1}
    gaps = np.diff(ref_steps[:256])
    out.update(int(g) for g in np.unique(gaps[gaps > 0])[:_STRIDES])
    for (a, at_a), (b, at_b) in itertools.pairwise(hits):
        apart = int(steps[b] - steps[a])
        if apart <= 0:
            continue
        for sa in at_a:
            for sb in at_b:
                stride, rest = divmod(int(sb - sa), apart)
                if stride >= 1 and not rest:
                    out.add(stride)
    return sorted(out)[: _STRIDES * 4]


def _offsets(steps: IntArray, hits: list[tuple[int, IntArray]], stride: int) -> list[int]:
    """Offsets that put one of the source's first finite values on a reference step holding
    the same value."""
    out = {int(at - stride * steps[i]) for i, found in hits[:3] for at in found}
    return sorted(out)[: _OFFSETS * 3]


def _moved(series: Series, alignment: Alignment | None) -> Series:
    if alignment is None or not alignment.aligned:
        return series
    if (alignment.offset, alignment.stride, alignment.divisor) == (0, 1, 1):
        return replace(series, axis=GLOBAL) if series.axis != GLOBAL else series
    steps = (alignment.offset + alignment.stride * series.steps) // alignment.divisor
    return replace(series, steps=steps.astype(np.int64), axis=GLOBAL)


def _moved_event(event: Event, alignment: Alignment | None) -> Event:
    """``event`` on the global step."""
    if alignment is None or not alignment.aligned:
        return event
    if (alignment.offset, alignment.stride, alignment.divisor) == (0, 1, 1):
        return replace(event, axis=GLOBAL) if event.axis != GLOBAL else event
    detail = dict(event.detail)
    after = detail.get("after_step")
    if isinstance(after, int):
        detail["after_step"] = alignment.to_global(after)
    step = None if event.step is None else alignment.to_global(event.step)
    return replace(event, step=step, detail=detail, axis=GLOBAL)
