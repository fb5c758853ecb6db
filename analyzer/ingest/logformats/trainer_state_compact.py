"""A ``trainer_state.json`` not in the Trainer's indented layout (one written compactly,
all on one line): read with the json module's decoder, record by record, so that a cut
or damaged file keeps its records before the damage. The policy is ``trainer_state``'s.

A file with runs of NUL bytes is read token by token instead (one ``raw_decode`` per key
and per value, not per record), so that each run stands between two tokens.
"""

from __future__ import annotations

import json
import math
import re

from analyzer.ingest.logformats import trainer_state_records as state_records
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.trainer_state_records import Records, emit, stopped
from analyzer.ingest.safeio import Deadline

_BLANKS = re.compile(r"[ \t\n\r\x00]*+")
"""JSON's blanks, and the NULs of a hole, which stands between two tokens."""
_PLAIN_BLANKS = re.compile(r"[ \t\n\r]*+")
_HISTORY_KEY = re.compile(r'"log_history"[ \t\n\r\x00]*+:')
_RESYNC = re.compile(r'[,{\[][ \t\n\r\x00]*+(?=["{])')
"""Where a member or a record may start again after a token a hole cut."""
_TOKEN = re.compile(r"[^ \t\n\r,:\[\]{}\x00]*+")
_Error = (ValueError, RecursionError)


class Where:
    """Lines and byte offsets of positions in ``text``, each counted on from the one
    asked for before it (positions come in increasing order), so that all the lookups
    of a file cost one pass over it."""

    __slots__ = ("ascii", "byte", "byte_at", "line_at", "lines", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.ascii = text.isascii()
        self.line_at, self.lines = 0, 1
        self.byte_at, self.byte = 0, 0

    def line(self, pos: int) -> int:
        if pos < self.line_at:
            self.line_at, self.lines = 0, 1
        self.lines += self.text.count("\n", self.line_at, pos)
        self.line_at = pos
        return self.lines

    def offset(self, pos: int) -> int:
        if self.ascii:
            return pos
        if pos < self.byte_at:
            self.byte_at, self.byte = 0, 0
        self.byte += len(self.text[self.byte_at : pos].encode("utf-8"))
        self.byte_at = pos
        return self.byte


def _skip(text: str, pos: int, blanks: re.Pattern[str] = _BLANKS) -> int:
    m = blanks.match(text, pos)
    return pos if m is None else m.end()


def read_compact(text: str, ctx: Context, deadline: Deadline) -> None:
    """Walk the top-level object key by key; values other than ``log_history`` are
    decoded and dropped, and damage after ``log_history`` loses none of its records."""
    decoder = json.JSONDecoder()
    where = Where(text)
    holes = "\x00" in text
    pos = _skip(text, 0)
    history = False
    since = 0  # where the member being read began, the blanks before it included
    try:
        if not text.startswith("{", pos):
            raise json.JSONDecodeError("Expecting '{'", text, pos)
        since, pos = pos, _skip(text, pos + 1)
        while not text.startswith("}", pos):
            key, pos = decoder.raw_decode(text, pos)
            if not isinstance(key, str):
                raise json.JSONDecodeError("Expecting property name", text, pos)
            pos = _skip(text, pos)
            if not text.startswith(":", pos):
                raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
            pos = _skip(text, pos + 1)
            if key == "log_history" and not history:
                end = _history(text, pos, decoder, ctx, deadline, where, holes)
                if end is None:
                    return
                pos, history = end, True
            else:
                _, pos = decoder.raw_decode(text, pos)
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                since, pos = pos, _skip(text, pos + 1)
            elif not text.startswith("}", pos):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
    except _Error as exc:
        if history:
            kept = "the object after log_history; its records were kept"
            _damage(text, exc, pos, ctx, where, kept)
            return
        found = _HISTORY_KEY.search(text, pos) if _holed(text, exc, since, pos) else None
        if found is None:
            _damage(text, exc, pos, ctx, where, "the object before log_history; nothing was kept")
        else:  # a hole cut a value before log_history: read on from its key
            _history(text, _skip(text, found.end()), decoder, ctx, deadline, where, holes)
        return
    if not history:
        ctx.issue("bad_json", "no log_history list in this trainer_state.json", 1)


def _history(
    text: str,
    pos: int,
    decoder: json.JSONDecoder,
    ctx: Context,
    deadline: Deadline,
    where: Where,
    holes: bool,
) -> int | None:
    """Read ``log_history`` from ``pos``: where it ends, or None when reading stopped
    inside it (damage, the deadline)."""
    if not text.startswith("[", pos):
        ctx.issue("bad_json", "log_history is not a list", where.line(pos), where.offset(pos))
        return None
    if holes:
        return _holed_history(text, pos + 1, decoder, Records(ctx), deadline, where)
    pos = _skip(text, pos + 1)
    count = 0
    while not text.startswith("]", pos):
        start = pos
        if (
            count
            and not count % state_records.CHECK_EVERY
            and stopped(deadline, ctx, where.line(pos), where.offset(pos))
        ):
            return None
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except _Error as exc:
            kept = f"record {count + 1} of log_history; the {count} before it were kept"
            _damage(text, exc, start, ctx, where, kept)
            return None
        if isinstance(entry, dict):
            line = where.line(start)
            emit({k: (_float(v), line) for k, v in entry.items() if _is_number(v)}, ctx)
        count += 1
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        elif not text.startswith("]", pos):
            missing = json.JSONDecodeError("Expecting ',' delimiter", text, pos)
            _damage(text, missing, pos, ctx, where, f"log_history after record {count}, all kept")
            return None
    return pos + 1


def _holed_history(
    text: str,
    pos: int,
    decoder: json.JSONDecoder,
    records: Records,
    deadline: Deadline,
    where: Where,
) -> int | None:
    """``log_history`` from after its '[' in a file with holes, token by token: where it
    ends, or None when reading stopped inside it."""
    ctx = records.ctx
    inside = False  # inside a record: a key or '}' is due, else a record or ']'
    due = False  # a value was just read: a delimiter is due
    fragile = False  # a run was met since the last record began: what follows may be bogus
    steps = 0
    while True:
        steps += 1
        if not steps % state_records.CHECK_EVERY and stopped(
            deadline, ctx, where.line(pos), where.offset(pos)
        ):
            return None
        last, pos = pos, _skip(text, pos)
        if text.find("\x00", last, pos) >= 0:
            records.hole()
            fragile = True
        try:
            if due:
                due = False
                if text.startswith(",", pos):
                    pos += 1
                elif inside and text.startswith("}", pos):
                    records.close()
                    inside, due, pos = False, True, pos + 1
                elif not inside and text.startswith("]", pos):
                    return pos + 1
                else:
                    raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
            elif not inside:
                if text.startswith("]", pos):
                    return pos + 1
                if text.startswith("{", pos):
                    records.open()
                    inside, fragile, pos = True, False, pos + 1
                elif records.adrift and text.startswith('"', pos):
                    inside = True  # a run took the record's start: its members go on
                    pos = _member(text, pos, decoder, records, where)
                    due = True
                else:  # an entry that is not a record: skipped, as when read whole
                    _, pos = decoder.raw_decode(text, pos)
                    due = True
            elif text.startswith("}", pos):
                records.close()
                inside, due, pos = False, True, pos + 1
            else:
                pos = _member(text, pos, decoder, records, where)
                due = True
        except _Error as exc:
            if not fragile and not _holed(text, exc, last, pos):
                _damage(text, exc, pos, ctx, where, "log_history; the records before were kept")
                return None
            # A hole cut the token: what is left of it is lost; read on where a member
            # or a record starts again.
            records.hole()
            fragile = True
            found = _RESYNC.search(text, pos)
            if found is None:
                message = "the file is cut inside log_history, after a run of NUL bytes"
                ctx.issue("truncated", message, where.line(pos), where.offset(pos))
                return None
            if text.startswith("{", found.start()):
                inside, pos = False, found.start()
            else:
                inside, pos = text.startswith('"', found.end()), found.end()


def _member(text: str, pos: int, decoder: json.JSONDecoder, records: Records, where: Where) -> int:
    """Read the key and value at ``pos``, with no hole inside the member: where it ends."""
    key, end = decoder.raw_decode(text, pos)
    if not isinstance(key, str):
        raise json.JSONDecodeError("Expecting property name", text, pos)
    colon = _skip(text, end, _PLAIN_BLANKS)
    if not text.startswith(":", colon):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, colon)
    value, end = decoder.raw_decode(text, _skip(text, colon + 1, _PLAIN_BLANKS))
    if text.startswith("\x00", end) and not isinstance(value, str | list | dict):
        # The number may go on past the hole: which it was is not known.
        raise json.JSONDecodeError("a run of NUL bytes right after a value", text, end)
    if _is_number(value):
        records.field(key, _float(value), where.line(pos))
    return end


