"""Hugging Face ``trainer_state.json``: the ``log_history`` list, one dict per log call.

The Trainer writes it with ``indent=2`` and Python's json, so a NaN loss is the bare
token ``NaN``. Records are read line by line, so a file cut mid-write keeps every
record before the cut and each point knows its line; a file written compactly (all
on one line) falls back to the json module.
"""

from __future__ import annotations

import json
import math
import re

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.hf import RENAME, SKIP
from analyzer.ingest.logformats.numbers import number_value

_FIELD = re.compile(r'\s*+"([^"\\]*+)":\s*+(\S++)')
_START = re.compile(r'\s*+"log_history":\s*+\[')


def read_trainer_state(text: str, ctx: Context) -> None:
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None or lines[start].rstrip().endswith("]") or len(lines) < 4:
        _read_compact(text, ctx)
        return
    record: dict[str, tuple[float, int]] | None = None
    for i in range(start + 1, len(lines)):
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
    )


def _read_compact(text: str, ctx: Context) -> None:
    try:
        state = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        line = exc.lineno if isinstance(exc, json.JSONDecodeError) else 1
        ctx.issue("bad_json", f"not valid JSON: {exc}", line)
        return
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        ctx.issue("bad_json", "no log_history list in this trainer_state.json", 1)
        return
    for entry in history:
        if isinstance(entry, dict):
            values = {
                k: (float(v), 1)
                for k, v in entry.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
            _emit(values, ctx)


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
