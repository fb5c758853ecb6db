"""What the format parsers write into while one file is read."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

from analyzer.ingest.logformats.store import PointStore
from analyzer.model import GLOBAL, Event, EventKind, IngestIssue, IssueKind, Location, StepAxis

MESSAGE_CHARS = 240
"""Event messages keep this many characters of the line."""

STEP_MIN, STEP_MAX = -(2**63), 2**63 - 1
"""Steps are stored as int64; a step outside this range is reported, not stored."""

ISSUES_PER_KIND = 20
"""Issues of one kind kept one by one; the rest are counted in a summary issue."""
STEP_AXIS_KEY = "step_axis"
"""Event detail: ``"global"`` on an event whose step its line named as a global step
(``Loss is nan at step 23``) in a file whose other numbers are on another axis (a
Lightning bar's batch count): the align stage leaves that step as it is."""


class Context:
    """Collects points, events, votes and notes for one file.

    ``line`` and ``rank`` describe the record being parsed; the reading loop sets
    them before each call. ``last_step`` is the latest step any parser reported,
    for messages that name none.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.line = 0
        self.rank: int | None = None
        self.last_step: int | None = None
        self._axis: StepAxis = GLOBAL
        self._named: list[int] = []
        self.store = PointStore()
        self.events: list[Event] = []
        self.notes: list[str] = []
        self.votes: Counter[str] = Counter()
        self._issues: list[IngestIssue] = []
        self._issue_counts: Counter[IssueKind] = Counter()
        self._issue_first: dict[str, int] = {}
        self._noted: set[str] = set()

    @property
    def axis(self) -> StepAxis:
        """The numbering the file's steps are on; a parser whose steps are not global steps
        (record positions, a framework's counter) says so here."""
        return self._axis

    @axis.setter
    def axis(self, axis: StepAxis) -> None:
        if axis != GLOBAL and self._axis == GLOBAL:
            for i in self._named:
                event = self.events[i]
                self.events[i] = replace(event, detail={**event.detail, STEP_AXIS_KEY: "global"})
            self._named.clear()
        self._axis = axis

    def _bad_step(self, step: int) -> bool:
        if STEP_MIN <= step <= STEP_MAX:
            return False
        self.issue("bad_step", f"step {str(step)[:30]} does not fit in 64 bits; points dropped")
        return True

    def point(self, tag: str, step: int, value: float) -> None:
        self.points_at(step, [(tag, value)])

    def points_at(self, step: int, items: list[tuple[str, float]]) -> None:
        """Several points of one record: one step, this line, this rank."""
        if self._bad_step(step) or not items:
            return
        tags, values = zip(*items, strict=True)
        store = self.store
        store.add(store.block(tags, self.rank), step, self.line, values)
        self.last_step = step

    def event(
        self, kind: EventKind, step: int | None, text: str, detail: dict[str, Any] | None = None,
        *, global_step: bool = False
    ) -> None:
        """An event at ``step``, on the file's axis; ``global_step``: the line named the step
        in a script's own words, a global step whatever the rest of the file counts."""
        info: dict[str, Any] = dict(detail or {})
        if step is not None and not STEP_MIN <= step <= STEP_MAX:
            info["step_text"], step = str(step)[:30], None
        if self.rank is not None:
            info.setdefault("rank", self.rank)
        if step is None and self.last_step is not None:
            # The message names no step; the last one logged before it bounds it.
            info.setdefault("after_step", self.last_step)
        named = global_step and step is not None
        if named and self._axis != GLOBAL:
            info[STEP_AXIS_KEY] = "global"
        message = text.strip()[:MESSAGE_CHARS]
        if named and self._axis == GLOBAL:
            self._named.append(len(self.events))  # marked if a parser later declares an axis
        self.events.append(Event(kind, step, Location(self.source, line=self.line), message, info))

    def nonfinite(self, tag: str, kind: str, step: int | None, text: str,
                  global_step: bool = False, **extra: Any) -> None:
        """A line that reports non-finiteness without a number to plot."""
        self.event("nonfinite", step, text, {"tag": tag, "kind": kind, **extra},
                   global_step=global_step)

    def note(self, key: str, text: str) -> None:
        """A remark for the report, kept once per key."""
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    def issue(
        self, kind: IssueKind, message: str, line: int | None = None, offset: int | None = None
    ) -> None:
        """Damage at ``line`` (the record being parsed when None), and at the byte
        ``offset`` when the reader knows it."""
        where = self.line if line is None else line
        self._issue_counts[kind] += 1
        self._issue_first.setdefault(kind, where)
        if self._issue_counts[kind] <= ISSUES_PER_KIND:
            place = Location(self.source, offset=offset, line=where)
            self._issues.append(IngestIssue(place, kind, message))

    def issues(self) -> list[IngestIssue]:
        out = list(self._issues)
        for kind, count in self._issue_counts.items():
            if count > ISSUES_PER_KIND:
                first = self._issue_first[kind]
                out.append(
                    IngestIssue(
                        Location(self.source, line=first),
                        kind,
                        f"{count} lines in all had this problem; only the first "
                        f"{ISSUES_PER_KIND} are listed",
                    )
                )
        return out


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
