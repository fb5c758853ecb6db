"""safetensors files: the header is validated before any tensor is read.

Layout: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
byte after the header) plus an optional ``__metadata__`` map of strings, then the data.
Every check below names the byte offset it is about. Tensors are read one at a time,
in chunks, straight from the file.

Policy: a header that fails a check yields no tensors (``bad_checkpoint``); holes and
bytes after the last tensor are reported and the tensors kept. A header larger than
``MAX_HEADER_BYTES`` or listing more than ``MAX_TENSORS`` tensors is refused
(``too_large``) before it is parsed: real checkpoints hold at most tens of thousands of
tensors per file, and a header of millions costs minutes and gigabytes to follow.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.ingest.ckpt.extents import torch_dtype
from analyzer.ingest.ckpt.leaves import Leaf
from analyzer.ingest.ckpt.npdtypes import np_type
from analyzer.ingest.ckpt.npstats import NpChunk
from analyzer.ingest.ckpt.quoting import foreign, quote, value
from analyzer.ingest.ckpt.ranges import FileRanges, contiguous_chunks
from analyzer.model import IngestIssue, IssueKind, Location

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 32 << 20
"""The largest header read (the reference implementation's own limit is 100 MB). A
header lists a tensor in about 100 bytes: 32 MiB is room for 300,000 of them."""
MAX_TENSORS = 100_000
"""The most tensors one file may list."""
PLAUSIBLE_LENGTH = 1 << 48
"""A header length at or above this is not given in messages: the 8 bytes that make it
are then more likely text (eight letters read as a length) than a damaged length."""
MAX_LISTED = 5
"""Holes reported one by one; the rest are counted."""

DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "F32": ("float32", 4),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
    "F64": ("float64", 8),
    "C64": ("complex64", 8),
}


@dataclass(frozen=True)
class SafeTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafeHeader:
    tensors: tuple[SafeTensor, ...]
    metadata: dict[str, str]
    data_start: int
    issues: tuple[IngestIssue, ...]


def _fail(path: str, offset: int, message: str, kind: IssueKind = "bad_checkpoint") -> SafeHeader:
    issue = IngestIssue(Location(path, offset=offset), kind, message)
    return SafeHeader((), {}, 0, (issue,))


def read_header(ranges: FileRanges) -> SafeHeader:
    """Parse and check the header; a header that fails a check yields no tensors."""
    path, size = ranges.path, ranges.size
    if size < 8:
        return _fail(path, 0, f"safetensors file of {size} bytes: too short for a header")
    (length,) = struct.unpack("<Q", ranges.read(0, 8))
    if 8 + length > size:
        if length >= PLAUSIBLE_LENGTH:  # its 8 bytes are likely not a length: not quoted
            return _fail(path, 0, f"safetensors header length (the first 8 bytes) reads as "
                         f"more than {PLAUSIBLE_LENGTH:,} bytes, in a file of {size:,}: not "
                         "a safetensors header")
        limit = f" (and the limit is {MAX_HEADER_BYTES:,})" if length > MAX_HEADER_BYTES else ""
        return _fail(path, 0, f"safetensors header claims {length} bytes; file has "
                     f"{size - 8} after it{limit}")
    if length > MAX_HEADER_BYTES:
        return _fail(path, 0, f"safetensors header of {length:,} bytes is above the limit of "
                     f"{MAX_HEADER_BYTES:,} bytes; refused before parsing", "too_large")
    raw = ranges.read(8, length)
    listed = raw.count(b'"data_offsets"')  # an upper bound, known before parsing
    if listed > MAX_TENSORS:
        return _too_many(path, listed, "about ")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else foreign(str(exc), 200)
        return _fail(path, 8, f"safetensors header is not valid JSON: {reason}")
    if not isinstance(header, dict):
        return _fail(path, 8, "safetensors header is not a JSON object")
    if len(header) - ("__metadata__" in header) > MAX_TENSORS:
        return _too_many(path, len(header) - ("__metadata__" in header), "")
    return _check_entries(path, header, 8 + length, size - 8 - length)


def _too_many(path: str, count: int, about: str) -> SafeHeader:
    return _fail(path, 8, f"safetensors header lists {about}{count:,} tensors, above the limit "
                 f"of {MAX_TENSORS:,} per file; refused", "too_large")


def _check_entries(path: str, header: dict[str, object], start: int, data_size: int) -> SafeHeader:
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        metadata = {}
    tensors: list[SafeTensor] = []
    for name, spec in header.items():
        problem = _entry_problem(spec, data_size)
        if problem is not None:
            return _fail(path, 8, f"safetensors tensor {quote(name)}: {problem}")
        assert isinstance(spec, dict)
        begin, end = spec["data_offsets"]
        tensors.append(SafeTensor(name, spec["dtype"], tuple(spec["shape"]), begin, end))
    ordered = sorted(tensors, key=lambda t: (t.begin, t.end))
    issues: list[IngestIssue] = []
    holes = 0
    covered = 0
    for tensor in ordered:
        if tensor.begin < covered:
            return _fail(
                path,
                start + tensor.begin,
                f"safetensors tensor {quote(tensor.name)} overlaps the tensor before it",
            )
        if tensor.begin > covered:
            holes += 1
            if holes <= MAX_LISTED:
                issues.append(
                    IngestIssue(
                        Location(path, offset=start + covered),
                        "bad_checkpoint",
                        f"safetensors data has a hole before {quote(tensor.name)}",
                    )
                )
        covered = max(covered, tensor.end)
    if holes > MAX_LISTED:
        issues.append(
            IngestIssue(Location(path, offset=start), "bad_checkpoint",
                        f"{holes - MAX_LISTED} more holes in the safetensors data")
        )
    if covered < data_size:
        issues.append(
            IngestIssue(
                Location(path, offset=start + covered),
                "bad_checkpoint",
                f"{data_size - covered} bytes after the last tensor",
            )
        )
    meta = {str(k): str(v) for k, v in metadata.items()}
    return SafeHeader(tuple(tensors), meta, start, tuple(issues))


def _entry_problem(spec: object, data_size: int) -> str | None:
    if not isinstance(spec, dict):
        return "entry is not an object"
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in DTYPES:
        return f"unknown dtype {value(dtype)}"
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        return f"bad shape {value(shape)}"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        return f"bad data_offsets {value(offsets)}"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return f"data_offsets [{begin}, {end}] outside the {data_size}-byte data section"
    numel = 1
    for dim in shape:
        numel *= dim
    expected = numel * DTYPES[dtype][1]
    if end - begin != expected:
        return f"data_offsets span {end - begin} bytes; shape and dtype need {expected}"
    return None


def leaf_of(ranges: FileRanges, header: SafeHeader, tensor: SafeTensor) -> Leaf:
    name, _ = DTYPES[tensor.dtype]
    offset = header.data_start + tensor.begin
    known = np_type(name)  # every safetensors type is, so torch is never needed here
    if known is not None:
        count = (tensor.end - tensor.begin) // known.itemsize

        def np_chunks() -> Iterator[torch.Tensor | NpChunk]:
            return contiguous_chunks(ranges, offset, count, known)

        return Leaf(tensor.shape, name, np_chunks, None, known.numeric)
    dtype = torch_dtype(name)
    if dtype is None:
        return Leaf(tensor.shape, name, None, "dtype not supported by this torch", False)
    numeric = dtype.is_floating_point or dtype.is_complex
    numel = (tensor.end - tensor.begin) // dtype.itemsize

    def chunks() -> Iterator[torch.Tensor | NpChunk]:
        return contiguous_chunks(ranges, offset, numel, dtype)

    return Leaf(tensor.shape, name, chunks, None, numeric)
