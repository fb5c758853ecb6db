"""Hugging Face's JSON metadata: ``config.json``, ``generation_config.json`` and the
top-level fields of a Trainer save's ``trainer_state.json``.

``trainer_state.json`` is read as a log (its ``log_history``) by
:mod:`analyzer.ingest.logformats.trainer_state`; only its top-level fields are taken here
(``global_step``, ``max_steps``, ``logging_steps``, ``train_batch_size``, ``best_metric``).
Beside the fields the settings use, every plain value of a file's top level and one level
below is kept (bounded: :func:`analyzer.ingest.metadata.keys.every_plain`), for the sweep
summary to compare runs by.
The Trainer writes them with ``indent=2`` and sorted keys, after the log history for most:
a file over MAX_BYTES, or one that does not parse, is read for lines that look like
top-level fields (two spaces, a key, a plain value) in its first and last WINDOW bytes.
Issues, by kind:

    bad_json     the file does not parse as JSON (its line): for trainer_state.json, the
                 top-level lines found are kept
    too_large    over MAX_BYTES: config.json and generation_config.json are not read;
                 trainer_state.json is read for its top-level lines
    unreadable   the file cannot be opened
    not_regular  a FIFO, device or socket: not opened
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from analyzer.ingest.metadata import open_failure
from analyzer.ingest.metadata.keys import (
    MODEL_CONFIG,
    MODEL_CONFIG_EXTRA,
    TRAINER_STATE,
    TRAINER_STATE_EXTRA,
    every_plain,
    plain,
)
from analyzer.ingest.safeio import open_regular
from analyzer.model import IngestIssue, IssueKind, Location, MetaValue

MAX_BYTES = 16 << 20
WINDOW = 1 << 20
_TOP_LINE = re.compile(
    rb'^  "([A-Za-z_][A-Za-z0-9_]{0,63})": ("(?:[^"\\\n]|\\.){0,512}"|-?[0-9][0-9.eE+-]{0,30}'
    rb'|true|false|null|NaN|-?Infinity),?\r?$', re.MULTILINE)


@dataclass
class JsonRead:
    """The plain fields taken from one JSON file, and the issues met."""

    fields: dict[str, MetaValue] = field(default_factory=dict)
    issues: list[IngestIssue] = field(default_factory=list)
    complete: bool = False


def _issue(path: str, kind: IssueKind, message: str, line: int | None = None) -> IngestIssue:
    return IngestIssue(Location(path, line=line), kind, message)


def _plain(value: object) -> MetaValue | None:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return plain(", ".join(value))  # architectures: ["GPT2LMHeadModel"]
    return plain(value)


def _pick(document: Mapping[str, object], names: tuple[str, ...]) -> dict[str, MetaValue]:
    out: dict[str, MetaValue] = {}
    for name in names:
        if name in document:
            value = _plain(document[name])
            if value is not None or document[name] is None:
                out[name] = value
    return out


def _read(path: str, out: JsonRead, whole: bool) -> tuple[bytes, bytes, int] | None:
    """(head, tail, size): the whole file when it fits, else its two windows (``whole``
    refuses a file too large instead)."""
    try:
        handle, size = open_regular(path)
    except OSError as exc:  # NotRegularFile included
        out.issues.append(open_failure(path, exc))
        return None
    with handle:
        if size <= MAX_BYTES:
            return handle.read(size), b"", size
        if whole:
            out.issues.append(_issue(path, "too_large", f"{size} bytes, over {MAX_BYTES}: "
                                     "not read"))
            return None
        head = handle.read(WINDOW)
        handle.seek(size - WINDOW)
        return head, handle.read(WINDOW), size


def _parse(path: str, data: bytes, out: JsonRead) -> object:
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except json.JSONDecodeError as exc:
        out.issues.append(_issue(path, "bad_json", f"not valid JSON ({exc.msg})", exc.lineno))
    except ValueError:  # an integer of thousands of digits, which Python refuses to build
        out.issues.append(_issue(path, "bad_json", "a number too long to read"))
    except RecursionError:
        out.issues.append(_issue(path, "bad_json", "JSON nested too deeply to parse"))
    return None


def read_model_config(path: str, generation: bool = False) -> JsonRead:
    """A ``config.json`` (or ``generation_config.json``: listed with its version only)."""
    out = JsonRead()
    got = _read(path, out, whole=True)
    if got is None:
        return out
    document = _parse(path, got[0], out)
    if isinstance(document, dict):
        names = ("transformers_version",) if generation else (*MODEL_CONFIG, *MODEL_CONFIG_EXTRA)
        out.fields = _pick(document, names)
        if not generation:
            every_plain(document, out.fields)
        out.complete = True
    return out


def read_trainer_state(path: str) -> JsonRead:
    """The top-level fields of a ``trainer_state.json`` (not its log history)."""
    out = JsonRead()
    got = _read(path, out, whole=False)
    if got is None:
        return out
    head, tail, size = got
    names = (*TRAINER_STATE, *TRAINER_STATE_EXTRA)
    if not tail:
        document = _parse(path, head, out)
        if isinstance(document, dict):
            out.fields = _pick(document, names)
            every_plain(document, out.fields)
            out.complete = True
            return out
    else:
        out.issues.append(_issue(path, "too_large", f"{size} bytes, over {MAX_BYTES}: its "
                                 "top-level fields were looked for in its first and last "
                                 f"{WINDOW} bytes"))
    found: dict[str, MetaValue] = {}
    for part in (head, tail):
        for match in _TOP_LINE.finditer(part):
            key = match.group(1).decode()
            if key in names and key not in found:
                try:
                    found[key] = _plain(json.loads(match.group(2)))
                except ValueError:
                    continue
    out.fields = {k: found[k] for k in names if k in found}
    return out
