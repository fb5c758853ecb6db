"""The records every part of the analyzer exchanges: the one contract between its stages.

This package imports nothing else of the project, so every stage, the dashboard and the
tests can depend on it. Its modules: ``issues`` (Location, IngestIssue and the typed issue
kinds), ``runs`` (what ingest reads: Series, Histogram, Event, LogSource, Run),
``checkpoints`` (the checkpoint scan's records), ``captures`` (a capture's checked
meta.json), ``replays`` (the replay's records), ``scaling`` (how a loss-scale series was read),
``findings`` (Incident, Evidence, Finding, SkippedRule, CodeRefusal), ``results``
(RunResult, Report and the report's schema version), ``fleet`` (the sweep summary of
many runs: SweepSummary and its parts) and ``jsonform`` (``encode``: records
as JSON).

All records are frozen dataclasses. Arrays inside them are numpy arrays that are
treated as read-only; a record never changes after it is built.

    Location        where something is in a file: a byte offset or a 1-based line
    Series          one scalar tag over steps, from one source file
    Histogram       one histogram tag over steps: min, max, sum, count per step
    Event           something that happened at a step: a restart, an overflow skip, ...
    IngestIssue     damage met while reading: the file, the offset or line, a typed kind
    Run             everything read from one run folder
    CaptureMeta     a flight-recorder capture's meta.json, its keys' types checked
    Incident        the first non-finite value of a tag (or of the whole run)
    Evidence        a fact a finding rests on, with its location
    Finding         a ranked root cause (or symptom) with its evidence and fix
    CodeRefusal     a replay not run: it would import code nobody trusted
    RunResult       a run plus what the analysis found in it
    Report          the versioned result of one analysis
"""

from __future__ import annotations

from analyzer.model.captures import (
    CAPTURE_DTYPES,
    CAPTURE_MODES,
    STEP_KINDS,
    Accumulation,
    AmpSettings,
    CaptureDtype,
    CaptureMeta,
    CaptureMode,
    CaptureTrigger,
    FactorySpec,
    OptimizerSpec,
    StepKind,
    StepSpec,
)
from analyzer.model.checkpoints import (
    FP16_MAX,
    AdamFinding,
    CheckpointFormat,
    CheckpointHistory,
    CheckpointScan,
    LayerGrowth,
    LayerStats,
    ReadMode,
    SaveRef,
    ScalerState,
    StaticListing,
    TensorGroup,
    TensorRecord,
    TensorStats,
)
from analyzer.model.findings import (
    CONFIDENCE_ORDER,
    CodeRefusal,
    Confidence,
    Evidence,
    Finding,
    FindingRole,
    Incident,
    SkippedRule,
    top_tie,
)
from analyzer.model.issues import (
    IngestIssue,
    IssueKind,
    Location,
)
from analyzer.model.jsonform import (
    encode,
)
from analyzer.model.metadata import (
    SETTING_NAMES,
    MetadataFile,
    MetadataKind,
    MetaValue,
    ReadStatus,
    RunMetadata,
    Setting,
)
from analyzer.model.replays import (
    LOSS_NAME,
    PHASES,
    REPLAY_SCHEMA_VERSION,
    ROOT_NAME,
    BackwardReport,
    ForwardReport,
    ModuleFrame,
    OpFault,
    ParamGrad,
    ParamUpdate,
    PassOutcome,
    Phase,
    ReplayResult,
    Role,
    TensorStat,
    UpdateReport,
    Verdict,
    VerdictKind,
    param_module,
)
from analyzer.model.results import (
    SCHEMA_VERSION,
    Report,
    RunResult,
    RunStatus,
)
from analyzer.model.runs import (
    GLOBAL,
    AlignConfidence,
    Alignment,
    AxisKind,
    Event,
    EventKind,
    FloatArray,
    Histogram,
    IntArray,
    LogSource,
    NonFiniteKind,
    PositionUnit,
    Run,
    Series,
    StepAxis,
    nonfinite_kind,
)
from analyzer.model.scaling import ScaleConvention, ScaleReading

__all__ = [
    "CAPTURE_DTYPES",
    "CAPTURE_MODES",
    "CONFIDENCE_ORDER",
    "FP16_MAX",
    "GLOBAL",
    "LOSS_NAME",
    "PHASES",
    "REPLAY_SCHEMA_VERSION",
    "ROOT_NAME",
    "SCHEMA_VERSION",
    "SETTING_NAMES",
    "STEP_KINDS",
    "Accumulation",
    "AdamFinding",
    "AlignConfidence",
    "Alignment",
    "AmpSettings",
    "AxisKind",
    "BackwardReport",
    "CaptureDtype",
    "CaptureMeta",
    "CaptureMode",
    "CaptureTrigger",
    "CheckpointFormat",
    "CheckpointHistory",
    "CheckpointScan",
    "CodeRefusal",
    "Confidence",
    "Event",
    "EventKind",
    "Evidence",
    "FactorySpec",
    "Finding",
    "FindingRole",
    "FloatArray",
    "ForwardReport",
    "Histogram",
    "Incident",
    "IngestIssue",
    "IntArray",
    "IssueKind",
    "LayerGrowth",
    "LayerStats",
    "Location",
    "LogSource",
    "MetaValue",
    "MetadataFile",
    "MetadataKind",
    "ModuleFrame",
    "NonFiniteKind",
    "OpFault",
    "OptimizerSpec",
    "ParamGrad",
    "ParamUpdate",
    "PassOutcome",
    "Phase",
    "PositionUnit",
    "ReadMode",
    "ReadStatus",
    "ReplayResult",
    "Report",
    "Role",
    "Run",
    "RunMetadata",
    "RunResult",
    "RunStatus",
    "SaveRef",
    "ScaleConvention",
    "ScaleReading",
    "ScalerState",
    "Series",
    "Setting",
    "SkippedRule",
    "StaticListing",
    "StepAxis",
    "StepKind",
    "StepSpec",
    "TensorGroup",
    "TensorRecord",
    "TensorStat",
    "TensorStats",
    "UpdateReport",
    "Verdict",
    "VerdictKind",
    "encode",
    "nonfinite_kind",
    "param_module",
    "top_tie",
]
