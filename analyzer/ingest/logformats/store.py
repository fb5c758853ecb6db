"""Points kept by record, not by point.

A dense log line carries ten metrics under one step and one line number. Appending
each metric to its own three lists costs more than reading the line, so a record is
kept as one row of a block: the block is keyed by the record's tag names and rank,
and holds the step, line and arrival number once per row. Rows are packed into numpy
arrays every ``PACK_ROWS`` rows, which also bounds memory. At the end each
(tag, rank) series is assembled from the columns that hold it, in arrival order.

Rows come either as floats or as the groups a fast line reader's regex captured:
number strings that ``float`` accepts, after ``skip`` leading groups that are not
values (the step counters). Those are converted once per packed block instead of
once per field. A block of such rows may also have a ``stepper`` that works out the
steps from the counter columns at packing time, one numpy expression for thousands of
rows instead of one Python expression per row.

A block also belongs to a group: the parser that wrote it (its owner's ``group`` when the
block was made). Parsers of one file may count steps differently (the Trainer's dict lines
by their order, DeepSpeed's ``step=N`` lines by the global step), so each group has its own
step axis, and a tag two groups write is two series, one per axis (:meth:`PointStore.series`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import numpy as np

PACK_ROWS = 1 << 14
"""Rows held as Python objects before a block packs them into arrays."""

Key = tuple[str, int | None]
A = TypeVar("A")
Row = tuple[float, ...] | tuple[str | None, ...]
Stepper = Callable[[list[tuple[str, ...]]], np.ndarray]
"""Steps (int64) from a block's ``skip`` leading columns of strings. The counters it
reads (with ``counter``) must be digit strings short enough that every step fits."""


def counter(column: tuple[str, ...]) -> np.ndarray:
    """A column of digit strings as int64, converted in one call."""
    return np.array(column, dtype=np.int64)


class Block:
    """The rows of one record shape: these tags, this rank."""

    __slots__ = ("group", "lines", "packed", "rank", "rows", "seqs", "skip", "stepper", "steps",
                 "tags")

    def __init__(
        self,
        tags: tuple[str, ...],
        rank: int | None,
        skip: int | None,
        stepper: Stepper | None = None,
        group: str = "",
    ) -> None:
        self.tags = tags
        self.rank = rank
        self.group = group
        """The parser that wrote the block, whose step axis its steps are on."""
        self.skip = skip
        """None for rows of floats; else rows of strings after this many other groups."""
        self.stepper = stepper
        """When set, steps come from the rows' leading groups and ``steps`` stays empty."""
        self.steps: list[int] = []
        self.lines: list[int] = []
        self.seqs: list[int] = []
        self.rows: list[Row] = []
        self.packed: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def pack(self) -> None:
        if not self.rows:
            return
        width = len(self.tags)
        steps = None
        if self.skip is None:
            values = np.array(self.rows, dtype=np.float64).reshape(len(self.rows), width)
        else:
            columns = list(zip(*self.rows, strict=True))
            values = np.empty((len(self.rows), width), dtype=np.float64)
            for i, column in enumerate(columns[self.skip :]):
                values[:, i] = list(map(float, column))
            if self.stepper is not None:
                steps = self.stepper(columns[: self.skip])
        self.packed.append(
            (
                np.array(self.steps, dtype=np.int64) if steps is None else steps,
                np.array(self.lines, dtype=np.int64),
                np.array(self.seqs, dtype=np.int64),
                values,
            )
        )
        self.steps, self.lines, self.seqs, self.rows = [], [], [], []

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """steps, lines, arrival numbers and the (rows, tags) value matrix."""
        self.pack()
        if len(self.packed) != 1:
            width = len(self.tags)
            parts = self.packed or [
                (_EMPTY_INT, _EMPTY_INT, _EMPTY_INT, np.empty((0, width), dtype=np.float64))
            ]
            self.packed = [tuple(np.concatenate(col) for col in zip(*parts, strict=True))]  # type: ignore[list-item]
        return self.packed[0]


_EMPTY_INT = np.empty(0, dtype=np.int64)


