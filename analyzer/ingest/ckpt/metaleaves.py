"""Tensors of the tree ``torch.load(map_location="meta")`` built, read from the archive.

On the meta device torch builds every tensor as the pickle describes it, without reading
a value, and notes on each storage where its record's bytes start
(``_checkpoint_offset``). That tree is scanned when it places a tensor differently from
the static reading (:func:`readings_agree`), whether weights_only or trusted code built
it. Its extents are then checked against torch's storages, not the static reader's,
before the values are read with ordinary reads (:mod:`ranges`), never a memory map.

Policy (``bad_checkpoint``, naming the record and its offset; the tensor is not scanned):
a storage that starts where no storage record starts, holds more bytes than its record
(a pickle can grow one, a ``BUILD`` on a tensor calling ``set_`` with a larger size), or
whose record fails :func:`extents.record_problem`; a view that reaches outside its
storage. A tensor trusted code made in memory (not on meta) is scanned where it is; one
this torch does not place (no ``_checkpoint_offset``) is listed with a note, unread.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.ingest.ckpt import extents
from analyzer.ingest.ckpt.archive import Archive, Entry
from analyzer.ingest.ckpt.leaves import Leaf, TorchLeaves
from analyzer.ingest.ckpt.npstats import NpChunk
from analyzer.ingest.ckpt.ranges import FileRanges, contiguous_chunks, span, strided_chunks
from analyzer.ingest.ckpt.staticpickle import TensorRef
from analyzer.ingest.ckpt.tree import LeafSource, walk

if TYPE_CHECKING:
    import torch


def record_offset(tensor: torch.Tensor) -> int | None:
    """Where torch placed the bytes of a meta tensor's storage, when it says."""
    try:
        offset = getattr(tensor.untyped_storage(), "_checkpoint_offset", None)
    except (RuntimeError, NotImplementedError):  # a layout without one storage
        return None
    return offset if isinstance(offset, int) else None


