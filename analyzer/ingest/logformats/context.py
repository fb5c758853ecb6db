"""What the format parsers write into while one file is read."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from analyzer.ingest.logformats.store import PointStore
from analyzer.model import GLOBAL, Event, EventKind, IngestIssue, IssueKind, Location, StepAxis
from analyzer.model.runs import EpochLength, EpochUnit

MESSAGE_CHARS = 240
"""Event messages keep this many characters of the line."""

STEP_MIN, STEP_MAX = -(2**63), 2**63 - 1
"""Steps are stored as int64; a step outside this range is reported, not stored."""

ISSUES_PER_KIND = 20
"""Issues of one kind kept one by one; the rest are counted in a summary issue."""
NAMED = "=global"
"""The group of events whose line named a global step in a script's own words (``Loss is
nan at step 23``): on the global step whatever the parser reading it counts."""
STEP_AXIS_KEY = "step_axis"
"""Event detail: ``"global"`` on such an event in a file whose other numbers are on
another axis (a Lightning bar's batch count), for readers of the report."""


class Context:
    """Collects points, events, votes and notes for one file.

    ``line`` and ``rank`` describe the record being parsed; the reading loop sets
    them before each call, and ``group`` to the parser reading it (its framework). Each
    group has its own step axis (:attr:`axis`): one file may hold the Trainer's dict
    lines, numbered by their order, beside DeepSpeed's ``step=N`` lines on the global
    step. ``last_step`` is the latest step any parser reported, for messages that name
    none; such a message is placed after its own group's last step where that group
    numbered any, else after the latest, on that step's axis.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.line = 0
        self.rank: int | None = None
        self.keyed: tuple[str, bytes] | None = None
        """The record being parsed and its key (``fast.key_of``), where the dispatcher
        worked it out; a parser reading that very record may use it."""
        self.group = ""
        """The parser reading the record (its framework): what the points and events it
        writes are grouped by, each group on its own step axis."""
        self._axes: dict[str, StepAxis] = {}
        self._last: dict[str, int] = {}
        self._latest: tuple[int, str] | None = None
        self.store = PointStore(self)
        self.events: list[Event] = []
        self._event_groups: list[str] = []
        self.notes: list[str] = []
        self.votes: Counter[str] = Counter()
        self._issues: list[IngestIssue] = []
        self._issue_counts: Counter[IssueKind] = Counter()
        self._issue_first: dict[str, int] = {}
        self._noted: set[str] = set()
        self.epoch_lengths: dict[tuple[int, EpochUnit], EpochLength] = {}
        """Each epoch length a parser read (a bar's total, a header's count), the first
        place it was read."""

    @property
    def axis(self) -> StepAxis:
        """The numbering the current group's steps are on; a parser whose steps are not
        global steps (record positions, a framework's counter) says so here."""
        return self._axes.get(self.group, GLOBAL)

    @axis.setter
    def axis(self, axis: StepAxis) -> None:
        self._axes[self.group] = axis

    def axis_of(self, group: str) -> StepAxis:
        """The step axis of a group's points and events."""
        return GLOBAL if group == NAMED else self._axes.get(group, GLOBAL)

    @property
    def last_step(self) -> int | None:
        """The latest step any parser reported."""
        return None if self._latest is None else self._latest[0]

    @last_step.setter
    def last_step(self, step: int | None) -> None:
        if step is None:
            self._latest = None
            self._last.pop(self.group, None)
            return
        self._last[self.group] = step
        self._latest = (step, self.group)

    @property
    def own_last_step(self) -> int | None:
        """The latest step the current group reported."""
        return self._last.get(self.group)

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
        self._last[self.group] = step
        self._latest = (step, self.group)

    def points_on(self, axis: StepAxis, step: int, items: list[tuple[str, float]]) -> None:
        """Points of one record on a numbering other than the current group's (a line
        without a step numbered by its position among such lines): kept apart from the
        group's other points, on ``axis``."""
        group = self.group
        self.group = f"{group}:{axis.kind}:{axis.label}"
        self._axes[self.group] = axis
        try:
            self.points_at(step, items)
        finally:
            self.group = group

    def event(
        self, kind: EventKind, step: int | None, text: str, detail: dict[str, Any] | None = None,
        *, global_step: bool = False
    ) -> None:
        """An event at ``step``, on the current group's axis; ``global_step``: the line
        named the step in a script's own words, a global step whatever the rest of the file
        counts."""
        info: dict[str, Any] = dict(detail or {})
        if step is not None and not STEP_MIN <= step <= STEP_MAX:
            info["step_text"], step = str(step)[:30], None
        if self.rank is not None:
            info.setdefault("rank", self.rank)
        group = NAMED if global_step and step is not None else self.group
        if step is None:
            # The message names no step; the last one its group logged before it bounds
            # it, else the last one any group logged, on that group's axis.
            own = self._last.get(group)
            if own is not None:
                info.setdefault("after_step", own)
            elif self._latest is not None:
                info.setdefault("after_step", self._latest[0])
                group = self._latest[1]
        message = text.strip()[:MESSAGE_CHARS]
        self.events.append(Event(kind, step, Location(self.source, line=self.line), message, info))
        self._event_groups.append(group)

    def placed_events(self) -> list[Event]:
        """The events, each with the step axis of the group its step or ``after_step`` is
        on."""
        out = []
        mixed = any(axis != GLOBAL for axis in self._axes.values())
        for event, group in zip(self.events, self._event_groups, strict=True):
            axis = self.axis_of(group)
            if axis != GLOBAL:
                event = replace(event, axis=axis)
            elif group == NAMED and mixed:
                event = replace(event, detail={**event.detail, STEP_AXIS_KEY: "global"})
            out.append(event)
        return out

    def series(self) -> Iterator[tuple[tuple[str, int | None], StepAxis, np.ndarray,
                                       np.ndarray, np.ndarray]]:
        """(tag, rank), step axis, steps, values and line numbers of every series: a tag
        written by groups on different axes is one series per axis."""
        for (key, axis), steps, values, lines in self.store.series_by(self.axis_of):
            yield key, axis, steps, values, lines

    def nonfinite(self, tag: str, kind: str, step: int | None, text: str,
                  global_step: bool = False, **extra: Any) -> None:
        """A line that reports non-finiteness without a number to plot."""
        self.event("nonfinite", step, text, {"tag": tag, "kind": kind, **extra},
                   global_step=global_step)

    def epoch_length(self, length: int, unit: EpochUnit, how: str) -> None:
        """An epoch's length, as the line being parsed prints it."""
        self.epoch_lengths.setdefault((length, unit), EpochLength(length, unit, self.line, how))

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
