"""Byte ranges of one checkpoint file, read with ordinary reads, never through a memory map.

A file is opened once, through :mod:`analyzer.ingest.safeio` (so a FIFO or a device named
``model.pt`` is refused by its type before opening), and every read is capped at the size
the file had then. A file that shrinks while it is read (a trainer overwriting
``last.ckpt`` in place) gives short reads, which callers report as missing values; a
memory map of it would fault with SIGBUS instead and kill the process.

    FileRanges          the open file: ``read``, ``readinto``, a bounded file object
    contiguous_chunks   a tensor's values stored one after the other, a chunk at a time
    strided_chunks      a view's values (any strides), a bounded span at a time

Values stored big-endian (an archive whose ``byteorder`` record says ``big``) are
byte-swapped in the buffer they are read into, as ``torch.load`` swaps them.

The element type is a torch dtype (chunks are torch tensors) or, for the types numpy can
read (:mod:`npdtypes`), an :class:`NpType` (chunks are :class:`NpChunk` values, and torch
is not needed). Both cut a tensor into the same chunks.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import numpy as np

from analyzer.ingest.ckpt.npdtypes import NpType
from analyzer.ingest.ckpt.npstats import NpChunk
from analyzer.ingest.safeio import open_regular
from analyzer.ingest.storage import SMALL_BLOCK, is_url

if TYPE_CHECKING:
    import torch
    from torch import Tensor

SPAN_FACTOR = 4
"""A strided block is read whole when its span is at most this many chunks."""


class FileRanges:
    """A regular file opened for reading ranges below the size it had when opened."""

    def __init__(self, path: str) -> None:
        self.path = path
        # On object storage each read fetches its range and little more: a listing reads
        # the zip directory and the pickle, never the tensors' values.
        handle, self.size = open_regular(path, SMALL_BLOCK) if is_url(path) else \
            open_regular(path)
        self._handle = cast(io.BufferedReader, handle)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> FileRanges:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; fewer where the file (as opened) ends."""
        length = min(length, self.size - offset)
        if offset < 0 or length <= 0:
            return b""
        self._handle.seek(offset)
        return self._handle.read(length)

    def readinto(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``offset``; the number of bytes read (short at the end)."""
        length = min(len(view), self.size - offset)
        if offset < 0 or length <= 0:
            return 0
        self._handle.seek(offset)
        got = 0
        while got < length:  # a read may return less than asked before the end
            n = self._handle.readinto(view[got:length])
            if not n:
                break
            got += n
        return got

    def stream(self) -> io.BufferedReader:
        """A file object over the same file, ending at the size it had when opened, for
        readers that want one (zipfile, torch.load of a small pickle)."""
        return io.BufferedReader(_Bounded(self), buffer_size=1 << 16)


class _Bounded(io.RawIOBase):
    """A seekable raw stream over :class:`FileRanges`, ending where the file ended."""

    def __init__(self, ranges: FileRanges) -> None:
        self._ranges = ranges
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._ranges.size}
        position = base[whence] + offset
        if position < 0:
            raise OSError(22, "negative seek position")
        self._position = position
        return position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        got = self._ranges.readinto(self._position, memoryview(buffer).cast("B"))
        self._position += got
        return got


def swap_bytes(raw: bytearray, length: int, dtype: torch.dtype) -> None:
    """Reverse the byte order of the first ``length`` bytes of ``raw``, value by value
    (each half of a complex value on its own, as torch's own byte swap does)."""
    import torch

    width = dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize
    if width <= 1 or length <= 0:
        return
    values = torch.frombuffer(raw, dtype=torch.uint8, count=length).view(-1, width)
    values.copy_(values.flip(1))


def _np_chunk(raw: bytearray | np.ndarray, kind: NpType, count: int, swap: bool) -> NpChunk:
    """``count`` values of ``kind`` from the start of ``raw``, without copying them."""
    base = np.dtype(kind.raw)
    per = kind.itemsize // base.itemsize
    if swap:
        base = base.newbyteorder(">")
    values = np.frombuffer(raw, dtype=base, count=count * per)
    return NpChunk(values.reshape(count, per) if per > 1 else values, kind)


def contiguous_chunks(
    ranges: FileRanges, offset: int, numel: int, dtype: torch.dtype | NpType, *,
    swap: bool = False
) -> Iterator[torch.Tensor | NpChunk]:
    """Chunks of ``numel`` values stored raw from byte ``offset`` (little-endian, or
    big-endian when ``swap``).

    One buffer is reused, so memory stays at one chunk. A short read (the file ends early)
    stops the iteration; callers compare element counts to notice it.
    """
    from analyzer.ingest.ckpt import stats

    item = _itemsize(dtype)
    buffer = bytearray(min(numel, stats.CHUNK) * item)
    view = memoryview(buffer)
    left, position = numel, offset
    while left > 0:
        count = min(left, stats.CHUNK)
        whole = ranges.readinto(position, view[: count * item]) // item
        if isinstance(dtype, NpType):
            if whole:
                yield _np_chunk(buffer, dtype, whole, swap)
        else:
            if swap:
                swap_bytes(buffer, whole * item, dtype)
            if whole:
                yield _torch_frombuffer(buffer, dtype, whole)
        if whole < count:
            return
        left -= count
        position += count * item


def _itemsize(dtype: torch.dtype | NpType) -> int:
    if isinstance(dtype, NpType):
        return dtype.itemsize
    return int(dtype.itemsize)


def _torch_frombuffer(buffer: bytearray, dtype: torch.dtype, count: int) -> torch.Tensor:
    from analyzer.ingest.ckpt.pinning import torch_pinned

    return cast("torch.Tensor", torch_pinned().frombuffer(buffer, dtype=dtype, count=count))


def span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a view's first element to its last, inclusive (0 when it is empty)."""
    if any(d == 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))


def storage_order(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions from the largest stride to the smallest: the order in which a view's
    values lie in its storage, which is the order :func:`strided_chunks` reads them in."""
    return tuple(sorted(range(len(stride)), key=lambda i: -stride[i]))


def strided_chunks(
    ranges: FileRanges,
    base: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: torch.dtype | NpType,
    *,
    swap: bool = False,
) -> Iterator[torch.Tensor | NpChunk]:
    """The values of a view whose first element is at byte ``base``, a bounded span at a
    time, in :func:`storage_order` (a transposed weight is read as it lies, not element by
    element). Strides must be non-negative and the extent checked against the storage."""
    from analyzer.ingest.ckpt import stats

    order = storage_order(stride)
    shape = tuple(shape[i] for i in order)
    stride = tuple(stride[i] for i in order)
    item = _itemsize(dtype)
    read = _Reader(ranges, dtype, item, swap)
    yield from _blocks(read, base, shape, stride, SPAN_FACTOR * stats.CHUNK)


class _Reader:
    """Reads the values of one view's blocks: the file, their dtype, their byte order."""

    def __init__(
        self, ranges: FileRanges, dtype: torch.dtype | NpType, item: int, swap: bool
    ) -> None:
        self.ranges, self.dtype, self.item, self.swap = ranges, dtype, item, swap

    def view(
        self, base: int, count: int, shape: tuple[int, ...], stride: tuple[int, ...]
    ) -> torch.Tensor | NpChunk:
        raw = bytearray(count * self.item)
        got = self.ranges.readinto(base, memoryview(raw))
        if got < len(raw):
            raise ValueError(f"the file ends {len(raw) - got} bytes before the tensor's last value")
        if isinstance(self.dtype, NpType):
            # Gathered as opaque items in the order torch's reshape gives, then viewed
            # as the stored type.
            items = np.frombuffer(raw, dtype=f"V{self.item}", count=count)
            strides = tuple(step * self.item for step in stride)
            picked = np.lib.stride_tricks.as_strided(items, shape, strides).reshape(-1)
            gathered = np.ascontiguousarray(picked)
            return _np_chunk(gathered.view(np.uint8), self.dtype, gathered.shape[0], self.swap)
        from analyzer.ingest.ckpt.pinning import torch_pinned

        torch = torch_pinned()
        if self.swap:
            swap_bytes(raw, len(raw), self.dtype)
        values = torch.frombuffer(raw, dtype=self.dtype, count=count)
        return cast("Tensor", values.as_strided(shape, stride).reshape(-1))


def _blocks(
    read: _Reader,
    base: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    limit: int,
) -> Iterator[torch.Tensor | NpChunk]:
    whole = span(shape, stride)
    if whole == 0:
        return
    if not shape or whole <= limit:
        yield read.view(base, whole, shape, stride)
        return
    inner, inner_stride = shape[1:], stride[1:]
    inner_span = span(inner, inner_stride)
    if inner_span > limit:  # one leading index alone spans too much: go one level down
        for row in range(shape[0]):
            yield from _blocks(read, base + row * stride[0] * read.item, inner, inner_stride,
                               limit)
        return
    rows = max(1, (limit - inner_span) // max(stride[0], 1) + 1)
    for first in range(0, shape[0], rows):
        block = (min(rows, shape[0] - first), *inner)
        yield read.view(base + first * stride[0] * read.item, span(block, stride), block, stride)
