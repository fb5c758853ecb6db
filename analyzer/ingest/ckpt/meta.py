"""A checkpoint's metadata: what the trainer saved about itself beside the evidence.

Read from the same tree as the tensors (torch's or the static reader's), so a checkpoint
whose hyperparameters hold an object that ``weights_only`` refuses still gives its global
step and the hyperparameters' plain values; an object is named (``hyperparameters_other``),
never built. One-value tensors (a callback's ``kth_value``, ``best_score``) are read as
floats, an infinity kept as it is: these are scores, not evidence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from analyzer.ingest.ckpt.npstats import NpChunk
from analyzer.ingest.ckpt.roles import framework_of, is_scaler_state, section_role
from analyzer.ingest.ckpt.tree import LeafSource, epoch_from_name
from analyzer.model.checkpoints import CallbackState, CheckpointMeta, Primitive, TensorRole

_MONITOR_IN_KEY = re.compile(r"'monitor': '([^']*)'")
MAX_ENTRIES = 200
"""Most plain values kept of one section (a config can be large; the report stays small)."""
MAX_DEPTH = 8
MAX_TEXT = 200
MAX_KEY = 120
"""Longest key part kept: a static reading can give a key that is an object's description."""


def scalar(value: object, leaves: LeafSource) -> float | None:
    """A number, or the value of a one-element tensor; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    leaf = leaves.leaf(value)
    if leaf is None or leaf.chunks is None or leaf.shape not in ((), (1,)):
        return None
    try:
        for chunk in leaf.chunks():
            if isinstance(chunk, NpChunk):
                return chunk.first()
            return float(chunk.reshape(-1)[0])
    except (RuntimeError, TypeError, ValueError, OSError):
        return None
    return None


def as_int(value: float | None) -> int | None:
    return int(value) if value is not None and value == value and abs(value) < 2**62 else None


@dataclass
class _Flat:
    """Plain values under one section, keys dotted, and the keys holding objects."""

    values: dict[str, Primitive] = field(default_factory=dict)
    objects: list[str] = field(default_factory=list)


def flatten(value: object, leaves: LeafSource, prefix: str = "") -> _Flat:
    out = _Flat()
    _flatten(value, prefix, leaves, out, 0)
    return out


def _flatten(value: object, key: str, leaves: LeafSource, out: _Flat, depth: int) -> None:
    if len(out.values) >= MAX_ENTRIES or depth > MAX_DEPTH:
        return
    if value is None or isinstance(value, bool | int | float):
        out.values[key] = value
    elif isinstance(value, str):
        out.values[key] = value[:MAX_TEXT]
    elif isinstance(value, Mapping | list | tuple):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for name, item in items:
            if len(out.values) >= MAX_ENTRIES:
                break
            part = str(name)[:MAX_KEY]
            _flatten(item, f"{key}.{part}" if key else part, leaves, out, depth + 1)
    elif leaves.leaf(value) is not None:
        number = scalar(value, leaves)
        if number is not None:  # a larger tensor is listed with the others, not here
            out.values[key] = number
    else:  # an object (a Path, a config class): named, never built
        out.objects.append(key)


def _callback(key: str, state: object, leaves: LeafSource) -> CallbackState:
    values: dict[str, Primitive] = {}
    monitor: str | None = None
    if isinstance(state, Mapping):
        for name, item in state.items():
            name = str(name)[:MAX_KEY]
            if name == "monitor" or len(values) >= MAX_ENTRIES:
                continue
            if name == "best_k_models" and isinstance(item, Mapping):
                values[name] = len(item)  # paths -> scores: the scores are its tensors
                continue
            flat = flatten(item, leaves, name)
            values.update(flat.values)
        found = state.get("monitor")
        monitor = found[:MAX_TEXT] if isinstance(found, str) else None
    if monitor is None:  # EarlyStopping keeps it in its state key only
        named = _MONITOR_IN_KEY.search(key)
        monitor = named.group(1)[:MAX_TEXT] if named else None
    return CallbackState(key=key[:MAX_TEXT], callback=key.split("{", 1)[0].strip()[:MAX_TEXT],
                         monitor=monitor, values=values)


def _hyperparameters(root: Mapping[object, object], leaves: LeafSource) -> _Flat:
    out = _Flat()
    for key, prefix in (("hyper_parameters", ""), ("datamodule_hyper_parameters", "datamodule"),
                        ("ds_config", "")):
        if key in root:
            flat = flatten(root[key], leaves, prefix)
            out.values.update(flat.values)
            out.objects.extend(flat.objects)
    return out


def _counters(root: Mapping[object, object], leaves: LeafSource) -> dict[str, int]:
    counters: dict[str, int] = {}
    for key in ("skipped_steps", "global_samples", "dp_world_size", "mp_world_size"):
        number = as_int(scalar(root.get(key), leaves)) if key in root else None
        if number is not None:
            counters[key] = number
    if "loops" in root:
        for name, value in flatten(root["loops"], leaves).values.items():
            # Lightning's progress trackers count ready/started/processed/completed, in
            # total and in the current epoch: the completed totals say where the run was.
            wanted = name.endswith(".total.completed") or name.endswith("_batches_that_stepped")
            if wanted and isinstance(value, int) and not isinstance(value, bool):
                counters[f"loops.{name}"] = value
    return counters


def _schedulers(root: Mapping[object, object], leaves: LeafSource) -> list[dict[str, Primitive]]:
    found: list[dict[str, Primitive]] = []
    for key, value in root.items():
        if section_role(key, value) != "scheduler" or value is None:
            continue
        states = value if isinstance(value, list | tuple) else [value]
        found.extend(flatten(state, leaves).values for state in states)
    return found


def _precision(root: Mapping[object, object], hparams: Mapping[str, Primitive]) -> str | None:
    for key, value in root.items():
        # Lightning files a precision plugin's state under its class name; MixedPrecision
        # (and FSDPPrecision) save one only for a GradScaler, which only "16-mixed" has.
        if str(key)[:MAX_KEY].endswith("Precision") and is_scaler_state(value):
            return "16-mixed"
    for dtype in ("fp16", "bf16"):  # DeepSpeed's config names the one it enables
        if hparams.get(f"{dtype}.enabled") is True:
            return dtype
    return None


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def read_meta(
    root: object, leaves: LeafSource, roles: Mapping[str, TensorRole], path: str
) -> CheckpointMeta | None:
    """The metadata of a checkpoint's map of sections (``roles`` gives each its role); for
    any other tree only an epoch its file name gives, else None. The epoch is taken from
    the file name where no key holds it."""
    if not isinstance(root, Mapping) or not roles:  # not sections: a bare state dict, say
        epoch = epoch_from_name(path)
        return None if epoch is None else CheckpointMeta(epoch=epoch)
    hparams = _hyperparameters(root, leaves)
    callbacks = root.get("callbacks")
    states = (
        tuple(_callback(str(k)[:MAX_TEXT], v, leaves)
              for k, v in list(callbacks.items())[:MAX_ENTRIES])
        if isinstance(callbacks, Mapping) else ()
    )
    framework = framework_of(root)
    version = root.get("pytorch-lightning_version", root.get("ds_version"))
    step_key = "global_steps" if framework == "deepspeed" else "global_step"
    return CheckpointMeta(
        framework=framework,
        framework_version=version[:MAX_TEXT] if isinstance(version, str) else None,
        global_step=as_int(scalar(root.get(step_key), leaves)),
        epoch=_first(as_int(scalar(root.get("epoch"), leaves)), epoch_from_name(path)),
        hyperparameters=hparams.values,
        hyperparameters_other=tuple(hparams.objects),
        precision=_precision(root, hparams.values),
        callbacks=states,
        counters=_counters(root, leaves),
        schedulers=tuple(_schedulers(root, leaves)),
        sections=dict(roles),
    )
