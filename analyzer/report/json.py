"""A :class:`Report` as versioned JSON: the machine contract.

The document is the records' own JSON form (:func:`analyzer.model.jsonform.encode`): each record
says in its fields which of them the document holds and how, and
:mod:`analyzer.model.schema` writes the JSON Schema from the same fields
(docs/report.schema.json, described in docs/report.md). ``schema_version`` changes
whenever a field changes meaning or disappears. The document holds no wall-clock values of
the analysis itself, so two analyses of the same folder give the same document.

:func:`json_chunks` gives the same text in pieces, one run at a time, so that the report of
a fleet of thousands of runs is written without holding its whole document (and the
objects behind it) at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from analyzer.model import Report, encode
from analyzer.model.jsonform import members

_INDENT = 2
_RUNS = '"runs": []'


def to_dict(report: Report) -> dict[str, Any]:
    data: dict[str, Any] = encode(report)
    return data


def to_json(report: Report) -> str:
    return "".join(json_chunks(report))


def json_chunks(report: Report) -> Iterator[str]:
    """The text of :func:`to_json` in pieces: the document around its runs, then each run
    encoded and written on its own. Joined, the pieces are exactly
    ``json.dumps(to_dict(report), indent=2)``."""
    outer: dict[str, Any] = encode(replace(report, results=()))
    for key, attr, f in members(Report):  # derived values are the whole report's
        if f is None:
            outer[key] = encode(getattr(report, attr))
    shell = json.dumps(outer, indent=_INDENT, allow_nan=False)
    key = "\n" + " " * _INDENT + _RUNS
    at = shell.find(key)
    if at < 0 or not report.results:  # nothing to write run by run
        yield json.dumps(to_dict(report), indent=_INDENT, allow_nan=False)
        return
    yield shell[:at + len(key) - 1] + "\n"  # up to the runs' opening bracket
    pad = " " * (2 * _INDENT)
    last = len(report.results) - 1
    for k, result in enumerate(report.results):
        text = json.dumps(encode(result), indent=_INDENT, allow_nan=False)
        yield pad + text.replace("\n", "\n" + pad) + (",\n" if k < last else "\n")
    yield " " * _INDENT + "]" + shell[at + len(key):]
