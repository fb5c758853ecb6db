"""The capture folder format, in one place: its names, where captures are, and the one
reader of ``meta.json`` and of the run's ``env.json``.

The recorder writes with these names; ingest, the replay and (through the :class:`Run`)
the rules read with them. The layout (docs/capture.md)::

    <run>/env.json                       the environment, written when the run starts
    <run>/capture/step_<N>/meta.json     a capture: N is the loop's step, not zero-padded
    <run>/capture/step_<N>/state.pt ...  (batch.pt, rng.pt, history.pt)
    <run>/capture/.step_<N>.<random>/    the recorder's folder while it writes; renamed
                                         to step_<N> once complete

A *capture* is a folder named ``step_<N>`` inside a run's ``capture/`` (or ``captures/``,
any case) that holds ``meta.json``: the recorder writes meta.json last, into a temporary
folder that it renames, so a folder of any other name (a run killed mid-write leaves its
``.step_<N>.<random>``) is ignored, and a ``step_<N>`` without meta.json is not a capture
(it can only come from a copy cut short or files removed by hand). Captures are listed
earliest step first: the earliest holds the first failure, and is the one replayed.

Neither torch nor numpy is imported here. What the reader meets, each an
:class:`IngestIssue` on the run (the replay raises the same text as a CaptureError):

    truncated     a ``step_<N>`` folder without meta.json: not taken as a capture
    not_followed  a symlinked ``step_<N>`` folder: not followed
    unreadable    a capture folder that cannot be listed; a file that cannot be read
    not_regular   meta.json or env.json is a FIFO, device, socket or folder: not opened
    too_large     meta.json or env.json over JSON_BYTES: not read
    bad_json      not UTF-8 (byte offset), not JSON (line), nested too deeply, or an
                  env.json that is not an object: the file gives nothing
    bad_record    a meta.json of another format or version, or a key of the wrong type:
                  the capture stays listed (its replay fails naming the key), but gives
                  the rules nothing

A damaged ``env.json`` leaves the run the environment its earliest readable capture
recorded, as a missing one does.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from analyzer.ingest import storage
from analyzer.ingest.safeio import NotRegularFile, open_regular

if TYPE_CHECKING:
    from analyzer.model import CaptureMeta, IngestIssue, IssueKind

FORMAT_NAME = "nan-forensics-capture"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 2 only adds keys to version 1 (the step contract, several optimizers, gradient
accumulation, where the code lives): both are read."""
ENV_FORMAT = "nan-forensics-env"
CAPTURE_DIR = "capture"
"""The folder the recorder writes captures into; readers also accept CAPTURE_DIR_NAMES."""
CAPTURE_DIR_NAMES = ("capture", "captures")
ENV_FILE = "env.json"
META_FILE = "meta.json"
STATE_FILE = "state.pt"
BATCH_FILE = "batch.pt"
RNG_FILE = "rng.pt"
HISTORY_FILE = "history.pt"
JSON_BYTES = 16 << 20
"""Largest meta.json or env.json read; the recorder writes a few kilobytes."""

_STEP_DIR = re.compile(r"step_(\d+)")


def step_dir_name(step: int) -> str:
    """The name of the capture of ``step``: ``step_<N>``."""
    return f"step_{step}"


def temporary_prefix(step: int) -> str:
    """How the recorder's folder starts while it writes ``step``'s capture."""
    return f".{step_dir_name(step)}."


def step_of(name: str) -> int | None:
    """The step of a capture folder's name, None for any other name (a temporary one)."""
    match = _STEP_DIR.fullmatch(name)
    return int(match[1]) if match else None


def is_capture_container(name: str) -> bool:
    """Whether a run's sub-folder of this name holds its captures."""
    return name.lower() in CAPTURE_DIR_NAMES


