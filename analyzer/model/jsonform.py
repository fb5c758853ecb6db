"""Records as JSON values: one field-driven encoder for every record of the package.

A dataclass becomes an object of its fields, in their order, followed by the derived
values its class names in ``JSON_EXTRA`` (a property's name, or a ``(key, property)``
pair), values a reader should not have to recompute, such as a tensor's L2 norm. A
field's metadata can shape its part (see :func:`json_meta`): left out, written under
another key, its record's fields written inline in the parent object, or some fields of
the records below it left out. Tuples and lists become arrays, mappings objects with
string keys, numpy scalars and arrays plain numbers and arrays. NaN and the infinities,
which JSON lacks, become the strings ``"nan"``, ``"inf"`` and ``"-inf"``, so the result
always passes ``json.dumps(..., allow_nan=False)``.

:mod:`analyzer.model.schema` reads the same metadata to write the JSON Schema, so the
document and its schema cannot drift apart.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import Field, fields, is_dataclass
from typing import Any

import numpy as np

Fallback = Callable[[Any], Any]
"""What to make of a value the encoder does not know; by default it is an error."""


def json_meta(
    *, omit: bool = False, key: str | None = None, inline: bool = False, drop: Collection[str] = ()
) -> dict[str, Any]:
    """A field's JSON form, as ``dataclasses.field(metadata=json_meta(...))``: ``omit``
    leaves it out (arrays a report summarises instead), ``key`` writes it under another
    name, ``inline`` writes the fields of its record in the parent object, ``drop`` leaves
    the named fields out of every record below it (what the document gives once,
    elsewhere)."""
    return {"json": {"omit": omit, "key": key, "inline": inline, "drop": tuple(drop)}}


def _meta(f: Field[Any]) -> dict[str, Any]:
    """A field's JSON metadata; ``{"json": False}`` is short for ``omit``."""
    meta = f.metadata.get("json", {})
    return {"omit": True} if meta is False else dict(meta)


def dropped(f: Field[Any]) -> tuple[str, ...]:
    """The fields left out of the records below ``f``."""
    return tuple(_meta(f).get("drop", ()))


def members(cls: type) -> Iterator[tuple[str, str, Field[Any] | None]]:
    """The JSON members of a record class, in order: (key, attribute, field), the field
    None for a derived value of ``JSON_EXTRA``; an ``inline`` field is given as itself,
    its key the empty string."""
    for f in fields(cls):
        meta = _meta(f)
        if meta.get("omit"):
            continue
        yield ("" if meta.get("inline") else meta.get("key") or f.name), f.name, f
    for extra in getattr(cls, "JSON_EXTRA", ()):
        key, attr = (extra, extra) if isinstance(extra, str) else extra
        yield key, attr, None


def _refuse(value: Any) -> Any:
    raise TypeError(f"no JSON form for {type(value).__name__}")


def encode(value: Any, *, drop: Collection[str] = (), fallback: Fallback = _refuse) -> Any:
    """``value`` as JSON values. ``drop`` names fields left out of every record inside
    ``value``; ``fallback`` turns a value the encoder does not know into a JSON one."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, enum.Enum):
        return encode(value.value, drop=drop, fallback=fallback)
    if is_dataclass(value) and not isinstance(value, type):
        return _record(value, frozenset(drop), fallback)
    if isinstance(value, Mapping):
        return {str(k): encode(v, drop=drop, fallback=fallback) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v, drop=drop, fallback=fallback) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        return encode(value.tolist(), drop=drop, fallback=fallback)
    return encode(fallback(value), drop=drop)


def _record(value: Any, drop: frozenset[str], fallback: Fallback) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, attr, f in members(type(value)):
        if f is not None and f.name in drop:
            continue
        below = drop | frozenset(dropped(f)) if f else drop
        part = encode(getattr(value, attr), drop=below, fallback=fallback)
        if key:
            out[key] = part
        elif isinstance(part, dict):
            out.update(part)
    return out


def _number(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