class Grouped(Protocol):
    group: str


class PointStore:
    """Every point of one file, grouped by record shape."""

    def __init__(self, owner: Grouped | None = None) -> None:
        self.blocks: dict[
            tuple[tuple[str, ...], int | None, int | None, Stepper | None, str], Block
        ] = {}
        self.columns: dict[Key, list[tuple[Block, int]]] = {}
        """Where each series lives, in the order the series first appeared."""
        self.seq = 0
        self.owner = owner
        """What names the group new blocks belong to: the ``Context`` reading the file,
        whose ``group`` is the parser reading the record."""

    def block(
        self,
        tags: tuple[str, ...],
        rank: int | None,
        skip: int | None = None,
        stepper: Stepper | None = None,
    ) -> Block:
        group = "" if self.owner is None else self.owner.group
        key = (tags, rank, skip, stepper, group)
        found = self.blocks.get(key)
        if found is None:
            found = self.blocks[key] = Block(tags, rank, skip, stepper, group)
            for i, tag in enumerate(tags):
                self.columns.setdefault((tag, rank), []).append((found, i))
        return found

    def add(self, block: Block, step: int, line: int, row: Row) -> None:
        """One record (``step`` is not kept in a block with a stepper)."""
        if block.stepper is None:
            block.steps.append(step)
        block.lines.append(line)
        block.seqs.append(self.seq)
        block.rows.append(row)
        self.seq += 1
        if len(block.rows) >= PACK_ROWS:
            block.pack()

    def extend(self, block: Block, first_line: int, rows: list[Row]) -> None:
        """Records of consecutive lines, the first at ``first_line``, into a block with a
        stepper."""
        n = len(rows)
        block.lines.extend(range(first_line, first_line + n))
        block.seqs.extend(range(self.seq, self.seq + n))
        block.rows.extend(rows)
        self.seq += n
        if len(block.rows) >= PACK_ROWS:
            block.pack()

    def extend_arrays(
        self, block: Block, first_line: int, steps: np.ndarray, values: np.ndarray
    ) -> None:
        """Records of consecutive lines, the first at ``first_line``, already as arrays
        (steps, and a value matrix of the block's width), after the rows it holds."""
        n = len(steps)
        block.pack()
        block.packed.append(
            (
                steps,
                np.arange(first_line, first_line + n, dtype=np.int64),
                np.arange(self.seq, self.seq + n, dtype=np.int64),
                values,
            )
        )
        self.seq += n

    def series(self) -> Iterator[tuple[Key, np.ndarray, np.ndarray, np.ndarray]]:
        """(tag, rank), steps, values and line numbers of every series, points in
        arrival order, whatever group wrote them."""
        for (key, _), steps, values, lines in self.series_by(lambda group: None):
            yield key, steps, values, lines

    def series_by(
        self, axis_of: Callable[[str], A]
    ) -> Iterator[tuple[tuple[Key, A], np.ndarray, np.ndarray, np.ndarray]]:
        """((tag, rank), axis), steps, values and line numbers of every series, one per
        step axis its blocks are on (``axis_of`` a block's group), points in arrival
        order; a tag's series in the order they first appeared."""
        for key, places in self.columns.items():
            by_axis: dict[A, list[tuple[Block, int]]] = {}
            for block, col in places:
                by_axis.setdefault(axis_of(block.group), []).append((block, col))
            for axis, held in by_axis.items():
                steps, values, lines = self._assemble(held)
                yield (key, axis), steps, values, lines

    @staticmethod
    def _assemble(places: list[tuple[Block, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = []
        for block, col in places:
            steps, lines, seqs, values = block.arrays()
            parts.append((steps, values[:, col], lines, seqs))
        if len(parts) == 1:
            steps, values, lines, _ = parts[0]
            return steps, np.ascontiguousarray(values), lines
        seqs = np.concatenate([p[3] for p in parts])
        order = np.argsort(seqs, kind="stable")
        return (
            np.concatenate([p[0] for p in parts])[order],
            np.concatenate([p[1] for p in parts])[order],
            np.concatenate([p[2] for p in parts])[order],
        )