class MetaError(ValueError):
    """A meta.json or env.json that cannot be taken: where, what kind, what is wrong."""

    def __init__(self, path: str, kind: IssueKind, reason: str, *,
                 line: int | None = None, offset: int | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.kind: IssueKind = kind
        self.reason = reason
        self.line = line
        self.offset = offset

    def issue(self) -> IngestIssue:
        from analyzer.model import IngestIssue, Location

        return IngestIssue(Location(self.path, offset=self.offset, line=self.line),
                           self.kind, self.reason)


def _issue(path: str, kind: IssueKind, reason: str) -> IngestIssue:
    return MetaError(path, kind, reason).issue()


def step_folders(container: str) -> tuple[list[str], list[IngestIssue]]:
    """The ``step_<N>`` folders of one capture folder, earliest first, found by listing
    alone; other names are not captures. Symlinked ones are reported, not followed."""
    if storage.is_url(container):
        return _remote_step_folders(container)
    try:
        with os.scandir(container) as entries:
            items = [(step_of(e.name), e) for e in entries]
    except OSError as exc:
        return [], [_issue(container, "unreadable",
                           f"folder cannot be listed: {exc.strerror or exc}")]
    found: list[tuple[int, str]] = []
    issues: list[IngestIssue] = []
    for step, entry in sorted((s, e) for s, e in items if s is not None):
        try:
            is_dir, is_link = entry.is_dir(), entry.is_symlink()
        except OSError:
            continue
        if is_dir and is_link:
            issues.append(_issue(entry.path, "not_followed",
                                 f"symlink to the folder {os.path.realpath(entry.path)}: "
                                 "not followed; name the folder itself to replay it"))
        elif is_dir:
            found.append((step, entry.path))
    return [path for _, path in found], issues


def _remote_step_folders(container: str) -> tuple[list[str], list[IngestIssue]]:
    """:func:`step_folders` of a folder on object storage (which has no symlinks)."""
    try:
        entries = storage.list_dir(container)
    except OSError as exc:
        return [], [_issue(container, "unreadable",
                           f"folder cannot be listed: {exc.strerror or exc}")]
    steps = sorted((step, name) for name, is_dir in entries
                   if is_dir and (step := step_of(name)) is not None)
    return [storage.join(container, name) for _, name in steps], []


def run_step_folders(run_folder: str, dir_names: Iterable[str] | None = None,
                     ) -> tuple[list[str], list[IngestIssue]]:
    """The ``step_<N>`` folders of every capture folder of a run, earliest first.
    ``dir_names`` are the run folder's sub-folder names when already listed."""
    if dir_names is None:
        try:
            dir_names = [name for name, is_dir in storage.list_dir(run_folder) if is_dir] \
                if storage.is_url(run_folder) else \
                [e.name for e in os.scandir(run_folder) if e.is_dir()]
        except OSError:
            return [], []
    found: list[str] = []
    issues: list[IngestIssue] = []
    for name in sorted(dir_names):
        if is_capture_container(name):
            more, problems = step_folders(storage.join(run_folder, name))
            found += more
            issues += problems
    found.sort(key=lambda p: (step_of(storage.name(p)), p))
    return found, issues


def is_complete(folder: str) -> bool:
    """Whether a ``step_<N>`` folder holds meta.json (of any type: a FIFO named meta.json
    is a damaged capture, which reading it reports)."""
    meta = storage.join(folder, META_FILE)
    return storage.exists(meta) if storage.is_url(meta) else os.path.lexists(meta)


def capture_of(path: str) -> str | None:
    """The capture behind ``path``, or None: ``path`` itself when it holds meta.json (a
    capture named directly), else the earliest capture of the run at ``path``, else of
    ``path`` taken as a capture folder."""
    if is_complete(path):
        return path
    for candidates in (run_step_folders(path)[0], step_folders(path)[0]):
        complete = [c for c in candidates if is_complete(c)]
        if complete:
            return complete[0]
    return None


def run_of_capture(folder: str) -> str:
    """The run a ``capture/step_<N>`` folder belongs to (the folder above ``capture/``)."""
    parent = storage.parent(storage.absolute(folder))
    if is_capture_container(storage.name(parent)):
        return storage.parent(parent)
    return parent


def read_json_object(path: str, what: str) -> dict[str, Any]:
    """A small JSON object, read through safeio: never blocks on a FIFO, never reads past
    JSON_BYTES. Raises FileNotFoundError when there is no file, MetaError otherwise."""
    try:
        handle, size = open_regular(path)
    except FileNotFoundError:
        raise
    except NotRegularFile as exc:
        raise MetaError(path, "not_regular", str(exc)) from None
    except OSError as exc:
        raise MetaError(path, "unreadable", f"cannot be opened: {exc.strerror or exc}") from None
    with handle:
        if size > JSON_BYTES:
            raise MetaError(path, "too_large", f"{size} bytes, more than the {JSON_BYTES} "
                                               f"a {what} may have: not read")
        try:
            raw = handle.read(size)
        except OSError as exc:
            raise MetaError(path, "unreadable", f"cannot be read: {exc.strerror or exc}") \
                from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MetaError(path, "bad_json", f"not UTF-8 at byte {exc.start}",
                        offset=exc.start) from None
    except json.JSONDecodeError as exc:
        raise MetaError(path, "bad_json", f"line {exc.lineno} column {exc.colno}: {exc.msg}",
                        line=exc.lineno) from None
    except RecursionError:
        raise MetaError(path, "bad_json", f"nested too deeply to be a {what}") from None
    except ValueError:  # json's only other refusal: an integer of too many digits
        raise MetaError(path, "bad_json", "holds an integer of more than "
                                          f"{sys.get_int_max_str_digits()} digits") from None
    if not isinstance(data, dict):
        raise MetaError(path, "bad_json", f"not a JSON object: not a {what}")
    return data


def read_capture_meta(folder: str) -> CaptureMeta:
    """The checked meta.json of the capture ``folder``; MetaError when it is missing,
    unreadable, of another format or version, or has a key of the wrong type."""
    path = storage.join(folder, META_FILE)
    try:
        data = read_json_object(path, "capture's meta.json")
    except FileNotFoundError:
        raise MetaError(path, "truncated", "missing: the capture is incomplete") from None
    if data.get("format") != FORMAT_NAME:
        raise MetaError(path, "bad_record", f"not a {FORMAT_NAME} meta.json (format key)")
    if data.get("version") not in READABLE_VERSIONS:
        raise MetaError(path, "bad_record", f"capture version {data.get('version')!r}; "
                                            "this reader knows versions "
                                            f"{', '.join(map(str, READABLE_VERSIONS))}")
    try:
        return _record(folder, data)
    except _BadKey as exc:
        raise MetaError(path, "bad_record", str(exc)) from None


def read_meta(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked meta.json of a capture as a plain dict (MetaError, a ValueError, when it
    cannot be taken); :func:`read_capture_meta` gives the typed record."""
    return dict(read_capture_meta(os.fspath(folder)).raw)


def read_env(run_folder: str) -> tuple[dict[str, Any] | None, IngestIssue | None]:
    """The run's env.json (any JSON object: older writers add no format key), or None when
    it has none; a file that cannot be taken gives None and its issue."""
    try:
        return read_json_object(storage.join(run_folder, ENV_FILE), "run's env.json"), None
    except FileNotFoundError:
        return None, None
    except MetaError as exc:
        return None, exc.issue()


@dataclass(frozen=True)
class RunCaptures:
    """What a run's captures and env.json give its :class:`Run`."""

    captures: tuple[str, ...]
    """Capture folders (``step_<N>`` holding meta.json), earliest step first."""
    metas: tuple[CaptureMeta, ...]
    """The checked meta.json of those whose file could be taken, in the same order."""
    env: Mapping[str, Any] | None
    """env.json, else the environment the earliest checked capture recorded."""
    issues: tuple[IngestIssue, ...]


def read_run_captures(run_folder: str, step_dirs: Iterable[str]) -> RunCaptures:
    """Read the captures (``step_<N>`` folders, as :func:`run_step_folders` lists them)
    and the env.json of one run."""
    captures: list[str] = []
    metas: list[CaptureMeta] = []
    issues: list[IngestIssue] = []
    for folder in step_dirs:
        if not is_complete(folder):
            issues.append(_issue(folder, "truncated", f"no {META_FILE}: an incomplete "
                                                      "capture, not replayed"))
            continue
        captures.append(folder)
        try:
            metas.append(read_capture_meta(folder))
        except MetaError as exc:
            issues.append(exc.issue())
    env, problem = read_env(run_folder)
    if problem is not None:
        issues.append(problem)
    if env is None and metas and metas[0].env is not None:
        env = dict(metas[0].env)
    return RunCaptures(tuple(captures), tuple(metas), env, tuple(issues))


class _BadKey(ValueError):
    """A key of meta.json missing or of the wrong type."""


_Check = tuple[Any, str]
_INT: _Check = (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
_NUMBER: _Check = (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number")
_STR: _Check = (lambda v: isinstance(v, str), "a string")
_BOOL: _Check = (lambda v: isinstance(v, bool), "a boolean")
_OBJECT: _Check = (lambda v: isinstance(v, dict), "a JSON object")
_NUMBER_OR_STR: _Check = (lambda v: _NUMBER[0](v) or isinstance(v, str), "a number or a string")
_INTS: _Check = (lambda v: isinstance(v, list) and all(_INT[0](x) for x in v), "a list of integers")
_NUMBERS: _Check = (lambda v: isinstance(v, list) and all(_NUMBER[0](x) for x in v),
                    "a list of numbers")
_STR_LISTS: _Check = (lambda v: isinstance(v, list) and all(
    isinstance(g, list) and all(isinstance(x, str) for x in g) for g in v),
    "a list of lists of strings")
_OBJECTS: _Check = (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
                    "a list of JSON objects")
_STRS: _Check = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                 "a list of strings")


def _key(data: Mapping[str, Any], key: str, check: _Check, *, where: str = "",
         required: bool = False) -> Any:
    """``data[key]`` when it passes ``check``; None when absent or null and not required."""
    value = data.get(key)
    if value is None and not required:
        return None
    if not check[0](value):
        missing = "missing or " if required else ""
        raise _BadKey(f"key {where + key!r} is {missing}not {check[1]}")
    return value


def _one_of(data: Mapping[str, Any], key: str, allowed: tuple[str, ...], *, where: str = "",
            required: bool = False) -> Any:
    value = _key(data, key, _STR, where=where, required=required)
    if value is not None and value not in allowed:
        raise _BadKey(f"{where + key} {value!r} is not one of {', '.join(allowed)}")
    return value


def _record(folder: str, data: dict[str, Any]) -> CaptureMeta:
    from analyzer.model import (
        CAPTURE_DTYPES,
        CAPTURE_MODES,
        STEP_KINDS,
        Accumulation,
        AmpSettings,
        CaptureMeta,
        CaptureTrigger,
        FactorySpec,
        OptimizerSpec,
        StepKind,
        StepSpec,
    )

    def spec_of(spec: Mapping[str, Any], what: str) -> FactorySpec:
        if not isinstance(spec.get("factory"), str):
            raise _BadKey(f"key {what!r} needs a 'factory' string")
        config = _key(spec, "config", _OBJECT, where=f"{what}.")
        return FactorySpec(spec["factory"],
                           dict(_key(spec, "kwargs", _OBJECT, where=f"{what}.") or {}),
                           None if config is None else dict(config))

    def factory(what: str) -> FactorySpec:
        return spec_of(_key(data, what, _OBJECT, required=True), what)

    def optional_factory(what: str, required: bool) -> FactorySpec | None:
        spec = _key(data, what, _OBJECT, required=required)
        return None if spec is None else spec_of(spec, what)

    def optimizer_of(spec: Mapping[str, Any], where: str) -> OptimizerSpec:
        lrs = _key(spec, "lrs", _NUMBERS, where=where) or ()
        params = _key(spec, "params", _STR_LISTS, where=where) or ()
        return OptimizerSpec(
            _key(spec, "class", _STR, where=where, required=True),
            dict(_key(spec, "hyperparameters", _OBJECT, where=where) or {}),
            _key(spec, "param_groups", _INT, where=where),
            tuple(float(x) for x in lrs),
            tuple(tuple(g) for g in params))

    version = data.get("version")
    call = _key(data, "step_call", _OBJECT) or {}
    kind = _one_of(call, "kind", STEP_KINDS, where="step_call.") or "loss_fn"
    step_factory = _key(call, "factory", _OBJECT, where="step_call.",
                        required=kind == "step_fn")
    trigger = _key(data, "trigger", _OBJECT, required=True)
    optimizer = _key(data, "optimizer", _OBJECT, required=True)
    listed = _key(data, "optimizers", _OBJECTS) or []
    accumulation = _key(data, "accumulation", _OBJECT) or {}
    micro = _key(accumulation, "micro_batches", _INT, where="accumulation.")
    if micro is not None and micro < 1:
        raise _BadKey("accumulation.micro_batches is not at least 1")
    first = optimizer_of(optimizer, "optimizer.")
    amp = _key(data, "amp", _OBJECT, required=True)
    device = _key(data, "device", _STR, required=True)
    lr, clip = _key(data, "lr", _NUMBER), _key(data, "grad_clip", _NUMBER)
    return CaptureMeta(
        folder=folder,
        step=_key(data, "step", _INT, required=True),
        trigger=CaptureTrigger(*(_key(trigger, k, _STR, where="trigger.")
                                 for k in ("what", "name", "kind"))),
        model=factory("model"),
        loss=optional_factory("loss", kind == "loss_fn"),
        optimizer=first,
        dtype=_one_of(data, "dtype", CAPTURE_DTYPES, required=True),
        amp=AmpSettings(
            _one_of(amp, "autocast_dtype", CAPTURE_DTYPES, where="amp."),
            _key(amp, "device_type", _STR, where="amp.") or device.split(":")[0],
            bool(_key(amp, "grad_scaler", _BOOL, where="amp.")),
            _one_of(amp, "scope", ("step", "forward"), where="amp.") or "step"),
        device=device,
        mode=_one_of(data, "mode", CAPTURE_MODES, required=True),
        lr=None if lr is None else float(lr),
        grad_clip=None if clip is None else float(clip),
        seed=_key(data, "seed", _INT),
        env=_key(data, "env", _OBJECT),
        state_step=_key(data, "state_step", _INT),
        every_n=_key(data, "every_n", _INT),
        history_steps=tuple(_key(data, "history_steps", _INTS) or ()),
        loss_value=_key(data, "loss_value", _NUMBER_OR_STR),
        files=tuple(_key(data, "files", _STRS) or ()),
        version=version if isinstance(version, int) else 1,
        step_call=StepSpec(
            cast(StepKind, kind),
            None if step_factory is None else spec_of(step_factory, "step_call.factory"),
            _key(call, "batch_idx", _INT, where="step_call.")),
        optimizers=tuple(optimizer_of(o, f"optimizers[{i}].") for i, o in enumerate(listed))
        or (first,),
        accumulation=Accumulation(
            micro or 1, _key(accumulation, "divide", _BOOL, where="accumulation.") is not False,
            _key(accumulation, "failing", _INT, where="accumulation."),
            _key(accumulation, "divisor", _INT, where="accumulation.")),
        code=_key(data, "code", _OBJECT),
        raw=data,
    )
