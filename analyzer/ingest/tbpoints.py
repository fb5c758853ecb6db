"""The scalar points of one event file, gathered from both decoding paths (the numpy fast
path in :mod:`analyzer.ingest.tb` and the protobuf one in :mod:`analyzer.ingest.tb_proto`)
and written into their tag's series window by window, so that the file's points are never
all held twice.

Each window's points are sorted by tag and then by file offset (a stable sort: the values
of one record keep their order) and appended to their tag's :class:`_Column`. Since
windows come in file order, a column holds its tag's series in file order. A column is
allocated once for the points its tag is expected to have in the whole file (what it had
so far, scaled by the share of the file read), and doubled when that was too little: the
part of it never written is never touched, so it costs address space, not memory.

Compactness: summary writers log every tag at the same steps, so a tag whose steps so far
are those of another tag holds no copy of them: the tags share one :class:`_Steps` until
one's next steps differ, and that one then gets a copy of its own (copy on diverge). Tags
that shared to the end get one steps array between them, read-only, as is every steps
array given out here. Record offsets are int32 in a file under 2 GiB. With ten tags sharing
their steps a point takes about 21 bytes (a tenth of a step, value, wall time, offset)
rather than 32, against about 60 bytes a scalar record takes in the file.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from analyzer.model import Series

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class _Steps:
    """A step column that tags may share: a tag with ``k`` points here has the steps
    ``data[:k]``. Summary writers log every tag at the same steps, so the tags of a file
    usually hold one of these between them rather than a copy each (see :class:`Points`)."""

    __slots__ = ("count", "data", "users")

    def __init__(self, capacity: int) -> None:
        self.data: IntArray = np.empty(capacity, dtype=np.int64)
        # steps written: those of its furthest user, who never leaves (only one behind
        # can disagree), so that a sole user always ends where it does
        self.count = 0
        self.users = 0

    def agrees(self, k: int, chunk: IntArray) -> bool:
        """Whether a tag with ``k`` points here, whose next steps are ``chunk``, can stay:
        its steps agree with those already written after its ``k`` points."""
        overlap = min(self.count - k, int(chunk.shape[0]))
        return overlap <= 0 or bool(np.array_equal(self.data[k: k + overlap],
                                                   chunk[:overlap]))

    def put(self, k: int, chunk: IntArray, expected: int) -> None:
        """Write ``chunk`` after ``k`` points (that :meth:`agrees`)."""
        need = k + int(chunk.shape[0])
        if need <= self.count:
            return
        if need > self.data.shape[0]:
            grown = np.empty(max(need, expected, 2 * self.data.shape[0]), dtype=np.int64)
            grown[: self.count] = self.data[: self.count]
            self.data = grown
        self.data[self.count: need] = chunk[self.count - k:]
        self.count = need


class _Column:
    """The points of one tag so far: offsets of their records, values, wall times, and
    its steps, held in a :class:`_Steps` that other tags may share."""

    def __init__(self, capacity: int, position: type[np.signedinteger[Any]]) -> None:
        self.count = 0
        self.position = position
        self.arrays = self._empty(capacity)
        self.steps: _Steps | None = None

    def _empty(self, capacity: int) -> tuple[npt.NDArray[Any], FloatArray, FloatArray]:
        return (np.empty(capacity, dtype=self.position), np.empty(capacity, dtype=np.float64),
                np.empty(capacity, dtype=np.float64))

    def append(self, parts: tuple[IntArray, npt.NDArray[Any], FloatArray],
               expected: int) -> None:
        m = int(parts[0].shape[0])
        need = self.count + m
        if need > self.arrays[0].shape[0]:
            grown = self._empty(max(need, expected, 2 * self.arrays[0].shape[0]))
            for old, new in zip(self.arrays, grown, strict=True):
                new[: self.count] = old[: self.count]
            self.arrays = grown
        with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, quietly
            for column, part in zip(self.arrays, parts, strict=True):
                column[self.count: need] = part
        self.count = need


@dataclass
class Points:
    """Scalar points gathered from both decoding paths, grouped by tag window by window.

    Tags are kept as small integers into ``names`` so that grouping never compares strings.
    ``size`` is the file's size, by which a tag's points in the whole file are estimated.
    """

    size: int = 0
    names: dict[str, int] = field(default_factory=dict)
    position: list[IntArray] = field(default_factory=list)
    tag: list[IntArray] = field(default_factory=list)
    step: list[IntArray] = field(default_factory=list)
    value: list[npt.NDArray[Any]] = field(default_factory=list)
    wall: list[FloatArray] = field(default_factory=list)
    columns: dict[int, _Column] = field(default_factory=dict)
    # the step columns tags may join, by their first step
    shared: dict[int, list[_Steps]] = field(default_factory=dict)
    bad_walls: int = 0  # records with a non-finite wall time, and the first one's offset
    first_bad_wall: int = -1

    def check_walls(self, position: IntArray, wall: FloatArray) -> None:
        bad = ~np.isfinite(wall)
        if bad.any():
            self.bad_walls += int(bad.sum())
            first = int(position[bad].min())
            self.first_bad_wall = first if self.first_bad_wall < 0 else min(first,
                                                                            self.first_bad_wall)

    def tag_id(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def add(self, position: IntArray, tag: IntArray, step: IntArray, value: npt.NDArray[Any],
            wall: FloatArray) -> None:
        """Points of the current window: file offsets of their records, tag ids, steps,
        values (float32 or float64) and wall times."""
        self.position.append(position)
        self.tag.append(tag)
        self.step.append(step)
        self.value.append(value)
        self.wall.append(wall)

    def flush(self, read: int) -> None:
        """The current window is over, ``read`` bytes of the file into it: append its
        points to their tags' columns."""
        if not self.position:
            return
        position, tag, step = _take(self.position), _take(self.tag), _take(self.step)
        wall = _take(self.wall)
        values = self.value
        if len({v.dtype for v in values}) == 1:
            value = _take(values)
        else:
            with np.errstate(invalid="ignore"):
                value = np.concatenate([v.astype(np.float64) for v in values])
        values.clear()
        scale = self.size / max(read, 1)
        if (tag[1:] == tag[:-1]).all() and (position[1:] >= position[:-1]).all():
            self._append(int(tag[0]), (position, step, value, wall), scale)
            return
        order = np.lexsort((position, tag))
        # one array at a time, so that each unsorted one is freed before the next is sorted
        tag = tag[order]
        position = position[order]
        step = step[order]
        value = value[order]
        wall = wall[order]
        del order
        cuts = np.flatnonzero(tag[1:] != tag[:-1]) + 1
        bounds = [0, *cuts.tolist(), int(tag.shape[0])]
        for lo, hi in itertools.pairwise(bounds):
            self._append(int(tag[lo]), (position[lo:hi], step[lo:hi], value[lo:hi],
                                        wall[lo:hi]), scale)

    def _append(self, t: int, parts: tuple[IntArray, IntArray, npt.NDArray[Any], FloatArray],
                scale: float) -> None:
        position, step, value, wall = parts
        column = self.columns.get(t)
        had = column.count if column is not None else 0
        need = had + int(position.shape[0])
        # at most a few times what it holds: a first window is a poor sample of a file
        expected = int(need * min(scale * 1.05, _MOST_AHEAD)) + 16
        if column is None:
            kind = np.int32 if self.size < 1 << 31 else np.int64
            column = self.columns[t] = _Column(expected, kind)
        self._put_steps(column, step, expected)
        column.append((position, value, wall), expected)

    def _put_steps(self, column: _Column, chunk: IntArray, expected: int) -> None:
        """Append ``chunk`` to the column's steps: in the steps it shares while they agree;
        where they differ (and for a new tag), in other steps that hold its steps so far
        and agree with ``chunk``, or else in a copy of its own (copy on diverge)."""
        k, held = column.count, column.steps
        if held is not None and held.agrees(k, chunk):
            held.put(k, chunk, expected)
            return
        first = int(held.data[0]) if held is not None else int(chunk[0])
        joined = next((c for c in reversed(self.shared.get(first, [])[-_CANDIDATES:])
                       if c is not held and _holds(c, held, k) and c.agrees(k, chunk)), None)
        if joined is None:
            joined = _Steps(max(k + int(chunk.shape[0]), expected))
            if held is not None:
                joined.data[:k] = held.data[:k]
            joined.count = k
            self.shared.setdefault(first, []).append(joined)
        if held is not None:
            held.users -= 1
            if not held.users:
                self.shared[first].remove(held)
        joined.users += 1
        column.steps = joined
        joined.put(k, chunk, expected)

    def series(self, path: str) -> tuple[Series, ...]:
        """One series per tag, sorted by tag name. Tags that shared their steps to the end
        get one steps array between them; every steps array is read-only, so that no one
        can change one tag's steps by writing another's."""
        self.flush(self.size)
        self.shared.clear()
        out = []
        views: dict[tuple[int, int], IntArray] = {}
        for name, t in sorted(self.names.items()):
            column = self.columns.pop(t, None)
            if column is None or not column.count or column.steps is None:
                continue
            n = column.count
            data = column.steps.data
            steps = views.get((id(data), n))
            if steps is None:
                steps = views[id(data), n] = data[:n]
                steps.flags.writeable = False
            positions, values, walls = column.arrays
            # int32 in a file under 2 GiB: its readers index, compare and int() it
            out.append(Series(tag=name, steps=steps, values=values[:n], wall_times=walls[:n],
                              source=path, positions=cast(IntArray, positions[:n])))
        return tuple(out)


# A column is allocated for at most this many times the points its tag has so far.
_MOST_AHEAD = 8.0
# A new tag is compared with at most this many step columns beginning at its first step.
_CANDIDATES = 4


def _holds(steps: _Steps, held: _Steps | None, k: int) -> bool:
    """Whether ``steps`` begin with the ``k`` steps of ``held`` (none: no steps yet)."""
    if held is None or not k:
        return True
    return (steps.count >= k and steps.data[k - 1] == held.data[k - 1]
            and bool(np.array_equal(steps.data[:k], held.data[:k])))


def _take(parts: list[Any]) -> Any:
    """One array from a list of parts, emptying the list so that the parts can be freed."""
    whole = parts[0] if len(parts) == 1 else np.concatenate(parts)
    parts.clear()
    return whole
