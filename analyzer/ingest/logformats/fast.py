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
from operator import itemgetter
from typing import TypeVar

import numpy as np

from analyzer.ingest.logformats import layouts
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


def colon_shape(tail: str, skip: frozenset[str]) -> tuple[str, list[str], str] | None:
    """A pattern for tails shaped like this one under ``base.colon_pairs``, the names
    of the pairs it captures, in order, and the literal text the pattern holds (every
    token but the values, and the ``,``/``]`` after them), for ``Shape``'s ``literals``.

    ``colon_pairs`` splits on blanks and takes the token after each ``name:`` token
    as its value. The pattern repeats every token literally except the values: a kept
    value becomes a captured decimal (with the ``,``/``]`` that followed it), a
    skipped value any token. A kept value that is not a plain decimal gives no shape.
    Blanks between tokens are matched by the kind of blanks the learned line had.
    """
    parts: list[str] = []
    names: list[str] = []
    literals: list[str] = []
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
                literals.append(m.group(2))
                names.append(name)
            name = None
            continue
        parts.append(re.escape(token))
        literals.append(token)
        if len(token) > 1 and token[-1] == ":":
            name = token[:-1]
    if not names:
        return None
    return r"\s*+" + "".join(parts) + r"\s*+", names, " ".join(literals)


ZERO_DIGITS = bytes(48 if 48 <= b <= 57 else b for b in range(256))
"""For ``bytes.translate``: every ASCII digit to ``0``. A line's key (its UTF-8 bytes so
translated) keeps every character but the ASCII digits."""
TEMPLATES = 4096
"""Line layouts remembered per shape (see ``Shape``)."""
TEMPLATE_CHARS = LEARN_CHARS
_ASCII_DIGIT = re.compile("[0-9]")


def key_of(text: str) -> bytes:
    """The key ``Shape`` remembers a layout by: the UTF-8 bytes, ASCII digits set to 0."""
    return text.encode("utf-8", "surrogatepass").translate(ZERO_DIGITS)


Getter = Callable[[str], tuple[str, ...]]
K = TypeVar("K")


def _getter(spans: list[slice]) -> Getter:
    if len(spans) == 1:
        only = spans[0]
        return lambda text: (text[only],)
    return itemgetter(*spans)


def remember(m: re.Match[str], into: dict[K, Getter], key: K) -> None:
    """Keep under ``key`` how to slice the groups of ``m`` out of a line of its layout
    (at most ``TEMPLATES`` in ``into``; a match with a group left out is not kept)."""
    spans = [m.span(g) for g in range(1, m.re.groups + 1)]
    if spans and len(into) < TEMPLATES and all(a >= 0 for a, _ in spans):
        into[key] = _getter([slice(a, b) for a, b in spans])


def record_key(text: str, ctx: Context) -> bytes | None:
    """The key of ``text`` where the dispatcher worked it out for this very record."""
    keyed = ctx.keyed
    if keyed is not None and keyed[0] is text and len(text) <= TEMPLATE_CHARS:
        return keyed[1]
    return None


