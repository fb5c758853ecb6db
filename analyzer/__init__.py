"""NaN Forensics: find when, where and why a PyTorch training run went NaN or Inf.

The public API is what this module exports; everything else is private to the package.
Names are imported on first use, so that ``import analyzer`` (and the command line's
start-up) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "analyze": "analyzer.api",
    "incidents": "analyzer.api",
    "read": "analyzer.api",
    "scalars": "analyzer.api",
    "tool_version": "analyzer.api",
    "ForensicsError": "analyzer.errors",
    "ReadError": "analyzer.errors",
    "UsageError": "analyzer.errors",
    "EventFile": "analyzer.ingest.tb",
    "RunFiles": "analyzer.ingest.discover",
    "find_runs": "analyzer.ingest.discover",
    "read_event_file": "analyzer.ingest.tb",
    "layer_from_tag": "analyzer.onset",
    "locate": "analyzer.onset",
    "SCHEMA_VERSION": "analyzer.model",
    "Event": "analyzer.model",
    "Histogram": "analyzer.model",
    "Incident": "analyzer.model",
    "IngestIssue": "analyzer.model",
    "Location": "analyzer.model",
    "Report": "analyzer.model",
    "Run": "analyzer.model",
    "RunResult": "analyzer.model",
    "Series": "analyzer.model",
}

__all__ = [
    "SCHEMA_VERSION",
    "Event",
    "EventFile",
    "ForensicsError",
    "Histogram",
    "Incident",
    "IngestIssue",
    "Location",
    "ReadError",
    "Report",
    "Run",
    "RunFiles",
    "RunResult",
    "Series",
    "UsageError",
    "analyze",
    "find_runs",
    "incidents",
    "layer_from_tag",
    "locate",
    "read",
    "read_event_file",
    "scalars",
    "tool_version",
]

if TYPE_CHECKING:
    from analyzer.api import analyze, incidents, read, scalars, tool_version
    from analyzer.errors import ForensicsError, ReadError, UsageError
    from analyzer.ingest.discover import RunFiles, find_runs
    from analyzer.ingest.tb import EventFile, read_event_file
    from analyzer.model import (
        SCHEMA_VERSION,
        Event,
        Histogram,
        Incident,
        IngestIssue,
        Location,
        Report,
        Run,
        RunResult,
        Series,
    )
    from analyzer.onset import layer_from_tag, locate


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
