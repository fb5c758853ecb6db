"""The byte work of TFRecord framing, vectorised: following lengths, checking CRCs, and
finding the next valid record after damage.

Everything here works on one buffer (a window of the file) with positions relative to it;
what the results mean, and what is reported, is decided in :mod:`analyzer.ingest.tfrecord`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from analyzer.ingest.crc32c import masked_crc32c, masked_crc32c_rows

HEADER = 12  # u64 length + u32 length CRC
OVERHEAD = 16  # header + u32 payload CRC
# Event payloads beyond this are not written by any summary writer (protobuf caps at 2 GiB).
MAX_RECORD = 1 << 31
# Payloads up to this length are CRC-checked in vectorised groups; longer ones one by one.
_VECTOR_MAX = 1024
# Lengths below this get their header CRCs from a lookup table indexed by length.
_LUT_MAX = 1 << 20
# The search for the next valid record looks at windows of positions that grow from the
# first size to the second: damage is usually one record long, sometimes megabytes.
_SCAN_FIRST, _SCAN_MAX = 256, 1 << 16

_LEN = struct.Struct("<Q")

Bytes = npt.NDArray[np.uint8]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def ints(values: list[int]) -> IntArray:
    return np.asarray(values, dtype=np.int64)


def rows(data: Bytes, starts: IntArray, width: int) -> Bytes:
    """Copy ``width`` bytes from each start into an (n, width) array.

    Indexing a sliding-window view copies whole rows; indexing with an (n, width) array of
    byte positions would first build an index array eight times the size of the data.
    """
    if width == 0:
        return np.zeros((starts.shape[0], 0), dtype=np.uint8)
    return np.lib.stride_tricks.sliding_window_view(data, width)[starts]


def length_at(data: Bytes, pos: int) -> int:
    return int(_LEN.unpack_from(data.data, pos)[0])


def lengths_at(data: Bytes, offsets: IntArray) -> IntArray:
    if not offsets.size:
        return ints([])
    return rows(data, offsets, 8).copy().view("<u8")[:, 0].astype(np.int64)


def walk(data: Bytes, pos: int, most: int) -> tuple[IntArray, int]:
    """Follow length fields from ``pos`` while each record lies wholly inside ``data``.

    The walk also stops at a zero length (no writer writes empty records, and a run of zero
    bytes read as 16-byte empty records would yield millions of them) and at a length above
    ``most``, leaving both to the caller.

    Summary writers log the same tags in the same order step after step, so record lengths
    repeat with a short period. Once the recent lengths show a period, the walk predicts the
    following records and checks the prediction against every length field at once (see
    :func:`_predict`); the result is the one a record-by-record walk gives, at a fraction of
    the cost.
    """
    raw = data.data
    size = int(data.shape[0])
    done: list[IntArray] = []
    offsets: list[int] = []
    recent: list[int] = []
    unpack = _LEN.unpack_from
    last = size - HEADER
    while pos <= last:
        n = unpack(raw, pos)[0]
        end = pos + OVERHEAD + n
        if end > size or n == 0 or n > most:
            break
        offsets.append(pos)
        recent.append(n)
        pos = end
        if len(recent) in _PERIOD_CHECKS:
            period = _period(recent)
            if period:
                done.append(ints(offsets))
                offsets = []
                pos, predicted = _predict(data, pos, recent[-period:])
                done.append(predicted)
            if period or len(recent) == _PERIOD_CHECKS[-1]:
                recent = []
    done.append(ints(offsets))
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


def _predict(data: Bytes, pos: int, cycle: list[int]) -> tuple[int, IntArray]:
    """Walk from ``pos`` while record lengths keep repeating ``cycle``.

    Blocks of predicted records, growing while predictions hold, are checked against the
    length fields in one go; records are accepted up to the first one whose length differs
    from the prediction, and the plain walk takes over there.
    """
    size = int(data.shape[0])
    lengths = ints(cycle)
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
    return pos, (np.concatenate(accepted) if accepted else ints([]))


def headers_ok(data: Bytes, offsets: IntArray) -> BoolArray:
    """Whether each record's stored length CRC matches its length.

    A header's CRC depends on the length alone, and records come in few lengths: each
    distinct length is hashed once and every stored CRC compared with its own.
    """
    if not offsets.size:
        return np.zeros(0, dtype=bool)
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
    ok: BoolArray = expected == stored
    return ok


def payloads_ok(data: Bytes, offsets: IntArray, lengths: IntArray) -> BoolArray:
    """Whether each record's payload matches its stored CRC (records lie inside ``data``).

    Records of one length are hashed together, four bytes of every record per step: that
    costs a few numpy calls per four bytes of length, so a length shared by few records
    (histograms, long or odd records) is hashed record by record in C instead.
    """
    ok = np.ones(offsets.shape[0], dtype=bool)
    short = np.flatnonzero(lengths <= _VECTOR_MAX)
    single = [np.flatnonzero(lengths > _VECTOR_MAX)]
    if short.size:
        order = short[np.argsort(lengths[short], kind="stable")]
        for group in np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1):
            n = int(lengths[group[0]])
            if 2 * group.size < n:
                single.append(group)
                continue
            per_chunk = max(1, (32 << 20) // (n + 4))  # bounds each copy to about 32 MB
            for lo in range(0, group.size, per_chunk):
                chunk = group[lo: lo + per_chunk]
                block = rows(data, offsets[chunk] + HEADER, n + 4)
                stored = np.ascontiguousarray(block[:, n:]).view("<u4")[:, 0]
                ok[chunk] = masked_crc32c_rows(block[:, :n]) == stored
    for i in np.concatenate(single).tolist():
        ok[i] = payload_ok(data, int(offsets[i]), int(lengths[i]))
    return ok


def find_record(data: Bytes, lo: int, room: int) -> tuple[int, int | None]:
    """The first position at or after ``lo`` where a valid record starts.

    A valid record has a header whose CRC checks, a length below :data:`MAX_RECORD` that
    fits in the ``room`` bytes the file holds from the start of ``data`` on, and a payload
    whose CRC checks. Returns ``(pos, None)`` for a record wholly inside ``data``;
    ``(pos, n)`` for a header that checks whose payload of ``n`` bytes lies past the end of
    ``data`` (it cannot be checked yet); ``(end, None)`` when no position before ``end``
    (the last one with a whole header in ``data``) holds a record.

    Only positions whose length field is below 2**31 (its top 33 bits zero) are hashed, and
    windows of zero bytes are passed over whole: a valid header always has a nonzero byte,
    since the CRC of a zero length is not zero.
    """
    size = int(data.shape[0])
    end = max(lo, size - HEADER + 1)
    pos, step = lo, _SCAN_FIRST
    while pos < end:
        stop = min(end, pos + step)
        step = min(step * 4, _SCAN_MAX)
        window = data[pos: stop + HEADER - 1]
        if pos == lo:  # damage is mostly one record long: look near first, without numpy
            found = _near_candidates(data, window.tobytes(), pos, stop - pos, room)
        elif window.any():
            m = stop - pos
            found = _header_candidates(data, pos + np.flatnonzero(
                (window[3:3 + m] < 0x80) & (window[4:4 + m] == 0) & (window[5:5 + m] == 0)
                & (window[6:6 + m] == 0) & (window[7:7 + m] == 0)), room)
        else:
            found = iter(())
        for cand in found:
            n = length_at(data, cand)
            if cand + OVERHEAD + n > size:
                return cand, n
            if payload_ok(data, cand, n):
                return cand, None
        pos = stop
    return end, None


def _near_candidates(data: Bytes, window: bytes, pos: int, m: int, room: int) -> Iterator[int]:
    """What :func:`_header_candidates` gives for the ``m`` positions from ``pos`` (``window``
    holds their bytes), found with ``bytes.find``, in order and lazily: the first window of
    a search is short, and numpy calls cost more than the search there."""
    at = window.find(b"\0\0\0\0", 4)
    while at != -1 and at - 4 < m:
        cand = pos + at - 4
        if window[at - 1] < 0x80 and cand + OVERHEAD + length_at(data, cand) <= room \
                and header_ok(data, cand):
            yield cand
        at = window.find(b"\0\0\0\0", at + 1)


def _header_candidates(data: Bytes, cands: IntArray, room: int) -> Iterator[int]:
    """The positions among ``cands``, in order, whose header CRC checks and whose record
    fits: one by one in C while they are few (the search mostly stops at the first), all at
    once with numpy when there are many."""
    if cands.size <= 64:
        for cand in cands.tolist():
            if cand + OVERHEAD + length_at(data, cand) <= room and header_ok(data, cand):
                yield cand
        return
    heads = rows(data, cands, HEADER)
    lengths = np.ascontiguousarray(heads[:, :8]).view("<u8")[:, 0].astype(np.int64)
    stored = np.ascontiguousarray(heads[:, 8:]).view("<u4")[:, 0]
    plausible = np.flatnonzero((cands + OVERHEAD + lengths <= room) & (heads != 0).any(axis=1))
    crc = masked_crc32c_rows(np.ascontiguousarray(heads[plausible, :8]))
    yield from cands[plausible[crc == stored[plausible]]].tolist()


def payload_ok(data: Bytes, pos: int, n: int) -> bool:
    """Whether the payload of the record at ``pos`` (``n`` bytes, inside ``data``) checks."""
    start = pos + HEADER
    stored = int.from_bytes(data[start + n: start + n + 4].tobytes(), "little")
    return masked_crc32c(data.data[start: start + n]) == stored


def header_ok(data: Bytes, pos: int) -> bool:
    """Whether the header at ``pos`` (wholly inside ``data``) has a matching length CRC."""
    stored = int.from_bytes(data[pos + 8: pos + HEADER].tobytes(), "little")
    return masked_crc32c(data[pos: pos + 8].tobytes()) == stored


def zeros_and_last_nonzero(data: Bytes) -> tuple[int, int]:
    """How many bytes of ``data`` are zero, and the index of its last nonzero byte (-1)."""
    size = int(data.shape[0])
    nonzero = int(np.count_nonzero(data))
    if not nonzero:
        return size, -1
    hi = size
    while hi > 0:  # from the end in blocks, so a long buffer needs no index array
        lo = max(0, hi - (1 << 20))
        block = data[lo:hi]
        if block.any():
            return size - nonzero, lo + int(block.shape[0] - 1 - np.argmax(block[::-1] != 0))
        hi = lo
    return size - nonzero, -1  # pragma: no cover - nonzero > 0 means a block is found
