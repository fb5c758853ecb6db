"""Records as JSON values: one field-driven encoder for every record of the package.

A dataclass becomes an object of its fields, in their order, followed by the properties
its class names in ``JSON_EXTRA`` (derived values a reader should not have to recompute,
such as a tensor's L2 norm); a field whose metadata says ``{"json": False}`` is left out.
Tuples and lists become arrays, mappings objects with string keys, numpy scalars and
arrays plain numbers and arrays. NaN and the infinities, which JSON lacks, become the
strings ``"nan"``, ``"inf"`` and ``"-inf"``, so the result always passes
``json.dumps(..., allow_nan=False)``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

Fallback = Callable[[Any], Any]
"""What to make of a value the encoder does not know; by default it is an error."""


def _refuse(value: Any) -> Any:
    raise TypeError(f"no JSON form for {type(value).__name__}")


def encode(value: Any, *, drop: Collection[str] = (), fallback: Fallback = _refuse) -> Any:
    """``value`` as JSON values. ``drop`` names fields left out of every record inside
    ``value`` (a report that lists read issues once drops them from the records that also
    hold them); ``fallback`` turns an unknown value into a JSON one."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, enum.Enum):
        return encode(value.value, drop=drop, fallback=fallback)
    if is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in fields(value):
            if f.name in drop or not f.metadata.get("json", True):
                continue
            out[f.name] = encode(getattr(value, f.name), drop=drop, fallback=fallback)
        for name in getattr(type(value), "JSON_EXTRA", ()):
            out[name] = encode(getattr(value, name), drop=drop, fallback=fallback)
        return out
    if isinstance(value, Mapping):
        return {str(k): encode(v, drop=drop, fallback=fallback) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v, drop=drop, fallback=fallback) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        return encode(value.tolist(), drop=drop, fallback=fallback)
    return encode(fallback(value), drop=drop)


def _number(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
