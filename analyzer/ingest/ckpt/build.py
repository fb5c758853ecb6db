"""Turning an unpickled (or statically described) tree into a :class:`CheckpointScan`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from analyzer.ingest.ckpt.leaves import Leaf
from analyzer.ingest.ckpt.optimizer import scan_optimizer
from analyzer.ingest.ckpt.stats import StatsAccumulator, aggregate_layers
from analyzer.ingest.ckpt.tree import (
    OPTIMIZER_KEYS,
    STEP_KEYS,
    LeafSource,
    find_parts,
    find_scaler,
    step_from_name,
    walk,
)
from analyzer.model import IngestIssue
from analyzer.model.checkpoints import (
    AdamFinding,
    CheckpointFormat,
    CheckpointScan,
    ReadMode,
    ScalerState,
    StaticListing,
    TensorGroup,
    TensorRecord,
)


@dataclass
class Draft:
    """What the reading stage hands to :func:`assemble`."""

    path: str
    size: int
    read_mode: ReadMode
    format: CheckpointFormat | None = None
    issues: list[IngestIssue] = field(default_factory=list)
    static: StaticListing | None = None
    files: tuple[str, ...] = ()


def record(name: str, group: TensorGroup, leaf: Leaf) -> TensorRecord:
    """A tensor's record, its stats computed chunk by chunk where its values can be read."""
    if not leaf.numeric or leaf.chunks is None:
        return TensorRecord(name, leaf.shape, leaf.dtype, group, None, leaf.note)
    acc = StatsAccumulator()
    try:
        for chunk in leaf.chunks():
            acc.add(chunk)
    except (RuntimeError, TypeError, ValueError, OSError) as exc:
        return TensorRecord(name, leaf.shape, leaf.dtype, group, None, f"not scanned: {exc}")
    expected = 1
    for dim in leaf.shape:
        expected *= dim
    if leaf.dtype.startswith("complex"):
        expected *= 2
    note = None
    if acc.numel < expected:
        note = f"only {acc.numel} of {expected} values present in the file"
    return TensorRecord(name, leaf.shape, leaf.dtype, group, acc.result(), note)


def _scalar(value: object, leaves: LeafSource) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    leaf = leaves.leaf(value)
    if leaf is None or leaf.chunks is None or leaf.shape not in ((), (1,)):
        return None
    try:
        for chunk in leaf.chunks():
            return float(chunk.reshape(-1)[0])
    except (RuntimeError, TypeError, ValueError, OSError):
        return None
    return None


def _int(value: float | None) -> int | None:
    return int(value) if value is not None and value == value and abs(value) < 2**62 else None


def _scaler(root: object, leaves: LeafSource) -> ScalerState | None:
    found = find_scaler(root)
    if found is None:
        return None
    key, state = found
    return ScalerState(
        key=key,
        scale=_scalar(state.get("scale"), leaves),
        growth_tracker=_int(_scalar(state.get("_growth_tracker"), leaves)),
        growth_factor=_scalar(state.get("growth_factor"), leaves),
        backoff_factor=_scalar(state.get("backoff_factor"), leaves),
        growth_interval=_int(_scalar(state.get("growth_interval"), leaves)),
    )


def _step(root: object, leaves: LeafSource, path: str) -> tuple[int | None, str | None]:
    if isinstance(root, Mapping):
        for key in STEP_KEYS:
            value = _int(_scalar(root.get(key), leaves)) if key in root else None
            if value is not None:
                return value, f"'{key}' key"
    from_name = step_from_name(path)
    if from_name is not None:
        return from_name, "file name"
    return None, None


def assemble(root: object, leaves: LeafSource, draft: Draft) -> CheckpointScan:
    parts = find_parts(root, draft.path, leaves)
    records = [record(name, "model", leaf) for name, leaf in walk(parts.model, "", leaves)]
    model_records = list(records)
    findings: list[AdamFinding] = []
    for key, state in parts.optimizers:
        more, adam = scan_optimizer(key, state, leaves, model_records, record)
        records.extend(more)
        findings.extend(adam)
    if isinstance(root, Mapping) and parts.model is not root and parts.format != "optimizer":
        skip = {parts.model_key, *OPTIMIZER_KEYS}
        for key, value in root.items():
            if str(key) not in skip:
                records.extend(
                    record(name, "other", leaf) for name, leaf in walk(value, str(key), leaves)
                )
    step, source = _step(root, leaves, draft.path)
    return CheckpointScan(
        path=draft.path,
        size=draft.size,
        format=draft.format or parts.format,
        read_mode=draft.read_mode,
        step=step,
        step_source=source,
        tensors=tuple(records),
        layers=aggregate_layers(records),
        adam=tuple(findings),
        scaler=_scaler(root, leaves),
        static=draft.static,
        files=draft.files or (draft.path,),
        issues=tuple(draft.issues),
    )
