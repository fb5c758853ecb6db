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
# Lengths below this get their header CRCs from a lookup table indexed by length.
_LUT_MAX = 1 << 20
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
    """Locate every intact record of ``data`` (the whole file as a uint8 array).

    With ``verify`` both CRCs of every record are checked. Without it the walk trusts the
    length fields until one points past the end of the file, where the header CRC is still
    consulted to tell a cut-off record from corruption.
    """
    size = int(data.shape[0])
    if size == 0:
        issue = IngestIssue(Location(path, offset=0), "empty_file", "file is empty (0 bytes)")
        return Framing(_ints([]), _ints([]), (issue,))
    raw = data.data
    segments: list[IntArray] = []
    issues: list[IngestIssue] = []
    pos = 0
    while pos < size:
        seg, stop = _walk(raw, pos, size)
        if verify and seg.size:
            bad = _first_bad_header(data, seg)
            if bad is not None:
                segments.append(seg[:bad])
                pos = _skip(data, int(seg[bad]), "bad_length_crc", "record header CRC mismatch",
                            issues, path)
                continue
        segments.append(seg)
        pos = stop
        if pos < size:
            pos = _diagnose_stop(data, pos, issues, path)
    offsets = np.concatenate(segments) if segments else _ints([])
    lengths = (np.asarray(_lengths_at(data, offsets), dtype=np.int64) if offsets.size
               else _ints([]))
    if not offsets.size and data.any() and not any(i.kind == "truncated" for i in issues):
        issues = [i for i in issues if i.kind not in ("bad_length_crc", "absurd_length")]
        issues.insert(0, _issue(path, 0, "not_event_file",
                                f"no valid TFRecord header in {size} bytes: not an event file"))
    if verify and offsets.size:
        good = _payload_crc_ok(data, offsets, lengths)
        for off in offsets[~good].tolist():
            issues.append(_issue(path, off, "bad_payload_crc",
                                 "record payload CRC mismatch: record skipped"))
        offsets, lengths = offsets[good], lengths[good]
    issues.sort(key=lambda i: i.location.offset or 0)
    return Framing(offsets, lengths, tuple(issues))


def rows(data: Bytes, starts: IntArray, width: int) -> Bytes:
    """Copy ``width`` bytes from each start into an (n, width) array.

    Indexing a sliding-window view copies whole rows; indexing with an (n, width) array of
    byte positions would first build an index array eight times the size of the data.
    """
    if width == 0:
        return np.zeros((starts.shape[0], 0), dtype=np.uint8)
    return np.lib.stride_tricks.sliding_window_view(data, width)[starts]


def _lengths_at(data: Bytes, offsets: IntArray) -> npt.NDArray[np.uint64]:
    return rows(data, offsets, 8).copy().view("<u8")[:, 0]


def _walk(raw: memoryview, pos: int, size: int) -> tuple[IntArray, int]:
    """Follow length fields from ``pos`` while each record fits in the file.

    Summary writers log the same tags in the same order step after step, so record lengths
    repeat with a short period. Once the recent lengths show a period, the walk predicts the
    following records and checks the prediction against every length field at once (see
    :func:`_predict`); the result is the one a record-by-record walk gives, at a fraction of
    the cost.
    """
    data = np.frombuffer(raw, dtype=np.uint8)
    done: list[IntArray] = []
    offsets: list[int] = []
    recent: list[int] = []
    unpack = _LEN.unpack_from
    last = size - HEADER
    while pos <= last:
        n = unpack(raw, pos)[0]
        end = pos + OVERHEAD + n
        if end > size:
            break
        offsets.append(pos)
        recent.append(n)
        pos = end
        if len(recent) in _PERIOD_CHECKS:
            period = _period(recent)
            if period:
                done.append(np.asarray(offsets, dtype=np.int64))
                offsets = []
                pos, predicted = _predict(data, pos, size, recent[-period:])
                done.append(predicted)
            if period or len(recent) == _PERIOD_CHECKS[-1]:
                recent = []
    done.append(np.asarray(offsets, dtype=np.int64))
    return np.concatenate(done), pos


# History lengths at which the walk looks for a period (doubling keeps the search cheap).
_PERIOD_CHECKS = (32, 64, 128, 256, 512, 1024)


