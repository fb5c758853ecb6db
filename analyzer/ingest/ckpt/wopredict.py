"""When torch's own reading of an archive is known in advance, so torch need not run.

For a complete archive the scan asks ``torch.load(weights_only=True, map_location="meta")``
whether the pickle may be loaded and where torch places each tensor, and scans the static
tree when both readings agree (:mod:`scan`). For what ``torch.save`` itself writes of a
state dict (ordered maps, tensors, parameters, numbers, strings, lists and tuples) the
answer is known without torch: :func:`agrees_without_torch` says so only when

* the pickle uses only opcodes and globals that torch's ``weights_only`` unpickler takes
  and that the static reader reads as it does (no object but an ``OrderedDict`` given a
  state, tensors rebuilt with the arguments ``torch.save`` writes), and the static read
  saw nothing that unpickler would treat otherwise (``unlike_torch``);
* the zip directory is byte for byte the form torch's writer makes, and the records torch
  reads before any tensor (``data.pkl``, ``version``, ``byteorder``, ``.format_version``,
  ``.storage_alignment``, ``.data/serialization_id``) hold what torch expects and match
  their CRC-32, which torch's zip reader checks;
* every storage lies where torch computes it to be: torch does not read the local
  headers of the storages after the first but derives their offsets from the layout its
  writer makes (each header right after the previous storage and its 16-byte data
  descriptor, the data aligned to ``.storage_alignment``), so a storage placed otherwise
  would be read by torch from elsewhere.

Anything else (another global, a sparse or quantized tensor, another layout, a file over
4 GiB) goes to torch as before. Tests compare both paths on real and damaged files.
"""

from __future__ import annotations

import struct
import zlib

from analyzer.ingest.ckpt.archive import Archive
from analyzer.ingest.ckpt.extents import itemsize
from analyzer.ingest.ckpt.ranges import FileRanges
from analyzer.ingest.ckpt.staticpickle import TORCH_STORAGES, StaticResult

OPCODES = frozenset({
    "PROTO", "STOP", "MARK", "GLOBAL", "REDUCE", "BUILD", "BINPERSID",
    "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "SETITEM", "SETITEMS", "APPEND", "APPENDS",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "BINUNICODE",
})  # fmt: skip
"""Opcodes torch's weights_only unpickler and the static reader read alike."""
GLOBALS = frozenset({
    "collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter", *(f"torch.{name}" for name in TORCH_STORAGES),
})
"""Globals on every torch's weights_only allow-list that the static reader rebuilds."""
_DESCRIPTOR = 16
_DESCRIPTOR64 = 24
_U32 = 0xFFFFFFFF


def agrees_without_torch(result: StaticResult, archive: Archive, ranges: FileRanges) -> bool:
    """True when torch's weights_only reading of this complete archive is known to accept
    it and to place every tensor as ``result`` does."""
    if result.error is not None or result.unlike_torch is not None:
        return False
    if not result.opcodes <= OPCODES or not set(result.globals_seen) <= GLOBALS:
        return False
    try:
        return (_directory_as_torch_writes(archive, ranges)
                and _records_as_torch_wants(archive, ranges)
                and _placed_as_torch_computes(result, archive, ranges))
    except struct.error:  # a record cut short: a file that shrank since it was opened
        return False


_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
_LOCATOR = struct.Struct("<4sIQI")
_END = struct.Struct("<4sHHHHIIH")


