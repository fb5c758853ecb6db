"""The scalar points of one event file, gathered from both decoding paths (the numpy fast
path in :mod:`analyzer.ingest.tb` and the protobuf one in :mod:`analyzer.ingest.tb_proto`)
and grouped by tag window by window, so that the file's points are never all held twice.

Each window's points are sorted by tag and then by file offset (a stable sort: the values
of one record keep their order) and kept as one chunk per tag. Since windows come in file
order, a tag's chunks joined are its series in file order. A chunk keeps the fast path's
values as float32, which is what ``simple_value`` holds, so it costs less than the series
made from it; the series are float64 like every other source's.
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
# A tag's points from one window: positions, steps, values, wall times.
_Chunk = tuple[IntArray, IntArray, npt.NDArray[Any], FloatArray]


@dataclass
class Points:
    """Scalar points gathered from both decoding paths, grouped by tag window by window.

    Tags are kept as small integers into ``names`` so that grouping never compares strings.
    """

    names: dict[str, int] = field(default_factory=dict)
    position: list[IntArray] = field(default_factory=list)
    tag: list[IntArray] = field(default_factory=list)
    step: list[IntArray] = field(default_factory=list)
    value: list[npt.NDArray[Any]] = field(default_factory=list)
    wall: list[FloatArray] = field(default_factory=list)
    chunks: dict[int, list[_Chunk]] = field(default_factory=dict)
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

    def flush(self) -> None:
        """The current window is over: sort its points into chunks per tag."""
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
        if (tag[1:] == tag[:-1]).all() and (position[1:] >= position[:-1]).all():
            self.chunks.setdefault(int(tag[0]), []).append((position, step, value, wall))
            return
        order = np.lexsort((position, tag))
        tag = tag[order]
        cuts = np.flatnonzero(tag[1:] != tag[:-1]) + 1
        bounds = [0, *cuts.tolist(), int(tag.shape[0])]
        position, step, value, wall = position[order], step[order], value[order], wall[order]
        for lo, hi in itertools.pairwise(bounds):
            self.chunks.setdefault(int(tag[lo]), []).append(
                (position[lo:hi].copy(), step[lo:hi].copy(), value[lo:hi].copy(),
                 wall[lo:hi].copy()))

    def series(self, path: str) -> tuple[Series, ...]:
        """One series per tag, sorted by tag name; the chunks are given up as they are
        joined."""
        self.flush()
        out = []
        for name, t in sorted(self.names.items()):
            parts = self.chunks.pop(t, [])
            if not parts:
                continue
            positions = np.concatenate([p[0] for p in parts])
            steps = np.concatenate([p[1] for p in parts])
            with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, quietly
                values = np.concatenate([p[2] for p in parts], dtype=np.float64)
            walls = np.concatenate([p[3] for p in parts])
            parts.clear()
            out.append(Series(tag=name, steps=steps, values=values, wall_times=walls,
                              source=path, positions=positions))
        return tuple(out)


def _take(parts: list[Any]) -> Any:
    """One array from a list of parts, emptying the list so that the parts can be freed."""
    whole = parts[0] if len(parts) == 1 else np.concatenate(parts)
    parts.clear()
    return whole
