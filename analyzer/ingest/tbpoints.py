"""The scalar points of one event file, gathered from both decoding paths (the numpy fast
path in :mod:`analyzer.ingest.tb` and the protobuf one in :mod:`analyzer.ingest.tb_proto`)
before they are grouped by tag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass
class Points:
    """Scalar points gathered from both decoding paths, before grouping by tag.

    Tags are kept as small integers into ``names`` so that grouping never compares strings.
    """

    names: dict[str, int] = field(default_factory=dict)
    record: list[IntArray] = field(default_factory=list)
    tag: list[IntArray] = field(default_factory=list)
    step: list[IntArray] = field(default_factory=list)
    value: list[FloatArray] = field(default_factory=list)
    wall: list[FloatArray] = field(default_factory=list)
    bad_walls: int = 0  # records with a non-finite wall time, and the first one
    first_bad_wall: int = -1

    def check_walls(self, record: IntArray, wall: FloatArray) -> None:
        bad = ~np.isfinite(wall)
        if bad.any():
            self.bad_walls += int(bad.sum())
            first = int(record[bad].min())
            self.first_bad_wall = first if self.first_bad_wall < 0 else min(first,
                                                                            self.first_bad_wall)

    def tag_id(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def add(self, record: IntArray, tag: IntArray, step: IntArray, value: FloatArray,
            wall: FloatArray) -> None:
        self.record.append(record)
        self.tag.append(tag)
        self.step.append(step)
        self.value.append(value)
        self.wall.append(wall)
