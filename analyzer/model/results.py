"""A run and what the analysis found in it, and the versioned report of an analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from analyzer.model.findings import CodeRefusal, Finding, Incident, SkippedRule
from analyzer.model.fleet import SweepSummary
from analyzer.model.issues import IngestIssue
from analyzer.model.jsonform import json_meta
from analyzer.model.replays import ReplayResult
from analyzer.model.runs import Run
from analyzer.model.scaling import ScaleReading

SCHEMA_VERSION = 4
"""Bumped whenever a field of the JSON report changes meaning or disappears (the schema is
:mod:`analyzer.model.schema`'s, written down in docs/report.schema.json). 2: a run's
``status`` may be ``unreadable``; every read issue, checkpoints' included, is
``{"kind", "message", "location": {"file", "offset", "line"}}``. 3: a read issue is listed
once, in its run's ``issues`` (no more ``issues`` under ``checkpoints`` and its ``scans``);
a run's ``replay`` no longer repeats the standalone replay document's ``schema`` and
``schema_version``. 4: a replay pass's ``fingerprint`` is null where no other pass of the
replay is compared with it bit for bit (every pass of a default replay)."""


RunStatus = Literal["failed", "finite", "unreadable"]

PlaceKind = Literal["layer", "loss_function", "optimizer_update", "input_data", "undetermined"]
Phase = Literal["forward", "backward", "update", "input"]


@dataclass(frozen=True)
class PlaceReading:
    """Where the run's first non-finite value was made, read from what the run logged (no
    replay): a layer, the loss function, the optimizer update, the input data, or
    ``undetermined`` between the ``candidates`` when the data cannot break their tie."""

    kind: PlaceKind
    layer: str | None = None
    candidates: tuple[str, ...] = ()
    """The places that fit equally (layers, ``loss function``) when ``kind`` is
    ``undetermined``; else empty."""
    phase: Phase | None = None
    """Which part of the step the logged values point to, from what was finite at the
    first non-finite step; None when they do not say."""
    step: int | None = None
    decided_by: str = ""
    evidence: tuple[str, ...] = ()
    would_decide: tuple[str, ...] = ()
    """What the run would have to leave for the tie to be broken."""


@dataclass(frozen=True)
class RunResult:
    """One run and what the analysis found in it."""

    run: Run = field(metadata=json_meta(inline=True))
    """Written inline: a run's JSON object holds the run's fields and the analysis's."""
    incident: Incident | None
    tag_incidents: tuple[Incident, ...] = ()
    layer_incident: Incident | None = None
    place: PlaceReading | None = None
    """The failing place read post hoc (the locate stage's); a replay, when it names one,
    is the stronger witness (:func:`analyzer.wording.failing_place`)."""
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
    scale: ScaleReading | None = field(default=None, metadata=json_meta(omit=True))
    """How the loss-scale series was read to find ``overflow_skips`` (the locate stage's;
    the rules state it); None where no locate stage read it."""

    JSON_EXTRA = ("status",)

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

    schema_version: int = field(default=SCHEMA_VERSION, kw_only=True)
    tool_version: str = field(default="", kw_only=True)
    results: tuple[RunResult, ...] = field(metadata=json_meta(key="runs"))
    issues: tuple[IngestIssue, ...] = ()
    """What the search for runs passed over outside every run (a symlinked folder, a folder
    too deep or that cannot be listed)."""
    summary: SweepSummary | None = None
    """The sweep summary of the runs (:func:`analyzer.fleet.summary.summarize`), when it
    was asked for (``forensics analyze --summary``); None otherwise."""

    JSON_EXTRA = ("failed",)

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.results)

    @property
    def readable(self) -> bool:
        """False when no run held anything readable: nothing was checked."""
        return any(r.status != "unreadable" for r in self.results)
