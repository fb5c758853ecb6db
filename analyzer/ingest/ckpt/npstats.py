"""Per-tensor statistics of values read with numpy, equal to torch's.

The counts (NaN, infinities, beyond float16) and the largest magnitude are exact either
way. The float32 sum of squares is added in torch's order (:mod:`npsum`), so it has the
same bits. Two results are torch's own and are handed to it (importing it then): a sum
that torch widens to float64 (a float64 tensor, or float32 values large enough for the
squares to overflow) is a BLAS dot product whose order belongs to the BLAS torch was
built with, and the square root of Adam's second moment (for ``ratio_max``) comes from
torch's vectorised kernel, which is not correctly rounded. Everything else stays here.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from analyzer.ingest.ckpt.npdtypes import NpType, float8_table
from analyzer.ingest.ckpt.npsum import torch_sum
from analyzer.ingest.ckpt.pinning import torch_pinned
from analyzer.model.checkpoints import FP16_MAX


class Totals(Protocol):
    """What a chunk is folded into (:class:`stats.StatsAccumulator`)."""

    numel: int
    nan: int
    pos_inf: int
    neg_inf: int
    abs_max: float
    sum_squares: float
    beyond_fp16: int

CHUNK = 1 << 20
_FP32_SQUARES_MAX = 1e37
PREFER_TORCH = True
"""Fold chunks with torch's reductions once torch is imported anyway (a replay, a file
torch had to read): the results are the same bits, torch's vectorised kernels are
faster on large tensors, and the import is already paid for."""


@dataclass(frozen=True)
class NpChunk:
    """Consecutive values of one tensor as stored (``raw``: one row per element, two
    columns for a complex type), with the type that says how to widen them."""

    raw: np.ndarray
    kind: NpType

    def numel(self) -> int:
        return int(self.raw.shape[0])

    def __getitem__(self, part: slice) -> NpChunk:
        return NpChunk(self.raw[part], self.kind)

    def first(self) -> float:
        """The first value as a float (a complex value raises, as ``float`` of a complex
        tensor does in torch)."""
        if self.kind.kind == "complex":
            raise TypeError("a complex value is not a number here")
        value = self.raw.reshape(-1)[:1]
        if self.kind.decode is not None:
            value = widen(value, self.kind, "first")
        return float(value[0])


def as_torch(chunk: NpChunk, role: str) -> Any:
    """``chunk`` widened, as a torch tensor sharing its memory, when torch is already
    imported and preferred; None otherwise."""
    if not (PREFER_TORCH and "torch" in sys.modules):
        return None
    torch = torch_pinned()
    return torch.from_numpy(widen(chunk.raw, chunk.kind, role))


_scratch: dict[tuple[str, str], np.ndarray] = {}


def scratch(role: str, dtype: str, count: int) -> np.ndarray:
    """A reused work buffer of at least ``count`` values (fresh chunk-sized allocations
    cost page faults that dominate the scan otherwise)."""
    buffer = _scratch.get((role, dtype))
    if buffer is None or buffer.shape[0] < count:
        buffer = np.empty(max(count, CHUNK), dtype=dtype)
        _scratch[(role, dtype)] = buffer
    return buffer[:count]


def widen(raw: np.ndarray, kind: NpType, role: str) -> np.ndarray:
    """The values of ``raw`` as flat float32 (float64 stays float64), copied into the
    ``role`` buffer where they are not already so."""
    flat = raw.reshape(-1)
    wide = "f8" if flat.dtype.kind == "f" and flat.dtype.itemsize == 8 else "f4"
    if kind.decode is None and flat.dtype == np.dtype(wide):
        return flat
    target = scratch(role, wide, flat.shape[0])
    if kind.decode is None:
        np.copyto(target, flat, casting="unsafe")
    elif kind.decode == "bf16":
        np.left_shift(flat.astype(np.uint32), 16, out=target.view(np.uint32))
    else:
        np.take(float8_table(kind.decode), flat, out=target)
    return target


def _count(mask: npt.NDArray[np.bool_]) -> int:
    return int(np.count_nonzero(mask))


def _wide_sum_squares(values: np.ndarray) -> float:
    torch = torch_pinned()
    wide = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
    return float(torch.dot(wide, wide))


def sum_squares(values: np.ndarray, abs_max: float) -> float:
    if values.dtype == np.float64 or abs_max * abs_max * values.shape[0] >= _FP32_SQUARES_MAX:
        return _wide_sum_squares(values)
    squares = scratch("squares", "f4", values.shape[0])
    np.multiply(values, values, out=squares)
    return torch_sum(squares)


def add(acc: Totals, chunk: NpChunk, role: str) -> None:
    """Fold ``chunk`` into ``acc`` as :meth:`StatsAccumulator.add` folds a torch chunk."""
    values = widen(chunk.raw, chunk.kind, role)
    acc.numel += values.shape[0]
    if values.shape[0] == 0:
        return
    low, high = float(values.min()), float(values.max())
    if not (math.isfinite(low) and math.isfinite(high)):
        acc.nan += _count(np.isnan(values))
        acc.pos_inf += _count(np.isposinf(values))
        acc.neg_inf += _count(np.isneginf(values))
        values = values[np.isfinite(values)]
        if values.shape[0] == 0:
            return
        low, high = float(values.min()), float(values.max())
    abs_max = max(abs(low), abs(high))
    acc.abs_max = max(acc.abs_max, abs_max)
    acc.sum_squares += sum_squares(values, abs_max)
    if abs_max > FP16_MAX:
        acc.beyond_fp16 += _count(np.abs(values) > FP16_MAX)


def adam_add(eps: float, m_chunk: NpChunk, v_chunk: NpChunk) -> tuple[float, int, int, float]:
    """(smallest v, zero v count, v below eps^2 count, largest |m| / (sqrt(v) + eps)) of
    one pair of chunks, in float32 as torch computes them; v_min is inf for no values."""
    m, v = widen(m_chunk.raw, m_chunk.kind, "adam_m"), widen(v_chunk.raw, v_chunk.kind, "adam_v")
    bounds = [float(m.min()), float(m.max()), float(v.min()), float(v.max())] if m.size else []
    if bounds and not all(math.isfinite(x) for x in bounds):
        finite = np.isfinite(m) & np.isfinite(v)
        m, v = m[finite], v[finite]
        bounds = [float(m.min()), float(m.max()), float(v.min()), float(v.max())] if v.size else []
    if not bounds:
        return math.inf, 0, 0, 0.0
    v_low = bounds[2]
    threshold = v.dtype.type(eps * eps)
    zero = _count(v == 0) if v_low <= 0 else 0
    below = _count(v < threshold) if v_low < threshold else 0
    denominator = scratch("adam_den", v.dtype.str, v.shape[0])
    # IEEE's correctly rounded root, as the torch branch takes it (optimizer.py): torch's
    # own float32 kernel is not correctly rounded, so numpy could not reproduce it.
    np.sqrt(np.maximum(v, 0) if v_low < 0 else v, out=denominator)
    np.add(denominator, v.dtype.type(eps), out=denominator)
    ratio = scratch("adam_ratio", m.dtype.str, m.shape[0])
    np.abs(m, out=ratio)
    np.divide(ratio, denominator, out=ratio, casting="unsafe")
    return v_low, zero, below, float(ratio.max())
