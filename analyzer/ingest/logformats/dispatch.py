"""Which parser reads each record.

The rule: the parsers of ``PARSERS`` are tried in order on a record holding one of
their triggers, the first that recognises it wins, and the fallback gets the rest.
Two shortcuts give the same outcome for less work:

- Which parsers hold a trigger in a record is remembered per record shape (the
  record with its digits set to 0, see ``Dispatcher.shape_of``): a log repeats a few
  shapes, so the triggers are searched for once per shape, not once per record.
- A parser that has learned the shape of its lines (see ``fast``) may take a run of
  lines at once through ``bulk``, when the batch as a whole guarantees what the
  per-record path would check: no line holds a prefix to strip, none a trigger of an
  earlier parser, none a carriage return or other control that splits records.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats import FALLBACK, PARSERS, LineParser, fast, reader
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.fast import ZERO_DIGITS
from analyzer.ingest.logformats.prefixes import EMBEDDED_MARKS, TAGGED, PrefixRule
from analyzer.ingest.logformats.reader import Lines, line_records

_PREFIX_START = frozenset(" \t>[0123456789")
_TAGGED_LINE = re.compile(r"(?m)^(?:" + TAGGED.pattern + ")")
_COMMON_CHARS = frozenset(" \t0123456789etaoinsrlcdmuhpgb.:_-,/|[]()EINOST")
"""Characters most log lines hold; see ``_sentinel``."""

Needle = tuple[str, str | None]


def _sentinel(needle: str) -> str | None:
    """A character of ``needle`` that few log lines hold, if it has one. Searching for
    one character is a memchr, several times faster than searching for a string, so
    when the character is absent the string is ruled out for little."""
    for ch in needle:
        if ch not in _COMMON_CHARS:
            return ch
    return None


def _needles(strings: tuple[str, ...]) -> tuple[Needle, ...]:
    return tuple((s, _sentinel(s)) for s in strings)


def _holds_any(text: str, needles: tuple[Needle, ...]) -> bool:
    for needle, sentinel in needles:
        if (sentinel is None or sentinel in text) and needle in text:
            return True
    return False


class Dispatcher:
    """Runs the parsers of one file over its records."""

    def __init__(self, rule: PrefixRule, ctx: Context) -> None:
        self.ctx = ctx
        self.parsers: list[LineParser] = [cls() for cls in PARSERS]
        if any(ch.isdigit() for p in self.parsers for t in p.triggers for ch in t):
            raise ValueError("a trigger holds a digit: Dispatcher.shape_of needs none to")
        self.memo: dict[bytes, Shape] = {}
        # The triggers of every parser before this one in the order: a record holding
        # none of them could not have been taken by an earlier parser.
        self.own = {id(p): _needles(p.triggers) for p in self.parsers}
        self.earlier = {
            id(p): _needles(tuple(t for q in self.parsers[:i] for t in q.triggers))
            for i, p in enumerate(self.parsers)
        }
        self.fallback = FALLBACK()
        self.strip = rule.strip
        self.numbered = rule.numbers != "none"
        self.marked = not self.numbered and not rule.bracketed
        """True when a batch without a prefix mark (``_TAG_MARKS``) holds no prefix."""
        self.recent: LineParser | None = None
        self.shadowed: tuple[Needle, ...] = ()
        self.run = 0
        """Records the recent parser has taken in a row. Bulk reading is tried from the
        second on: in a log whose format changes every line it would only miss."""
        self.bare = False
        """True while the records come from a batch that holds no prefix mark at all."""
        self.splits: dict[bytes, list[tuple[int, int, int, int]]] | None = (
            {} if fast.ENABLED else None
        )
        """Per layout of a physical line split at carriage returns only: where its
        records are (see ``_spans``)."""

    def lines(self, batch: Lines) -> None:
        lines = batch.lines
        before = batch.before
        record = self.record
        # Whole-batch facts for the bulk path, worked out on first need.
        untagged: bool | None = None if batch.plain and self.marked else False
        clean: dict[int, bool] = {}
        # No mark anywhere: no record of the batch can have a prefix to strip.
        self.bare = self.marked and not _holds_any(batch.text, _TAG_MARKS)
        if self.bare and untagged is None:
            untagged = True
        holes, single = batch.holes, reader.single
        i, n = 0, len(lines)
        while i < n:
            recent = self.recent
            bulk = getattr(recent, "bulk", None) if self.run > 1 else None
            if bulk is not None and untagged is not False:
                if untagged is None:
                    untagged = _untagged(batch.text)
                ok = clean.get(id(recent))
                if ok is None:
                    ok = clean[id(recent)] = untagged and not _holds_any(
                        batch.text, self.shadowed
                    )
                if ok:
                    self.ctx.group = recent.framework  # type: ignore[union-attr]
                    taken = bulk(lines, i, before, self.ctx)
                    if taken > i:
                        i = taken
                        continue
            line = lines[i]
            i += 1
            if not line:
                continue
            if batch.plain or single(line, holes):
                record(before + i, line)
            elif self._split_line(line, before + i, holes):
                continue
            else:
                bare = self.bare
                if bare and "\x1b" in line:
                    # Taking out an escape sequence can join a prefix mark that the
                    # batch's text does not hold ('[\x1b[32mRank 0]').
                    self.bare = False
                for number, text in line_records(line, before + i, self.ctx, holes):
                    record(number, text)
                self.bare = bare
        self.bare = False

    def _split_line(self, line: str, number: int, holes: bool) -> bool:
        """Read a physical line that carriage returns alone split into records, by the
        layout of a line read before where there was one; False when it is not such a
        line.

        What ``reader`` keeps of such a line (which pieces between carriage returns are
        records, and which bar redraws collapse) depends on tests that look at letters,
        blanks and brackets, never at digits: the same for every line of one key (its
        UTF-8 bytes with the ASCII digits set to 0). Lines of one key also hold their
        carriage returns at the same places, in characters and in the key's bytes, so
        the records and their keys are slices at places remembered per key."""
        splits = self.splits
        if splits is None or not reader.returns_only(line, holes):
            return False
        key = line.encode("utf-8", "surrogatepass").translate(ZERO_DIGITS)
        spans = splits.get(key)
        if spans is None:
            spans = _spans(line, key)
            if len(splits) < MEMO_ENTRIES:
                splits[key] = spans
        record = self.record
        for a, b, c, d in spans:
            record(number, line[a:b], key[c:d])
        return True

    def record(self, number: int, text: str, key: bytes | None = None) -> None:
        """Read one record; ``key`` is its key where the caller has it (see ``shape_of``)."""
        ctx = self.ctx
        ctx.line = number
        ctx.rank = None
        prefixed, holders, fallback = self.shape_of(text, key)
        if prefixed and not self.bare:
            text, ctx.rank = self.strip(text)
            if not text:
                return
            _, holders, fallback = self.shape_of(text)
        recent = self.recent
        for parser in holders:
            ctx.group = parser.framework
            if parser.parse(text, ctx):
                if parser is recent:
                    self.run += 1
                elif parser.repeats:
                    self.recent, self.shadowed = parser, self.earlier[id(parser)]
                    self.run = 1
                else:
                    self.run = 0
                return
        self.run = 0
        if fallback:
            ctx.group = self.fallback.framework
            self.fallback.parse(text, ctx)

    def shape_of(self, text: str, key: bytes | None = None) -> Shape:
        """What the record's characters other than digits decide: whether it may start
        with a prefix to strip, the parsers holding a trigger in it (in order), and
        whether the fallback may take it.

        No trigger holds a digit, and the prefix pattern and the fallback's test look
        at digits only as digits, so records that differ only in their digits get the
        same answer. A log repeats a few shapes whose numbers change: the answer is kept
        per record with its digits set to 0. The key is the UTF-8 encoding, where every
        digit is one byte and no other character holds the byte of an ASCII digit, so
        one bytes.translate makes it; ``key`` is that key where the caller has it."""
        if len(text) <= MEMO_CHARS:
            if key is None:
                key = text.encode("utf-8", "surrogatepass").translate(ZERO_DIGITS)
            self.ctx.keyed = (text, key)
            found = self.memo.get(key)
            if found is not None:
                return found
        else:
            key = None
            self.ctx.keyed = None
        found = (
            (text[0] in _PREFIX_START and (self.numbered or TAGGED.match(text) is not None))
            or _holds_any(text, _EMBEDDED),
            tuple(p for p in self.parsers if _holds_any(text, self.own[id(p)])),
            self.fallback.wants(text),
        )
        if key is not None:
            if len(self.memo) >= MEMO_ENTRIES:
                self.memo.clear()
            self.memo[key] = found
        return found


Shape = tuple[bool, tuple[LineParser, ...], bool]
MEMO_CHARS = 1024
"""Records up to this long are remembered by ``Dispatcher.shape_of``."""
MEMO_ENTRIES = 4096
"""Shapes remembered per file; the memo starts again empty when it is full."""

_TAG_MARKS = _needles((">", "[rank", "[Rank", "[RANK", "[default", "]<std"))
_EMBEDDED = _needles(EMBEDDED_MARKS)
"""Rank marks that ``PrefixRule.strip`` takes out after a logging header, not only at the
start of a record."""


def _spans(line: str, key: bytes) -> list[tuple[int, int, int, int]]:
    """The records of ``line`` (see ``Dispatcher._split_line``) as slices: the start and
    end of each in ``line`` and in ``key``, the line's key."""
    pieces = line.split("\r")
    chars, octets = [0], [0]
    for piece, piece_key in zip(pieces, key.split(b"\r"), strict=True):
        chars.append(chars[-1] + len(piece) + 1)
        octets.append(octets[-1] + len(piece_key) + 1)
    return [
        (chars[j], chars[j + 1] - 1, octets[j], octets[j + 1] - 1)
        for j in reader.record_pieces(pieces)
    ]


def _untagged(text: str) -> bool:
    """True when no line of ``text`` starts with a prefix ``PrefixRule.strip`` removes.
    Substring tests rule most text out faster than the line-start search."""
    if not _holds_any(text, _TAG_MARKS):
        return True
    return _TAGGED_LINE.search(text) is None and not _holds_any(text, _EMBEDDED)
