"""Shared pieces of the fast line readers.

A format whose lines repeat one shape (the same field names in the same order, only
the numbers changing) learns that shape from a line its plain parser has read, and
then matches the following lines with one compiled pattern that captures the
numbers as strings. A line the pattern does not take in full goes to the plain
parser, so the fast reader only ever handles lines whose outcome it can tell in
advance; ``tests/test_logs_reading.py`` compares both readers on every fixture and on
generated lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.store import Block, Row

ENABLED = True
"""Switch for the fast readers; the oracle tests turn it off to get the plain path."""

LEARN_CHARS = 4096
"""Shapes are learned from lines up to this long: a dense log line is a few hundred
characters, and a pattern built from a huge line would cost more to compile than
it could save."""

DECIMAL = r"[-+]?+(?:\d{1,40}+(?:\.\d{0,40}+)?+|\.\d{1,40}+)(?:[eE][-+]?+\d{1,2}+)?+(?![\d.eE])"
"""A number token that ``float`` reads exactly as the plain parsers do, and always to a
finite value: at most 40 digits before the point and a two-digit exponent stay far
from the float range, so a value that overflows to inf is left to the plain parser,
which may have something to say about it. Bounded repetitions keep a field short."""

_DECIMAL_TOKEN = re.compile("(" + DECIMAL + r")([,\]]*+)")
_BLANKS = re.compile(r"(\s++)")


def _blank_run(run: str) -> str:
    """A pattern for blank runs like ``run``: the plain readers split on any whitespace,
    but a class of literal blanks matches several times faster than ``\\s``, and the
    logs these shapes serve pad with spaces (mmcv with a tab). A run of other blanks
    keeps ``\\s``; a line that pads differently from the learned one goes to the plain
    parser."""
    if run.strip(" ") == "":
        return " ++"
    if run.strip(" \t") == "":
        return r"[ \t]++"
    return r"\s++"


def colon_shape(tail: str, skip: frozenset[str]) -> tuple[str, list[str]] | None:
    """A pattern for tails shaped like this one under ``base.colon_pairs``, and the
    names of the pairs it captures, in order.

    ``colon_pairs`` splits on blanks and takes the token after each ``name:`` token
    as its value. The pattern repeats every token literally except the values: a kept
    value becomes a captured decimal (with the ``,``/``]`` that followed it), a
    skipped value any token. A kept value that is not a plain decimal gives no shape.
    Blanks between tokens are matched by the kind of blanks the learned line had.
    """
    parts: list[str] = []
    names: list[str] = []
    name: str | None = None
    pieces = _BLANKS.split(tail.strip())
    for at in range(0, len(pieces), 2):
        token = pieces[at]
        if at:
            parts.append(_blank_run(pieces[at - 1]))
        if name is not None:
            if name in skip:
                parts.append(r"\S++")
            else:
                m = _DECIMAL_TOKEN.fullmatch(token)
                if m is None:
                    return None
                parts.append("(" + DECIMAL + ")" + re.escape(m.group(2)))
                names.append(name)
            name = None
            continue
        parts.append(re.escape(token))
        if len(token) > 1 and token[-1] == ":":
            name = token[:-1]
    if not names:
        return None
    return r"\s*+" + "".join(parts) + r"\s*+", names






class Shape:
    """A learned line shape and where its points go.

    ``pattern`` is matched in full from the position of the format's header word;
    ``line`` is the same pattern preceded by a prefix that finds that word's first
    occurrence, for whole lines. Groups are ``skip`` counters, then one value per tag.
    ``block`` has a stepper that turns the counters into steps in bulk; ``step_of``
    does it for one row, for the step an event may need.
    """

    __slots__ = ("block", "line", "pattern", "step_of", "window")

    def __init__(
        self, prefix: str, pattern: str, block: Block, step_of: Callable[[Row], int]
    ) -> None:
        self.pattern = re.compile(pattern)
        self.line = re.compile(prefix + pattern)
        self.block = block
        self.step_of = step_of
        self.window = 1

    def take(self, row: Row, ctx: Context, framework: str) -> None:
        """One record read by ``pattern``: what the plain parser would have stored."""
        step = self.step_of(row)
        block = self.block
        if ctx.rank != block.rank:
            block = ctx.store.block(block.tags, ctx.rank, block.skip, block.stepper)
        ctx.store.add(block, step, ctx.line, row)
        ctx.last_step = step
        ctx.votes[framework] += 1

    def bulk(self, lines: list[str], start: int, before: int, ctx: Context, framework: str) -> int:
        """Take the lines from ``start`` on while they match; the index of the first
        line not taken. Lines are matched in windows that double while every line
        matches and start again at one after a miss, so the matches wasted past a miss
        never outnumber the lines taken before it."""
        match = self.line.fullmatch
        block = self.block
        i, n, window = start, len(lines), self.window
        while i < n:
            found = list(map(match, lines[i : i + window]))
            try:
                k = found.index(None)
            except ValueError:
                k = len(found)
            if k:
                if block.rank is not None:  # the shape was learned on a rank's line
                    block = ctx.store.block(block.tags, None, block.skip, block.stepper)
                rows = [m.groups() for m in (found[:k] if k < len(found) else found) if m]
                ctx.store.extend(block, before + i + 1, rows)
                ctx.line, ctx.rank, ctx.last_step = before + i + k, None, self.step_of(rows[-1])
                ctx.votes[framework] += k
                i += k
            if k < len(found):
                self.window = 1
                return i
            window = min(window * 2, 4096)
        self.window = window
        return i
