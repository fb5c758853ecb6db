"""A run's hyperparameters as flat keys, from what ingest already read: its metadata files,
its environment and its capture's meta. Nothing is opened here.

Keys are the files' own names (``lr``, ``optimizer``, ``batch_size``; a nested config's
keys joined with ``.``: ``model.optimizer.lr``), so a sweep's keys read as its config
wrote them. When several files give one key, the file the training code wrote wins, in the
order the settings are resolved (:data:`analyzer.ingest.metadata.read.PRECEDENCE`), then
the latest save. The environment's keys are prefixed ``env.`` (``env.torch``,
``env.gpu``, ``env.deterministic_algorithms``), the capture's ``capture.``
(``capture.optimizer``, ``capture.lr``, ``capture.amp.autocast_dtype``).

Fields that count the training's progress (a trainer state's ``global_step``, a
scheduler's ``last_epoch``, a best metric) are not hyperparameters: a run that died early
has smaller ones, which says nothing about why it died. They are left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from analyzer.ingest.metadata.read import PRECEDENCE
from analyzer.model import MetadataFile, RunResult
from analyzer.model.fleet import HyperValue

MAX_TEXT = 200
PROGRESS = frozenset({
    "global_step", "epoch", "best_metric", "best_global_step", "best_model_checkpoint",
    "total_flos", "num_input_tokens_seen", "last_epoch", "last_lr", "transformers_version",
})  # fmt: skip
"""Keys of a file's fields that say how far the training went, or which writer wrote it
(the environment gives versions once, under ``env.``)."""
_ENV_SKIP = frozenset({"format", "version"})


def _value(value: object) -> HyperValue | None:
    if isinstance(value, bool | int | str):
        return value[:MAX_TEXT] if isinstance(value, str) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


def _order(files: tuple[MetadataFile, ...]) -> list[MetadataFile]:
    """Files the training code wrote first, then the latest save of a kind first."""
    rank = {kind: k for k, kind in enumerate(PRECEDENCE)}

    def numbers(path: str) -> tuple[int, ...]:
        digits = "".join(c if c.isdigit() else " " for c in path).split()
        return tuple(-int(d) for d in digits[-4:])

    return sorted(files, key=lambda f: (rank.get(f.kind, len(rank)), numbers(f.path)))


def _file_keys(files: tuple[MetadataFile, ...]) -> dict[str, HyperValue]:
    out: dict[str, HyperValue] = {}
    for f in _order(files):
        if f.kind in ("generation_config", "rng_state"):
            continue
        for key, raw in f.fields.items():
            if key in PROGRESS or key in out:
                continue
            value = _value(raw)
            if value is not None:
                out[key] = value
    return out


def _env_keys(env: Mapping[str, Any]) -> dict[str, HyperValue]:
    out: dict[str, HyperValue] = {}
    for key, raw in env.items():
        if not isinstance(key, str) or key in _ENV_SKIP:
            continue
        if key == "gpus" and isinstance(raw, list):
            out["env.gpu_count"] = len(raw)
            names = sorted({str(g)[:MAX_TEXT] for g in raw if isinstance(g, str)})
            if names:
                out["env.gpu"] = ", ".join(names)[:MAX_TEXT]
            continue
        value = _value(raw)
        if value is not None:
            out[f"env.{key}"] = value
    return out


def _capture_keys(result: RunResult) -> dict[str, HyperValue]:
    metas = result.run.capture_metas
    if not metas:
        return {}
    meta = metas[0]
    out: dict[str, HyperValue] = {"capture.optimizer": meta.optimizer.cls[:MAX_TEXT],
                                  "capture.dtype": meta.dtype,
                                  "capture.amp.grad_scaler": meta.amp.grad_scaler}
    if meta.amp.autocast_dtype is not None:
        out["capture.amp.autocast_dtype"] = meta.amp.autocast_dtype
    lrs = [lr for lr in meta.optimizer.lrs if math.isfinite(lr)]
    lr = max(lrs) if lrs else meta.lr
    if lr is not None and math.isfinite(lr):
        out["capture.lr"] = lr
    if meta.grad_clip is not None and math.isfinite(meta.grad_clip):
        out["capture.grad_clip"] = meta.grad_clip
    for key, raw in meta.optimizer.hyperparameters.items():
        value = _value(raw)
        if isinstance(key, str) and key != "lr" and value is not None:
            out[f"capture.optimizer.{key}"] = value
    return out


def hyperparameters(result: RunResult) -> dict[str, HyperValue]:
    """The run's hyperparameters and environment as flat keys, sorted by key."""
    run = result.run
    out: dict[str, HyperValue] = {}
    if run.metadata is not None:
        out.update(_file_keys(run.metadata.files))
    if run.env is not None:
        for key, value in _env_keys(run.env).items():
            out.setdefault(key, value)
    for key, value in _capture_keys(result).items():
        out.setdefault(key, value)
    return dict(sorted(out.items()))
