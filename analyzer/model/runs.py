"""What is read from a run folder: series, histograms, events, logs, the run itself."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from analyzer.model.captures import CaptureMeta
from analyzer.model.issues import IngestIssue, Location
from analyzer.model.jsonform import json_meta
from analyzer.model.metadata import RunMetadata

if TYPE_CHECKING:
    from analyzer.model.checkpoints import CheckpointHistory

NonFiniteKind = Literal["nan", "+inf", "-inf", "nan-or-inf"]
"""``nan-or-inf`` is for sources that say only "NaN or Inf" (some frameworks' messages)."""
PositionUnit = Literal["offset", "line"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def nonfinite_kind(value: float) -> NonFiniteKind | None:
    """Classify a number: None when finite, else 'nan', '+inf' or '-inf'."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return None


AxisKind = Literal["global", "counter", "record", "epoch"]


@dataclass(frozen=True)
class StepAxis:
    """Which numbering a source's steps are on.

    ``global``: the run's optimizer step, as its event files (or ``trainer_state.json``'s
    ``step``, or a log line that names the step) count it. ``counter``: a framework's own
    iteration counter, from ``base`` (nanoGPT's ``iter`` from 0, Megatron's ``iteration``
    from 1); ``counts_skipped`` says whether steps a loss scaler skipped are counted.
    ``record``: the record's position in its file (1, 2, ...), for logs that print no step
    (the Hugging Face Trainer's dict lines without a progress bar). ``epoch``: a batch index
    within its epoch, not yet placed on a global count. ``label`` is the source's own word
    for the number (``iter``, ``iteration``, ``record``).
    """

    kind: AxisKind = "global"
    base: int = 0
    counts_skipped: bool = True
    label: str = "step"


GLOBAL = StepAxis()
"""The run's global step: what event files count."""

AlignConfidence = Literal["exact", "inferred", "unaligned"]


@dataclass(frozen=True)
class Alignment:
    """How one source's steps were placed on the run's global step: ``global = (offset +
    stride * own) // divisor``; ``divisor`` above 1 for a log that counts batches of a run
    that accumulates ``divisor`` of them per optimizer step.

    ``exact``: by the source's own numbers (a global step, or a counter whose relation to
    the global step is known); ``inferred``: by matching values it shares with the run's
    global series (``agreement`` of ``points`` compared); ``unaligned``: no method placed
    it, and its steps are never ordered against global steps.
    """

    source: str
    axis: StepAxis
    confidence: AlignConfidence
    method: str
    offset: int = 0
    stride: int = 1
    agreement: float | None = None
    points: int = 0
    divisor: int = 1

    @property
    def aligned(self) -> bool:
        return self.confidence != "unaligned"

    def to_global(self, step: int) -> int:
        return (self.offset + self.stride * step) // self.divisor

    def to_own(self, step: int) -> int | None:
        """The source's own number for a global ``step`` (the first, where several batches
        make one step), or None where none maps to it."""
        own, rest = divmod(step * self.divisor - self.offset, self.stride)
        return None if rest else own


@dataclass(frozen=True, eq=False)
class Series:
    """One scalar tag of one source file, in the order the file holds it.

    ``positions[i]`` is where point ``i`` was read: the byte offset of its record
    (``position_unit == "offset"``) or its line number (``"line"``). Steps are not
    deduplicated or sorted: a restarted run logs the same steps twice, and that is
    evidence too.
    """

    tag: str
    steps: IntArray
    values: FloatArray
    wall_times: FloatArray
    source: str
    positions: IntArray
    position_unit: PositionUnit = "offset"
    rank: int | None = None
    axis: StepAxis = GLOBAL
    """The numbering ``steps`` are on; after alignment, the global step for every aligned
    source (its own numbers are the alignment's ``to_own``)."""

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def location(self, index: int) -> Location:
        pos = int(self.positions[index])
        if self.position_unit == "line":
            return Location(self.source, line=pos)
        return Location(self.source, offset=pos)


@dataclass(frozen=True, eq=False)
class Histogram:
    """A histogram tag: per step the summary numbers of the distribution."""

    tag: str
    steps: IntArray
    wall_times: FloatArray
    mins: FloatArray
    maxs: FloatArray
    sums: FloatArray
    counts: FloatArray
    sum_squares: FloatArray
    source: str
    positions: IntArray

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def nonfinite_mask(self) -> npt.NDArray[np.bool_]:
        """True where the logged distribution held a NaN or Inf.

        A histogram of a tensor with NaN or Inf has a non-finite min, max or sum.
        """
        stats = np.stack([self.mins, self.maxs, self.sums, self.sum_squares])
        return np.asarray(~np.isfinite(stats).all(axis=0), dtype=bool)

    def location(self, index: int) -> Location:
        return Location(self.source, offset=int(self.positions[index]))


EventKind = Literal["restart", "nonfinite", "overflow_skip", "loss_scale", "min_loss_scale",
                    "error", "checkpoint_save", "model_description"]


@dataclass(frozen=True)
class Event:
    """Something that happened at a step, as opposed to a number logged at it.

    Kinds in use: ``restart`` (a new file_version record, a new event file, or a
    step going backwards), ``nonfinite`` (a log line that reports a NaN or Inf without a
    number to plot; detail ``tag`` and ``kind``), ``overflow_skip`` (a mixed-precision
    step skipped for overflow), ``loss_scale`` (the loss scale changed),
    ``min_loss_scale`` (the scaler reached its floor), ``error`` (an error the run
    printed, e.g. ``FloatingPointError``), ``checkpoint_save`` (a save the log announced,
    detail ``global_step``: the Hugging Face Trainer's ``checkpoint-N``),
    ``model_description`` (a model summary or printed module the log holds, detail
    ``modules``: see :mod:`analyzer.ingest.logformats.model_print`). A log event
    without a step of its own carries
    ``detail["after_step"]``, the last step the log numbered before it.
    """

    kind: EventKind
    step: int | None
    location: Location
    message: str
    detail: Mapping[str, object] = field(default_factory=dict)
    axis: StepAxis = field(default=GLOBAL, metadata=json_meta(omit=True))
    """The numbering ``step`` and ``after_step`` are on (see :attr:`Series.axis`): the
    axis of the parser whose numbers they are, not always the file's other lines'."""


EpochUnit = Literal["batch", "optimizer_step"]


@dataclass(frozen=True)
class EpochLength:
    """The length of an epoch as a log printed it: ``length`` in ``unit`` (a Lightning bar's
    total counts batches, the Trainer's header optimizer steps: with gradient accumulation
    the two differ by its factor), where it was read (``line`` of the log) and in what
    words (``how``)."""

    length: int
    unit: EpochUnit
    line: int
    how: str


@dataclass(frozen=True)
class LogSource:
    """A text log of a run: the framework it looks like, and remarks for the report."""

    path: str
    framework: str | None
    confidence: float
    notes: tuple[str, ...] = ()
    epoch_length: EpochLength | None = field(default=None, metadata=json_meta(omit=True))
    """The steps per epoch the log printed, where it printed one length only."""


FileRole = Literal["events", "log", "checkpoint", "metadata", "capture", "env", "listed"]
"""``listed``: a file of the training that is not read (an earlier save's trainer_state.json,
whose history the latest one holds)."""


@dataclass(frozen=True)
class RunSegment:
    """A folder a framework made for one part of a training: one per restart, in the order
    they were written (Lightning's ``version_N``, a Trainer's ``runs/<date>_<host>``,
    torchrun's ``attempt_N``), or written beside the others (``parallel``: Keras'
    ``train/`` and ``validation/``, one folder per rank). ``label``: relative to the run."""

    folder: str
    label: str
    parallel: bool = False


@dataclass(frozen=True)
class RunFile:
    """One file of a run (a capture: its step folder) and what the analysis reads it as;
    ``segment`` indexes the run's segments (None: outside every segment)."""

    path: str
    role: FileRole
    segment: int | None = None


@dataclass(frozen=True)
class RunLayout:
    """How discovery made one training into a run: its root folder, the framework layouts
    recognised (``lightning``, ``huggingface``, ``accelerate``, ``keras``, ``torchrun``,
    ``ranks``, ``tensorboard``; ``run-root`` for a folder named with ``--run-root``), its
    segments, and its files by role."""

    root: str
    layouts: tuple[str, ...] = ()
    segments: tuple[RunSegment, ...] = ()
    files: tuple[RunFile, ...] = ()


@dataclass(frozen=True)
class PointCounts:
    """What a slim run (:meth:`Run.slim`) keeps of its dropped series and histograms: the
    points of each tag, scalar and histogram apart, in the order the run held them (a
    scalar tag whose series are all empty is kept with 0 points)."""

    scalars: tuple[tuple[str, int], ...] = ()
    histograms: tuple[tuple[str, int], ...] = ()


def _counted(items: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for tag, points in items:
        counts[tag] = counts.get(tag, 0) + points
    return tuple(counts.items())


@dataclass(frozen=True)
class Run:
    """Everything read from one run folder."""

    path: str
    name: str
    files: tuple[str, ...]
    series: tuple[Series, ...] = field(default=(), metadata=json_meta(omit=True))
    """Summarised in the JSON report as ``tags``: points per tag."""
    histograms: tuple[Histogram, ...] = field(default=(), metadata=json_meta(omit=True))
    events: tuple[Event, ...] = ()
    issues: tuple[IngestIssue, ...] = ()
    """Every read issue of the run, its checkpoints' included: the JSON report lists them
    here only, once each."""
    logs: tuple[LogSource, ...] = ()
    checkpoints: CheckpointHistory | None = field(
        default=None, metadata=json_meta(drop=("issues",)))
    captures: tuple[str, ...] = ()
    """Capture folders of the flight recorder (``capture/step_N``), earliest step first."""
    capture_metas: tuple[CaptureMeta, ...] = field(default=(), metadata=json_meta(omit=True))
    alignments: tuple[Alignment, ...] = ()
    """How each source that is not an event file was placed on the global step (the
    ``align`` stage), one per step axis its lines are on (a file may mix parsers that
    count differently), the one with the most points first; a source without one is on
    the global step by its own numbers."""
    """The checked meta.json of each capture whose file could be taken, in that order."""
    env: Mapping[str, Any] | None = field(default=None, metadata=json_meta(omit=True))
    """The run's env.json, or else the environment its earliest capture recorded (what
    the rules compare with healthy runs beside it)."""
    metadata: RunMetadata | None = field(default=None, metadata=json_meta(drop=("issues",)))
    """The framework metadata files read (hparams.yaml, training_args.bin, ...) and the
    training settings resolved from them; None when the run has none."""
    layout: RunLayout | None = None
    """The run's folders and files by role, as discovery grouped them."""
    dropped: PointCounts | None = field(default=None, metadata=json_meta(omit=True))
    """Set on a slim run (:meth:`slim`): the per-tag points of the series and histograms
    it no longer holds, which :attr:`tag_points`, :meth:`tags`, :attr:`scalar_points` and
    :attr:`readable` answer from."""

    JSON_EXTRA = (("tags", "tag_points"),)

    def alignment_of(self, source: str, axis: StepAxis | None = None) -> Alignment | None:
        """How ``source``'s steps on ``axis`` were placed; without an axis, the source's
        first alignment (that of the numbering with the most points)."""
        return next((a for a in self.alignments if a.source == source
                     and (axis is None or a.axis == axis)), None)

    def is_aligned(self, source: str, axis: StepAxis | None = None) -> bool:
        """Whether ``source``'s steps on ``axis`` are on the global step (event files always
        are; an aligned source's series and events are on :data:`GLOBAL` after the align
        stage); without an axis, whether all of them are."""
        if axis is None:
            return all(a.aligned for a in self.alignments if a.source == source)
        found = self.alignment_of(source, axis)
        return found is None or found.aligned

    @cached_property
    def _one_numbering(self) -> frozenset[tuple[str, StepAxis]] | None:
        """The (source, axis) numberings whose steps may be compared with each other: those
        on the global step; when none is (a run of unaligned logs alone), the one with the
        most points, which is then the run's only numbering. None when every source is on
        it. Computed once per run: the rules ask for the run's global series and events
        many times."""
        if not any(not a.aligned for a in self.alignments):
            return None
        # An event on no step at all (a model printed before the first record) is on no
        # numbering: it must not make its axis look placed.
        placed = {(s.source, s.axis) for s in self.series if self.is_aligned(s.source, s.axis)
                  } | {(e.location.file, e.axis) for e in self.events
                       if (e.step is not None or "after_step" in e.detail)
                       and self.is_aligned(e.location.file, e.axis)}
        if placed:
            return frozenset(placed)
        points: dict[tuple[str, StepAxis], int] = {}
        for s in self.series:
            points[(s.source, s.axis)] = points.get((s.source, s.axis), 0) + len(s)
        for e in self.events:
            points.setdefault((e.location.file, e.axis), 0)
        return frozenset([max(points, key=lambda k: (points[k], k[0], k[1].label))]
                         ) if points else None

    @cached_property
    def global_series(self) -> tuple[Series, ...]:
        """The series on one numbering, the global step: what may be compared with each
        other (a source left unaligned counts in its own numbers)."""
        keep = self._one_numbering
        return self.series if keep is None else tuple(s for s in self.series
                                                        if (s.source, s.axis) in keep)

    @cached_property
    def global_events(self) -> tuple[Event, ...]:
        keep = self._one_numbering
        return self.events if keep is None else tuple(e for e in self.events
                                                        if (e.location.file, e.axis) in keep)

    def slim(self) -> Run:
        """The run without its series and histograms, their per-tag points kept: what an
        analysis holds of a run once its rules have read it (a fleet's memory is then
        bounded by its largest run, not the sum). Slimming twice changes nothing."""
        if self.dropped is not None:
            return self
        counts = PointCounts(_counted([(s.tag, len(s)) for s in self.series]),
                             _counted([(h.tag, len(h)) for h in self.histograms]))
        return replace(self, series=(), histograms=(), dropped=counts)

    def tags(self) -> list[str]:
        """The scalar tags, sorted."""
        if self.dropped is not None:
            return sorted(tag for tag, _ in self.dropped.scalars)
        return sorted({s.tag for s in self.series})

    @property
    def scalar_points(self) -> int:
        """Points over every scalar series (histograms not counted)."""
        if self.dropped is not None:
            return sum(points for _, points in self.dropped.scalars)
        return sum(len(s) for s in self.series)

    @property
    def tag_points(self) -> dict[str, int]:
        """Points per tag over every series and histogram of it: a restarted writer,
        several ranks or a tag in both a log and an event file each add their points."""
        if self.dropped is not None:
            pairs = [*self.dropped.scalars, *self.dropped.histograms]
        else:
            pairs = [(s.tag, len(s)) for s in self.series] + \
                [(h.tag, len(h)) for h in self.histograms]
        return dict(_counted(pairs))

    @property
    def readable(self) -> bool:
        """Whether anything could be read at all: a value, an event or a checkpoint tensor.
        A run of empty, unreadable or foreign files is not (a capture counts only once it
        has been replayed: see :attr:`RunResult.status`)."""
        if self.series or self.histograms or self.events:
            return True
        if self.dropped is not None and (self.dropped.scalars or self.dropped.histograms):
            return True
        return self.checkpoints is not None and any(
            t.stats is not None for scan in self.checkpoints.scans for t in scan.tensors)
