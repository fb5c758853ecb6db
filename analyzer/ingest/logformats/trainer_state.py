"""Hugging Face ``trainer_state.json``: the ``log_history`` list, one dict per log call.

The Trainer writes it with ``indent=2``, ``sort_keys=True`` and Python's json, so a NaN
loss is the bare token ``NaN``. Such a file is read line by line, so that each point
knows its line. A file written compactly (all on one line) is read record by record
with the json module's decoder (``raw_decode``), so that a cut one keeps its whole
records as well (see ``trainer_state_compact``; ``trainer_state_records`` gathers the
fields of both into records). Policy, one rule per kind:

- ``truncated``: the file ends inside ``log_history`` (a save cut mid-write): every whole
  record before the cut is kept; the issue gives the line and byte offset of the record
  that was cut;
- ``bad_json``: the JSON is malformed before the end of ``log_history``: the records
  before the damage are kept and reading stops there; no ``log_history`` list at all is
  reported the same way;
- ``zero_tail``: the file ends in NUL bytes (its size was written, its data never): they
  are dropped and the text before them is read;
- ``zero_run``: a run of NUL bytes with text after it (a block that never reached the
  disk, whose bytes are lost) is skipped as a break between JSON tokens, never glued
  into one, and between records: the fields before it and those after it are never
  taken for one record's, as the lost bytes may have held the end of one record and the
  start of the next. The fields before it are kept when they hold their record's step,
  those after it when the rest of the record (its closing brace) holds it; a token the
  run cut is lost. A run between two records loses nothing. Runs are reported as a
  text log's are (``logformats.source``): line, byte offset and length, the first
  ``HOLES_LISTED`` one by one, then a summary;
- ``read_limit``: the time budget ran out: the records before are kept.

Lines and byte offsets are counted on from the last one asked for, never again from
the start, so a file costs time in proportion to its size.

A record's ``step`` is ``state.global_step`` when ``log`` was called: the optimizer steps
taken so far, from 1, which the Trainer's ``TensorBoardCallback`` writes at too
(:data:`GLOBAL_STEP`).
"""

from __future__ import annotations

import itertools
import re

from analyzer.ingest.logformats import trainer_state_records as state_records
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import number_value
from analyzer.ingest.logformats.source import HOLES_LISTED, report_hole, report_holes
from analyzer.ingest.logformats.trainer_state_compact import read_compact
from analyzer.ingest.logformats.trainer_state_records import Records, stopped
from analyzer.ingest.safeio import Deadline
from analyzer.model import StepAxis

GLOBAL_STEP = StepAxis("global", label="global_step")
"""``log_history[].step``: the Trainer's global step."""
_FIELD = re.compile(r'\s*+"([^"\\]*+)":\s*+(\S++)')
_START = re.compile(r'[\s\x00]*+"log_history":[\s\x00]*+\[')
_NULS = re.compile(rb"\x00+")
_HOLES = re.compile("\x00+")
_WHOLE = re.compile(
    r"\s*+(?:[{}\]],?+\s*+\x00?+"
    r'|"[^"\\\x00]*+"[ \t]*+:[ \t]*+(?:"(?:[^"\\\x00]|\\[^\x00])*+"|[^\s\x00,"]++)'
    r"(?:[ \t]*+,\s*+\x00?+|[ \t\r]*+)|\x00)?+"
)
"""A piece of a line between runs of NULs that a run cut no token of: blank, a bracket or
a field, with the NUL of the run after it if there is one. A field a run follows must
end in its comma: a bare value right before a run may have gone on in the lost bytes."""


def read_trainer_state(data: bytes, ctx: Context, deadline: Deadline | None = None) -> None:
    budget = Deadline() if deadline is None else deadline
    ctx.axis = GLOBAL_STEP
    kept = data.rstrip(b"\x00")
    holes = b"\x00" in kept
    if holes or len(kept) < len(data):
        _report_holes(data, ctx)
    text = kept.decode("utf-8", errors="replace")
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None or lines[start].rstrip(" \t\r\x00").endswith("]") or len(lines) < 4:
        read_compact(text, ctx, budget)
        return
    count = len(lines)
    numbers = None
    if holes:
        lines, numbers = _pieces(lines, start)
    records = Records(ctx)
    for i in range(start + 1, len(lines)):
        number = i + 1 if numbers is None else numbers[i]
        if not (i - start) % state_records.CHECK_EVERY and stopped(budget, ctx, number):
            return
        line = lines[i]
        if holes and line == _HOLE:
            records.hole()
            continue
        stripped = line.strip()
        record = records.record
        if record is None:
            if stripped == "{":
                records.open()
                continue
            if stripped.startswith("]"):
                return
            if not records.adrift:
                continue
        elif stripped.startswith("}"):
            records.close()
            continue
        m = _FIELD.match(line)
        if m is not None:
            value = number_value(m.group(2).rstrip(","))
            if value is None:
                continue
            if record is None:
                records.field(m.group(1), value, number)
            else:  # what Records.field does in a record, without the call
                record[m.group(1)] = (value, number)
    ctx.issue(
        "truncated",
        "log_history ends before its closing bracket; records up to here were kept",
        count,
        len(kept),
    )


_HOLE = "\x00"
"""What ``_pieces`` puts for a run of NULs."""


def _pieces(lines: list[str], start: int) -> tuple[list[str], list[int]]:
    """The lines from ``start`` with each one that holds NULs replaced by its pieces
    between runs, and a mark for each run; the line number of each. A piece a run cut
    a token of is left out."""
    out, numbers = lines[: start + 1], list(range(1, start + 2))
    # A run may have taken the newline after the list's bracket: read what follows it.
    head = _START.match(lines[start])
    rest = [(start + 1, lines[start][head.end() :])] if head is not None else []
    for number, line in itertools.chain(rest, enumerate(lines[start + 1 :], start + 2)):
        if "\x00" not in line:
            out.append(line)
            numbers.append(number)
            continue
        pieces = _HOLES.split(line)
        for k, piece in enumerate(pieces):
            if k:
                out.append(_HOLE)
                numbers.append(number)
            # A piece a run follows is whole only if it would be with the run after it.
            whole = _WHOLE.fullmatch(piece if k == len(pieces) - 1 else piece + "\x00")
            if whole and piece.strip():
                out.append(piece)
                numbers.append(number)
    return out, numbers


_AROUND = (
    "a hole in the text; the records around it are read, and a record it falls in keeps "
    "its fields before it only when they hold its step"
)


def _report_holes(data: bytes, ctx: Context) -> None:
    """Each run of NUL bytes of the file, as a text log's are reported."""
    line, counted, listed = 1, 0, 0
    first: tuple[int, int] | None = None
    for m in _NULS.finditer(data):
        start, end = m.span()
        line += data.count(b"\n", counted, start)
        counted = start
        if first is None:
            first = (line, start)
        if end == len(data):
            report_hole(ctx, end - start, True, line, start)
            return
        if listed == HOLES_LISTED:
            break
        report_hole(ctx, end - start, False, line, start, _AROUND)
        listed += 1
    else:
        return
    # More runs than are listed: counted in C, the tail still said.
    kept = data.rstrip(b"\x00")
    if len(kept) < len(data):
        report_hole(ctx, len(data) - len(kept), True, kept.count(b"\n") + 1, len(kept))
    report_holes(ctx, _NULS.subn(b"", data)[1], data.count(0), listed, *first)
