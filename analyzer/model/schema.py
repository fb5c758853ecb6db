"""The JSON Schema of the report, written from the records themselves.

The schema is derived from the same things the encoder (:mod:`analyzer.model.jsonform`)
follows: each record's fields and their types, their JSON metadata and ``JSON_EXTRA``.
So a field added to a record is in the schema at once; ``docs/report.schema.json`` holds
the result (``python -m analyzer.model.schema > docs/report.schema.json``, or ``make
golden``), and a test checks the committed file against this module and every golden
report against the file. Records are closed objects (``additionalProperties: false``)
and every member is required: a reader may rely on each key being present, null where
the value is absent.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any

from analyzer.model.jsonform import dropped, members

DIALECT = "https://json-schema.org/draft/2020-12/schema"
FLOAT: dict[str, Any] = {
    "description": "A float; NaN and the infinities, which JSON lacks, as strings.",
    "anyOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}],
}


class _Writer:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {"Float": FLOAT}
        self.names = _record_names()

    def record(self, cls: type, drop: frozenset[str]) -> dict[str, Any]:
        applied = drop & {f.name for f in dataclasses.fields(cls)}
        name = cls.__name__ + "".join("No" + d.title().replace("_", "") for d in sorted(applied))
        if name not in self.defs:
            self.defs[name] = {}  # a placeholder while its members are written
            self.defs[name] = self._object(cls, drop)
        return {"$ref": f"#/$defs/{name}"}

    def _object(self, cls: type, drop: frozenset[str]) -> dict[str, Any]:
        hints = typing.get_type_hints(cls, localns=self.names)
        props: dict[str, Any] = {}
        for key, attr, f in members(cls):
            if f is not None and f.name in drop:
                continue
            if f is None:
                prop = getattr(cls, attr)
                hint = typing.get_type_hints(prop.fget, localns=self.names)["return"]
                props[key] = self.type(hint, drop)
                continue
            below = drop | frozenset(dropped(f))
            if key:
                props[key] = self.type(hints[f.name], below)
            else:  # inline: the record's members stand in this object
                inner = self.defs[self.record(hints[f.name], below)["$ref"].rsplit("/", 1)[1]]
                props.update(inner["properties"])
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        return {"type": "object", "description": " ".join(doc.split()),
                "properties": props, "required": list(props), "additionalProperties": False}

    def type(self, hint: Any, drop: frozenset[str]) -> dict[str, Any]:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if hint is type(None) or hint is None:
            return {"type": "null"}
        if hint is bool:
            return {"type": "boolean"}
        if hint is int:
            return {"type": "integer"}
        if hint is float:
            return {"$ref": "#/$defs/Float"}
        if hint is str:
            return {"type": "string"}
        if hint in (Any, object):
            return {}
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            return self.record(hint, drop)
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin in (types.UnionType, typing.Union):
            return {"anyOf": [self.type(a, drop) for a in args]}
        if origin in (tuple, list):
            return {"type": "array", "items": self.type(args[0], drop)}
        if origin in (dict, Mapping):
            return {"type": "object", "additionalProperties": self.type(args[1], drop)}
        raise TypeError(f"no JSON Schema for the type {hint!r}")


def _record_names() -> dict[str, Any]:
    """Every name of the model package, to resolve the records' annotations (written as
    strings, some only imported for type checking)."""
    import analyzer.model as model

    names = {name: getattr(model, name) for name in model.__all__}
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("analyzer.model."):
            names.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    return names


def report_schema() -> dict[str, Any]:
    """The JSON Schema of ``forensics analyze --json``'s document."""
    from analyzer.model.results import Report

    writer = _Writer()
    top = writer.record(Report, frozenset())
    name = top["$ref"].rsplit("/", 1)[1]
    return {"$schema": DIALECT, "title": "NaN Forensics report", **writer.defs.pop(name),
            "$defs": dict(sorted(writer.defs.items()))}


def main() -> int:
    json.dump(report_schema(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
