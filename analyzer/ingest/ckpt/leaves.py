"""A common view of a tensor, whether torch loaded it or a static read described it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.ingest.ckpt.archive import Archive
from analyzer.ingest.ckpt.staticpickle import TensorRef
from analyzer.ingest.ckpt.stats import file_chunks, tensor_chunks

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Leaf:
    """A tensor's description and, when its values can be read, a way to read them."""

    shape: tuple[int, ...]
    dtype: str
    chunks: Callable[[], Iterator[torch.Tensor]] | None
    note: str | None = None
    numeric: bool = True


def torch_dtype(name: str) -> torch.dtype | None:
    import torch

    value = getattr(torch, name, None)
    return value if isinstance(value, torch.dtype) else None


def _numeric(dtype: torch.dtype | None) -> bool:
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


class TorchLeaves:
    """Leaves of a tree that ``torch.load`` built; ``release`` drops mapped pages."""

    def __init__(self, *, release: bool) -> None:
        self.release = release

    def leaf(self, value: object) -> Leaf | None:
        import torch

        if not isinstance(value, torch.Tensor):
            return None
        dtype = str(value.dtype).removeprefix("torch.")
        shape = tuple(int(d) for d in value.shape)
        if value.is_sparse or value.is_quantized or value.device.type != "cpu":
            return Leaf(shape, dtype, None, "layout or device not scanned", False)
        release = self.release

        def chunks() -> Iterator[torch.Tensor]:
            return tensor_chunks(value, release=release)

        return Leaf(shape, dtype, chunks, None, _numeric(value.dtype))


class StaticLeaves:
    """Leaves of a statically read ``torch.save`` pickle, read raw from the archive."""

    def __init__(self, path: str, archive: Archive | None, *, little_endian: bool) -> None:
        self.path = path
        self.archive = archive
        self.little_endian = little_endian

    def leaf(self, value: object) -> Leaf | None:
        if not isinstance(value, TensorRef):
            return None
        dtype_name = value.storage.dtype if value.storage else "unknown"
        dtype = torch_dtype(dtype_name)
        numeric = _numeric(dtype)
        note = self._unreadable(value, dtype)
        if note is not None or dtype is None or value.storage is None or self.archive is None:
            return Leaf(value.shape, dtype_name, None, note, numeric)
        entry = self.archive.member(f"data/{value.storage.key}")
        assert entry is not None  # checked by _unreadable
        start = entry.data_offset + value.offset * dtype.itemsize
        path, count = self.path, value.numel

        def chunks() -> Iterator[torch.Tensor]:
            return file_chunks(path, start, count, dtype)

        return Leaf(value.shape, dtype_name, chunks, None, numeric)

    def _unreadable(self, ref: TensorRef, dtype: torch.dtype | None) -> str | None:
        if ref.storage is None or dtype is None:
            return "storage type not recognised"
        if self.archive is None:
            return "values not read (not a zip archive)"
        if not self.little_endian:
            return "big-endian archive: values not read"
        if ref.offset < 0 or any(d < 0 for d in ref.shape):
            return "negative offset or size in the pickle"
        if not ref.contiguous:
            return "strided view: values not read"
        entry = self.archive.member(f"data/{ref.storage.key}")
        if entry is None and not self.archive.complete:
            return f"storage data/{ref.storage.key} not written whole before the file ends"
        if entry is None:
            return f"storage data/{ref.storage.key} missing from the archive"
        if entry.compressed:
            return "compressed storage: values not read"
        if (ref.offset + ref.numel) * dtype.itemsize > entry.stored_size:
            return "storage shorter than the tensor"
        return None
