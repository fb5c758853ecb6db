"""NaN Forensics: find when, where and why a PyTorch training run went NaN or Inf.

The public API is what this module exports; everything else is private to the package,
except the records of :mod:`analyzer.model`, which also holds the parts of the records
below (a replay's passes and ops, a checkpoint scan's tensors and layers) for annotations.

    analyze(paths) -> Report            read, locate, replay and rank the causes
    read(paths) -> [Run]                the runs below ``paths``, read
    iter_analyze(paths), iter_runs(paths)  the same one run at a time, for fleets
    summary(report) -> {name: DataFrame}  the sweep summary: causes, steps, separating keys
    locate(run) -> RunResult            a run's first non-finite values
    scalars(paths), incidents(report)   the same as long pandas DataFrames
    find_runs(paths) -> [RunFiles]      the run folders and their files, nothing read
    read_event_file(path) -> EventFile  one TensorBoard event file
    scan_checkpoint(path) -> CheckpointScan, scan_run_checkpoints(paths) -> CheckpointHistory
    FlightRecorder(...)                 in a training loop: capture the first bad step
    load_capture(path), replay(path) -> ReplayResult, replay_step(...)
    explain(code) -> str | None         a rule's documentation (``forensics explain``)

Names are imported on first use, so that ``import analyzer`` (and the command line's
start-up) stays cheap: neither torch nor streamlit is imported until a call needs it. No
submodule of this package is named like one of these names, since importing a submodule
binds its name on the package and would hide the function (a test checks this).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "analyze": "analyzer.api",
    "incidents": "analyzer.api",
    "iter_analyze": "analyzer.api",
    "iter_runs": "analyzer.api",
    "read": "analyzer.api",
    "scalars": "analyzer.api",
    "summary": "analyzer.api",
    "tool_version": "analyzer.api",
    "FlightRecorder": "analyzer.capture.recorder",
    "CaptureError": "analyzer.replayer.errors",
    "ForensicsError": "analyzer.errors",
    "ModelRebuildError": "analyzer.replayer.errors",
    "ReadError": "analyzer.errors",
    "ReplayError": "analyzer.replayer.errors",
    "UsageError": "analyzer.errors",
    "scan_checkpoint": "analyzer.ingest.checkpoints",
    "scan_run_checkpoints": "analyzer.ingest.checkpoints",
    "EventFile": "analyzer.ingest.tb",
    "RunFiles": "analyzer.ingest.discover",
    "find_runs": "analyzer.ingest.discover",
    "read_event_file": "analyzer.ingest.tb",
    "layer_from_tag": "analyzer.tags",
    "locate": "analyzer.onset",
    "SCHEMA_VERSION": "analyzer.model",
    "CaptureMeta": "analyzer.model",
    "CheckpointHistory": "analyzer.model",
    "CheckpointScan": "analyzer.model",
    "CodeRefusal": "analyzer.model",
    "Event": "analyzer.model",
    "Evidence": "analyzer.model",
    "Finding": "analyzer.model",
    "Histogram": "analyzer.model",
    "Incident": "analyzer.model",
    "IngestIssue": "analyzer.model",
    "Location": "analyzer.model",
    "LogSource": "analyzer.model",
    "ReplayResult": "analyzer.model",
    "Report": "analyzer.model",
    "Run": "analyzer.model",
    "RunResult": "analyzer.model",
    "Series": "analyzer.model",
    "SkippedRule": "analyzer.model",
    "load_capture": "analyzer.replayer",
    "replay": "analyzer.replayer",
    "replay_step": "analyzer.replayer",
    "explain": "analyzer.rules",
}

__all__ = [
    "SCHEMA_VERSION",
    "CaptureError",
    "CaptureMeta",
    "CheckpointHistory",
    "CheckpointScan",
    "CodeRefusal",
    "Event",
    "EventFile",
    "Evidence",
    "Finding",
    "FlightRecorder",
    "ForensicsError",
    "Histogram",
    "Incident",
    "IngestIssue",
    "Location",
    "LogSource",
    "ModelRebuildError",
    "ReadError",
    "ReplayError",
    "ReplayResult",
    "Report",
    "Run",
    "RunFiles",
    "RunResult",
    "Series",
    "SkippedRule",
    "UsageError",
    "analyze",
    "explain",
    "find_runs",
    "incidents",
    "iter_analyze",
    "iter_runs",
    "layer_from_tag",
    "load_capture",
    "locate",
    "read",
    "read_event_file",
    "replay",
    "replay_step",
    "scalars",
    "scan_checkpoint",
    "scan_run_checkpoints",
    "summary",
    "tool_version",
]

if TYPE_CHECKING:
    from analyzer.api import (
        analyze,
        incidents,
        iter_analyze,
        iter_runs,
        read,
        scalars,
        summary,
        tool_version,
    )
    from analyzer.capture.recorder import FlightRecorder
    from analyzer.errors import ForensicsError, ReadError, UsageError
    from analyzer.ingest.checkpoints import scan_checkpoint, scan_run_checkpoints
    from analyzer.ingest.discover import RunFiles, find_runs
    from analyzer.ingest.tb import EventFile, read_event_file
    from analyzer.model import (
        SCHEMA_VERSION,
        CaptureMeta,
        CheckpointHistory,
        CheckpointScan,
        CodeRefusal,
        Event,
        Evidence,
        Finding,
        Histogram,
        Incident,
        IngestIssue,
        Location,
        LogSource,
        ReplayResult,
        Report,
        Run,
        RunResult,
        Series,
        SkippedRule,
    )
    from analyzer.onset import locate
    from analyzer.replayer import load_capture, replay, replay_step
    from analyzer.replayer.errors import CaptureError, ModelRebuildError, ReplayError
    from analyzer.rules import explain
    from analyzer.tags import layer_from_tag


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
