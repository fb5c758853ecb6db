"""A :class:`Report` as versioned JSON: the machine contract.

The document is the records' own JSON form (:func:`analyzer.model.jsonform.encode`): each record
says in its fields which of them the document holds and how, and
:mod:`analyzer.model.schema` writes the JSON Schema from the same fields
(docs/report.schema.json, described in docs/report.md). ``schema_version`` changes
whenever a field changes meaning or disappears. The document holds no wall-clock values of
the analysis itself, so two analyses of the same folder give the same document.
"""

from __future__ import annotations

import json
from typing import Any

from analyzer.model import Report, encode


def to_dict(report: Report) -> dict[str, Any]:
    data: dict[str, Any] = encode(report)
    return data


def to_json(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, allow_nan=False)
