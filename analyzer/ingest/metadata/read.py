"""A run's metadata files read into one :class:`RunMetadata`, its settings resolved.

Each file goes to the reader of its kind (by name); random-number generator states are
listed, never opened (Accelerate's ``random_states_*.pkl`` is a plain pickle: opening it
could only mean unpickling it). A setting several files give is taken from the kind that
the training code itself wrote first (:data:`PRECEDENCE`), and among files of one kind
from the latest save (``checkpoint-500`` over ``checkpoint-100``, ``version_1`` over
``version_0``). A Lightning checkpoint's ``hyper_parameters`` and precision, which the
checkpoint scan exposes (:attr:`CheckpointScan.meta`), join as one more file: the latest
save's (:func:`with_checkpoints`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from analyzer.ingest.metadata.hfjson import read_model_config, read_trainer_state
from analyzer.ingest.metadata.hparams import read_hparams
from analyzer.ingest.metadata.keys import (
    MODEL_CONFIG,
    TRAINER_STATE,
    TRAINING_ARGS,
    coerce,
    hparam_setting,
    mapped,
    plain,
)
from analyzer.ingest.metadata.torchsaved import read_scheduler, read_training_args
from analyzer.model import (
    SETTING_NAMES,
    CheckpointHistory,
    CheckpointScan,
    IngestIssue,
    MetadataFile,
    MetadataKind,
    MetaValue,
    ReadStatus,
    RunMetadata,
    Setting,
)

TRAINER_STATE_NAME = "trainer_state.json"
PRECEDENCE: tuple[MetadataKind, ...] = (
    "training_args", "trainer_state", "checkpoint_hparams", "hparams", "scheduler",
    "model_config",
)  # fmt: skip
"""Which kind of file a setting is taken from when several give it, first first."""


@dataclass(frozen=True)
class _Read:
    file: MetadataFile
    settings: Mapping[str, tuple[str, MetaValue]]
    issues: tuple[IngestIssue, ...]


def kind_of(path: str) -> tuple[MetadataKind, str] | None:
    """The kind of metadata file ``path`` names, and the framework that writes it."""
    name = os.path.basename(path).lower()
    known: dict[str, tuple[MetadataKind, str]] = {
        "hparams.yaml": ("hparams", "lightning"),
        "config.json": ("model_config", "transformers"),
        "generation_config.json": ("generation_config", "transformers"),
        "training_args.bin": ("training_args", "transformers"),
        TRAINER_STATE_NAME: ("trainer_state", "transformers"),
        "scheduler.pt": ("scheduler", "torch"),
        "scheduler.bin": ("scheduler", "torch"),
    }
    if name in known:
        return known[name]
    if re.fullmatch(r"rng_state(_\d+)?\.pth", name):
        return "rng_state", "transformers"
    if re.fullmatch(r"random_states_\d+\.pkl", name):
        return "rng_state", "accelerate"
    return None


def _status(complete: bool, fields: Mapping[str, object], issues: Sequence[object]
            ) -> ReadStatus:
    if complete and not issues:
        return "read"
    return "partial" if fields else "failed"


def _read_one(path: str, kind: MetadataKind, framework: str) -> _Read:
    if kind == "rng_state":
        return _Read(MetadataFile(path, kind, framework, "listed"), {}, ())
    if kind == "hparams":
        h = read_hparams(path)
        status = _status(h.parsed, h.fields, h.issues)
        return _Read(MetadataFile(path, kind, framework, status, h.fields), h.settings,
                     tuple(h.issues))
    if kind in ("model_config", "generation_config", "trainer_state"):
        j = (read_trainer_state(path) if kind == "trainer_state"
             else read_model_config(path, generation=kind == "generation_config"))
        names = {"trainer_state": TRAINER_STATE, "model_config": MODEL_CONFIG}.get(kind, {})
        status = _status(j.complete, j.fields, j.issues)
        return _Read(MetadataFile(path, kind, framework, status, j.fields),
                     mapped(j.fields, names), tuple(j.issues))
    s = read_training_args(path) if kind == "training_args" else read_scheduler(path)
    settings = mapped(s.fields, TRAINING_ARGS) if kind == "training_args" else (
        {"learning_rate": ("base_lrs", s.fields["base_lr"])} if "base_lr" in s.fields else {})
    status = _status(s.complete, s.fields, s.issues)
    return _Read(MetadataFile(path, kind, framework, status, s.fields), settings,
                 tuple(s.issues))


def _save_order(path: str) -> tuple[int, ...]:
    """Numbers in the path, for the latest save to sort last."""
    return tuple(int(n) for n in re.findall(r"\d+", path)[-4:])


def read_run_metadata(metadata_files: Iterable[str], log_files: Iterable[str] = ()
                      ) -> RunMetadata | None:
    """The run's metadata, from its metadata files and the ``trainer_state.json`` among
    its logs (its top-level fields only); None when there is none."""
    paths = [*metadata_files,
             *(p for p in log_files if os.path.basename(p) == TRAINER_STATE_NAME)]
    reads: list[_Read] = []
    for path in paths:
        kind = kind_of(path)
        if kind is not None:
            reads.append(_read_one(path, *kind))
    if not reads:
        return None
    return resolve([r.file for r in reads], [r.settings for r in reads],
                   tuple(i for r in reads for i in r.issues))


def resolve(files: Sequence[MetadataFile],
            settings: Sequence[Mapping[str, tuple[str, MetaValue]]],
            issues: tuple[IngestIssue, ...] = ()) -> RunMetadata:
    """One setting per name from every file's settings (``settings[i]`` is ``files[i]``'s),
    by :data:`PRECEDENCE`, then the latest save."""
    rank = {kind: k for k, kind in enumerate(PRECEDENCE)}
    order = sorted(range(len(files)), key=lambda i: (
        rank.get(files[i].kind, len(rank)), [-n for n in _save_order(files[i].path)]))
    chosen: dict[str, Setting] = {}
    for i in order:
        for name, (key, value) in settings[i].items():
            if name not in chosen:
                chosen[name] = Setting(value, files[i].path, key)
    ordered = {name: chosen[name] for name in SETTING_NAMES if name in chosen}
    return RunMetadata(files=tuple(files), settings=ordered, issues=issues)


def _checkpoint_settings(scan: CheckpointScan) -> tuple[MetadataFile, dict[str, tuple[str,
                                                                                   MetaValue]]]:
    meta = scan.meta
    assert meta is not None
    fields = {key: plain(value) for key, value in meta.hyperparameters.items()
              if value is None or plain(value) is not None}
    if meta.precision is not None:
        fields["precision"] = plain(meta.precision)
    found: dict[str, tuple[int, str, MetaValue]] = {}
    for key, value in fields.items():
        path = tuple(key.split("."))
        setting = "precision" if key == "precision" else hparam_setting(path)
        got = coerce(setting, value) if setting is not None else None
        if setting is not None and got is not None and (
                setting not in found or len(path) < found[setting][0]):
            found[setting] = (len(path), key, got)
    framework = meta.framework or "lightning"
    file = MetadataFile(scan.path, "checkpoint_hparams", framework, "read", fields)
    return file, {name: (key, value) for name, (_, key, value) in found.items()}


def with_checkpoints(meta: RunMetadata | None, history: CheckpointHistory | None
                     ) -> RunMetadata | None:
    """``meta`` with the hyperparameters and precision of the run's latest checkpoint that
    saved any, each setting taken where no file of higher precedence gave it."""
    if history is None:
        return meta
    scans = [s for s in history.scans
             if s.meta is not None and (s.meta.hyperparameters or s.meta.precision)]
    if not scans:
        return meta
    latest = max(enumerate(scans), key=lambda p: (p[1].step if p[1].step is not None else -1,
                                                  p[0]))[1]
    file, settings = _checkpoint_settings(latest)
    if meta is None:
        return resolve([file], [settings])
    rank = {kind: k for k, kind in enumerate(PRECEDENCE)}
    kinds = {f.path: f.kind for f in meta.files}
    mine = rank["checkpoint_hparams"]
    chosen = dict(meta.settings)
    for name, (key, value) in settings.items():
        held = chosen.get(name)
        if held is None or rank.get(kinds.get(held.source, "rng_state"), len(rank)) > mine:
            chosen[name] = Setting(value, file.path, key)
    ordered = {name: chosen[name] for name in SETTING_NAMES if name in chosen}
    return RunMetadata(files=(*meta.files, file), settings=ordered, issues=meta.issues)
