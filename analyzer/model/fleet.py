"""What a sweep summary says about many runs: how many failed, of what, when, and which
hyperparameters tell the failed runs from the healthy ones.

Built by :func:`analyzer.fleet.summary.summarize`; written as text by
:mod:`analyzer.report.summary`, as JSON through :func:`analyzer.model.jsonform.encode`, as
DataFrames by :func:`analyzer.frames.summary_frames`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

HyperValue = bool | int | float | str
"""A hyperparameter's value in a summary: plain values only."""

KeyKind = Literal["number", "category"]
SkipReason = Literal["constant", "identifier", "missing", "one_outcome", "too_few"]
"""Why a key was not tested: ``constant`` (one value in every run that has it),
``identifier`` (a different value in every run: a name, a path, a seed), ``missing`` (absent from
half the judged runs or more), ``one_outcome`` (present only in failed runs, or only in
healthy ones: a capture's meta, say), ``too_few`` (fewer than the minimum of either
outcome among the runs that have it)."""


@dataclass(frozen=True)
class RunRow:
    """One run of the sweep: its outcome, its top cause and first failing step, and its
    hyperparameters (flat keys)."""

    path: str
    name: str
    status: Literal["failed", "finite", "unreadable"]
    cause: str | None = None
    """The top cause's rule code; None when the run did not fail or no cause was named."""
    causes: tuple[str, ...] = ()
    """Every cause tied at the top, ``cause`` first: the run is one of each one's runs in
    the causes' counts (:class:`CauseCount`)."""
    first_step: int | None = None
    """The global step of the run's first non-finite value; None when the failure names no
    step, or only one of a source left off the global step (its own count, which no other
    run's steps compare with)."""
    hyperparameters: Mapping[str, HyperValue] = field(default_factory=dict)


@dataclass(frozen=True)
class CauseCount:
    """A root cause and the failed runs it explains: ``runs`` where it is the top finding,
    ``tied`` of them where another cause ties with it (those runs count for each)."""

    code: str | None
    """None for the failed runs where no cause was named."""
    name: str
    runs: int
    tied: int = 0


@dataclass(frozen=True)
class StepBin:
    """Failed runs whose first non-finite step is in ``[low, high]``."""

    low: int
    high: int
    runs: int


@dataclass(frozen=True)
class StepDistribution:
    """The first non-finite step of the failed runs that name one."""

    runs: int
    """Failed runs with a global step (:attr:`RunRow.first_step`)."""
    without_step: int = 0
    """Failed runs without one: a log line before any step, a source left unaligned."""
    minimum: int | None = None
    q1: float | None = None
    median: float | None = None
    q3: float | None = None
    maximum: int | None = None
    bins: tuple[StepBin, ...] = ()


@dataclass(frozen=True)
class Side:
    """One side of a split: the runs whose value is on it and how many of them failed.

    For a number, ``op`` is ``>=`` or ``<=`` and ``value`` the bound; for a category,
    ``==`` or ``!=`` (a key of two values names the other one: ``== true``)."""

    op: Literal[">=", "<=", "==", "!="]
    value: HyperValue
    runs: int
    failed: int


@dataclass(frozen=True)
class Separator:
    """A key tested for association with failure, its effect and its p-value.

    ``test``: ``mann-whitney`` (the failed runs' values against the healthy ones', two
    sided) or ``fisher`` (one value against the rest, two sided; the smallest p of the
    key's values, times the number of values tested). ``p_adjusted``: Holm's over every
    key tested. ``failing`` is the side most of whose runs failed, ``other`` the rest: for a
    number the cut that best separates the two outcomes (Youden's J)."""

    key: str
    kind: KeyKind
    test: Literal["mann-whitney", "fisher"]
    runs: int
    failed: int
    p_value: float
    p_adjusted: float
    significant: bool
    failing: Side
    other: Side


@dataclass(frozen=True)
class SkippedKey:
    """A key not tested, and why."""

    key: str
    reason: SkipReason
    runs: int
    """Judged runs that have the key."""


@dataclass(frozen=True)
class SweepSummary:
    """The sweep's runs, their outcomes and causes, and the keys that separate them.

    ``separators`` holds every key tested, the smallest adjusted p first; those under
    ``alpha`` are ``significant``, the others are listed as not significant. Runs that
    could not be read take part in the counts only."""

    runs: int
    failed: int
    finite: int
    unreadable: int
    causes: tuple[CauseCount, ...] = ()
    steps: StepDistribution = field(default_factory=lambda: StepDistribution(0))
    separators: tuple[Separator, ...] = ()
    skipped: tuple[SkippedKey, ...] = ()
    alpha: float = 0.01
    correction: Literal["holm"] = "holm"
    min_runs: int = 3
    """Runs of each outcome a key needs for its test."""
    rows: tuple[RunRow, ...] = ()
