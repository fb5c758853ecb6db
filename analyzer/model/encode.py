"""Records as JSON values."""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """A value made of dicts, lists and numbers, ready for strict JSON: NaN and the
    infinities (which JSON lacks) become the strings "nan", "inf" and "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
