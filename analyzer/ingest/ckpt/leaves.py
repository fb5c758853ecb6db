"""A common view of a tensor, whether torch loaded it or a static read described it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from analyzer.ingest.ckpt.archive import Archive
from analyzer.ingest.ckpt.extents import torch_dtype, unfit
from analyzer.ingest.ckpt.npdtypes import NpType, np_type
from analyzer.ingest.ckpt.npstats import NpChunk
from analyzer.ingest.ckpt.ranges import (
    FileRanges,
    contiguous_chunks,
    strided_chunks,
)
from analyzer.ingest.ckpt.staticpickle import TensorRef
from analyzer.ingest.ckpt.stats import tensor_chunks

if TYPE_CHECKING:
    import torch

ByteOrder = Literal["little", "big"]


@dataclass(frozen=True)
class Leaf:
    """A tensor's description and, when its values can be read, a way to read them."""

    shape: tuple[int, ...]
    dtype: str
    chunks: Callable[[], Iterator[torch.Tensor | NpChunk]] | None
    note: str | None = None
    numeric: bool = True
    layout: tuple[int, ...] | None = None
    """The strides of a view whose chunks are not cut from one flat run of its values
    (they may also follow the storage's order, not the view's); two leaves are read in
    lockstep, chunk against chunk, only when their layouts agree."""


def _numeric(dtype: torch.dtype | None) -> bool:
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


class TorchLeaves:
    """Leaves of a tree that ``torch.load`` built in memory (a bare pickle)."""

    def leaf(self, value: object) -> Leaf | None:
        import torch

        if not isinstance(value, torch.Tensor):
            return None
        dtype = str(value.dtype).removeprefix("torch.")
        shape = tuple(int(d) for d in value.shape)
        if value.is_sparse or value.is_quantized or value.device.type != "cpu":
            return Leaf(shape, dtype, None, "layout or device not scanned", False)
        def chunks() -> Iterator[torch.Tensor | NpChunk]:
            return tensor_chunks(value)

        layout = None if value.is_contiguous() else tuple(int(s) for s in value.stride())
        return Leaf(shape, dtype, chunks, None, _numeric(value.dtype), layout)


class StaticLeaves:
    """Leaves of a statically read ``torch.save`` pickle, read raw from the archive.

    Every tensor's extent is checked (:mod:`extents`) before a byte of it is read. Values
    of a big-endian archive are byte-swapped as they are read; ``order`` None (a byte
    order record that names neither) leaves every value unread.
    """

    def __init__(
        self, ranges: FileRanges | None, archive: Archive | None, *, order: ByteOrder | None
    ) -> None:
        self.ranges = ranges
        self.archive = archive
        self.order = order
        self._made: dict[int, tuple[TensorRef, Leaf]] = {}

    def leaf(self, value: object) -> Leaf | None:
        if not isinstance(value, TensorRef):
            return None
        # The tree is walked several times (to classify it, then to scan it): one Leaf
        # per tensor, kept with the tensor so that its id cannot be reused meanwhile.
        made = self._made.get(id(value))
        if made is not None and made[0] is value:
            return made[1]
        leaf = self._make(value)
        self._made[id(value)] = (value, leaf)
        return leaf

    def _make(self, value: TensorRef) -> Leaf:
        dtype_name = value.dtype_name
        # numpy reads the types it knows; torch is imported only for the others.
        known = np_type(dtype_name)
        dtype: torch.dtype | NpType | None = known if known is not None else \
            torch_dtype(dtype_name)
        numeric = dtype.numeric if isinstance(dtype, NpType) else _numeric(dtype)
        note = self._unreadable(value, dtype)
        ranges, archive = self.ranges, self.archive
        if note is not None or dtype is None or ranges is None or archive is None:
            return Leaf(value.shape, dtype_name, None, note, numeric)
        assert value.storage is not None  # checked by _unreadable
        entry = archive.member(f"data/{value.storage.key}")
        assert entry is not None
        base = entry.data_offset + value.offset * int(dtype.itemsize)
        shape, stride, count = value.shape, value.stride, value.numel
        swap = self.order == "big"
        if value.contiguous:

            def chunks() -> Iterator[torch.Tensor | NpChunk]:
                return contiguous_chunks(ranges, base, count, dtype, swap=swap)

            return Leaf(shape, dtype_name, chunks, None, numeric)

        def strided() -> Iterator[torch.Tensor | NpChunk]:
            return strided_chunks(ranges, base, shape, stride, dtype, swap=swap)

        return Leaf(shape, dtype_name, strided, None, numeric, stride)

    def _unreadable(self, ref: TensorRef, dtype: torch.dtype | NpType | None) -> str | None:
        if ref.storage is None or dtype is None:
            return "storage type not recognised"
        if self.archive is None:
            return "values not read (not a zip archive)"
        if self.order is None:
            return "values not read: the archive's byteorder record names no byte order"
        reason = unfit(ref, self.archive)
        return None if reason is None else f"not scanned: {reason}"
