"""Where a tensor's bytes lie in a torch archive, checked before any of them is read.

An archive describes every tensor twice: its pickle names a storage (an archive key, a
dtype and an element count) and a view of it (offset, size, strides), and its zip holds
the storage's bytes as the record ``<prefix>/data/<key>``. Nothing ties the three
together but the writer's good faith. ``torch.load(mmap=True)`` trusts the element count
and maps that many bytes from where the record starts, so a short record makes it read the
records after it (the next tensor, zip headers) as if they were values.

Policy (``bad_checkpoint``, naming the record and its byte offset): a storage whose record
is missing, compressed, shorter than its element count needs, off the storage alignment
the archive declares, or not followed by the next zip header (a local header altered to
move its bytes), and a view that reaches
outside its storage or has a malformed geometry, are reported, and their tensors are not
scanned. Every read mode goes through this check before any tensor's bytes are read; a
file with any such problem is not handed to ``torch.load``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.ingest.ckpt.archive import Archive, Entry
from analyzer.ingest.ckpt.npdtypes import np_type
from analyzer.ingest.ckpt.pinning import torch_pinned
from analyzer.ingest.ckpt.ranges import span
from analyzer.ingest.ckpt.staticpickle import StaticResult, StorageRef, TensorRef

if TYPE_CHECKING:
    import torch

MAX_ISSUES = 20
"""Problems listed one by one per file; the rest are counted in one more issue."""


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype a file names without the ``torch.`` prefix, or None."""
    torch = torch_pinned()
    value = getattr(torch, name, None)
    return value if isinstance(value, torch.dtype) else None


@functools.cache
def itemsize(dtype: str) -> int | None:
    """Bytes per element of a torch dtype named without its ``torch.`` prefix (torch is
    asked only about a type numpy does not read)."""
    known = np_type(dtype)
    if known is not None:
        return known.itemsize
    found = torch_dtype(dtype)
    return None if found is None else int(found.itemsize)


@dataclass(frozen=True)
class Problem:
    """One storage or view that does not fit, and the record it is about."""

    member: str
    offset: int | None
    message: str


def storage_problem(storage: StorageRef, entry: Entry | None, archive: Archive) -> str | None:
    """Why the bytes of ``storage`` cannot be read from its record, or None."""
    size = itemsize(storage.dtype)
    if entry is None:
        if archive.truncated:
            return "not written whole before the file ends"
        return "missing" if archive.complete else "not found by following the local headers"
    if size is None or storage.numel < 0:
        placed = record_problem(entry, archive, 0, "")
        if placed is not None:
            return placed
        return f"storage type {storage.dtype!r} or element count {storage.numel} not understood"
    need = storage.numel * size
    claim = f"the pickle gives it {storage.numel} {storage.dtype} elements ({need} bytes)"
    return record_problem(entry, archive, need, claim)


def record_problem(entry: Entry, archive: Archive, need: int, claim: str) -> str | None:
    """Why ``need`` bytes of a storage cannot be read from the record ``entry``, or None;
    ``claim`` says who gives the storage that many bytes."""
    if entry.compressed:
        return "compressed (torch.save never compresses a storage)"
    if entry.name in archive.misplaced:
        return (
            f"its bytes, from offset {entry.data_offset}, are not followed by the next zip "
            "header where they end (its local header was altered)"
        )
    if archive.alignment is not None and entry.data_offset % archive.alignment:
        return (
            f"its bytes start at offset {entry.data_offset}, off the archive's "
            f"{archive.alignment}-byte storage alignment (its local header was altered)"
        )
    if need > entry.stored_size:
        return f"{claim} but its record holds {entry.stored_size} bytes"
    return None


def view_problem(ref: TensorRef) -> str | None:
    """Why the view ``ref`` does not fit in its storage (as the pickle sizes it), or None."""
    if ref.problem is not None:
        return ref.problem
    storage = ref.storage
    if storage is None:
        return "no storage"
    if len(ref.shape) != len(ref.stride):
        return f"{len(ref.shape)} sizes but {len(ref.stride)} strides"
    if ref.offset < 0 or any(d < 0 for d in ref.shape) or any(s < 0 for s in ref.stride):
        return "negative offset, size or stride"
    tensor_item, storage_item = itemsize(ref.dtype_name), itemsize(storage.dtype)
    if tensor_item is None or storage_item is None:
        return f"dtype {ref.dtype_name!r} not understood"
    elements = span(ref.shape, ref.stride)
    need = (ref.offset + elements) * tensor_item if elements else 0
    have = storage.numel * storage_item
    if need > have:
        return (
            f"the view needs {need} bytes from the storage's start (offset {ref.offset}, size "
            f"{list(ref.shape)}, stride {list(ref.stride)}) but the storage has {have}"
        )
    return None


def problems(result: StaticResult, archive: Archive) -> list[Problem]:
    """Every storage and view of the pickle that does not fit, storages first."""
    found: list[Problem] = []
    for key, storage in result.storages.items():
        entry = archive.member(f"data/{key}")
        if entry is None and not archive.complete:
            continue  # cut off with the file, or lost with its directory: that issue says so
        reason = storage_problem(storage, entry, archive)
        if reason is not None:
            member = f"{archive.prefix}/data/{key}"
            offset = entry.data_offset if entry is not None else None
            found.append(Problem(member, offset, f"storage {member}: {reason}"))
    for ref in result.tensors:
        reason = view_problem(ref) if ref.storage is None or ref.storage.numel >= 0 else None
        if reason is not None:
            key = ref.storage.key if ref.storage is not None else "?"
            entry = archive.member(f"data/{key}")
            member = f"{archive.prefix}/data/{key}"
            offset = entry.data_offset if entry is not None else None
            found.append(Problem(member, offset, f"a tensor over {member}: {reason}"))
    return found


def unfit(ref: TensorRef, archive: Archive) -> str | None:
    """Why the values of ``ref`` must not be read from ``archive``, or None."""
    if ref.storage is None:
        return "storage type not recognised"
    entry = archive.member(f"data/{ref.storage.key}")
    reason = storage_problem(ref.storage, entry, archive)
    if reason is not None:
        return f"storage data/{ref.storage.key}: {reason}"
    return view_problem(ref)
