"""A float32 sum in the order torch's CPU kernel adds, so that numpy gives its bits.

torch sums a contiguous float32 run (``Tensor.sum`` on one thread) by cascade: the run is
cut into vectors of W lanes (8 on x86), the vectors are read four at a
time into four accumulators, and every 2^p rows (p at least 4) the accumulators are
folded into three further levels, so that no accumulator adds up more than a few hundred
terms. The leftover vectors join the first accumulator, the four are folded, the values
past the last whole vector are added one by one from zero and the W lanes of the folded
vector after them. A run shorter than W is summed the same way one value per lane.
Reproducing that order, each addition rounded to float32, gives torch's result bit for
bit, which keeps reports identical whether a scan ran with torch or without it.

The order was read from torch's ``SumKernel.cpp`` and is checked against torch itself by
the tests, on every length up to a few chunks.
"""

from __future__ import annotations

import functools
import platform

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
_ROWS = 4
"""Accumulators per level (torch's ILP factor)."""
_LEVELS = 4


@functools.cache
def lanes() -> int:
    """Float32 lanes of the vector torch's sum kernel adds with: 8 on x86 (its AVX2 and
    default kernels; the AVX-512 build of torch reuses the AVX2 sum), 4 on 64-bit Arm."""
    return 4 if platform.machine().lower() in ("aarch64", "arm64") else 8


def _ceil_log2(value: int) -> int:
    return 1 if value <= 2 else (value - 1).bit_length()


def _sequential(rows: F32) -> F32:
    """Rows added one after the other from zero, column by column, in float32."""
    total = np.zeros(rows.shape[1:], dtype=np.float32)
    for row in rows:
        np.add(total, row, out=total)
    return total


def _grouped(rows: F32, size: int) -> tuple[F32, F32]:
    """The sequential sums of each whole group of ``size`` rows, and of the rows left.
    One addition per position in the group, over every group at once."""
    whole = rows.shape[0] // size
    groups = rows[: whole * size].reshape(whole, size, *rows.shape[1:])
    sums = np.zeros((whole, *rows.shape[1:]), dtype=np.float32)
    for position in range(size if whole else 0):
        np.add(sums, groups[:, position], out=sums)
    return sums, _sequential(rows[whole * size :])


def _multi_row_sum(rows: F32) -> F32:
    """torch's ``multi_row_sum``: ``rows`` (n, k) summed over n through four levels."""
    size = rows.shape[0]
    power = max(4, _ceil_log2(size) // _LEVELS)
    step = 1 << power
    blocks_whole = (size // step) * step
    blocks, _ = _grouped(rows[:blocks_whole], step)
    tail = _sequential(rows[blocks_whole:])
    # Level 1 takes the block sums in groups of `step`, level 2 those in groups of
    # `step`, level 3 keeps the rest; each holds what came since its last flush.
    level1_full, level1 = _grouped(blocks, step)
    level2_full, level2 = _grouped(level1_full, step)
    level3 = _sequential(level2_full)
    total = tail
    for part in (level1, level2, level3):
        total = np.add(total, part, dtype=np.float32)
    return total


def _row_sum(rows: F32) -> F32:
    """torch's ``row_sum``: (n, lanes) rows read four at a time, folded to one row."""
    size, width = rows.shape
    ilp = size // _ROWS
    partial = _multi_row_sum(rows[: ilp * _ROWS].reshape(ilp, _ROWS * width))
    partial = partial.reshape(_ROWS, width).copy()
    for extra in rows[ilp * _ROWS :]:
        partial[0] = np.add(partial[0], extra, dtype=np.float32)
    folded: F32 = partial[0]
    for k in range(1, _ROWS):
        np.add(folded, partial[k], out=folded)
    return folded


def torch_sum(values: F32, width: int | None = None) -> float:
    """``float(torch.from_numpy(values).sum())`` for a flat float32 array, on one thread."""
    width = lanes() if width is None else width
    count = values.shape[0]
    if count < width:
        return float(np.float32(0) + np.float32(_row_sum(values.reshape(count, 1))[0]))
    whole = count // width
    vector = _row_sum(values[: whole * width].reshape(whole, width))
    total = np.float32(0)
    for value in values[whole * width :]:
        total = np.float32(total + value)
    for value in vector:
        total = np.float32(total + value)
    return float(total)
