"""What a format parser is, and the key/value readers several formats share.

The readers split with str methods rather than scan with a regex: a regex that may
start a match at every character is the slowest thing a log reader can do, and
these tails are plain ``name: value`` / ``name=value`` lists.
"""

from __future__ import annotations

from typing import Protocol

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import number_value


def colon_pairs(text: str, skip: frozenset[str] = frozenset()) -> list[tuple[str, float]]:
    """The numeric ``name: value`` pairs of a blank-separated tail.

    Covers detectron2 (``iter: 19  total_loss: 2.3``), mmengine (``lr: 1e-3  loss: nan``),
    mmcv (``lr: 1e-3, loss: nan``) and Keras (``- loss: nan - accuracy: 0.1``).
    """
    out: list[tuple[str, float]] = []
    name: str | None = None
    for token in text.split():
        if name is not None:
            if name not in skip:
                raw = token.rstrip(",]")
                try:
                    out.append((name, float(raw)))  # inline: the common case, per field
                except ValueError:
                    value = number_value(raw)
                    if value is not None:
                        out.append((name, value))
            name = None
        elif len(token) > 1 and token[-1] == ":":
            name = token[:-1]
    return out


def equals_pairs(text: str, skip: frozenset[str] = frozenset()) -> list[tuple[str, float]]:
    """The numeric ``name=value`` pairs of a comma-separated tail (tqdm postfixes,
    fairseq's simple progress)."""
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        if not sep:
            continue
        words = name.split()
        if not words:
            continue
        name = words[-1]  # "100 / 1102 loss" -> "loss": a count may precede the first pair
        if name in skip:
            continue
        value = number_value(raw.strip().rstrip("]"))
        if value is not None:
            out.append((name, value))
    return out


class LineParser(Protocol):
    """One log format. A fresh instance reads one file, so it may keep state.

    ``triggers`` are plain substrings; ``parse`` runs only on records holding one
    of them, and returns True when it recognised the record (no other parser then
    sees it). ``repeats`` is explained on the attribute. A parser with a fast reader
    may also have ``bulk(lines, start, before, ctx) -> int``: take whole lines from
    ``lines[start]`` on (line numbers ``before + index + 1``) while they fit its
    learned shape, and return the index of the first line not taken.
    """

    framework: str
    triggers: tuple[str, ...]
    repeats: bool
    """True when the format's records come in runs: the parser that took the last
    records becomes the recent one, whose ``bulk`` (if it has one) may then take the
    following lines in one call (see ``dispatch``); False for one-off messages."""

    def parse(self, text: str, ctx: Context) -> bool: ...


class Fallback(LineParser, Protocol):
    """The parser for records no format parser took."""

    def wants(self, text: str) -> bool:
        """False when ``parse`` would surely not take ``text``. The answer must depend
        only on the characters of ``text`` other than digits, as the dispatcher keeps it
        per record shape."""
        ...
