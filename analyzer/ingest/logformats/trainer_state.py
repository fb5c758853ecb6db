"""Hugging Face ``trainer_state.json``: the ``log_history`` list, one dict per log call.

The Trainer writes it with ``indent=2`` and Python's json, so a NaN loss is the bare
token ``NaN``. Such a file is read line by line, so that each point knows its line. A
file written compactly (all on one line) is read record by record with the json
module's decoder (``raw_decode``), so that a cut one keeps its whole records as well.
Policy, one rule per kind:

- ``truncated``: the file ends inside ``log_history`` (a save cut mid-write): every whole
  record before the cut is kept; the issue gives the line and byte offset of the record
  that was cut;
- ``bad_json``: the JSON is malformed before the end of ``log_history``: the records
  before the damage are kept and reading stops there; no ``log_history`` list at all is
  reported the same way;
- ``zero_tail``: the file ends in NUL bytes (its size was written, its data never): they
  are dropped and the text before them is read;
- ``read_limit``: the time budget ran out: the records before are kept.
"""

from __future__ import annotations

import json
import math
import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.hf import RENAME, SKIP
from analyzer.ingest.logformats.numbers import number_value
from analyzer.ingest.safeio import Deadline

_FIELD = re.compile(r'\s*+"([^"\\]*+)":\s*+(\S++)')
_START = re.compile(r'\s*+"log_history":\s*+\[')
_BLANKS = re.compile(r"[ \t\n\r]*+")
_CHECK_EVERY = 4096
"""Lines or records read between two looks at the deadline."""


def read_trainer_state(data: bytes, ctx: Context, deadline: Deadline | None = None) -> None:
    budget = Deadline() if deadline is None else deadline
    kept = data.rstrip(b"\x00")
    if len(kept) < len(data):
        ctx.issue(
            "zero_tail",
            f"the file ends in {len(data) - len(kept)} NUL bytes (a zero-filled tail); "
            "they are skipped",
            kept.count(b"\n") + 1,
            len(kept),
        )
    text = kept.decode("utf-8", errors="replace")
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None or lines[start].rstrip().endswith("]") or len(lines) < 4:
        _read_compact(text, ctx, budget)
        return
    record: dict[str, tuple[float, int]] | None = None
    for i in range(start + 1, len(lines)):
        if not (i - start) % _CHECK_EVERY and _stopped(budget, ctx, i + 1):
            return
        stripped = lines[i].strip()
        if record is None:
            if stripped == "{":
                record = {}
            elif stripped.startswith("]"):
                return
            continue
        if stripped.startswith("}"):
            _emit(record, ctx)
            record = None
            continue
        m = _FIELD.match(lines[i])
        if m is not None:
            value = number_value(m.group(2).rstrip(","))
            if value is not None:
                record[m.group(1)] = (value, i + 1)
    ctx.issue(
        "truncated",
        "log_history ends before its closing bracket; records up to here were kept",
        len(lines),
        len(kept),
    )


def _stopped(deadline: Deadline, ctx: Context, line: int, offset: int | None = None) -> bool:
    if not deadline.expired():
        return False
    ctx.issue(
        "read_limit",
        f"reading stopped at its time budget of {deadline.seconds:g} s; the records before "
        "were kept",
        line,
        offset,
    )
    return True


def _skip(text: str, pos: int) -> int:
    m = _BLANKS.match(text, pos)
    return pos if m is None else m.end()


def _read_compact(text: str, ctx: Context, deadline: Deadline) -> None:
    """Walk the top-level object key by key; values other than ``log_history`` are
    decoded and dropped, and damage after ``log_history`` loses none of its records."""
    decoder = json.JSONDecoder()
    pos = _skip(text, 0)
    history = False
    try:
        if not text.startswith("{", pos):
            raise json.JSONDecodeError("Expecting '{'", text, pos)
        pos = _skip(text, pos + 1)
        while not text.startswith("}", pos):
            key, pos = decoder.raw_decode(text, pos)
            if not isinstance(key, str):
                raise json.JSONDecodeError("Expecting property name", text, pos)
            pos = _skip(text, pos)
            if not text.startswith(":", pos):
                raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
            pos = _skip(text, pos + 1)
            if key == "log_history" and not history:
                end = _read_history(text, pos, decoder, ctx, deadline)
                if end is None:
                    return
                pos, history = end, True
            else:
                _, pos = decoder.raw_decode(text, pos)
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                pos = _skip(text, pos + 1)
            elif not text.startswith("}", pos):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
    except (ValueError, RecursionError) as exc:
        if history:
            _damage(text, exc, pos, ctx, "the object after log_history; its records were kept")
        else:
            _damage(text, exc, pos, ctx, "the object before log_history; nothing was kept")
        return
    if not history:
        ctx.issue("bad_json", "no log_history list in this trainer_state.json", 1)


def _read_history(
    text: str, pos: int, decoder: json.JSONDecoder, ctx: Context, deadline: Deadline
) -> int | None:
    """Read ``log_history`` record by record from ``pos``: where it ends, or None when
    reading stopped inside it (damage, the deadline)."""
    if not text.startswith("[", pos):
        ctx.issue("bad_json", "log_history is not a list", _line(text, pos), _offset(text, pos))
        return None
    pos = _skip(text, pos + 1)
    count = 0
    while not text.startswith("]", pos):
        start = pos
        if count and not count % _CHECK_EVERY and _stopped(
            deadline, ctx, _line(text, pos), _offset(text, pos)
        ):
            return None
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            kept = f"record {count + 1} of log_history; the {count} before it were kept"
            _damage(text, exc, start, ctx, kept)
            return None
        if isinstance(entry, dict):
            line = _line(text, start)
            _emit({k: (_float(v), line) for k, v in entry.items() if _is_number(v)}, ctx)
        count += 1
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        elif not text.startswith("]", pos):
            missing = json.JSONDecodeError("Expecting ',' delimiter", text, pos)
            _damage(text, missing, pos, ctx, f"log_history after record {count}, all kept")
            return None
    return pos + 1


def _damage(text: str, exc: Exception, start: int, ctx: Context, what: str) -> None:
    """A cut (the text ends inside the value) is ``truncated``; anything else
    ``bad_json``. Either is reported where the value that failed begins."""
    pos = exc.pos if isinstance(exc, json.JSONDecodeError) else start
    reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
    # Nothing closes after the failure: the text ended inside the value.
    closed = text.find("}", pos) >= 0 or text.find("]", pos) >= 0
    cut = reason.startswith("Unterminated string") or (
        isinstance(exc, json.JSONDecodeError) and not closed
    )
    line, offset = _line(text, start), _offset(text, start)
    if cut:
        ctx.issue("truncated", f"the file is cut inside {what}", line, offset)
    else:
        message = f"not valid JSON ({reason}, at character {pos}) in {what}"
        ctx.issue("bad_json", message, line, offset)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _offset(text: str, pos: int) -> int:
    head = text[:pos]
    return pos if head.isascii() else len(head.encode("utf-8"))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past the float range, as a writer would store it
        return math.inf if value > 0 else -math.inf


def _emit(record: dict[str, tuple[float, int]], ctx: Context) -> None:
    found = record.get("step")
    if found is None or math.isnan(found[0]) or math.isinf(found[0]):
        return
    step = int(found[0])
    ctx.votes["transformers"] += 1
    for key, (value, line) in record.items():
        if key not in SKIP:
            ctx.line = line
            ctx.point(RENAME.get(key, key), step, value)
