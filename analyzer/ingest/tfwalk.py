"""The byte work of TFRecord framing, vectorised: following lengths and checking CRCs (the
search for the next valid record after damage is in :mod:`analyzer.ingest.tfsearch`).

Everything here works on one buffer (a window of the file) with positions relative to it;
what the results mean, and what is reported, is decided in :mod:`analyzer.ingest.tfrecord`.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np
import numpy.typing as npt

from analyzer.ingest import crc32c
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
# A run of records is checked at once in pieces of about this many bytes.
_RUN_BYTES = 1 << 20
# A prediction checks at most about this many records at once (the arrays of a block cost
# 40 bytes a record).
_PREDICT_MOST = 1 << 16

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
    the cost. The period is looked for in suffixes of the history, so that a one-off record
    (the file_version record, a histogram among scalars) delays it by a few records only;
    and after a one-off breaks a prediction, the walk picks the same cycle up again as soon
    as the records after it match one phase of it (:class:`_Cycle`).
    """
    raw = data.data
    size = int(data.shape[0])
    fit = size if until is None else min(size, until)
    done: list[IntArray] = []
    offsets: list[int] = []
    recent: list[int] = []
    cycle: _Cycle | None = None
    heads: Bytes | None = None
    reach = _FIRST_CYCLES  # cycles the last prediction held for, and one more
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
        lengths = cycle.resume(n) if cycle is not None else None
        if lengths is None and not len(recent) % _CHECK_EVERY:
            lengths = _suffix_period(recent)
            if lengths is not None:
                cycle = _Cycle(lengths)
        if lengths is None:
            if len(recent) >= 2 * _HISTORY:
                del recent[:-_HISTORY]
            continue
        done.append(ints(offsets))
        offsets = []
        if heads is None:  # the 8 bytes from each position: made once, for every prediction
            heads = np.lib.stride_tricks.sliding_window_view(data, 8)
        pos, predicted = _predict(data, pos, lengths, fit, heads, reach)
        done.append(predicted)
        # One-off records (a histogram among scalars) tend to come at one spacing: the next
        # prediction checks as far as this one held in its first block, so that it does not
        # grow past the break block by block.
        reach = max(_FIRST_CYCLES, int(predicted.shape[0]) // len(lengths) + 2)
        recent = []
        if cycle is not None:
            cycle.after(lengths, int(predicted.shape[0]))
    done.append(ints(offsets))
    return np.concatenate(done), pos


# The walk looks for a period every this many records, in suffixes of the history of
# 8, 16, 32, ... records (each suffix size as often as it has records), up to _HISTORY.
_CHECK_EVERY = 8
_HISTORY = 1024


def _suffix_period(recent: list[int]) -> list[int] | None:
    """The lengths of one cycle, in the phase that comes next, when a recent suffix of
    ``recent`` repeats with a period: the shortest period of the longest such suffix (a
    longer suffix shows the whole cycle of a writer's tags, a shorter one may show part of
    it, or fit between two one-off records)."""
    count = len(recent)
    sizes = []
    k = _CHECK_EVERY
    while k <= min(count, _HISTORY) and not count % k:
        sizes.append(k)
        k *= 2
    for k in reversed(sizes):
        suffix = recent[-k:]
        period = _period(suffix)
        if period:
            return suffix[-period:]
    return None


def _period(lengths: list[int]) -> int | None:
    """The shortest period of the whole recent history, if it repeats at least twice."""
    n = len(lengths)
    last = lengths[-1]
    for p in range(1, n // 2 + 1):
        if lengths[-1 - p] == last and lengths[p:] == lengths[:-p]:
            return p
    return None


class _Cycle:
    """The cycle of lengths last found, kept across the one-off records that break it.

    After a prediction stops at a record of another length, the walk goes on record by
    record; each record narrows the phases of the cycle the records since the break could
    be at, and once one phase is left, prediction resumes from the phase after it. A cycle
    whose resumed predictions keep failing at once is dropped (the lengths changed for
    good: a step's varint grew a byte), and the period is looked for afresh.
    """

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.where: dict[int, list[int]] = {}
        for j, n in enumerate(lengths):
            self.where.setdefault(n, []).append(j)
        self.phases: list[int] = []
        self.misses = 0
        self.live = True

    def resume(self, n: int) -> list[int] | None:
        """The record after a break has length ``n``: the cycle's lengths from the next
        record on, when the records since the break fix its phase."""
        if not self.live:
            return None
        size = len(self.lengths)
        cycle = self.lengths
        phases = [q for q in ((j + 1) % size for j in self.phases) if cycle[q] == n]
        if not phases:
            phases = self.where.get(n, [])
        self.phases = phases
        if len(phases) != 1:
            return None
        j = (phases[0] + 1) % size
        return cycle[j:] + cycle[:j]

    def after(self, lengths: list[int], accepted: int) -> None:
        """A prediction of ``lengths`` accepted ``accepted`` records: less than a cycle, or
        than walking would have cost as much as the prediction, counts as a miss."""
        self.phases = []
        if accepted >= max(len(lengths), _WORTH):
            self.misses = 0
            return
        self.misses += 1
        self.live = self.misses <= _MISSES


# Resumed predictions that may fail in a row before the cycle is given up, and the records
# a prediction must accept to pay for itself (a numpy call costs about as much as walking
# a few dozen records one by one).
_MISSES = 4
_WORTH = 32
_FIRST_CYCLES = 16
"""Cycles a prediction checks in its first block when none held before it."""


def _predict(data: Bytes, pos: int, cycle: list[int], fit: int,
             heads: Bytes | None = None, first: int = _FIRST_CYCLES) -> tuple[int, IntArray]:
    """Walk from ``pos`` while record lengths keep repeating ``cycle`` and records end by
    ``fit``.

    Blocks of predicted records, ``first`` cycles and then growing while predictions hold,
    are checked against the length fields in one go; records are accepted up to the first
    one whose length differs from the prediction, and the plain walk takes over there.
    """
    lengths = ints(cycle)
    period = lengths.shape[0]
    if heads is None:  # the 8 bytes from each position: made once per walk, it is reused
        heads = np.lib.stride_tricks.sliding_window_view(data, 8)
    accepted: list[IntArray] = []
    cycles = min(first, _PREDICT_MOST // period + 1)
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
        cycles = min(cycles * 4, _PREDICT_MOST // period + 1)
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

    Records that follow one another (as a walk gives them) are checked a run at a time, in
    one C call per few megabytes (:func:`_run_ok`); only a run that fails is checked record
    by record, to find which records fail.
    """
    if offsets.size <= _FEW:
        return np.array([payload_ok(data, pos, n) for pos, n in
                         zip(offsets.tolist(), lengths.tolist(), strict=True)], dtype=bool)
    ok = np.ones(offsets.shape[0], dtype=bool)
    ends = offsets + OVERHEAD + lengths
    if not (offsets[1:] == ends[:-1]).all():
        return _each_ok(data, offsets, lengths)
    for lo, hi in _pieces(ends - int(offsets[0])):
        # a piece holding a record of megabytes is checked record by record, not copied
        if int(ends[hi - 1]) - int(offsets[lo]) > 2 * _RUN_BYTES or not _run_ok(
                data, offsets[lo:hi], lengths[lo:hi]):
            ok[lo:hi] = _each_ok(data, offsets[lo:hi], lengths[lo:hi])
    return ok


def _pieces(ends: IntArray) -> list[tuple[int, int]]:
    """Consecutive index ranges of records of about :data:`_RUN_BYTES` each (``ends``: where
    each record ends, counted from the first one's start)."""
    cuts = np.searchsorted(ends, np.arange(_RUN_BYTES, int(ends[-1]), _RUN_BYTES), side="right")
    bounds = [0, *dict.fromkeys(int(c) for c in cuts.tolist() if 0 < c < ends.shape[0]),
              int(ends.shape[0])]
    return list(itertools.pairwise(bounds))


def _run_ok(data: Bytes, offsets: IntArray, lengths: IntArray) -> bool:
    """Whether every payload of a run of consecutive records checks, in one C call (see
    :func:`analyzer.ingest.crc32c.neutral_keys`): a copy of the run with each stored CRC
    replaced by the value that leaves a zero CRC register at zero after a record whose
    payload matches it. A record too long for the table of those values is checked on its
    own and left out of the run (zeroed in the copy: zeros keep the register at zero)."""
    start = int(offsets[0])
    run = data[start: int(offsets[-1]) + OVERHEAD + int(lengths[-1])].copy()
    rel = offsets - start
    long = np.flatnonzero(lengths > crc32c.NEUTRAL_MAX)
    for i in long.tolist():
        if not payload_ok(data, int(offsets[i]), int(lengths[i])):
            return False
        run[int(rel[i]): int(rel[i]) + OVERHEAD + int(lengths[i])] = 0
    short = np.flatnonzero(lengths <= crc32c.NEUTRAL_MAX) if long.size else None
    at = rel + HEADER + lengths
    n = lengths
    if short is not None:
        at, n = at[short], n[short]
    fields = np.lib.stride_tricks.sliding_window_view(run, 4, writeable=True)
    stored = np.ascontiguousarray(fields[at]).view("<u4")[:, 0]
    wanted = crc32c.unmask(stored) ^ crc32c.neutral_keys(n)
    fields[at] = wanted.astype("<u4").view(np.uint8).reshape(-1, 4)
    return crc32c.register_is_zero(run.tobytes())


def _each_ok(data: Bytes, offsets: IntArray, lengths: IntArray) -> BoolArray:
    """Whether each record's payload checks, record by record (grouped by length).

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