def _period(lengths: list[int]) -> int | None:
    """The shortest period of the whole recent history, if it repeats at least twice."""
    n = len(lengths)
    for p in range(1, n // 2 + 1):
        if lengths[p:] == lengths[:-p]:
            return p
    return None


def _predict(data: Bytes, pos: int, size: int, cycle: list[int]) -> tuple[int, IntArray]:
    """Walk from ``pos`` while record lengths keep repeating ``cycle``.

    Blocks of predicted records, growing while predictions hold, are checked against the
    length fields in one go; records are accepted up to the first one whose length differs
    from the prediction, and the plain walk takes over there.
    """
    lengths = np.asarray(cycle, dtype=np.int64)
    period = lengths.shape[0]
    heads = np.lib.stride_tricks.sliding_window_view(data, 8)
    accepted: list[IntArray] = []
    cycles = 16
    while True:
        want = np.tile(lengths, cycles)
        ends = pos + np.cumsum(want + OVERHEAD)
        fit = int(np.searchsorted(ends, size, side="right"))
        fit -= fit % period  # whole cycles only, so the next block starts in phase
        if fit == 0:
            break
        offs = np.concatenate(([pos], ends[: fit - 1]))
        found = heads[offs].copy().view("<u8")[:, 0]
        wrong = np.flatnonzero(found != want[:fit].astype(np.uint64))
        if wrong.size:
            accepted.append(offs[: int(wrong[0])])
            pos = int(offs[int(wrong[0])])
            break
        accepted.append(offs)
        pos = int(ends[fit - 1])
        cycles = min(cycles * 4, (1 << 20) // period + 1)
    return pos, (np.concatenate(accepted) if accepted else _ints([]))


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
    (n,) = _LEN.unpack_from(data.data, pos)
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
    return _first_bad_header(data, _ints([pos])) is None


def _first_bad_header(data: Bytes, offsets: IntArray) -> int | None:
    """Index of the first record whose length CRC is wrong.

    A header's CRC depends on the length alone, and records come in few lengths: each
    distinct length is hashed once and every stored CRC compared with its own.
    """
    heads = rows(data, offsets, HEADER)
    length_bytes = np.ascontiguousarray(heads[:, :8])
    stored = np.ascontiguousarray(heads[:, 8:]).view("<u4")[:, 0]
    lengths = length_bytes.view("<u8")[:, 0]
    if int(lengths.max()) < _LUT_MAX:  # the usual case: a lookup table indexed by length
        present = np.flatnonzero(np.bincount(lengths.astype(np.intp)))
        table = np.zeros(int(present[-1]) + 1, dtype=np.uint32)
        table[present] = masked_crc32c_rows(
            np.ascontiguousarray(present.astype("<u8")[:, None]).view(np.uint8))
        expected = table[lengths.astype(np.intp)]
    else:
        _, first, inverse = np.unique(lengths, return_index=True, return_inverse=True)
        expected = masked_crc32c_rows(length_bytes[first])[inverse.reshape(-1)]
    bad = np.flatnonzero(expected != stored)
    return int(bad[0]) if bad.size else None


def _payload_crc_ok(data: Bytes, offsets: IntArray, lengths: IntArray) -> npt.NDArray[np.bool_]:
    ok = np.ones(offsets.shape[0], dtype=bool)
    short = lengths <= _VECTOR_MAX
    for n in np.unique(lengths[short]).tolist():
        idx = np.flatnonzero(short & (lengths == n))
        per_chunk = max(1, (32 << 20) // (n + 4))  # bounds each copy to about 32 MB
        for lo in range(0, idx.size, per_chunk):
            chunk = idx[lo: lo + per_chunk]
            block = rows(data, offsets[chunk] + HEADER, n + 4)
            stored = np.ascontiguousarray(block[:, n:]).view("<u4")[:, 0]
            ok[chunk] = masked_crc32c_rows(block[:, :n]) == stored
    raw = data.data
    for i in np.flatnonzero(~short).tolist():
        s, n = int(offsets[i]) + HEADER, int(lengths[i])
        ok[i] = masked_crc32c(raw[s: s + n]) == int.from_bytes(raw[s + n: s + n + 4], "little")
    return ok


def _issue(path: str, offset: int, kind: str, message: str) -> IngestIssue:
    return IngestIssue(Location(path, offset=offset), kind, message)


def _ints(values: list[int]) -> IntArray:
    return np.asarray(values, dtype=np.int64)
