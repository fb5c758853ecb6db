"""Metadata files written by ``torch.save``, read without unpickling: the Trainer's
``training_args.bin`` and a scheduler's ``scheduler.pt`` / ``scheduler.bin``.

``training_args.bin`` is ``torch.save(TrainingArguments)``: a pickle of a dataclass whose
class lives in ``transformers``. Loading it would import and run whatever classes the
pickle names, so it is never loaded: the zip container is checked by
:mod:`analyzer.ingest.ckpt.archive` (bounds, overlaps, bombs, a save cut short), and the
pickle's opcodes are walked by :mod:`analyzer.ingest.ckpt.staticpickle`, which builds
stand-ins and calls nothing. The plain fields of the dataclass's state are kept (an enum
such as ``lr_scheduler_type`` as its value), up to MAX_FIELDS; never a secret's
(``hub_token``), and of a pickle cut short only the known ones. A scheduler's
state_dict is read the same way: ``base_lrs``, ``_last_lr`` and ``last_epoch``. Issues, by kind:

    truncated       a zip cut off mid-save (the archive's own issue); the pickle is still
                    read when its entry was written whole
    bad_checkpoint  a zip the archive reader refuses (its issue: overlapping or
                    out-of-file entries, a bomb)
    bad_record      no pickle in it, a pickle that stops early (the byte offset: the
                    fields before it are kept), or one that holds no TrainingArguments
                    (or no state_dict)
    too_large       a pickle over MAX_PICKLE bytes: not walked
    unreadable      the file cannot be opened
    not_regular     a FIFO, device or socket: not opened
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from analyzer.ingest.ckpt.archive import read_archive
from analyzer.ingest.ckpt.ranges import FileRanges
from analyzer.ingest.ckpt.staticpickle import Call, Obj, StaticResult, read_pickle
from analyzer.ingest.metadata import open_failure
from analyzer.ingest.metadata.keys import (
    MAX_FIELDS,
    TRAINING_ARGS,
    TRAINING_ARGS_EXTRA,
    is_secret,
    plain,
)
from analyzer.model import IngestIssue, IssueKind, Location, MetaValue

MAX_PICKLE = 4 << 20
"""A TrainingArguments pickle is a few KiB; a scheduler's state a few hundred bytes."""
_LOCAL = struct.Struct("<4s4xH16xHH")
"""A zip local header's magic, method, name length and extra length (30 bytes in all)."""
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
"""What a pre-zip ``torch.save`` pickles first."""


@dataclass
class SavedRead:
    """The plain fields recovered from one file, and the issues met."""

    fields: dict[str, MetaValue] = field(default_factory=dict)
    issues: list[IngestIssue] = field(default_factory=list)
    complete: bool = False
    found: bool = False
    """Whether the object looked for was in the pickle at all."""


def _issue(path: str, kind: IssueKind, message: str, offset: int | None = None) -> IngestIssue:
    return IngestIssue(Location(path, offset=offset), kind, message)


@dataclass(frozen=True)
class _Pickle:
    """A pickle walked statically: its bytes (from ``start``), and where they lie in the
    file (``base``)."""

    result: StaticResult
    data: bytes
    base: int
    start: int = 0


def _pickle_of(path: str, out: SavedRead) -> _Pickle | None:
    """The file's pickle, walked statically."""
    try:
        ranges = FileRanges(path)
    except OSError as exc:  # NotRegularFile included
        out.issues.append(open_failure(path, exc))
        return None
    with ranges:
        if ranges.read(0, 2) != b"PK":
            return _legacy(ranges, out)
        archive = read_archive(ranges)
        out.issues.extend(archive.issues)
        if archive.refused:
            return None
        entry = archive.member("data.pkl")
        if entry is None and archive.truncated:
            return _cut_pickle(ranges)
        if entry is None:
            out.issues.append(_issue(path, "bad_record", "no data.pkl in the archive: not a "
                                     "torch.save file", 0))
            return None
        if entry.compressed or entry.stored_size > MAX_PICKLE:
            kind: IssueKind = "too_large" if not entry.compressed else "bad_record"
            why = (f"over {MAX_PICKLE} bytes" if not entry.compressed else
                   "compressed, which torch.save never does")
            out.issues.append(_issue(path, kind, f"data.pkl {why}: not read",
                                     entry.header_offset))
            return None
        data = ranges.read(entry.data_offset, entry.stored_size)
        return _Pickle(read_pickle(data), data, entry.data_offset)


def _cut_pickle(ranges: FileRanges) -> _Pickle | None:
    """The start of a pickle cut off mid-save: ``torch.save`` writes data.pkl first, so
    its bytes follow the file's first local header, as far as the file goes."""
    header = ranges.read(0, _LOCAL.size)
    if len(header) < _LOCAL.size:
        return None
    magic, method, name_length, extra_length = _LOCAL.unpack(header)
    name = ranges.read(_LOCAL.size, name_length)
    if magic != b"PK\x03\x04" or method != 0 or not name.endswith(b"/data.pkl"):
        return None
    start = _LOCAL.size + name_length + extra_length
    data = ranges.read(start, MAX_PICKLE)
    return _Pickle(read_pickle(data), data, start)


