"""Per-tensor statistics, computed a bounded chunk at a time.

A tensor's values are never copied whole: chunks of at most ``CHUNK`` elements are
folded into an accumulator, half-precision chunks by way of a reused float32 buffer.
Chunks without NaN or Inf (the common case, told by one min/max pass, since both
propagate NaN) take a fast path of reductions only. Tensors of a file are read from it
into a reused buffer (:mod:`ranges`), as numpy arrays where numpy knows their type
(:mod:`npstats` folds those, to the same results); only a bare pickle, loaded whole by
``torch.load``, has its tensors in memory already, as torch tensors.

torch is imported only when a torch tensor is folded or a torch reading is needed; from
then on, inside :func:`single_threaded`, it runs on one thread (see there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, cast

from analyzer.ingest.ckpt.pinning import torch_pinned
from analyzer.model.checkpoints import FP16_MAX, LayerStats, TensorRecord, TensorStats

if TYPE_CHECKING:
    import torch
    from torch import Tensor

CHUNK = 1 << 20
"""Elements per chunk: 4 MiB as float32, small enough to stay in cache on most CPUs."""

_scratch_buffers: dict[tuple[str, object], torch.Tensor] = {}


def scratch(role: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A reused work buffer: fresh allocations of chunk size cost page faults that
    dominate the scan otherwise. Not shared between threads."""
    import torch

    buffer = _scratch_buffers.get((role, dtype))
    if buffer is None or buffer.numel() < numel:
        buffer = torch.empty(max(numel, CHUNK), dtype=dtype)
        _scratch_buffers[(role, dtype)] = buffer
    return buffer[:numel]


def work_view(chunk: torch.Tensor, role: str) -> torch.Tensor:
    """``chunk`` as float32 (float64 stays float64), copied into scratch if needed."""
    import torch

    if chunk.is_complex():
        chunk = torch.view_as_real(chunk).reshape(-1)
    if chunk.dtype in (torch.float32, torch.float64):
        return chunk
    out = scratch(role, torch.float32, chunk.numel())
    out.copy_(chunk)
    return out


def count(mask: torch.Tensor) -> int:
    # count_nonzero is an order of magnitude faster than bool.sum() on CPU.
    import torch

    return int(torch.count_nonzero(mask))


_FP32_SQUARES_MAX = 1e37
"""Beyond this bound on (abs max)^2 x count, a float32 sum of squares could overflow."""


def sum_squares(values: torch.Tensor, abs_max: float) -> float:
    """Sum of squares. torch sums float32 by cascade, so the relative error stays near
    1e-7 without widening; values large enough to overflow float32 are widened."""
    import torch

    if values.dtype == torch.float64 or abs_max * abs_max * values.numel() >= _FP32_SQUARES_MAX:
        wide = scratch("wide", torch.float64, values.numel())
        wide.copy_(values)
        return float(torch.dot(wide, wide))
    squares = scratch("squares", values.dtype, values.numel())
    torch.mul(values, values, out=squares)
    return float(squares.sum())


class StatsAccumulator:
    """Folds chunks of one tensor into :class:`TensorStats`."""

    def __init__(self) -> None:
        self.numel = 0
        self.nan = 0
        self.pos_inf = 0
        self.neg_inf = 0
        self.abs_max = 0.0
        self.sum_squares = 0.0
        self.beyond_fp16 = 0

    def add(self, chunk: object, role: str = "stats") -> None:
        from analyzer.ingest.ckpt.npstats import NpChunk, add, as_torch

        if isinstance(chunk, NpChunk):
            loaded = as_torch(chunk, role)
            if loaded is None:
                add(self, chunk, role)
                return
            chunk = loaded
        torch = torch_pinned()
        values = work_view(cast("Tensor", chunk), role)
        self.numel += values.numel()
        if values.numel() == 0:
            return
        low, high = (float(v) for v in torch.aminmax(values))
        if not (math.isfinite(low) and math.isfinite(high)):
            self.nan += count(torch.isnan(values))
            self.pos_inf += count(torch.isposinf(values))
            self.neg_inf += count(torch.isneginf(values))
            values = values[torch.isfinite(values)]
            if values.numel() == 0:
                return
            low, high = (float(v) for v in torch.aminmax(values))
        abs_max = max(abs(low), abs(high))
        self.abs_max = max(self.abs_max, abs_max)
        self.sum_squares += sum_squares(values, abs_max)
        if abs_max > FP16_MAX:
            self.beyond_fp16 += count(values.abs() > FP16_MAX)

    def result(self) -> TensorStats:
        return TensorStats(
            numel=self.numel,
            nan=self.nan,
            pos_inf=self.pos_inf,
            neg_inf=self.neg_inf,
            abs_max=self.abs_max,
            sum_squares=self.sum_squares,
            beyond_fp16=self.beyond_fp16,
        )


def merge(parts: Iterable[TensorStats]) -> TensorStats:
    """Aggregate the stats of several tensors (a layer) into one."""
    items = list(parts)
    return TensorStats(
        numel=sum(p.numel for p in items),
        nan=sum(p.nan for p in items),
        pos_inf=sum(p.pos_inf for p in items),
        neg_inf=sum(p.neg_inf for p in items),
        abs_max=max((p.abs_max for p in items), default=0.0),
        sum_squares=sum(p.sum_squares for p in items),
        beyond_fp16=sum(p.beyond_fp16 for p in items),
    )


def tensor_chunks(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """Flat chunks of ``tensor``; a non-contiguous tensor is copied block by block."""
    tensor = tensor.detach()  # a Parameter would make every reduction record autograd history

    if tensor.dim() == 0:
        yield tensor.reshape(1)
        return
    if tensor.is_contiguous():
        flat = tensor.reshape(-1)
        for begin in range(0, flat.numel(), CHUNK):
            yield flat[begin : begin + CHUNK]
        return
    rows = max(1, CHUNK // max(1, tensor[0].numel()))
    for begin in range(0, tensor.shape[0], rows):
        yield tensor[begin : begin + rows].reshape(-1)


def stats_of(chunks: Iterable[torch.Tensor]) -> TensorStats:
    acc = StatsAccumulator()
    for chunk in chunks:
        acc.add(chunk)
    return acc.result()


def layer_of(name: str) -> str:
    """The module prefix of a parameter name.

    ``blocks.3.attn.qkv.weight`` belongs to ``blocks.3.attn.qkv``.
    """
    return name.rsplit(".", 1)[0] if "." in name else name


def aggregate_layers(records: Iterable[TensorRecord]) -> tuple[LayerStats, ...]:
    """Per-layer aggregates of the model tensors, in first-seen order."""
    grouped: dict[str, list[TensorRecord]] = {}
    for record in records:
        if record.group == "model" and record.stats is not None:
            grouped.setdefault(layer_of(record.name), []).append(record)
    return tuple(
        LayerStats(
            layer=layer,
            tensors=tuple(r.name for r in members),
            stats=merge(r.stats for r in members if r.stats is not None),
        )
        for layer, members in grouped.items()
    )