class Shape:
    """A learned line shape and where its points go.

    ``pattern`` is matched in full from the position of the format's header word;
    ``line`` is the same pattern preceded by a prefix that finds that word's first
    occurrence, for whole lines. Groups are ``skip`` counters, then one value per tag.
    ``block`` has a stepper that turns the counters into steps in bulk; ``step_of``
    does it for one row, for the step an event may need.

    Layouts: a match of these patterns depends on a line's digits only through the
    literal digits the pattern holds. Every class in them holds all ten ASCII digits or
    none (``\\d``, ``\\s``, ``\\S``, ``[^E]``, ``[^|]``, ...), so a test of a class at a
    digit gives the same answer for every digit, and a literal other than a digit
    differs from every digit. Two lines equal but for their ASCII digits (equal
    ``key_of``) therefore match alike, with the same group spans, wherever they hold the
    same digits at the pattern's literal digits. The builder says where those are:
    ``literals`` is every literal piece of the pattern outside the ``fixed`` groups (the
    groups whose text is literal, by index in ``groups()``: Megatron's loss scale and
    counters, held at the value just seen). Where ``literals`` holds no ASCII digit, the
    group spans of a line that matched are remembered under its key, and a line with
    that key is read by slicing at those spans instead of matching, once the fixed
    groups' text is checked (a line where one differs is matched). Keys live per
    pattern and per start position; at most ``TEMPLATES`` of them per shape, of lines
    up to ``TEMPLATE_CHARS``.
    """

    __slots__ = ("block", "counters", "fixed", "keyed", "line", "lines", "pattern", "records",
                 "step_of", "steps_of", "window")

    def __init__(
        self,
        prefix: str,
        pattern: str,
        block: Block,
        step_of: Callable[[Row], int],
        literals: str | None = None,
        fixed: dict[int, str] | None = None,
        steps_of: tuple[tuple[int, ...], Callable[[list[np.ndarray]], np.ndarray]] | None = None,
    ) -> None:
        self.pattern = re.compile(pattern)
        self.line = re.compile(prefix + pattern)
        self.block = block
        self.step_of = step_of
        self.window = 1
        self.keyed = ENABLED and literals is not None and _ASCII_DIGIT.search(literals) is None
        self.fixed = tuple(sorted((fixed or {}).items()))
        self.records: dict[tuple[bytes, int], Getter] = {}
        """Layouts of records matched by ``pattern`` from a position."""
        self.lines: dict[bytes, Layout] = {}
        """Layouts of whole lines matched by ``line``."""
        self.counters: tuple[int, ...] = () if steps_of is None else steps_of[0]
        self.steps_of = None if steps_of is None else steps_of[1]
        """The steps from the integers of the ``counters`` groups, for rows read from
        their bytes; None: rows are kept as strings."""

    def _fits(self, row: tuple[str, ...]) -> bool:
        for at, text in self.fixed:  # noqa: SIM110 (a loop: all() costs a generator a line)
            if row[at] != text:
                return False
        return True


    def match(self, text: str, at: int, ctx: Context) -> Row | None:
        """The groups of ``pattern`` matched in full on ``text`` from ``at``, or None."""
        found = record_key(text, ctx) if self.keyed else None
        key = None
        if found is not None:
            key = (found, at)
            get = self.records.get(key)
            if get is not None:
                row = get(text)
                if not self.fixed or self._fits(row):
                    return row
        m = self.pattern.fullmatch(text, at)
        if m is None:
            return None
        if key is not None:
            remember(m, self.records, key)
        return m.groups()

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
        matches and start again at one after a miss. The window reached is kept for the
        next call (a log whose lines of one format come between others' resumes at full
        speed); a miss at that call's first line wastes it once, and the window starts
        again at one. Each window was earned by as many lines taken before, so the lines
        read in vain are never more than twice the lines taken, over the whole file."""
        i, n, window = start, len(lines), self.window
        while i < n:
            part = lines[i : i + window]
            k = self._window(part, before + i + 1, ctx)
            if k:
                ctx.votes[framework] += k
                i += k
            if k < len(part):
                self.window = 1
                return i
            window = min(window * 2, 4096)
        self.window = window
        return i

    def _window(self, part: list[str], first: int, ctx: Context) -> int:
        """Store the lines of ``part`` (the first is line ``first``) up to the first that
        ``line`` does not match; how many were stored."""
        if not self.keyed:
            rows = self._matched(part)
        else:
            data = "\n".join(part).encode("utf-8", "surrogatepass")
            keys = data.translate(ZERO_DIGITS).split(b"\n")
            found = self._layouts(part, keys)
            if found and all(type(f) is Layout and f.form is not None for f in found):
                return self._numbers(part, keys, data, found, first, ctx)  # type: ignore[arg-type]
            rows = self._strings(part, found)
        if rows:
            ctx.store.extend(self._unranked(ctx), first, rows)
            ctx.line, ctx.rank, ctx.last_step = first + len(rows) - 1, None, self.step_of(rows[-1])
        return len(rows)

    def _unranked(self, ctx: Context) -> Block:
        """The block for lines taken in bulk, which hold no prefix, so no rank."""
        block = self.block
        if block.rank is None:
            return block
        # The shape was learned on a rank's line.
        return ctx.store.block(block.tags, None, block.skip, block.stepper)

    def _matched(self, part: list[str]) -> list[Row]:
        """The rows of the lines of ``part`` up to the first that ``line`` does not match."""
        found = list(map(self.line.fullmatch, part))
        if None in found:
            found = found[: found.index(None)]
        return [m.groups() for m in found if m]

    def _layouts(self, part: list[str], keys: list[bytes]) -> list[Layout | Row]:
        """For the lines of ``part`` up to the first that ``line`` does not match: the
        remembered layout of each, or the groups of a match not remembered."""
        known = self.lines.get
        match = self.line.fullmatch
        found: list[Layout | Row] = []
        for line, key in zip(part, keys, strict=True):
            layout = known(key)
            if layout is None:
                m = match(line)
                if m is None:
                    break
                layout = self._line_layout(m, line, key)
                if layout is None:
                    found.append(m.groups())
                    continue
            found.append(layout)
        return found

    def _line_layout(self, m: re.Match[str], line: str, key: bytes) -> Layout | None:
        if len(line) > TEMPLATE_CHARS or len(self.lines) >= TEMPLATES:
            return None
        spans = [m.span(g) for g in range(1, m.re.groups + 1)]
        if not spans or any(a < 0 for a, _ in spans):
            return None
        skip = self.block.skip or 0
        form = None
        if self.steps_of is not None:
            form = layouts.numeric(line, spans, skip, self.counters, self.fixed)
        layout = self.lines[key] = Layout(_getter([slice(a, b) for a, b in spans]), form)
        return layout

    def _strings(self, part: list[str], found: list[Layout | Row]) -> list[Row]:
        """The rows of ``found`` as strings, up to the first line whose fixed groups
        differ from the shape's (matched, it would not match)."""
        fits = self._fits
        rows: list[Row] = []
        for line, got in zip(part, found, strict=False):
            if type(got) is Layout:
                row = got.get(line)
                if not fits(row):
                    m = self.line.fullmatch(line)
                    if m is None:
                        break
                    row = m.groups()
                rows.append(row)
            else:
                rows.append(got)  # type: ignore[arg-type]
        return rows

    def _numbers(
        self, part: list[str], keys: list[bytes], data: bytes, found: list[Layout], first: int,
        ctx: Context,
    ) -> int:
        """Store the lines of ``found`` from their bytes (see ``layouts``), up to the first
        whose fixed groups differ from the shape's; how many were stored."""
        k = len(found)
        lengths = np.fromiter(map(len, keys[:k]), np.int64, k)
        starts = np.zeros(k, dtype=np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        raw = np.frombuffer(data, dtype=np.uint8)
        by_layout: dict[int, tuple[Layout, list[int]]] = {}
        for index, layout in enumerate(found):
            entry = by_layout.get(id(layout))
            if entry is None:
                entry = by_layout[id(layout)] = (layout, [])
            entry[1].append(index)
        cut = k
        parts = []
        for layout, indexes in by_layout.values():
            rows = np.array(indexes, dtype=np.int64)
            fits, counters, values = layouts.evaluate(layout.form, raw, starts, part, rows)  # type: ignore[arg-type]
            if not fits.all():
                cut = min(cut, int(rows[np.argmin(fits)]))
            parts.append((rows, counters, values))
        if cut == 0:
            return 0
        steps = np.empty(k, dtype=np.int64)
        values_all = np.empty((k, len(self.block.tags)), dtype=np.float64)
        for rows, counters, values in parts:
            steps[rows] = self.steps_of(counters)  # type: ignore[misc]
            values_all[rows] = values
        ctx.store.extend_arrays(self._unranked(ctx), first, steps[:cut], values_all[:cut])
        ctx.line, ctx.rank, ctx.last_step = first + cut - 1, None, int(steps[cut - 1])
        return cut


class Layout:
    """A remembered line layout: its groups by slicing, and its numbers' places."""

    __slots__ = ("form", "get")

    def __init__(self, get: Getter, form: layouts.Numeric | None) -> None:
        self.get = get
        self.form = form
