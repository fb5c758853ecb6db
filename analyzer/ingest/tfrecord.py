"""TFRecord framing: where the records of a file are, and what damage lies between them.

A record is ``u64 length | u32 masked CRC of length | payload | u32 masked CRC of payload``,
all little-endian. Damage is returned as :class:`IngestIssue` values, one written policy per
kind, never raised:

    empty_file       0 bytes: the writer was created but never flushed
    truncated        the last record is cut off (the normal state of a crashed run's file):
                     everything before it is kept, reading stops
    zero_tail        the rest of the file is zero bytes (space reserved but never written):
                     everything before it is kept, reading stops
    bad_length_crc   a header whose length CRC does not match: the length cannot be trusted,
                     so the reader scans forward to the next valid header and goes on
    absurd_length    a header with a valid CRC but a length no event record has: skipped
                     like a bad header; nothing is allocated for it
    bad_payload_crc  the payload does not match its CRC: that record is skipped
    not_event_file   no valid record anywhere: the file is not an event file

The framing walk is a tight Python loop over lengths only; CRCs are checked afterwards for
all records at once (see :mod:`analyzer.ingest.crc32c`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzer.ingest.crc32c import masked_crc32c, masked_crc32c_rows
from analyzer.model import IngestIssue, Location

HEADER = 12  # u64 length + u32 length CRC
OVERHEAD = 16  # header + u32 payload CRC
# Event payloads beyond this are not written by any summary writer (protobuf caps at 2 GiB).
MAX_RECORD = 1 << 31
# Payloads up to this length are CRC-checked in vectorised groups; longer ones one by one.
_VECTOR_MAX = 1024
# Resynchronisation scans candidate header positions in windows of this many bytes.
_SCAN_WINDOW = 1 << 16

_LEN = struct.Struct("<Q")

Bytes = npt.NDArray[np.uint8]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Framing:
    """Offsets and payload lengths of the intact records of one file, in file order."""

    offsets: IntArray
    lengths: IntArray
    issues: tuple[IngestIssue, ...]


def frame(data: Bytes, path: str, *, verify: bool = True) -> Framing:
    """Locate every intact record of ``data`` (the whole file as a uint8 array)."""
    size = int(data.shape[0])
    if size == 0:
        issue = IngestIssue(Location(path, offset=0), "empty_file", "file is empty (0 bytes)")
        return Framing(_ints([]), _ints([]), (issue,))
    raw = memoryview(data)
    offsets: list[int] = []
    lengths: list[int] = []
    issues: list[IngestIssue] = []
    pos = 0
    while pos < size:
        seg_off, seg_len, stop = _walk(raw, pos, size)
        if verify and seg_off:
            bad = _first_bad_header(data, seg_off)
            if bad is not None:
                offsets += seg_off[:bad]
                lengths += seg_len[:bad]
                pos = seg_off[bad]
                pos = _skip(data, pos, "bad_length_crc", "record header CRC mismatch", issues, path)
                continue
        offsets += seg_off
        lengths += seg_len
        pos = stop
        if pos >= size:
            break
        pos = _diagnose_stop(data, pos, issues, path)
    framing_offsets, framing_lengths = _ints(offsets), _ints(lengths)
    if not offsets and size > 0:
        issues = [i for i in issues if i.kind not in ("bad_length_crc", "absurd_length")]
        issues.insert(0, _issue(path, 0, "not_event_file",
                                f"no valid TFRecord header in {size} bytes: not an event file"))
    if verify and offsets:
        good = _payload_crc_ok(data, framing_offsets, framing_lengths)
        for off in framing_offsets[~good]:
            issues.append(_issue(path, int(off), "bad_payload_crc",
                                 "record payload CRC mismatch: record skipped"))
        framing_offsets, framing_lengths = framing_offsets[good], framing_lengths[good]
    issues.sort(key=lambda i: i.location.offset or 0)
    return Framing(framing_offsets, framing_lengths, tuple(issues))


def _walk(raw: memoryview, pos: int, size: int) -> tuple[list[int], list[int], int]:
    """Follow length fields from ``pos`` while each record fits in the file."""
    offsets: list[int] = []
    lengths: list[int] = []
    unpack = _LEN.unpack_from
    while pos + HEADER <= size:
        (n,) = unpack(raw, pos)
        end = pos + OVERHEAD + n
        if end > size:
            break
        offsets.append(pos)
        lengths.append(n)
        pos = end
    return offsets, lengths, pos


def _diagnose_stop(data: Bytes, pos: int, issues: list[IngestIssue], path: str) -> int:
    """The walk stopped before the end of the file at ``pos``: say why, return where to go on."""
    size = int(data.shape[0])
    rest = size - pos
    if not data[pos:].any():
        issues.append(_issue(path, pos, "zero_tail",
                             f"last {rest} bytes are all zero: nothing was written there"))
        return size
    if rest < HEADER:
        issues.append(_issue(path, pos, "truncated",
                             f"file ends inside a record header ({rest} of {HEADER} bytes); "
                             "everything before it was read"))
        return size
    if not _header_ok(data, pos):
        return _skip(data, pos, "bad_length_crc", "record header CRC mismatch", issues, path)
    (n,) = _LEN.unpack_from(memoryview(data), pos)
    if n >= MAX_RECORD:
        return _skip(data, pos, "absurd_length",
                     f"record claims {n} bytes, more than any event record holds", issues, path)
    issues.append(_issue(path, pos, "truncated",
                         f"last record cut off: {rest - OVERHEAD if rest > OVERHEAD else 0} of "
                         f"{n} payload bytes present; everything before it was read"))
    return size


def _skip(data: Bytes, pos: int, kind: str, what: str,
          issues: list[IngestIssue], path: str) -> int:
    """Report damage at ``pos`` and return the offset of the next valid record (or the end)."""
    size = int(data.shape[0])
    found = _next_header(data, pos + 1)
    if found is None:
        if not data[pos:].any():
            issues.append(_issue(path, pos, "zero_tail", f"last {size - pos} bytes are all "
                                 "zero: nothing was written there"))
        else:
            issues.append(_issue(path, pos, kind, f"{what}; no valid record after it, last "
                                 f"{size - pos} bytes skipped"))
        return size
    issues.append(_issue(path, pos, kind,
                         f"{what}; skipped {found - pos} bytes to the next valid record "
                         f"at offset {found}"))
    return found


def _next_header(data: Bytes, start: int) -> int | None:
    """The first position at or after ``start`` holding a valid header whose record fits."""
    size = int(data.shape[0])
    pos = start
    while pos + HEADER <= size:
        stop = min(size - HEADER + 1, pos + _SCAN_WINDOW)
        windows = np.lib.stride_tricks.sliding_window_view(data[pos: stop + HEADER - 1], HEADER)
        heads = np.ascontiguousarray(windows[:, :8])
        stored = np.ascontiguousarray(windows[:, 8:]).view("<u4")[:, 0]
        room = size - OVERHEAD - np.arange(pos, stop, dtype=np.int64)
        fits = heads.view("<u8")[:, 0] <= np.maximum(room, 0).astype(np.uint64)
        hits = np.flatnonzero((masked_crc32c_rows(heads) == stored) & fits)
        if hits.size:
            return pos + int(hits[0])
        pos = stop
    return None


def _header_ok(data: Bytes, pos: int) -> bool:
    return bool(_first_bad_header(data, [pos]) is None)


def _first_bad_header(data: Bytes, offsets: list[int]) -> int | None:
    offs = np.asarray(offsets, dtype=np.int64)
    rows = data[offs[:, None] + np.arange(HEADER)]
    crc = masked_crc32c_rows(np.ascontiguousarray(rows[:, :8]))
    stored = np.ascontiguousarray(rows[:, 8:]).view("<u4")[:, 0]
    bad = np.flatnonzero(crc != stored)
    return int(bad[0]) if bad.size else None


def _payload_crc_ok(data: Bytes, offsets: IntArray, lengths: IntArray) -> npt.NDArray[np.bool_]:
    ok = np.ones(offsets.shape[0], dtype=bool)
    short = lengths <= _VECTOR_MAX
    for n in np.unique(lengths[short]).tolist():
        idx = np.flatnonzero(short & (lengths == n))
        per_chunk = max(1, (32 << 20) // (n + 4))  # bounds the gathered copy to ~32 MB
        for lo in range(0, idx.size, per_chunk):
            chunk = idx[lo: lo + per_chunk]
            rows = data[(offsets[chunk] + HEADER)[:, None] + np.arange(n + 4)]
            stored = np.ascontiguousarray(rows[:, n:]).view("<u4")[:, 0]
            ok[chunk] = masked_crc32c_rows(rows[:, :n]) == stored
    raw = memoryview(data)
    for i in np.flatnonzero(~short).tolist():
        s, n = int(offsets[i]) + HEADER, int(lengths[i])
        stored = int.from_bytes(raw[s + n: s + n + 4], "little")
        ok[i] = masked_crc32c(raw[s: s + n]) == stored
    return ok


def _issue(path: str, offset: int, kind: str, message: str) -> IngestIssue:
    return IngestIssue(Location(path, offset=offset), kind, message)


def _ints(values: list[int]) -> IntArray:
    return np.asarray(values, dtype=np.int64)