class MetaLeaves:
    """Leaves of a meta-device tree whose values are read from ``archive``."""

    def __init__(self, ranges: FileRanges, archive: Archive) -> None:
        self.ranges = ranges
        self.archive = archive
        self.problems: list[extents.Problem] = []
        """Every storage or view that did not fit, once each, as leaves were made."""
        self._records = {
            e.data_offset: e for e in archive.entries.values()
            if e.name.startswith(f"{archive.prefix}/data/")
        }
        self._made: dict[int, tuple[object, Leaf]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._in_memory = TorchLeaves()

    def leaf(self, value: object) -> Leaf | None:
        import torch

        if not isinstance(value, torch.Tensor):
            return None
        if value.device.type != "meta":
            return self._in_memory.leaf(value)
        made = self._made.get(id(value))  # one Leaf per tensor, as in StaticLeaves
        if made is not None and made[0] is value:
            return made[1]
        leaf = self._make(value)
        self._made[id(value)] = (value, leaf)
        return leaf

    def _make(self, value: torch.Tensor) -> Leaf:
        import torch

        dtype = value.dtype
        name = str(dtype).removeprefix("torch.")
        shape = tuple(int(d) for d in value.shape)
        numeric = dtype.is_floating_point or dtype.is_complex
        if value.is_sparse or value.is_quantized or value.layout != torch.strided:
            return Leaf(shape, name, None, "layout not scanned", False)
        offset = record_offset(value)
        if offset is None:
            return Leaf(shape, name, None, "values not read: this torch does not say where "
                        "its storage lies in the archive", numeric)
        entry = self._records.get(offset)
        reason = self._unfit(value, offset, entry)
        if reason is not None or entry is None:
            return Leaf(shape, name, None, f"not scanned: {reason}", numeric)
        stride = tuple(int(s) for s in value.stride())
        base = entry.data_offset + int(value.storage_offset()) * dtype.itemsize
        ranges, count = self.ranges, value.numel()
        if value.is_contiguous():

            def chunks() -> Iterator[torch.Tensor | NpChunk]:
                return contiguous_chunks(ranges, base, count, dtype)

            return Leaf(shape, name, chunks, None, numeric)

        def strided() -> Iterator[torch.Tensor | NpChunk]:
            return strided_chunks(ranges, base, shape, stride, dtype)

        return Leaf(shape, name, strided, None, numeric, stride)

    def _unfit(self, value: torch.Tensor, offset: int, entry: Entry | None) -> str | None:
        nbytes = int(value.untyped_storage().nbytes())
        if entry is None:
            return self._report(f"offset {offset}", offset, f"torch places a storage at offset "
                                f"{offset}, where no storage record of the archive starts")
        member = entry.name
        claim = f"torch's reading of the pickle gives it {nbytes} bytes"
        reason = extents.record_problem(entry, self.archive, nbytes, claim)
        if reason is not None:
            return self._report(member, offset, f"storage {member}: {reason}")
        shape = tuple(int(d) for d in value.shape)
        stride = tuple(int(s) for s in value.stride())
        first = int(value.storage_offset())
        elements = span(shape, stride)
        need = (first + elements) * value.element_size() if elements else 0
        if first < 0 or any(s < 0 for s in stride) or need > nbytes:
            return self._report(member, offset, (
                f"a tensor over {member}: the view needs {need} bytes from the storage's "
                f"start (offset {first}, size {list(shape)}, stride {list(stride)}) but "
                f"torch's storage has {nbytes}"))
        return None

    def _report(self, member: str, offset: int, message: str) -> str:
        if (member, message) not in self._reported:
            self._reported.add((member, message))
            self.problems.append(extents.Problem(member, offset, message))
        return message


@dataclass(frozen=True)
class _Placed(Leaf):
    """A tensor's description with where its values lie: the record's offset (None when
    torch does not say), the offset in the storage, the strides."""

    where: tuple[int | None, int, tuple[int, ...]] = (None, 0, ())


class _MetaPlaced:
    """Where torch's meta-device reading puts each tensor."""

    def leaf(self, value: object) -> Leaf | None:
        import torch

        if not isinstance(value, torch.Tensor):
            return None
        try:
            where = (record_offset(value) if value.device.type == "meta" else -1,
                     int(value.storage_offset()), tuple(int(s) for s in value.stride()))
        except (RuntimeError, NotImplementedError):  # sparse and other layouts: no strides
            where = (-1, -1, ())
        return _Placed(tuple(value.shape), str(value.dtype).removeprefix("torch."), None,
                       where=where)


class _StaticPlaced:
    """Where the static reading puts each tensor."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive

    def leaf(self, value: object) -> Leaf | None:
        if not isinstance(value, TensorRef):
            return None
        entry = self.archive.member(f"data/{value.storage.key}") if value.storage else None
        where = (entry.data_offset if entry else -1, value.offset, value.stride)
        return _Placed(value.shape, value.dtype_name, None, where=where)


Placement = tuple[str, tuple[int, ...], str, tuple[int | None, int, tuple[int, ...]]]


def readings_agree(meta: object, static: object, archive: Archive) -> bool:
    """True when torch's meta-device tree and the static one put the same tensors (name,
    shape, dtype, record, offset in it, strides) in the same order: the static tree can
    then stand in for torch's."""
    return _agree(_placements(meta, _MetaPlaced()), _placements(static, _StaticPlaced(archive)))


def _placements(root: object, leaves: LeafSource) -> list[Placement]:
    return [
        (name, leaf.shape, leaf.dtype, leaf.where)
        for name, leaf in walk(root, "", leaves)
        if isinstance(leaf, _Placed)
    ]


def _agree(torch_side: list[Placement], static_side: list[Placement]) -> bool:
    # A record offset torch does not give (None: an older torch) is not compared.
    if len(torch_side) != len(static_side):
        return False
    for (*ours, (record, *rest)), (*theirs, (their_record, *their_rest)) in zip(
        torch_side, static_side, strict=True
    ):
        if ours != theirs or rest != their_rest or record not in (None, their_record):
            return False
    return True
