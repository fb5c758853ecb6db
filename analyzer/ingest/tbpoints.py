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
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.model import Series

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class _Column:
    """The points of one tag so far: offsets of their records, steps, values, wall times."""

    def __init__(self, capacity: int) -> None:
        self.count = 0
        self.arrays = _empty(capacity)

    def append(self, parts: tuple[IntArray, IntArray, npt.NDArray[Any], FloatArray],
                expected: int) -> None:
        m = int(parts[0].shape[0])
        need = self.count + m
        if need > self.arrays[0].shape[0]:
            grown = _empty(max(need, expected, 2 * self.arrays[0].shape[0]))
            for old, new in zip(self.arrays, grown, strict=True):
                new[: self.count] = old[: self.count]
            self.arrays = grown
        with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, quietly
            for column, part in zip(self.arrays, parts, strict=True):
                column[self.count: need] = part
        self.count = need


def _empty(capacity: int) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    return (np.empty(capacity, dtype=np.int64), np.empty(capacity, dtype=np.int64),
            np.empty(capacity, dtype=np.float64), np.empty(capacity, dtype=np.float64))


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
        column = self.columns.get(t)
        had = column.count if column is not None else 0
        need = had + int(parts[0].shape[0])
        # at most a few times what it holds: a first window is a poor sample of a file
        expected = int(need * min(scale * 1.05, _MOST_AHEAD)) + 16
        if column is None:
            column = self.columns[t] = _Column(expected)
        column.append(parts, expected)

    def series(self, path: str) -> tuple[Series, ...]:
        """One series per tag, sorted by tag name."""
        self.flush(self.size)
        out = []
        for name, t in sorted(self.names.items()):
            column = self.columns.pop(t, None)
            if column is None or not column.count:
                continue
            n = column.count
            positions, steps, values, walls = column.arrays
            positions, steps, values, walls = positions[:n], steps[:n], values[:n], walls[:n]
            out.append(Series(tag=name, steps=steps, values=values, wall_times=walls,
                              source=path, positions=positions))
        return tuple(out)


# A column is allocated for at most this many times the points its tag has so far.
_MOST_AHEAD = 8.0


def _take(parts: list[Any]) -> Any:
    """One array from a list of parts, emptying the list so that the parts can be freed."""
    whole = parts[0] if len(parts) == 1 else np.concatenate(parts)
    parts.clear()
    return whole
