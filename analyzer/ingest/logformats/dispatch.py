"""Which parser reads each record.

The rule: the parsers of ``PARSERS`` are tried in order on a record holding one of
their triggers, the first that recognises it wins, and the fallback gets the rest.
Two shortcuts give the same outcome for less work:

- Logs are long runs of one format, so the parser that took the previous record is
  tried first, unless a trigger of a parser before it in the order is present.
- A parser that has learned the shape of its lines (see ``fast``) may take a run of
  lines at once through ``bulk``, when the batch as a whole guarantees what the
  per-record path would check: no line holds a prefix to strip, none a trigger of an
  earlier parser, none a carriage return or other control that splits records.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats import FALLBACK, PARSERS, LineParser
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.prefixes import TAGGED, PrefixRule
from analyzer.ingest.logformats.reader import LINE_CAP, Lines, line_records

_PREFIX_START = frozenset(" \t>[0123456789")
_TAGGED_LINE = re.compile(r"(?m)^(?:" + TAGGED.pattern + ")")


class Dispatcher:
    """Runs the parsers of one file over its records."""

    def __init__(self, rule: PrefixRule, ctx: Context) -> None:
        self.ctx = ctx
        self.parsers: list[LineParser] = [cls() for cls in PARSERS]
        self.flat = tuple((t, p) for p in self.parsers for t in p.triggers)
        # The triggers of every parser before this one in the order: a record holding
        # none of them could not have been taken by an earlier parser.
        self.earlier = {
            id(p): tuple(t for q in self.parsers[:i] for t in q.triggers)
            for i, p in enumerate(self.parsers)
        }
        self.fallback = FALLBACK()
        self.strip = rule.strip
        self.numbered = rule.numbers != "none"
        self.recent: LineParser | None = None
        self.recent_triggers: tuple[str, ...] = ()
        self.shadowed: tuple[str, ...] = ()

    def lines(self, batch: Lines) -> None:
        lines = batch.lines
        before = batch.before
        record = self.record
        # Whole-batch facts for the bulk path, worked out on first need.
        untagged: bool | None = None if batch.plain and not self.numbered else False
        clean: dict[int, bool] = {}
        i, n = 0, len(lines)
        while i < n:
            recent = self.recent
            bulk = getattr(recent, "bulk", None)
            if bulk is not None and untagged is not False:
                if untagged is None:
                    untagged = _untagged(batch.text)
                ok = clean.get(id(recent))
                if ok is None:
                    ok = clean[id(recent)] = untagged and not any(
                        t in batch.text for t in self.shadowed
                    )
                if ok:
                    taken = bulk(lines, i, before, self.ctx)
                    if taken > i:
                        i = taken
                        continue
            line = lines[i]
            i += 1
            if not line:
                continue
            if batch.plain or (
                "\r" not in line
                and "\x1b" not in line
                and "\x08" not in line
                and len(line) <= LINE_CAP
            ):
                record(before + i, line)
            else:
                for number, text in line_records(line, before + i, self.ctx):
                    record(number, text)

    def record(self, number: int, text: str) -> None:
        ctx = self.ctx
        ctx.line = number
        ctx.rank = None
        if text[0] in _PREFIX_START and (self.numbered or TAGGED.match(text) is not None):
            text, ctx.rank = self.strip(text)
            if not text:
                return
        recent = self.recent
        tried = None
        if recent is not None:
            for trigger in self.recent_triggers:
                if trigger in text:
                    tried = recent
                    break
            if tried is not None:
                for trigger in self.shadowed:
                    if trigger in text:
                        tried = None
                        break
                if tried is not None and recent.parse(text, ctx):
                    return
        # The ordered scan, over every trigger in parser order: a parser's triggers
        # are adjacent, so `done` keeps it from being tried twice.
        done = tried
        for trigger, parser in self.flat:
            if trigger in text and parser is not done:
                done = parser
                if parser.parse(text, ctx):
                    if parser.repeats:
                        self.recent, self.recent_triggers = parser, parser.triggers
                        self.shadowed = self.earlier[id(parser)]
                    return
        self.fallback.parse(text, ctx)

_TAG_MARKS = ("[rank", "[Rank", "[RANK", "[default", "]<std")


def _untagged(text: str) -> bool:
    """True when no line of ``text`` starts with a prefix ``PrefixRule.strip`` removes.
    Substring tests rule most text out faster than the line-start search."""
    if ">" not in text and not any(mark in text for mark in _TAG_MARKS):
        return True
    return _TAGGED_LINE.search(text) is None
