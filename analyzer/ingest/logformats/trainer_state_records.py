"""The records of a ``trainer_state.json``'s ``log_history``, gathered field by field.

Both layouts (``trainer_state`` reads the indented one, ``trainer_state_compact`` the
compact one) hand their fields here, with the runs of NUL bytes met between them; the
policy these follow is written in ``trainer_state``.
"""

from __future__ import annotations

import math

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.hf import RENAME, SKIP
from analyzer.ingest.safeio import Deadline

CHECK_EVERY = 4096
"""Lines or records read between two looks at the deadline."""


class Records:
    """``log_history``'s records as their fields come. A run of NUL bytes breaks the
    record it falls in: the lost bytes may have held the end of one record and the start
    of the next, so the fields before it make a record of their own (kept when they hold
    its step) and those after it another, which its ``}`` ends."""

    __slots__ = ("adrift", "ctx", "record")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.record: dict[str, tuple[float, int]] | None = None
        self.adrift = False
        """A run was met outside any record: a field may come before any '{' (the run
        may have taken it)."""

    def open(self) -> None:
        self.record = {}
        self.adrift = False

    def close(self) -> None:
        if self.record is not None:
            emit(self.record, self.ctx)
        self.record = None

    def field(self, key: str, value: float, line: int) -> None:
        record = self.record
        if record is None:
            if not self.adrift:
                return
            record = self.record = {}  # a run took the record's start: read the rest
            self.adrift = False
        record[key] = (value, line)

    def hole(self) -> None:
        """A run of NULs between the last field (or bracket) and the next."""
        self.close()
        self.adrift = True


def stopped(deadline: Deadline, ctx: Context, line: int, offset: int | None = None) -> bool:
    if not deadline.expired():
        return False
    ctx.issue(
        "read_limit",
        f"reading stopped at its time budget of {deadline.seconds:g} s; the records before "
        "were kept",
        line,
        offset,
    )
    return True


def emit(record: dict[str, tuple[float, int]], ctx: Context) -> None:
    found = record.get("step")
    if found is None or math.isnan(found[0]) or math.isinf(found[0]):
        return
    step = int(found[0])
    ctx.votes["transformers"] += 1
    for key, (value, line) in record.items():
        if key not in SKIP:
            ctx.line = line
            ctx.point(RENAME.get(key, key), step, value)