def _directory_as_torch_writes(archive: Archive, ranges: FileRanges) -> bool:
    """The central directory and its end records exactly as torch's zip writer makes
    them: Python's zip reader tolerates fields (entry counts, disk numbers, attributes)
    that torch's refuses, so only this form is judged without torch."""
    size, count = ranges.size, len(archive.entries)
    if size < _END.size + _LOCATOR.size + _ZIP64_END.size or count >= 0xFFFF:
        return False
    end = _END.unpack(ranges.read(size - _END.size, _END.size))
    locator_at = size - _END.size - _LOCATOR.size
    locator = _LOCATOR.unpack(ranges.read(locator_at, _LOCATOR.size))
    record_at = locator_at - _ZIP64_END.size
    record = _ZIP64_END.unpack(ranges.read(record_at, _ZIP64_END.size))
    directory_size, directory_at = end[5], end[6]
    if end != (b"PK\x05\x06", 0, 0, count, count, directory_size, directory_at, 0):
        return False
    if locator != (b"PK\x06\x07", 0, record_at, 1):
        return False
    if record[0] != b"PK\x06\x06" or record[1] != 44 or record[4:] != (
        0, 0, count, count, directory_size, directory_at
    ) or directory_at + directory_size != record_at:
        return False
    raw = ranges.read(directory_at, directory_size)
    position = 0
    for entry in archive.entries.values():
        if position + _CENTRAL.size > len(raw):
            return False
        fields = _CENTRAL.unpack_from(raw, position)
        name_length = fields[10]
        name = raw[position + _CENTRAL.size : position + _CENTRAL.size + name_length]
        flags = 0x808 if entry.stored_size else 0x800  # no data descriptor after no data
        expected = (b"PK\x01\x02", 0, 0, flags, 0, fields[5], fields[6], entry.crc,
                    entry.stored_size, entry.stored_size, name_length, 0, 0, 0, 0, 0,
                    entry.header_offset)
        if fields != expected or name != entry.name.encode():
            return False
        position += _CENTRAL.size + name_length
    return position == len(raw)


def _record(archive: Archive, ranges: FileRanges, leaf: str) -> bytes | None:
    """A small record's bytes when its CRC matches; None when it is absent or unfit."""
    entry = archive.member(leaf)
    if entry is None or entry.compressed or entry.crc is None or entry.stored_size > 1 << 28:
        return None
    data = ranges.read(entry.data_offset, entry.stored_size)
    ok = len(data) == entry.stored_size and zlib.crc32(data) == entry.crc
    return data if ok else None


def _records_as_torch_wants(archive: Archive, ranges: FileRanges) -> bool:
    names = list(archive.entries)
    if not names or not all(n.startswith(f"{archive.prefix}/") for n in names):
        return False  # torch names the archive after its first entry's folder
    if archive.member(".data/version") is not None:
        return False
    version = _record(archive, ranges, "version")
    if version is None or version.strip() not in (b"1", b"2", b"3"):
        return False
    for leaf in ("data.pkl", "byteorder", ".format_version", ".storage_alignment",
                 ".data/serialization_id"):
        if archive.member(leaf) is not None and _record(archive, ranges, leaf) is None:
            return False
    serial = _record(archive, ranges, ".data/serialization_id") or b""
    if not serial.isascii():  # torch hands it to Python as text
        return False
    order = _record(archive, ranges, "byteorder")
    if archive.member("byteorder") is not None and order != b"little":
        return False
    if archive.member(".storage_alignment") is not None:
        text = _record(archive, ranges, ".storage_alignment") or b""
        if not text.isdigit() or int(text) != archive.alignment:
            return False
    return True


def _placed_as_torch_computes(result: StaticResult, archive: Archive, ranges: FileRanges) -> bool:
    marker = archive.member(".format_version")
    if marker is None:
        return True  # torch then reads each storage's own local header, as the static read
    if (_record(archive, ranges, ".format_version") or b"") < b"1":
        return True
    alignment = archive.alignment or 64
    cursor: int | None = None
    for key, storage in result.storages.items():  # in the order torch first loads them
        entry = archive.member(f"data/{key}")
        size = itemsize(storage.dtype)
        if entry is None or size is None or storage.numel < 0:
            return False
        nbytes = storage.numel * size
        if cursor is None:
            if key != "0":
                return False  # torch refuses a first storage of another key
            header, offset = entry.header_offset, entry.data_offset
        else:
            header, offset = cursor, _aligned(cursor + 30 + len(entry.name) + 4, alignment)
            if offset != entry.data_offset:
                return False
        if header >= _U32 or nbytes >= _U32 or offset >= _U32:
            return False
        cursor = offset + nbytes + (_DESCRIPTOR if nbytes > 0 else 0)
    return True


def _aligned(start: int, alignment: int) -> int:
    return start if start % alignment == 0 else start + alignment - start % alignment
