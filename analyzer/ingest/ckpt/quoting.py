"""What a message may say about the bytes of the file it is about.

Reports get shared, and a file named like a checkpoint may be a link to anything. A
message therefore quotes only what a checkpoint format defines as a name (a tensor, a
zip member, a shard, a global), cut to a length, and describes any other value by its
type and size. Text that other libraries put in their exceptions (json, pickletools,
torch) can carry a piece of the file in quotes; :func:`foreign` takes those pieces out.
"""

from __future__ import annotations

import re

NAME_LIMIT = 80
"""Characters of a name quoted in a message."""

_TOKEN = re.compile(r"[A-Z0-9_]{1,12}")
"""A string value quoted as it is: the shape of a safetensors dtype (``F8_E4M3``)."""
_QUOTED = re.compile(r"""b?'(?:[^'\\\n]|\\.){0,2000}'|b?"(?:[^"\\\n]|\\.){0,2000}\"""")


def quote(text: str) -> str:
    """``text`` quoted, cut to :data:`NAME_LIMIT` characters (the length said past it)."""
    if len(text) <= NAME_LIMIT:
        return repr(text)
    return f"{text[:NAME_LIMIT]!r}... ({len(text):,} characters)"


def value(item: object) -> str:
    """A short description of a JSON value read from a header: a number, a dtype-like
    token (capitals, digits, underscores) or a short list of integers as it is; anything
    else by its type and size."""
    if isinstance(item, bool) or item is None:
        return repr(item)
    if isinstance(item, int | float):
        return repr(item) if len(repr(item)) <= 24 else f"a number of {len(repr(item))} digits"
    if isinstance(item, str):
        return repr(item) if _TOKEN.fullmatch(item) else f"a string of {len(item):,} characters"
    if isinstance(item, list):
        if len(item) <= 8 and all(isinstance(v, int) and len(repr(v)) <= 24 for v in item):
            return repr(item)
        return f"a list of {len(item):,} items"
    if isinstance(item, dict):
        return f"an object of {len(item):,} keys"
    return type(item).__name__


def foreign(message: str, limit: int = 300) -> str:
    """Another library's error text, first line only, with quoted pieces replaced: they
    may be bytes of the file (``invalid literal for int(): b'...'``)."""
    lines = message.strip().splitlines()
    first = lines[0] if lines else ""
    return _QUOTED.sub("'...'", first)[:limit]