def _legacy(ranges: FileRanges, out: SavedRead) -> _Pickle | None:
    """A pre-zip save: the magic number, the protocol, system info, then the object."""
    if ranges.size > MAX_PICKLE:
        out.issues.append(_issue(ranges.path, "too_large", f"not a zip archive, and over "
                                 f"{MAX_PICKLE} bytes: not read as a pickle", 0))
        return None
    data = ranges.read(0, ranges.size)
    result, start = read_pickle(data), 0
    if result.error is None and result.root == _LEGACY_MAGIC:
        for _ in range(3):
            start = result.end
            result = read_pickle(data, start)
            if result.error is not None:
                break
    return _Pickle(result, data, 0, start)


def _state(root: object) -> Mapping[object, object] | None:
    if isinstance(root, Obj):
        state = root.state
        if isinstance(state, tuple) and state and isinstance(state[0], dict):
            state = state[0]  # (dict state, slot state)
        return state if isinstance(state, dict) else None
    return root if isinstance(root, dict) else None


def _plain(value: object) -> MetaValue | None:
    if isinstance(value, Call) and len(value.args) == 1 and isinstance(value.args[0], str):
        return plain(value.args[0])  # an enum member, rebuilt from its value
    return plain(value)


def _walked(path: str, got: _Pickle, out: SavedRead) -> Mapping[object, object]:
    result = got.result
    if result.error is None:
        return _state(result.root) or {}
    at = None if result.error_offset is None else got.base + result.error_offset
    out.issues.append(_issue(path, "bad_record", f"pickle: {result.error}; the fields "
                             "before it are kept", at))
    state = _state(result.root)
    if not state and result.error_offset is not None:
        state = _state(_closed(got.data, got.start, result.error_offset).root)
    return state or {}


def _closed(data: bytes, start: int, stop: int) -> StaticResult:
    """The opcodes before ``stop`` followed by SETITEMS, BUILD and STOP: the fields a
    dataclass's pickle had set out before it was cut, put in its state as a whole pickle
    would. A value whose opcodes were cut midway is left out with its key."""
    return read_pickle(data[:stop] + b"ub.", start)


def read_training_args(path: str) -> SavedRead:
    """The plain fields of a pickled ``TrainingArguments``, read without unpickling it."""
    out = SavedRead()
    got = _pickle_of(path, out)
    if got is None:
        return out
    state = _walked(path, got, out)
    for name in (*TRAINING_ARGS, *TRAINING_ARGS_EXTRA):
        if name in state:
            value = _plain(state[name])
            if value is not None or state[name] is None:
                out.fields[name] = value
    if got.result.error is None:
        # Closing a cut pickle may close a nested config's dict as the state: its keys
        # would pass for the dataclass's own. A cut file keeps the known fields only.
        _other_fields(state, out.fields)
    out.found = "learning_rate" in out.fields
    if not out.found and got.result.error is None:
        out.issues.append(_issue(path, "bad_record", "the pickle holds no TrainingArguments "
                                 "(no learning_rate field)", got.base))
    out.complete = out.found and got.result.error is None
    return out


def _other_fields(state: Mapping[object, object], fields: dict[str, MetaValue]) -> None:
    """The dataclass's other plain fields (an enum by its value), up to MAX_FIELDS; a
    secret (``hub_token``) never."""
    added = 0
    for name, raw in state.items():
        if added >= MAX_FIELDS:
            return
        if not isinstance(name, str) or name.startswith("_") or name in fields \
                or is_secret(name):
            continue
        value = _plain(raw)
        if value is not None or raw is None:
            fields[name] = value
            added += 1


def read_scheduler(path: str) -> SavedRead:
    """A learning-rate scheduler's state_dict: its base and last rates, its step count."""
    out = SavedRead()
    got = _pickle_of(path, out)
    if got is None:
        return out
    state = _walked(path, got, out)
    base = _rates(state.get("base_lrs"))
    last = _rates(state.get("_last_lr"))
    if base:
        out.fields["base_lr"] = max(base)
        out.fields["param_groups"] = len(base)
    if last:
        out.fields["last_lr"] = max(last)
    epoch = plain(state.get("last_epoch"))
    if isinstance(epoch, int) and not isinstance(epoch, bool):
        out.fields["last_epoch"] = epoch
    out.found = bool(out.fields)
    if not out.found and got.result.error is None:
        out.issues.append(_issue(path, "bad_record", "the pickle holds no scheduler state "
                                 "(no base_lrs)", got.base))
    out.complete = out.found and got.result.error is None
    return out


def _rates(value: object) -> list[float]:
    if not isinstance(value, list | tuple):
        return []
    return [float(v) for v in value[:4096] if isinstance(v, float)
            or (isinstance(v, int) and not isinstance(v, bool) and plain(v) is not None)]
