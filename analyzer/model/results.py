"""A run and what the analysis found in it, and the versioned report of an analysis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analyzer.model.findings import CodeRefusal, Finding, Incident, SkippedRule
from analyzer.model.issues import IngestIssue
from analyzer.model.replays import ReplayResult
from analyzer.model.runs import Run

SCHEMA_VERSION = 2
"""Bumped whenever a field of the JSON report changes meaning or disappears. 2: a run's
``status`` may be ``unreadable``; every read issue, checkpoints' included, is
``{"kind", "message", "location": {"file", "offset", "line"}}``."""


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
