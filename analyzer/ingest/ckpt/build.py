"""Turning an unpickled (or statically described) tree into a :class:`CheckpointScan`.

Every tensor gets a role (:data:`analyzer.model.checkpoints.TensorRole`): the model's are
weights, an optimizer's its state, and each other top-level section the role its key has
(:mod:`roles`). Only weights, optimizer state, the scaler and sections no framework names
are evidence; the rest is the trainer's bookkeeping, reported in ``scan.meta``
(:mod:`meta`) and never a non-finite finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from analyzer.ingest.ckpt.leaves import Leaf
from analyzer.ingest.ckpt.meta import as_int, read_meta, scalar
from analyzer.ingest.ckpt.optimizer import scan_optimizer
from analyzer.ingest.ckpt.roles import is_zero_shard, section_role
from analyzer.ingest.ckpt.stats import StatsAccumulator, aggregate_layers
from analyzer.ingest.ckpt.tree import (
    OPTIMIZER_KEYS,
    STEP_KEYS,
    LeafSource,
    Parts,
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
    TensorRole,
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


def record(
    name: str, group: TensorGroup, leaf: Leaf, role: TensorRole | None = None
) -> TensorRecord:
    """A tensor's record, its stats computed chunk by chunk where its values can be read.
    ``role`` defaults to the group's (model tensors are weights)."""
    role = role or _GROUP_ROLES[group]
    if not leaf.numeric or leaf.chunks is None:
        return TensorRecord(name, leaf.shape, leaf.dtype, group, None, leaf.note, role)
    acc = StatsAccumulator()
    try:
        for chunk in leaf.chunks():
            acc.add(chunk)
    except (RuntimeError, TypeError, ValueError, OSError) as exc:
        return TensorRecord(name, leaf.shape, leaf.dtype, group, None, f"not scanned: {exc}", role)
    expected = 1
    for dim in leaf.shape:
        expected *= dim
    if leaf.dtype.startswith("complex"):
        expected *= 2
    note = None
    if acc.numel < expected:
        note = f"only {acc.numel} of {expected} values present in the file"
    return TensorRecord(name, leaf.shape, leaf.dtype, group, acc.result(), note, role)


_GROUP_ROLES: dict[str, TensorRole] = {"model": "weights", "optimizer": "optimizer",
                                       "other": "other"}


def _scaler(root: object, leaves: LeafSource) -> ScalerState | None:
    found = find_scaler(root)
    if found is None:
        return None
    key, state = found
    return ScalerState(
        key=key,
        scale=scalar(state.get("scale"), leaves),
        growth_tracker=as_int(scalar(state.get("_growth_tracker"), leaves)),
        growth_factor=scalar(state.get("growth_factor"), leaves),
        backoff_factor=scalar(state.get("backoff_factor"), leaves),
        growth_interval=as_int(scalar(state.get("growth_interval"), leaves)),
    )


def _step(root: object, leaves: LeafSource, path: str) -> tuple[int | None, str | None]:
    """The training step of the save and where it was read: a step key, else the file or
    folder name. An epoch is not a step: it is the metadata's ``epoch``."""
    if isinstance(root, Mapping):
        for key in STEP_KEYS:
            value = as_int(scalar(root.get(key), leaves)) if key in root else None
            if value is not None:
                return value, f"'{key}' key"
    return step_from_name(path)


class _Unread:
    """Leaves listed without reading a value (a ZeRO optimizer partition)."""

    def __init__(self, leaves: LeafSource, note: str) -> None:
        self.leaves, self.note = leaves, note

    def leaf(self, value: object) -> Leaf | None:
        leaf = self.leaves.leaf(value)
        return None if leaf is None else replace(leaf, chunks=None, note=self.note)


MAX_SECTIONS = 200
MAX_SECTION_NAME = 200


def _sections(root: object, parts: Parts) -> dict[str, TensorRole]:
    """Every top-level key with its role."""
    if not isinstance(root, Mapping) or parts.model is root:
        return {}
    if parts.format == "scaler":  # a scaler.pt: every entry is the scaler's
        return {str(k)[:MAX_SECTION_NAME]: "scaler" for k in list(root)[:MAX_SECTIONS]}
    optimizer_keys = {k.split(".", 1)[0] for k, _ in parts.optimizers}
    roles: dict[str, TensorRole] = {}
    for key, value in root.items():
        name = str(key)
        if len(roles) >= MAX_SECTIONS:
            break
        roles[name[:MAX_SECTION_NAME]] = (
            "weights" if name == parts.model_key
            else "optimizer" if name in optimizer_keys or name in OPTIMIZER_KEYS
            else section_role(name, value)
        )
    return roles


def _format(draft: Draft, parts: Parts, root: object) -> CheckpointFormat:
    if draft.format is not None:
        return draft.format
    if is_zero_shard(draft.path, root):
        return "zero_optimizer"
    if parts.format in ("training", "lightning") and isinstance(root, Mapping) and \
            "ds_version" in root:  # Lightning's DeepSpeed strategy adds its own keys to these
        return "deepspeed"
    return parts.format


def assemble(root: object, leaves: LeafSource, draft: Draft) -> CheckpointScan:
    zero = is_zero_shard(draft.path, root)
    if zero:
        leaves = _Unread(leaves, "ZeRO optimizer partition: listed, values not read")
    parts = find_parts(root, draft.path, leaves)
    if zero and not parts.optimizers and isinstance(root, Mapping):
        state = root.get("optimizer_state_dict")
        parts = replace(parts, optimizers=(("optimizer_state_dict", state),)) \
            if isinstance(state, Mapping) else parts
    records = [record(name, "model", leaf) for name, leaf in walk(parts.model, "", leaves)]
    model_records = list(records)
    findings: list[AdamFinding] = []
    for key, state in parts.optimizers:
        more, adam = scan_optimizer(key, state, leaves, model_records, record)
        if zero:  # a partition's slots are flat shards: no parameter to pair them with
            more = [record(name, "optimizer", leaf) for name, leaf in walk(state, key, leaves)]
            adam = []
        records.extend(more)
        findings.extend(adam)
    roles = _sections(root, parts)
    if isinstance(root, Mapping) and parts.model is not root and parts.format != "optimizer":
        skip = {parts.model_key, *OPTIMIZER_KEYS, *(k for k, _ in parts.optimizers)}
        for key, value in root.items():
            if str(key) not in skip:
                role = roles.get(str(key)[:MAX_SECTION_NAME]) or section_role(key, value)
                records.extend(
                    record(name, "other", leaf, role)
                    for name, leaf in walk(value, str(key), leaves)
                )
    step, source = _step(root, leaves, draft.path)
    return CheckpointScan(
        path=draft.path,
        size=draft.size,
        format=_format(draft, parts, root),
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
        meta=read_meta(root, leaves, roles, draft.path),
    )
