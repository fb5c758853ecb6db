"""TFRecord framing: where the records of a file are, and what damage lies between them.

A record is ``u64 length | u32 masked CRC of length | payload | u32 masked CRC of payload``,
all little-endian. With ``verify`` (the default) a record counts only when both its CRCs
check; without it the walk trusts length fields and consults the CRCs only where it stops.
Payload CRCs are checked a run of records at a time (one hash per megabyte, see
:mod:`analyzer.ingest.crc32c`) and record by record only in a run that fails, so a run of
damaged records passes unnoticed only by the chance of a CRC-32 match, about 2**-32 (a file
crafted to pass could as well carry right CRCs).
Damage is returned as :class:`IngestIssue` values, one written policy per kind, never raised:

    empty_file       0 bytes: the writer was created but never flushed
    truncated        a record is cut off: its header checks but the file ends inside it.
                     At the end of the file (the normal state of a crashed run's file)
                     everything before it is kept; where a valid record follows (a writer
                     killed mid-record, then another appending) reading resumes there
    zero_tail        the file ends in a run of zero bytes where a record should start (space
                     reserved but never written): passed over whole, in constant memory
    zero_run         a run of zero bytes in the middle (a copytruncate hole, a preallocated
                     region written later): passed over whole, reading resumes at the next
                     valid record
    bad_length_crc   a header whose length CRC does not match: the length is not trusted
    absurd_length    a header with a valid CRC but a length no event record has (2 GiB or
                     more): nothing is allocated for it, the length is not trusted
    bad_payload_crc  the payload does not match its CRC: the record is dropped, and its
                     length is not trusted either
    too_large        a record longer than the reader decodes in bounded memory
                     (:data:`MAX_LOADED`): skipped whole. With verify, or when the search
                     after damage lands on it, its payload CRC is checked first (piece by
                     piece when it is not in memory; a mismatch makes it bad_payload_crc);
                     without verify and away from damage its length is trusted unchecked
    read_limit       the time budget ran out: reading stops, everything before is kept (the
                     deadline is consulted inside the search after damage too, not only
                     between windows). Or the check budget below was spent: one issue per
                     file says how many records and bytes it left unchecked, and where
    not_event_file   no valid record anywhere: the file is not an event file

Wherever a length is not trusted, the reader scans forward for the next position where a
header whose CRC checks is followed by a payload whose CRC checks, resumes there, and the
issue says how many bytes were skipped and where reading resumed (or that nothing valid
followed). Issues go to an :class:`~analyzer.ingest.issuelog.IssueLog`, which lists a
bounded number of each kind per file and counts the rest.

That scan, and the walk on from where it resumes, spend payload CRCs on records that may
fail. Honest damage makes that about one record per damaged stretch; a hostile file can make
it the rest of the file for every position (headers that check everywhere, each claiming to
run to the end), quadratic in all. So the payload bytes checked on records that fail are
capped per file at :data:`CHECK_FLOOR` plus :data:`CHECK_FACTOR` per byte of the file up
to where reading is (see :class:`~analyzer.ingest.tfsearch.Budget`). Where a check after
damage would cost more than is left, the record is not checked and its length is not
trusted: the search passes such candidates over, and a walk after damage that reaches one
treats it as the start of a damaged stretch. The read_limit issue counts them. The floor is
as large as the longest record loaded, so an honest file would need hundreds of megabytes
of failing records to meet the cap. The first walk through a window's bytes checks each
byte once and is not capped, but what fails in it is charged.

The :class:`Framer` is fed the file window by window (see :mod:`analyzer.ingest.tfwindow`);
:func:`frame` frames a buffer that holds a whole file. The byte work is in
:mod:`analyzer.ingest.tfwalk`, the search after damage in :mod:`analyzer.ingest.tfsearch`,
the words of the damage issues in :mod:`analyzer.ingest.tfdamage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from analyzer.ingest.issuelog import IssueLog
from analyzer.ingest.safeio import Deadline
from analyzer.ingest.tfdamage import Damage, DamageKind, at_end, what
from analyzer.ingest.tfsearch import Budget, OutOfTime, find_record
from analyzer.ingest.tfwalk import (
    HEADER,
    MAX_RECORD,
    OVERHEAD,
    BoolArray,
    Bytes,
    IntArray,
    header_ok,
    headers_ok,
    ints,
    length_at,
    lengths_at,
    payload_ok,
    payloads_ok,
    rows,
    walk,
    zeros_and_last_nonzero,
)
from analyzer.model import IngestIssue

__all__ = ["HEADER", "MAX_LOADED", "OVERHEAD", "Framer", "Framing", "frame", "rows"]

MAX_LOADED = 256 << 20
"""Longest record read into memory to be decoded; longer ones are checked and skipped."""
CHECK_FLOOR = 256 << 20
"""Payload CRC bytes a file may spend on records that fail, beside :data:`CHECK_FACTOR`."""
CHECK_FACTOR = 4
"""Further bytes of that budget per byte of the file framed so far."""
# A run of zeros this long at the end of a damaged stretch is reported as a zero tail.
_ZERO_NOTE = 4096
# The kind of a damaged stretch that begins at a record the budget could not check: its
# stretches are summed up in one read_limit issue per file instead of listed.
_UNCHECKED: Final = "unchecked"


# Records walked from one position: offsets, lengths, header CRC ok, the indices of records
# failing a CRC, and where the walk stopped.
_Walked = tuple[IntArray, IntArray, BoolArray, IntArray, int]


class _Accepted:
    """The records a window accepted so far: offsets and lengths, in runs."""

    def __init__(self) -> None:
        self._offsets: list[IntArray] = []
        self._lengths: list[IntArray] = []

    def add(self, offsets: IntArray, lengths: IntArray) -> None:
        if offsets.size:
            self._offsets.append(offsets)
            self._lengths.append(lengths)

    def last(self) -> tuple[int, int] | None:
        if not self._offsets:
            return None
        return int(self._offsets[-1][-1]), int(self._lengths[-1][-1])

    def drop_last(self) -> None:
        self._offsets[-1] = self._offsets[-1][:-1]
        self._lengths[-1] = self._lengths[-1][:-1]
        if not self._offsets[-1].size:
            self._offsets.pop()
            self._lengths.pop()

    def arrays(self) -> tuple[IntArray, IntArray]:
        if not self._offsets:
            return ints([]), ints([])
        if len(self._offsets) == 1:
            return self._offsets[0], self._lengths[0]
        return np.concatenate(self._offsets), np.concatenate(self._lengths)


@dataclass(frozen=True)
class Framing:
    """Offsets and payload lengths of the intact records of one file, in file order."""

    offsets: IntArray
    lengths: IntArray
    issues: tuple[IngestIssue, ...]


def frame(data: Bytes, path: str, *, verify: bool = True) -> Framing:
    """Locate every intact record of ``data`` (the whole file as a uint8 array)."""
    framer = Framer(path, int(data.shape[0]), verify=verify)
    offsets, lengths = (framer.feed(data, 0, final=True) if data.shape[0]
                        else (ints([]), ints([])))
    return Framing(offsets, lengths, tuple(framer.finish()))


class Framer:
    """Frames one file fed as consecutive buffers (windows).

    Each :meth:`feed` gets the bytes from :attr:`pos` on, at least :attr:`need` of them
    unless the file ends first, and returns the records wholly inside them. When
    :attr:`big` is set, the next record is too long to load: the caller checks its payload
    CRC by streaming (when :attr:`big_needs_check`) and calls :meth:`resolve_big`.
    """

    def __init__(self, path: str, size: int, *, verify: bool = True,
                 deadline: Deadline | None = None) -> None:
        self.path = path
        self.size = size
        self.verify = verify
        self.pos = 0
        self.need = HEADER
        self.big: tuple[int, int] | None = None
        self.done = size == 0
        self.records = 0
        self.log = IssueLog(path)
        self.budget = Budget(CHECK_FLOOR, CHECK_FACTOR, deadline)
        self._damage: Damage | None = None
        self._end = 0  # end of the current buffer, as a file offset
        self._limit = size  # the file offset no record may pass
        if size == 0:
            self.log.add(0, "empty_file", "file is empty (0 bytes)")

    @property
    def big_needs_check(self) -> bool:
        return self.verify or self._damage is not None

    def feed(self, buf: Bytes, base: int, final: bool) -> tuple[IntArray, IntArray]:
        """Frame ``buf``, the file's bytes from offset ``base`` (== :attr:`pos`) on;
        ``final`` says the file ends with it. Returns offsets (relative to ``buf``) and
        payload lengths of the records it accepted."""
        if base != self.pos or self.done or self.big is not None:
            raise ValueError("feed() must get the bytes from Framer.pos on")
        self._end = base + int(buf.shape[0])
        self._limit = self._end if final else self.size
        self.budget.base = base
        accepted = _Accepted()
        try:
            self._frame(buf, base, final, accepted)
        except OutOfTime as late:
            self.out_of_time(late.at)
        offsets, lengths = accepted.arrays()
        self.records += int(offsets.shape[0])
        return offsets, lengths

    def _frame(self, buf: Bytes, base: int, final: bool, accepted: _Accepted) -> None:
        cache: _Walked | None = None
        limit = False  # after damage, walk on only as far as the check budget allows
        p: int | None = 0
        while p is not None:
            if self._damage is not None:  # the search looks at the deadline too
                p = self._scan(buf, base, p, final)
                if p is None:
                    break
                limit = self.verify
            seg, lens, hdr, bad, stop = self._segment(buf, p, cache, limit)
            cache = None
            if bad.size:
                b = int(bad[0])
                accepted.add(seg[:b], lens[:b])
                at = int(seg[b])
                self._open(base + at, "bad_payload_crc" if hdr[b] else "bad_length_crc",
                           int(lens[b]) if hdr[b] else None)
                cache = (seg[b + 1:], lens[b + 1:], hdr[b + 1:], bad[1:] - (b + 1), stop)
                p = at + 1
                continue
            accepted.add(seg, lens)
            p = self._at_stop(buf, base, stop, final, accepted, limit)
        if final:
            self.done = True
        elif not self.verify:
            self._hold_back_last(base, accepted)

    def _segment(self, buf: Bytes, p: int, cache: _Walked | None, limit: bool) -> _Walked:
        """Records walked from ``p``, whether each header checks, and which records fail a
        check. After damage the scan usually resumes at a record already walked and
        checked: that walk is reused. Otherwise, with ``limit``, the walk ends where the
        payloads checked would cost more than the budget has left, should they fail; the
        payload bytes from the first failing record on are charged to the budget."""
        if cache is not None and cache[0].size:
            j = int(np.searchsorted(cache[0], p))
            if j < cache[0].shape[0] and int(cache[0][j]) == p:
                seg, lens, hdr, bad, stop = cache
                bad = bad[int(np.searchsorted(bad, j)):] - j
                return seg[j:], lens[j:], hdr[j:], bad, stop
        until = p + OVERHEAD + max(0, self.budget.spare(p)) if limit else None
        seg, stop = walk(buf, p, MAX_LOADED, until)
        lens = lengths_at(buf, seg)
        if not self.verify:
            return seg, lens, np.ones(seg.shape[0], dtype=bool), ints([]), stop
        hdr = headers_ok(buf, seg)
        pay = payloads_ok(buf, seg, lens) if seg.size else hdr
        bad = np.flatnonzero(~(hdr & pay))
        if bad.size:
            self.budget.wasted += int(lens[int(bad[0]):].sum())
        return seg, lens, hdr, bad, stop

    def _at_stop(self, buf: Bytes, base: int, p: int, final: bool, accepted: _Accepted,
                 limit: bool) -> int | None:
        """The walk stopped at ``p``: say why; the position to go on from, or None. With
        ``limit`` (after damage), a record the budget cannot check is not trusted."""
        rest = int(buf.shape[0]) - p
        if rest < HEADER:
            if not final:
                self._wait(base + p, HEADER)
                return None
            if rest:
                self._open(base + p, "truncated", None)
                self._count(buf, base, rest + p)
                self._close(None)
            return None
        n = length_at(buf, p)
        end = p + OVERHEAD + n
        if not self.verify and 0 < n <= MAX_LOADED and buf.shape[0] < end <= self._limit - base:
            # Without verify a length is trusted while its record fits in the file, as the
            # walk does inside a window: where a window ends must not change that.
            self._wait(base + p, OVERHEAD + n)
            return None
        if not header_ok(buf, p):
            back = self._suspect_previous(buf, base, p, accepted)
            if back is not None:
                return back + 1
            self._open(base + p, "bad_length_crc", None)
            return p + 1
        if n >= MAX_RECORD:
            self._open(base + p, "absurd_length", n)
            return p + 1
        if base + end > self._limit:
            self._open(base + p, "truncated", n)
            return p + 1
        if limit and n > self.budget.spare(p):
            self._open(base + p, _UNCHECKED, n)
            return p + 1
        if n > MAX_LOADED and end <= buf.shape[0]:
            ok = not self.big_needs_check or payload_ok(buf, p, n)
            return self._big_record(base + p, n, ok) - base
        if end <= buf.shape[0] and n and limit:  # the end of what the budget let it walk
            return p
        if end <= buf.shape[0]:  # an empty record, which the walk leaves to be checked here
            if self.verify and not payload_ok(buf, p, n):
                self._open(base + p, "bad_payload_crc", n)
                return p + 1
            accepted.add(ints([p]), ints([n]))
            return end
        self._wait(base + p, OVERHEAD + n)
        return None

    def _suspect_previous(self, buf: Bytes, base: int, p: int,
                          accepted: _Accepted) -> int | None:
        """Without verify, a bad header right after a record casts doubt on that record's
        length (a writer killed mid-record, another appending): check its payload CRC, and
        when it fails, drop it and scan from there instead. Returns its position then."""
        if self.verify:
            return None
        last = accepted.last()
        if last is None:
            return None
        q, n = last
        if q + OVERHEAD + n != p or n > self.budget.spare(q) or payload_ok(buf, q, n):
            return None
        self.budget.wasted += n
        accepted.drop_last()
        self._open(base + q, "bad_payload_crc", n)
        return q

    def _hold_back_last(self, base: int, accepted: _Accepted) -> None:
        """Without verify, leave the last record before the window's end to the next
        window, so that :meth:`_suspect_previous` can still look at it there."""
        if self.big is not None or self._damage is not None:
            return
        last = accepted.last()
        if last is None or base + last[0] + OVERHEAD + last[1] != self.pos:
            return
        accepted.drop_last()
        self.need += self.pos - (base + last[0])
        self.pos = base + last[0]

    def _wait(self, pos: int, need: int) -> None:
        self.pos, self.need = pos, need
        if need - OVERHEAD > MAX_LOADED:
            self.big = (pos, need - OVERHEAD)

    def _scan(self, buf: Bytes, base: int, p: int, final: bool) -> int | None:
        """Look for the next valid record from ``p`` on; its position, or None (waiting for
        more bytes, or at the end)."""
        size = int(buf.shape[0])
        found, n = find_record(buf, p, self._limit - base, self.budget)
        if n is not None:  # a header that checks, its payload not read yet
            self._count(buf, base, found)
            self._wait(base + found, OVERHEAD + n)
            return None
        if found < size - HEADER + 1:
            self._count(buf, base, found)
            self._close(base + found)
            return found
        if final:
            self._count(buf, base, size)
            self._close(None)
            return None
        self._count(buf, base, found)
        self._wait(base + found, HEADER)
        return None

    def resolve_big(self, ok: bool) -> None:
        """The answer for :attr:`big`: whether its payload CRC checks (or was not asked)."""
        if self.big is None:
            raise ValueError("no record is waiting to be resolved")
        off, n = self.big
        self.big = None
        self.need = HEADER
        self.pos = self._big_record(off, n, ok)

    def _big_record(self, off: int, n: int, ok: bool) -> int:
        """A record too long to decode at ``off``: skip it, or treat it as damage when its
        payload CRC fails. Returns the file offset to go on from."""
        if ok:
            if self._damage is not None:
                self._close(off)
            self.log.add(off, "too_large", f"record of {n} payload bytes, more than the "
                         f"{MAX_LOADED} bytes a record may have to be decoded: skipped")
            return off + OVERHEAD + n
        self.budget.wasted += n
        if self._damage is None:
            self._open(off, "bad_payload_crc", n)
        damage = self._damage
        assert damage is not None
        damage.last_nonzero = max(damage.last_nonzero, off)  # a header checks there: not zero
        damage.counted = max(damage.counted, off + 1)
        return off + 1

    def stop(self, at: int) -> None:
        """Reading ends at ``at`` before the end of the file (a time budget, a read error)."""
        damage, self._damage = self._damage, None
        if damage is None:
            pass
        elif damage.kind == _UNCHECKED:
            self.budget.skip(damage.start, at - damage.start)
        else:
            self.log.add(damage.start, damage.kind,
                         f"{what(damage, False)}; reading stopped {at - damage.start} bytes "
                         f"later, at offset {at}, before a valid record was found"
                         f"{self._passed(damage)}")
        self.done = True

    def out_of_time(self, at: int) -> None:
        """The deadline passed with reading at ``at``: stop there."""
        self.stop(at)
        deadline = self.budget.deadline
        seconds = f" of {deadline.seconds:g} s" if deadline is not None else ""
        self.log.add(at, "read_limit", f"reading stopped at offset {at} of {self.size} after "
                     f"the time budget{seconds}; everything before it was kept")

    def finish(self) -> list[IngestIssue]:
        """The issues, in file order; call once reading is over."""
        if self._damage is not None:
            self.stop(self._end)
        unchecked = self.budget.summary()
        if unchecked is not None:
            self.log.add(self.budget.first, "read_limit", unchecked)
        if self.records == 0 and {"bad_length_crc", "absurd_length"} & self.log.kinds() \
                and not {"truncated", "bad_payload_crc", "too_large"} & self.log.kinds():
            self.log.drop({"bad_length_crc", "absurd_length", "zero_tail"})
            self.log.add(0, "not_event_file", f"no valid TFRecord header in {self.size} "
                         "bytes: not an event file")
        return self.log.issues()

    def _open(self, at: int, kind: DamageKind, length: int | None) -> None:
        self._damage = Damage(at, kind, length, counted=at, last_nonzero=at - 1,
                               passed=self.budget.passed)

    def _passed(self, damage: Damage) -> str:
        """What the message of ``damage`` says about records the budget left unchecked."""
        count = self.budget.passed - damage.passed
        if not count:
            return ""
        return (f"; {count} header(s) in it that check were not followed: checking their "
                "payloads would have cost more than the budget for damage had left "
                "(see the read_limit issue)")

    def _count(self, buf: Bytes, base: int, upto: int) -> None:
        """Look at the damaged bytes up to ``upto`` (relative) for zeros."""
        damage = self._damage
        assert damage is not None
        lo = max(0, damage.counted - base)
        if upto > lo:
            _, last = zeros_and_last_nonzero(buf[lo:upto])
            if last >= 0:
                damage.last_nonzero = base + lo + last
        damage.counted = max(damage.counted, base + upto)

    def _close(self, found: int | None) -> None:
        """The damaged stretch ends at ``found`` (a valid record) or at the end of the file."""
        damage = self._damage
        assert damage is not None
        self._damage = None
        end = self._end if found is None else found
        skipped = end - damage.start
        if damage.last_nonzero < damage.start:
            self.log.add(damage.start, "zero_tail" if found is None else "zero_run", (
                f"last {skipped} bytes are all zero: nothing was written there" if found is None
                else f"{skipped} zero bytes (space reserved or a hole, never written); "
                f"reading resumes at the next valid record, at offset {found}"))
            return
        if damage.kind == _UNCHECKED:
            self.budget.skip(damage.start, skipped)
        elif found is not None:
            self.log.add(damage.start, damage.kind, f"{what(damage, True)}; skipped "
                         f"{skipped} bytes to the next valid record at offset {found}"
                         f"{self._passed(damage)}")
        else:
            self.log.add(damage.start, damage.kind,
                         at_end(damage, skipped) + self._passed(damage))
        tail = end - damage.last_nonzero - 1
        if found is None and tail >= _ZERO_NOTE:
            self.log.add(damage.last_nonzero + 1, "zero_tail",
                         f"last {tail} bytes are all zero: nothing was written there")
