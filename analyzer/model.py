"""The records every part of the analyzer exchanges.

All records are frozen dataclasses. Arrays inside them are numpy arrays that are
treated as read-only; a record never changes after it is built.

    Location        where something is in a file: a byte offset or a 1-based line
    Series          one scalar tag over steps, from one source file
    Histogram       one histogram tag over steps: min, max, sum, count per step
    Event           something that happened at a step: a restart, an overflow skip, ...
    IngestIssue     damage met while reading: the file, the offset or line, a typed kind
    Run             everything read from one run folder
    Incident        the first non-finite value of a tag (or of the whole run)
    Evidence        a fact a finding rests on, with its location
    Finding         a ranked root cause (or symptom) with its evidence and fix
    CodeRefusal     a replay not run: it would import code nobody trusted
    RunResult       a run plus what the analysis found in it
    Report          the versioned result of one analysis
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from analyzer.ingest.ckpt.records import CheckpointHistory
    from analyzer.replayer.records import ReplayResult

SCHEMA_VERSION = 2
"""Bumped whenever a field of the JSON report changes meaning or disappears. 2: a run's
``status`` may be ``unreadable``; every read issue, checkpoints' included, is
``{"kind", "message", "location": {"file", "offset", "line"}}``."""

NonFiniteKind = Literal["nan", "+inf", "-inf", "nan-or-inf"]
"""``nan-or-inf`` is for sources that say only "NaN or Inf" (some frameworks' messages)."""
PositionUnit = Literal["offset", "line"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def json_safe(value: Any) -> Any:
    """A value made of dicts, lists and numbers, ready for strict JSON: NaN and the
    infinities (which JSON lacks) become the strings "nan", "inf" and "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def nonfinite_kind(value: float) -> NonFiniteKind | None:
    """Classify a number: None when finite, else 'nan', '+inf' or '-inf'."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return None


@dataclass(frozen=True)
class Location:
    """A place in a file: a byte offset for binary files, a 1-based line for text."""

    file: str
    offset: int | None = None
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The one JSON shape of a location, wherever a report holds one."""
        return {"file": self.file, "offset": self.offset, "line": self.line}

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.offset is not None:
            return f"{self.file}@{self.offset}"
        return self.file


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


@dataclass(frozen=True)
class Event:
    """Something that happened at a step, as opposed to a number logged at it.

    Kinds in use: ``restart`` (a new file_version record, a new event file, or a
    step going backwards), ``nonfinite`` (a log line that reports a NaN or Inf without a
    number to plot; detail ``tag`` and ``kind``), ``overflow_skip`` (a mixed-precision
    step skipped for overflow), ``loss_scale`` (the loss scale changed),
    ``min_loss_scale`` (the scaler reached its floor), ``error`` (an error the run
    printed, e.g. ``FloatingPointError``). A log event without a step of its own carries
    ``detail["after_step"]``, the last step the log numbered before it.
    """

    kind: str
    step: int | None
    location: Location
    message: str
    detail: Mapping[str, object] = field(default_factory=dict)


IssueKind = Literal[
    "empty_file",
    "not_event_file",
    "truncated",
    "zero_tail",
    "zero_run",
    "bad_length_crc",
    "bad_payload_crc",
    "absurd_length",
    "not_an_event",
    "unreadable",
    "bad_line",
    "long_line",
    "not_text",
    "bad_json",
    "bad_step",
    "unsafe_checkpoint",
    "bad_checkpoint",
    "not_regular",
    "read_limit",
    "too_large",
    "bad_record",
    "not_followed",
    "too_deep",
]
"""Each kind has one written policy, in the docstring of the module that reports it.
``not_regular`` (a FIFO, device or socket: refused before opening), ``read_limit`` (a read
stopped at its byte or time budget; what came before is kept), ``too_large`` (refused by a
size limit before anything was allocated), ``bad_record`` (a record framed intact whose
contents are malformed: skipped), ``not_followed`` (a symlinked folder, not walked) and
``too_deep`` (a folder below the walk's depth limit, not walked) are shared by readers."""


@dataclass(frozen=True)
class IngestIssue:
    """Damage met while reading. Reading goes on; the issue says what was lost."""

    location: Location
    kind: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The one JSON shape of a read issue, wherever a report holds one."""
        return {"kind": self.kind, "message": self.message, "location": self.location.to_dict()}

    def __str__(self) -> str:
        return f"{self.location}: {self.kind}: {self.message}"


@dataclass(frozen=True)
class LogSource:
    """A text log of a run: the framework it looks like, and remarks for the report."""

    path: str
    framework: str | None
    confidence: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    """Everything read from one run folder."""

    path: str
    name: str
    files: tuple[str, ...]
    series: tuple[Series, ...] = ()
    histograms: tuple[Histogram, ...] = ()
    events: tuple[Event, ...] = ()
    issues: tuple[IngestIssue, ...] = ()
    logs: tuple[LogSource, ...] = ()
    checkpoints: CheckpointHistory | None = None
    captures: tuple[str, ...] = ()
    """Capture folders of the flight recorder (``capture/step_N``), earliest step first."""

    def tags(self) -> list[str]:
        return sorted({s.tag for s in self.series})

    @property
    def readable(self) -> bool:
        """Whether anything could be read at all: a value, an event or a checkpoint tensor.
        A run of empty, unreadable or foreign files is not (a capture counts only once it
        has been replayed: see :attr:`RunResult.status`)."""
        if self.series or self.histograms or self.events:
            return True
        return self.checkpoints is not None and any(
            t.stats is not None for scan in self.checkpoints.scans for t in scan.tensors)


@dataclass(frozen=True)
class Incident:
    """The first non-finite value of a tag, or of the whole run.

    ``last_finite_step`` is the last step before ``step`` at which the same tag was
    finite (None when it never was). ``decided_by`` says which rule picked this
    incident among others at the same step, for the run-level incident.
    """

    step: int | None
    """None only for a log line that reports a NaN/Inf before the log numbered any step
    (an autograd anomaly error at the first backward, say)."""
    tag: str
    kind: NonFiniteKind
    last_finite_step: int | None
    location: Location
    layer: str | None = None
    decided_by: str | None = None
    origin: str = "scalar"
    """Where the value was seen: ``scalar``, ``histogram``, ``log`` or ``checkpoint``."""
    rank: int | None = None
    """The data-parallel rank whose log line it was, for rank-prefixed logs."""
    after: bool = False
    """True when the source names no step and ``step`` is the last step logged before it:
    the value went non-finite at some later step, not at ``step``."""

    @property
    def earliest_step(self) -> int | None:
        """The first step that can hold the failure: ``step``, or the one after it for a
        line placed after a step; None when unknown."""
        if self.step is None:
            return None
        return self.step + 1 if self.after else self.step


def step_words(step: int | None, after: bool = False) -> str:
    """A failure's step in words: ``step 12``, ``after step 12`` or ``no step``."""
    if step is None:
        return "no step"
    return f"after step {step}" if after else f"step {step}"


Confidence = Literal["low", "medium", "high"]
CONFIDENCE_ORDER: dict[str, int] = {"low": 0, "medium": 1, "high": 2}


@dataclass(frozen=True)
class Evidence:
    """One fact a finding rests on, and where it was seen."""

    text: str
    location: Location | None = None
    step: int | None = None
    subject: str | None = None
    """The tensor, parameter, module or tag the fact is about."""


@dataclass(frozen=True)
class Finding:
    """A root cause (or a symptom of one) that a rule found in a run.

    ``role`` is ``cause`` for a root cause, ``symptom`` for a mechanism that a cause
    explains (exploding gradients, loss spikes) and ``warning`` for a risk in a run that
    did not fail. ``rank_note`` says, for every finding but the first, why it ranked lower.
    """

    code: str
    name: str
    title: str
    confidence: Confidence
    role: str
    evidence: tuple[Evidence, ...]
    fix: str
    score: float = 0.0
    rank_note: str | None = None

    @property
    def is_failure(self) -> bool:
        return self.role in ("cause", "symptom")


@dataclass(frozen=True)
class SkippedRule:
    """A rule that could not run on a run, and the evidence it lacked."""

    code: str
    name: str
    reason: str


@dataclass(frozen=True)
class CodeRefusal:
    """A replay not run because it would import code nobody trusted (:mod:`analyzer.trust`).

    ``folder`` is where the code would come from and ``command`` the one that trusts it;
    both None when no trust allows the name (the standard library, say)."""

    target: str
    message: str
    folder: str | None = None
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "message": self.message, "folder": self.folder,
                "command": self.command}


RunStatus = Literal["failed", "finite", "unreadable"]


@dataclass(frozen=True)
class RunResult:
    """One run and what the analysis found in it."""

    run: Run
    incident: Incident | None
    tag_incidents: tuple[Incident, ...] = ()
    layer_incident: Incident | None = None
    overflow_skips: tuple[int, ...] = ()
    """Steps a dynamic loss scaler skipped; their non-finite gradients are not incidents."""
    findings: tuple[Finding, ...] = ()
    """Ranked: the most likely root cause first."""
    skipped_rules: tuple[SkippedRule, ...] = ()
    replay: ReplayResult | None = None
    replay_error: str | None = None
    """Why the capture could not be replayed, when it could not."""
    replay_refused: CodeRefusal | None = None
    """Why the capture was not replayed: it would import code that is not trusted."""

    @property
    def failed(self) -> bool:
        return self.incident is not None

    @property
    def status(self) -> RunStatus:
        """``failed`` (a non-finite value), ``finite``, or ``unreadable`` (nothing read)."""
        if self.failed:
            return "failed"
        return "finite" if self.run.readable or self.replay is not None else "unreadable"


@dataclass(frozen=True)
class Report:
    """The result of analysing one or more run folders."""

    results: tuple[RunResult, ...]
    schema_version: int = SCHEMA_VERSION
    tool_version: str = ""
    issues: tuple[IngestIssue, ...] = ()
    """What the search for runs passed over outside every run (a symlinked folder, a folder
    too deep or that cannot be listed)."""

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.results)

    @property
    def readable(self) -> bool:
        """False when no run held anything readable: nothing was checked."""
        return any(r.status != "unreadable" for r in self.results)
