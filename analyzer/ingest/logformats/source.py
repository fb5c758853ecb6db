"""The bytes of a text log as the record reader sees them.

A log is opened through :mod:`analyzer.ingest.safeio` and read by chunks, never past the
size it had when it was opened (a log still being written is read as it stood) and never
past a time budget. Before the record reader sees a chunk, NUL bytes are taken out and a
UTF-16 log is turned into UTF-8. Policy, one rule per kind:

- ``zero_tail`` (the run the file ends in) and ``zero_run`` (one with text after it): a
  run of NUL bytes is a hole, not text: a crash's zero-filled tail, the hole
  ``copytruncate`` leaves at the head of a log still being written to, a block that never
  reached the disk. The run is skipped and stands for a break between records (the
  text on either side is never glued into one record), not between lines: line numbers
  stay those of the file. Each run is reported with its line, byte offset and length in
  bytes of the file: the first ``HOLES_LISTED`` runs of a file with text after them one
  by one and the rest in one ``zero_run`` summary; the tail is always reported. The work
  is done per chunk by C routines (``bytes.count``, ``re.subn``), so a zero-filled
  gigabyte costs time in proportion to its size and memory of one chunk.
- ``read_limit``: the time budget ran out. The lines read before are kept; the line being
  read is dropped, as the stop cut it, and reading ends.
- A UTF-8 byte-order mark is dropped. A UTF-16 log (Windows PowerShell's redirection
  writes one) is recognised by its byte-order mark, or by ASCII text whose every other
  byte is NUL, and transcoded chunk by chunk; its holes are then located by line only
  (their lengths are still in bytes of the file: two per NUL character).

:func:`sniff` reads the head of the file the same way, for the decisions taken before
reading (empty, not text, which prefixes a line may carry).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import BinaryIO

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.safeio import Deadline
from analyzer.model import IssueKind

HEAD_BYTES = 1 << 16
"""Bytes of text, NULs aside, that :func:`sniff` collects."""
HOLES_LISTED = 10
"""Runs of NUL bytes reported one by one; the rest of a file's are summarised (fewer
than ``context.ISSUES_PER_KIND``, so the summary is not itself summarised)."""

_NULS = re.compile(rb"\x00+")
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = ((b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_CONTROL = bytes([*range(1, 7), *range(16, 27), *range(28, 32), 127])
"""Control bytes that text does not hold. Left out, as logs do hold them: tab, newline,
CR, backspace, form feed, vertical tab, escape, and BEL, SO and SI, which terminal
sequences end with (a title's ``\x1b]0;...\x07``, screen's colour reset ``\x1b[m\x0f``).
Random bytes are some 9% of these."""


@dataclass(frozen=True)
class Head:
    """What :func:`sniff` saw at the start of a file."""

    text: bytes
    """The first ``HEAD_BYTES`` bytes of text (or all of it), NULs removed, in UTF-8."""
    encoding: str
    skip: int
    """Bytes of byte-order mark to skip."""
    nul_bytes: int
    """NUL bytes met before ``text`` was complete."""
    whole: bool
    """True when ``text`` is all the text the file holds."""

    def control_share(self) -> float:
        """The share of ``text`` made of control bytes no text holds."""
        if not self.text:
            return 0.0
        return (len(self.text) - len(self.text.translate(None, _CONTROL))) / len(self.text)


def _encoding(raw: bytes) -> tuple[str, int]:
    if raw.startswith(_UTF8_BOM):
        return "utf-8", len(_UTF8_BOM)
    for bom, name in _UTF16_BOMS:
        if raw.startswith(bom):
            return name, len(bom)
    pairs = len(raw) // 2
    if pairs >= 8:
        even, odd = raw[0 : 2 * pairs : 2].count(0), raw[1 : 2 * pairs : 2].count(0)
        # ASCII in UTF-16: one half of the bytes all NUL, the other half none. A hole
        # makes both halves NUL, so it is never taken for UTF-16.
        if odd >= 0.95 * pairs and even <= 0.05 * pairs:
            return "utf-16-le", 0
        if even >= 0.95 * pairs and odd <= 0.05 * pairs:
            return "utf-16-be", 0
    return "utf-8", 0


def sniff(stream: BinaryIO, size: int, deadline: Deadline, chunk_bytes: int) -> Head:
    """Read from the start until ``HEAD_BYTES`` of text are found, the file ends or the
    deadline passes, skipping NUL bytes (a hole at the head may be large)."""
    raw = stream.read(min(size, HEAD_BYTES))
    encoding, skip = _encoding(raw)
    decoder = _decoder(encoding)
    consumed, nuls, parts, kept, zeros = len(raw), 0, [], 0, b""
    data = raw[skip:]
    while True:
        if decoder is not None:
            data = decoder.decode(data, consumed >= size).encode("utf-8")
        if b"\x00" in data:
            if len(zeros) != len(data):
                zeros = bytes(len(data))
            if data[0] == 0 and data == zeros:
                nuls, data = nuls + len(data), b""
            else:
                nuls += data.count(0)
                data = _NULS.sub(b"", data)
        parts.append(data)
        kept += len(data)
        if kept >= HEAD_BYTES or consumed >= size or deadline.expired():
            break
        data = stream.read(min(size - consumed, chunk_bytes))
        if not data:
            break
        consumed += len(data)
    text = b"".join(parts)
    return Head(text[:HEAD_BYTES], encoding, skip, nuls, consumed >= size and kept <= HEAD_BYTES)


def _decoder(encoding: str) -> codecs.IncrementalDecoder | None:
    if encoding == "utf-8":
        return None
    return codecs.getincrementaldecoder(encoding)(errors="replace")


class Chunks:
    """A log's bytes chunk by chunk: bounded in size and time, in UTF-8, each run of NUL
    bytes collapsed to one NUL (the mark of a hole for the record reader)."""

    def __init__(
        self, stream: BinaryIO, size: int, ctx: Context, head: Head, deadline: Deadline
    ) -> None:
        self.stream = stream
        self.size = size
        self.ctx = ctx
        self.deadline = deadline
        self.decoder = _decoder(head.encoding)
        self.unit = 1 if self.decoder is None else 2
        """Bytes of the file per NUL the record reader sees: UTF-16 spends two on one."""
        self.consumed = head.skip
        stream.seek(head.skip)
        self.stopped = False
        """True when the deadline cut the read."""
        self.runs = 0
        self.listed = 0
        self.nul_bytes = 0
        self.in_run = False
        """The last chunk ended inside a run of NULs, which the next one may go on with."""
        self.hole: list[int] | None = None
        """The run being located while runs are still listed: [line, offset, length]."""
        self.last: list[int] = [0, -1, 0]
        """The run the last chunk ended in, located whether runs are still listed or not,
        so that a file's tail is reported after the listing has stopped."""
        self.first: tuple[int, int | None] | None = None
        self.zero_block = b""

    def read(self, line: int, chunk_bytes: int) -> bytes:
        """The next chunk (b"" at the end); ``line`` is the line its first byte is on."""
        while self.consumed < self.size:
            if self.deadline.expired():
                self.stopped = True
                self.ctx.issue(
                    "read_limit",
                    f"reading stopped at its time budget of {self.deadline.seconds:g} s, at "
                    f"byte {self.consumed}; the lines before were kept",
                    line,
                    self.consumed,
                )
                return b""
            start = self.consumed
            data = self.stream.read(min(self.size - start, chunk_bytes))
            if not data:
                self.size = start  # the file shrank while it was read
                return b""
            self.consumed += len(data)
            if self.decoder is not None:
                data = self.decoder.decode(data, self.consumed >= self.size).encode("utf-8")
            if b"\x00" not in data:
                if data and self.in_run:
                    self.in_run = False
                    self._close(False)
            else:
                data = self._collapse(data, line, None if self.decoder else start)
            if data:  # empty: a UTF-16 unit cut by the chunk, or the inside of a hole
                return data
        return b""

    def _collapse(self, data: bytes, line: int, base: int | None) -> bytes:
        """``data`` with each run of NULs as one NUL, a run that goes on from the last
        chunk as none, so that the marks do not depend on where chunks end."""
        unit = self.unit
        continued = self.in_run and data[0] == 0
        if data[0] == 0 and data == self._zeros(len(data)):
            # The inside of a large hole: one memcmp instead of three passes. A run
            # that does not go on from the last chunk starts one (the last chunk held
            # no NUL at its end, so no run is open to close).
            length = unit * len(data)
            self.nul_bytes += length
            if continued:
                self.last[2] += length
                if self.hole is not None:
                    self.hole[2] += length
            else:
                self.runs += 1
                self.last = [line, -1 if base is None else base, length]
                if self.listed < HOLES_LISTED:
                    self._open(line, base, 0, length)
            self.in_run = True
            return b"" if continued else b"\x00"
        self.nul_bytes += unit * data.count(0)
        collapsed, runs = _NULS.subn(b"\x00", data)
        if self.in_run and not continued:
            self._close(False)
        self.runs += runs - continued
        if self.listed < HOLES_LISTED:
            self._locate(data, line, base, continued)
        self.in_run = data[-1] == 0
        if self.in_run:  # a run starts in this chunk (one that fills it goes above)
            text = len(data.rstrip(b"\x00"))
            offset = -1 if base is None else base + text
            self.last = [line + data.count(b"\n", 0, text), offset, unit * (len(data) - text)]
        return collapsed[1:] if continued else collapsed

    def _locate(self, data: bytes, line: int, base: int | None, continued: bool) -> None:
        """Follow the runs of ``data`` one by one, until enough of them are listed."""
        unit = self.unit
        for m in _NULS.finditer(data):
            start, end = m.span()
            if start == 0 and continued and self.hole is not None:
                self.hole[2] += unit * end
            else:
                where = line + data.count(b"\n", 0, start)
                self._open(where, base, start, unit * (end - start))
            if end < len(data):
                self._close(False)
                if self.listed >= HOLES_LISTED:
                    return

    def _zeros(self, size: int) -> bytes:
        if len(self.zero_block) != size:
            self.zero_block = bytes(size)
        return self.zero_block

    def _open(self, line: int, base: int | None, start: int, length: int = 0) -> None:
        offset = None if base is None else base + start
        self.hole = [line, -1 if offset is None else offset, length]
        if self.first is None:
            self.first = (line, offset)

    def _close(self, at_end: bool) -> None:
        hole, self.hole = self.hole, None
        if hole is None:
            return
        self.listed += 1
        where, offset, length = hole
        report_hole(self.ctx, length, at_end, where, None if offset < 0 else offset)

    def finish(self) -> None:
        """Report the run the file ends in, and the runs past the listed ones."""
        at_end = self.in_run and not self.stopped
        if at_end and self.hole is None:
            # Past the listed runs: the tail is still said, from where it was followed.
            where, at, length = self.last
            report_hole(self.ctx, length, True, where, None if at < 0 else at)
        self._close(at_end)
        if self.runs > self.listed and self.first is not None:
            line, offset = self.first
            report_holes(self.ctx, self.runs, self.nul_bytes, self.listed, line, offset)


def report_hole(
    ctx: Context,
    length: int,
    at_end: bool,
    line: int,
    offset: int | None,
    what: str = "a hole in the text; the text around them is read",
) -> None:
    """One run of NUL bytes: ``zero_tail`` when the file ends in it, else ``zero_run``
    (``what`` says what became of the text around it)."""
    if at_end:
        what = "the file ends in them (a zero-filled tail); the text before them is read"
    kind: IssueKind = "zero_tail" if at_end else "zero_run"
    ctx.issue(kind, f"{length} NUL bytes skipped: {what}", line, offset)


def report_holes(
    ctx: Context, runs: int, nul_bytes: int, listed: int, line: int, offset: int | None
) -> None:
    """The summary of a file's runs of NUL bytes past the ``listed`` ones."""
    ctx.issue(
        "zero_run",
        f"{runs} runs of NUL bytes in all, {nul_bytes} bytes, skipped; "
        f"only the first {listed} are listed",
        line,
        offset,
    )
