"""Reading an event file's records window by window, with ordinary reads.

No memory map: a mapped file that shrinks while it is read (a writer truncating it, a
network file system) faults with SIGBUS on the next access and the process dies without a
word. The file is read by ranges instead, from a handle :func:`safeio.open_regular` opened,
never past the size it had then. Each window holds :data:`WINDOW` new bytes after the part
of a record the previous window's end cut; a record longer than a window is read whole,
up to :data:`~analyzer.ingest.tfrecord.MAX_LOADED`. Peak memory is therefore about a window
(or the longest record) plus what is decoded, whatever the size of the file.

The issues reported here, beside the framing's (see :mod:`analyzer.ingest.tfrecord`):

    truncated    the file turned out shorter than when it was opened (it shrank while it
                 was read): what was read is kept, the missing part is reported
    read_limit   the time budget (a :class:`~analyzer.ingest.safeio.Deadline`) ran out:
                 what came before is kept, reading stops
    unreadable   a read failed part way: what came before is kept, reading stops
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from analyzer.ingest.crc32c import crc32c_extend, mask_int
from analyzer.ingest.safeio import Deadline
from analyzer.ingest.tfrecord import HEADER, Framer
from analyzer.ingest.tfwalk import Bytes, IntArray

WINDOW = 4 << 20
"""New bytes read per window."""


@dataclass(frozen=True)
class Window:
    """The records wholly inside one window: ``offsets`` relative to ``data``.

    ``data`` is overwritten by the next window: copy what must outlive it."""

    data: Bytes
    base: int
    offsets: IntArray
    lengths: IntArray


class _OutOfTime(Exception):
    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


class RecordReader:
    """Feeds a file to a :class:`Framer` window by window; iterate for the windows."""

    def __init__(self, handle: BinaryIO, size: int, framer: Framer, deadline: Deadline,
                 window: int | None = None) -> None:
        self.handle = handle
        self.size = size
        self.framer = framer
        self.deadline = deadline
        self.window = window or WINDOW
        self._at = 0  # where the handle is
        self._backing: Bytes = np.zeros(0, dtype=np.uint8)
        self._shrunk = False
        self._failed: OSError | None = None  # a read that failed after some bytes came
        self._sparse_fd = _sparse_fd(handle, size)

    def __iter__(self) -> Iterator[Window]:
        framer = self.framer
        buf: Bytes = np.zeros(0, dtype=np.uint8)
        base = 0
        first = True
        while not framer.done:
            try:
                if framer.big is not None:
                    off, n = framer.big
                    framer.resolve_big(self._payload_ok(off, n) if framer.big_needs_check
                                       else True)
                    continue
                if not first and self.deadline.expired():
                    raise _OutOfTime(framer.pos)
                first = False
                if self._failed is not None:  # the bytes before it were framed first
                    raise self._failed
                buf, base, final = self._next(buf, base)
            except _OutOfTime as stop:
                framer.out_of_time(stop.at)
                return
            except OSError as exc:
                framer.stop(framer.pos)
                framer.log.add(framer.pos, "unreadable", f"read failed at offset {framer.pos}: "
                               f"{exc.strerror or exc}; everything before it was kept")
                return
            offsets, lengths = framer.feed(buf, base, final)
            yield Window(buf, base, offsets, lengths)

    def _next(self, buf: Bytes, base: int) -> tuple[Bytes, int, bool]:
        """The next window: the bytes from the framer's position on; whether the file ends.

        One backing array is reused from window to window (the carried bytes moved to its
        front): touching fresh memory for every window costs more than reading into it.
        """
        start = self.framer.pos
        keep = int(buf.shape[0]) - (start - base) if base <= start <= base + buf.shape[0] else 0
        at = start + keep
        want = max(0, min(max(self.window, self.framer.need - keep), self.size - at))
        if self._backing.shape[0] < keep + want:
            grown = np.empty(keep + want, dtype=np.uint8)
            grown[:keep] = buf[buf.shape[0] - keep:]
            self._backing = grown
        elif keep:
            self._backing[:keep] = buf[buf.shape[0] - keep:]
        got = self._read_into(self._backing.data[keep: keep + want], at) if want else 0
        if self._failed is not None:  # not the end: the window's records are kept
            return self._backing[: keep + got], start, False
        if got < want:
            self._shrank(at + got)
        return self._backing[: keep + got], start, got < want or at + got >= self.size

    def _read_into(self, view: memoryview, at: int) -> int:
        if self._sparse_fd is not None:
            return self._read_sparse(view, at, self._sparse_fd)
        return self._read_plain(view, at)

    def _read_sparse(self, view: memoryview, at: int, fd: int) -> int:
        """Read into ``view`` from ``at``, filling the file's holes with zeros unread.

        A hole reads as zeros, but the kernel still hands each of its pages over (a 1 GiB
        hole first read cost seconds); ``SEEK_DATA`` says where the next data begins, so
        the zeros before it are written here instead. Bytes are zeros either way."""
        want = min(len(view), max(0, self.size - at))
        got = 0
        while got < want:
            pos = at + got
            data, hole = _extent(fd, pos, self.size)
            if data > pos:
                n = min(want - got, data - pos)
                np.frombuffer(view, dtype=np.uint8)[got: got + n] = 0
                got += n
                continue
            span = min(want - got, max(1, hole - pos))
            n = self._read_plain(view[got: got + span], pos)
            got += n
            if n < span or self._failed is not None:
                break
        return got

    def _read_plain(self, view: memoryview, at: int) -> int:
        if self._at != at:
            self.handle.seek(at)
        got = 0
        while got < len(view):
            try:
                n = self.handle.readinto(view[got:])  # type: ignore[attr-defined]
            except OSError as exc:  # a store's read that fails mid-window (a timeout)
                if not got:
                    raise
                self._failed = exc
                break
            if not n:
                break
            got += n
        self._at = at + got
        return got

    def _payload_ok(self, off: int, n: int) -> bool:
        """Check the CRC of a payload too long to load, piece by piece."""
        crc, at, end = 0, off + HEADER, off + HEADER + n
        piece = np.empty(min(self.window, n), dtype=np.uint8)
        while at < end:
            if self.deadline.expired():
                raise _OutOfTime(off)
            view = piece.data[: min(piece.shape[0], end - at)]
            got = self._read_into(view, at)
            if self._failed is not None:
                raise self._failed
            if got < len(view):
                self._shrank(at + got)
                return False
            crc = crc32c_extend(crc, view)
            at += got
        stored = np.zeros(4, dtype=np.uint8)
        got = self._read_into(stored.data, end)
        if self._failed is not None:
            raise self._failed
        if got < 4:
            self._shrank(end + got)
            return False
        return mask_int(crc) == int.from_bytes(stored.tobytes(), "little")

    def _shrank(self, end: int) -> None:
        if not self._shrunk:
            self._shrunk = True
            self.framer.log.add(end, "truncated", f"file shrank while it was read: it had "
                                f"{self.size} bytes when opened but ends at offset {end}; the "
                                f"last {self.size - end} bytes are missing")


def _sparse_fd(handle: BinaryIO, size: int) -> int | None:
    """The descriptor of a local file with holes (fewer blocks allocated than its size),
    where the system can find them (``SEEK_DATA``); None otherwise."""
    if not hasattr(os, "SEEK_DATA") or size < (1 << 20):
        return None
    try:
        fd = handle.fileno()
        info = os.fstat(fd)
    except (AttributeError, OSError, ValueError):  # a store's file object has none
        return None
    blocks = getattr(info, "st_blocks", None)
    if blocks is None or blocks * 512 >= size:
        return None
    return fd


def _extent(fd: int, pos: int, size: int) -> tuple[int, int]:
    """Where the data at or after ``pos`` begins, and where the hole after that begins.

    The descriptor's offset is put back: the buffered handle over it keeps its own idea of
    where it is. A hole that runs to the end goes to the end the file has now (a file that
    shrank still reads short), and a system that gives no answer makes it all data."""
    back = os.lseek(fd, 0, os.SEEK_CUR)
    try:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                return pos, size
            return max(pos, min(size, os.fstat(fd).st_size)), size
        try:
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        except OSError:
            hole = size
        return data, hole
    finally:
        os.lseek(fd, back, os.SEEK_SET)
