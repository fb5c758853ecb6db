"""Finding the next valid record after damage, within a budget of work and of time.

A position is a candidate when its length field is below 2**31 and its header CRC checks;
it is a valid record when its payload CRC checks too. In damage written by a dying process
a header CRC matches by chance about once in 2**32 positions, so the first candidate is
nearly always the record sought and the search costs one payload CRC. A hostile file can
instead hold a valid header at every position, each claiming a payload that runs to the end
of the file: checking each one costs the rest of the file, quadratic in all.

So the payload CRC bytes spent on records that fail are bounded per file by a
:class:`Budget`: a fixed allowance plus a few bytes per byte of the file framed so far.
Honest damage spends a tiny part of it. A candidate whose payload would cost more than what
is left is passed over unchecked (and counted, so the issue can say so); the allowance grows
again as the search moves on. The deadline is consulted inside the search too, so a single
window cannot outlast it (:class:`OutOfTime` carries where it stopped).

Positions here are relative to one buffer; :attr:`Budget.base` is its file offset.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from analyzer.ingest.crc32c import masked_crc32c_rows
from analyzer.ingest.safeio import Deadline
from analyzer.ingest.tfwalk import (
    HEADER,
    OVERHEAD,
    Bytes,
    IntArray,
    header_ok,
    length_at,
    payload_ok,
    rows,
)

# The search looks at windows of positions that grow from the first size to the second:
# damage is usually one record long, sometimes megabytes.
_SCAN_FIRST, _SCAN_MAX = 256, 1 << 16


class OutOfTime(Exception):
    """The deadline passed at file offset ``at``; what came before it stands."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


class Budget:
    """What checking records near damage may still spend in one file.

    Payload CRCs of records that fail (:attr:`wasted` bytes) may cost up to ``floor`` bytes
    plus ``factor`` bytes per byte of the file up to the position looked at. Candidates left
    unchecked because their check would cost more than that are counted (:attr:`passed`), and
    so are records a walk after damage reached but could not check (:meth:`skip`), for
    :meth:`summary`.
    """

    def __init__(self, floor: int, factor: int, deadline: Deadline | None = None) -> None:
        self.floor = floor
        self.factor = factor
        self.deadline = deadline
        self.base = 0
        self.wasted = 0
        self.passed = 0
        self.first = -1  # file offset of the first record refused, -1 for none
        self.last = -1
        self.skipped = 0  # records reached by a walk after damage and not checked
        self.skipped_bytes = 0  # bytes from them to the next valid record

    def spare(self, pos: int) -> int:
        """Bytes that may still be spent on failing checks, at ``pos`` of the buffer."""
        return self.floor + self.factor * (self.base + pos) - self.wasted

    def affordable(self, cands: IntArray, lengths: IntArray) -> IntArray:
        """Those of ``cands`` whose payload of ``lengths`` bytes may be checked; counts the
        others as passed."""
        ok = lengths <= self.floor + self.factor * (self.base + cands) - self.wasted
        refused = cands[~ok]
        if refused.size:
            self.passed += int(refused.shape[0])
            self._refused(int(refused[0]), int(refused[-1]))
        return cands[ok]

    def refuse(self, pos: int) -> None:
        """The candidate at ``pos`` of the buffer is passed over unchecked."""
        self.passed += 1
        self._refused(pos, pos)

    def skip(self, at: int, skipped: int) -> None:
        """A record at file offset ``at`` was not checked; ``skipped`` bytes from it on were
        passed over to the next valid record (or the end)."""
        self.skipped += 1
        self.skipped_bytes += skipped
        self._refused(at - self.base, at - self.base)

    def _refused(self, lo: int, hi: int) -> None:
        if self.first < 0:
            self.first = self.base + lo
        self.last = max(self.last, self.base + hi)

    def summary(self) -> str | None:
        """What the budget left unchecked in the file, if anything (offsets from
        :attr:`first` to :attr:`last`)."""
        if self.first < 0:
            return None
        done = []
        if self.skipped:
            done.append(f"{self.skipped} record(s) a walk after damage reached were not "
                        f"checked, their lengths not trusted, and {self.skipped_bytes} bytes "
                        "from them to the next valid record skipped")
        if self.passed:
            done.append(f"{self.passed} header(s) that check, met while searching damaged "
                        "stretches, were not followed")
        return (f"checking records near damage would have cost more than its budget "
                f"({self.floor} bytes of payload CRC plus {self.factor} per byte of the "
                f"file) between offsets {self.first} and {self.last}: " + "; ".join(done))

    def tick(self, pos: int) -> None:
        """Raise :class:`OutOfTime` at ``pos`` of the buffer once the deadline has passed."""
        if self.deadline is not None and self.deadline.expired():
            raise OutOfTime(self.base + pos)


def find_record(data: Bytes, lo: int, room: int, budget: Budget) -> tuple[int, int | None]:
    """The first position at or after ``lo`` where a valid record starts.

    A valid record has a header whose CRC checks, a length that fits in the ``room`` bytes
    the file holds from the start of ``data`` on, and a payload whose CRC checks. Returns
    ``(pos, None)`` for a record wholly inside ``data``; ``(pos, n)`` for a header that
    checks whose payload of ``n`` bytes lies past the end of ``data`` (it cannot be checked
    yet, but ``budget`` allows it); ``(end, None)`` when no position before ``end`` (the
    last one with a whole header in ``data``) holds a record. Candidates ``budget`` does not
    allow are passed over.

    Windows of zero bytes are passed over whole: a valid header always has a nonzero byte,
    since the CRC of a zero length is not zero.
    """
    size = int(data.shape[0])
    end = max(lo, size - HEADER + 1)
    pos, step = lo, _SCAN_FIRST
    while pos < end:
        budget.tick(pos)
        stop = min(end, pos + step)
        step = min(step * 4, _SCAN_MAX)
        window = data[pos: stop + HEADER - 1]
        if pos == lo:  # damage is mostly one record long: look near first, without numpy
            found = _near_candidates(data, window.tobytes(), pos, stop - pos, room)
        elif window.any():
            m = stop - pos
            found = _header_candidates(data, pos + np.flatnonzero(
                (window[3:3 + m] < 0x80) & (window[4:4 + m] == 0) & (window[5:5 + m] == 0)
                & (window[6:6 + m] == 0) & (window[7:7 + m] == 0)), room, budget)
        else:
            found = iter(())
        for cand in found:
            n = length_at(data, cand)
            if n > budget.spare(cand):  # the budget shrank since the candidate was found
                budget.refuse(cand)
                continue
            if cand + OVERHEAD + n > size:
                return cand, n
            budget.tick(cand)
            if payload_ok(data, cand, n):
                return cand, None
            budget.wasted += n
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


def _header_candidates(data: Bytes, cands: IntArray, room: int,
                       budget: Budget) -> Iterator[int]:
    """The positions among ``cands``, in order, whose header CRC checks and whose record
    fits: one by one in C while they are few (the search mostly stops at the first), all at
    once with numpy when there are many, then only those ``budget`` allows."""
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
    valid = plausible[crc == stored[plausible]]
    yield from budget.affordable(cands[valid], lengths[valid]).tolist()
