"""The byte work of TFRecord framing, vectorised: following lengths and checking CRCs (the
search for the next valid record after damage is in :mod:`analyzer.ingest.tfsearch`).

Everything here works on one buffer (a window of the file) with positions relative to it;
what the results mean, and what is reported, is decided in :mod:`analyzer.ingest.tfrecord`.
"""

from __future__ import annotations

import struct

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
# Up to this many records are checked one by one in C: numpy calls cost more for so few
# (after damage, the walk between two damaged spots is often a record or two).
_FEW = 8

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
    if offsets.size <= _FEW:
        return ints([length_at(data, pos) for pos in offsets.tolist()])
    return rows(data, offsets, 8).copy().view("<u8")[:, 0].astype(np.int64)


def walk(data: Bytes, pos: int, most: int, until: int | None = None) -> tuple[IntArray, int]:
    """Follow length fields from ``pos`` while each record lies wholly inside ``data`` (and
    ends by ``until``, when given).

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
    fit = size if until is None else min(size, until)
    done: list[IntArray] = []
    offsets: list[int] = []
    recent: list[int] = []
    unpack = _LEN.unpack_from
    last = size - HEADER
    while pos <= last:
        n = unpack(raw, pos)[0]
        end = pos + OVERHEAD + n
        if end > fit or n == 0 or n > most:
            break
        offsets.append(pos)
        recent.append(n)
        pos = end
        if len(recent) in _PERIOD_CHECKS:
            period = _period(recent)
            if period:
                done.append(ints(offsets))
                offsets = []
                pos, predicted = _predict(data, pos, recent[-period:], fit)
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


def _predict(data: Bytes, pos: int, cycle: list[int], fit: int) -> tuple[int, IntArray]:
    """Walk from ``pos`` while record lengths keep repeating ``cycle`` and records end by
    ``fit``.

    Blocks of predicted records, growing while predictions hold, are checked against the
    length fields in one go; records are accepted up to the first one whose length differs
    from the prediction, and the plain walk takes over there.
    """
    lengths = ints(cycle)
    period = lengths.shape[0]
    heads = np.lib.stride_tricks.sliding_window_view(data, 8)
    accepted: list[IntArray] = []
    cycles = 16
    while True:
        want = np.tile(lengths, cycles)
        ends = pos + np.cumsum(want + OVERHEAD)
        inside = int(np.searchsorted(ends, fit, side="right"))
        inside -= inside % period  # whole cycles only, so the next block starts in phase
        if inside == 0:
            break
        offs = np.concatenate(([pos], ends[: inside - 1]))
        found = heads[offs].copy().view("<u8")[:, 0]
        wrong = np.flatnonzero(found != want[:inside].astype(np.uint64))
        if wrong.size:
            accepted.append(offs[: int(wrong[0])])
            pos = int(offs[int(wrong[0])])
            break
        accepted.append(offs)
        pos = int(ends[inside - 1])
        cycles = min(cycles * 4, (1 << 20) // period + 1)
    return pos, (np.concatenate(accepted) if accepted else ints([]))


def headers_ok(data: Bytes, offsets: IntArray) -> BoolArray:
    """Whether each record's stored length CRC matches its length.

    A header's CRC depends on the length alone, and records come in few lengths: each
    distinct length is hashed once and every stored CRC compared with its own.
    """
    if offsets.size <= _FEW:
        return np.array([header_ok(data, pos) for pos in offsets.tolist()], dtype=bool)
    heads = rows(data, offsets, HEADER)
    length_bytes = np.ascontiguousarray(heads[:, :8])
    stored = np.ascontiguousarray(heads[:, 8:]).view("<u4")[:, 0]
    lengths = length_bytes.view("<u8")[:, 0]
    longest = int(lengths.max())
    # The usual case: a lookup table indexed by length, when it is not much longer than
    # the records are many.
    if longest < _LUT_MAX and longest < 64 * offsets.size:
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
    if offsets.size <= _FEW:
        return np.array([payload_ok(data, pos, n) for pos, n in
                         zip(offsets.tolist(), lengths.tolist(), strict=True)], dtype=bool)
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