def _holed(text: str, exc: Exception, last: int, pos: int) -> bool:
    """True when a run of NULs lies between ``last`` and the end of the token where
    ``exc`` failed (the decoder names where a token starts: ``N`` for a cut ``NaN``)."""
    failed = max(exc.pos if isinstance(exc, json.JSONDecodeError) else pos, pos)
    token = _TOKEN.match(text, failed)
    return text.find("\x00", last, (failed if token is None else token.end()) + 1) >= 0


def _damage(text: str, exc: Exception, start: int, ctx: Context, where: Where, what: str) -> None:
    """A cut (the text ends inside the value) is ``truncated``; anything else
    ``bad_json``. Either is reported where the value that failed begins."""
    pos = exc.pos if isinstance(exc, json.JSONDecodeError) else start
    reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
    # Nothing closes after the failure: the text ended inside the value.
    closed = text.find("}", pos) >= 0 or text.find("]", pos) >= 0
    cut = reason.startswith("Unterminated string") or (
        isinstance(exc, json.JSONDecodeError) and not closed
    )
    line, offset = where.line(start), where.offset(start)
    if cut:
        ctx.issue("truncated", f"the file is cut inside {what}", line, offset)
    else:
        message = f"not valid JSON ({reason}, at character {pos}) in {what}"
        ctx.issue("bad_json", message, line, offset)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past the float range, as a writer would store it
        return math.inf if value > 0 else -math.inf
