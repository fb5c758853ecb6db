"""Chunks of a log's text to numbered records.

The chunks come from :class:`analyzer.ingest.logformats.source.Chunks` (bounded reads,
NUL runs collapsed to one NUL). Policy for damage, one rule each:

- invalid UTF-8: replaced with U+FFFD, the line is kept and counted (``bad_line``);
- a carriage return, a run of backspaces or a hole (a NUL) separates records inside one
  physical line, all under that line's number. A run of progress-bar redraws collapses
  to what a terminal would show, its last segment, but a segment is kept when it is not
  a bar redraw (a record printed between two redraws), when it holds a NaN or Inf, when
  it was drawn over one that does (Lightning's tqdm bar redraws the previous step's
  values at each new count before this step's: the NaN of one step would else stand for
  the next one too), when the next segment is not a redraw (the bar state a record
  belongs to), or when a hole follows it (nothing is known to have been drawn over it);
- a record longer than LINE_CAP characters (escape sequences included): the first
  LINE_CAP are kept, the rest of it is skipped (``long_line``). A physical line longer
  than LINE_CAP bytes is never buffered whole: it is split at its separators as the
  chunks come, and only its open record is held, up to the cap;
- terminal sequences (colours, a window title, shift-in/out) are dropped from a line
  that holds an escape character;
- a last line without a newline is read like any other, and is not reported: a process
  still writing, or killed, leaves one (its output flushed mid-line), so it says nothing
  of damage, and what it holds is read or passed over as any record is. A log-only run
  whose last line was cut is judged by the lines it has; the report's read issues are
  for what the reader had to skip or replace.

The records of a file do not depend on where its chunks end: state that a boundary would
cut (the open record, a bar redraw waiting for the segment after it, a record being
skipped past its cap) is carried from one chunk to the next.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.source import Chunks

CHUNK_BYTES = 1 << 22
LINE_CAP = 1 << 16
"""Characters kept of one record; longer ones are cut here and reported."""

_ANSI = re.compile(
    r"\x1b\[[0-9;?]*+[A-Za-z]\x0f?+"  # colours, cursor moves; screen's reset ends in SI
    r"|\x1b[()][0-9A-Za-z]"  # a character set (xterm's reset starts with ESC ( B)
    r"|\x1b\][^\x07\x1b\r\x08\x00]*+(?:\x07|\x1b\\)"  # a window title, up to BEL or ST
)
"""What a terminal draws with and a log need not keep. Each sequence starts with ESC and
none spans a record separator, so removing them before or after a line is split into
records gives the same records."""
_BACKSPACES = re.compile(r"\x08++")
_REDRAW_ENDS = ("]", "it/s", "s/it")
"""How tqdm and Lightning bars end a redraw; a record printed onto a bar does not."""
_SEPARATORS = (b"\r", b"\x08", b"\x00")
Records = list[tuple[int, str]]


def _decode(raw: bytes, line: int, ctx: Context) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        ctx.issue("bad_line", _BAD_UTF8, line)
        return raw.decode("utf-8", errors="replace")


_BAD_UTF8 = "invalid UTF-8 in the line; replaced with U+FFFD"


def _split(
    line: str, number: int, ctx: Context, held: str | None, out: Records, holes: bool
) -> str | None:
    """Append the records of ``line`` (a physical line, or whole segments of one) to
    ``out``. ``held`` is a bar redraw met before it, kept until the next segment shows
    whether it was redrawn over; the one ``line`` leaves is returned. ``holes`` is False
    when the bytes the line came from held no NUL. One pass."""
    if holes and "\x00" in line:
        return _split_holes(line, number, ctx, held, out)
    capped = len(line) > LINE_CAP
    if not capped and "\x1b" in line:
        # No escape sequence holds a separator, so they may go before the split; a
        # record cut at the cap counts its escape sequences, so then they go after.
        line = _ANSI.sub("", line)
    if "\x08" in line:
        line = _BACKSPACES.sub("\r", line)
    pieces = line.split("\r")
    if capped:
        pieces = [_capped(part, number, ctx) for part in pieces]
    if held is not None:
        pieces.insert(0, held)
    kept, left = _keep(pieces, held is not None)
    out.extend([(number, pieces[j]) for j in kept])
    return None if left is None else pieces[left]


def _capped(part: str, number: int, ctx: Context) -> str:
    """A piece of a line longer than LINE_CAP: cut at the cap (reported), then its escape
    sequences taken out."""
    if len(part) > LINE_CAP:
        ctx.issue("long_line", _cut_message(), number)
        part = part[:LINE_CAP]
    if "\x1b" in part:
        part = _ANSI.sub("", part)
    return part


def _keep(pieces: list[str], holding: bool) -> tuple[list[int], int | None]:
    """Which of ``pieces`` (a line's segments between separators, after the bar redraw
    held from before it when ``holding``) are records, by index in order, and the bar
    redraw left held, if any. The tests look at letters, blanks and brackets only, never
    at digits."""
    kept: list[int] = []
    held = 0 if holding else None
    for j in range(1 if holding else 0, len(pieces)):
        part = pieces[j]
        if not part or part.isspace():
            continue
        # tqdm pads a frame shorter than the one before with spaces, to cover it.
        redraw = part.rstrip(" ").endswith(_REDRAW_ENDS)
        if held is not None and (not redraw or _mentions_nonfinite(pieces[held])):
            kept.append(held)
            if redraw and _mentions_nonfinite(pieces[held]) and not _mentions_nonfinite(part):
                # What the bar showed next: tqdm's refresh repeats a step's values at the
                # next count before that count's own are drawn over it.
                kept.append(j)
                held = None
                continue
        if redraw:
            held = j
        else:
            held = None
            kept.append(j)
    return kept, held


def record_pieces(pieces: list[str]) -> list[int]:
    """Which of ``pieces``, a complete line's segments between carriage returns (a line
    ``returns_only`` holds true of), are its records, by index in order: what
    ``line_records`` gives of that line."""
    kept, left = _keep(pieces, False)
    if left is not None:
        kept.append(left)
    return kept


def _split_holes(
    line: str, number: int, ctx: Context, held: str | None, out: Records
) -> str | None:
    for k, piece in enumerate(line.split("\x00")):
        if k and held is not None:  # nothing is known to have been drawn over it
            out.append((number, held))
            held = None
        held = _split(piece, number, ctx, held, out, False)
    return held


def _mentions_nonfinite(segment: str) -> bool:
    # Only 'a'/'A' lower-case to a text holding 'a', and only 'f'/'F' to one holding 'f':
    # a bar without them needs no lower-cased copy.
    if "a" not in segment and "f" not in segment and "A" not in segment and "F" not in segment:
        return False
    low = segment.lower()
    return "nan" in low or "inf" in low


def _cut_message() -> str:
    return f"a record longer than {LINE_CAP} characters was cut there; the rest of it was skipped"


class Lines:
    """Complete physical lines read together: ``lines[i]`` is line ``before + i + 1``.

    ``plain`` is True when no line holds a carriage return, backspace, hole or escape
    sequence and none is longer than LINE_CAP: then every non-empty line is one
    record as it stands, and ``text`` (the lines joined) may be searched as a whole.
    ``holes`` is False when no line holds a hole, so that no line need be searched for one.
    """

    __slots__ = ("before", "holes", "lines", "plain", "text")

    def __init__(self, before: int, lines: list[str], text: str, plain: bool, holes: bool) -> None:
        self.before = before
        self.lines = lines
        self.text = text
        self.plain = plain
        self.holes = holes


Batch = Lines | Records
"""Complete lines, or the records of a line read in pieces or left without a newline."""


def single(text: str, holes: bool = True, length: int | None = None) -> bool:
    """True when ``text`` is one record as it stands: no carriage return, backspace or
    escape character, no hole unless ``holes`` is False (its bytes held no NUL), and not
    longer than LINE_CAP. ``length`` is the length held to the cap when ``text`` is lines
    joined: the longest line's."""
    return "\r" not in text and returns_only(text, holes, length)


def returns_only(text: str, holes: bool = True, length: int | None = None) -> bool:
    """True when carriage returns are all that may split ``text`` into records: no
    backspace or escape character, no hole unless ``holes`` is False, and not longer than
    LINE_CAP (``length`` as for ``single``)."""
    return (
        (len(text) if length is None else length) <= LINE_CAP
        and "\x1b" not in text
        and "\x08" not in text
        and (not holes or "\x00" not in text)
    )


def line_records(line: str, number: int, ctx: Context, holes: bool = True) -> Records:
    """The records of one complete physical line (``holes`` as for ``_split``)."""
    if not line:
        return []
    if single(line, holes):
        return [(number, line)]
    out: Records = []
    held = _split(line, number, ctx, None, out, holes)
    if held is not None:
        out.append((number, held))
    return out


def iter_batches(chunks: Chunks, ctx: Context) -> Iterator[Batch]:
    """The file as batches of complete lines, and the records of the lines that
    outgrow LINE_CAP bytes before their newline, in order."""
    number = 0  # lines complete before ``pending``
    pending = b""
    long: _LongLine | None = None
    while chunk := chunks.read(number + 1, CHUNK_BYTES):
        if long is not None:
            cut = chunk.find(b"\n")
            out = long.feed(chunk if cut < 0 else chunk[:cut], cut >= 0)
            if out:
                yield out
            if cut < 0:
                continue
            long = None
            number += 1
            chunk = chunk[cut + 1 :]
        buffer = pending + chunk if pending else chunk
        cut = buffer.rfind(b"\n")
        if cut < 0:
            pending = buffer
        else:
            pending = buffer[cut + 1 :]
            yield _complete_lines(buffer[:cut], number, ctx)
            number += buffer.count(b"\n", 0, cut + 1)
        if len(pending) > LINE_CAP:
            long = _LongLine(number + 1, ctx)
            out = long.feed(pending, False)
            pending = b""
            if out:
                yield out
    if not chunks.stopped:  # a line the time budget cut is not read
        if long is not None:
            out = long.feed(b"", True)
            if out:
                yield out
        elif pending:
            number += 1
            yield line_records(_decode(pending, number, ctx), number, ctx)
    chunks.finish()


class _LongLine:
    """A physical line that outgrew LINE_CAP bytes before its newline, read as its
    chunks come: split after its last separator each time, holding only the open record
    (up to the cap) and the bar redraw waiting for the segment after it. What it gives,
    records and issues, is what reading the whole line at once gives."""

    __slots__ = ("buf", "check", "ctx", "held", "number", "skipping")

    def __init__(self, number: int, ctx: Context) -> None:
        self.number = number
        self.ctx = ctx
        self.buf = b""
        self.held: str | None = None
        self.skipping = False
        """Inside a record already cut at LINE_CAP: its rest is skipped."""
        self.check: codecs.IncrementalDecoder | None = _STRICT()
        """Every byte of the line, skipped ones too: invalid UTF-8 anywhere in it is
        reported, as for a line read whole."""

    def feed(self, data: bytes, end: bool) -> Records:
        """The records that ``data`` completes; ``end`` when the line ends after it."""
        self._check(data, end)
        out: Records = []
        if self.skipping:
            cut = min((i for i in map(data.find, _SEPARATORS) if i >= 0), default=-1)
            data = b"" if cut < 0 else data[cut:]
            self.skipping = cut < 0
        buf = self.buf + data if self.buf else data
        if end:
            self.held = self._split(buf, out)
            if self.held is not None:
                out.append((self.number, self.held))
            return out
        cut = max(map(buf.rfind, _SEPARATORS))
        if cut >= 0:
            head, buf = buf[: cut + 1], buf[cut + 1 :]
            self.held = self._split(head, out)
        if len(buf) > LINE_CAP:
            text = _text(buf)
            if len(text) > LINE_CAP:
                # One character past the cap, so that _split cuts and reports it; a
                # character cut by the chunk's end lies past it. The open record holds
                # no separator, so no hole either.
                part = text[: LINE_CAP + 1]
                self.held = _split(part, self.number, self.ctx, self.held, out, False)
                buf = b""
                self.skipping = True
        self.buf = buf
        return out

    def _split(self, raw: bytes, out: Records) -> str | None:
        return _split(_text(raw), self.number, self.ctx, self.held, out, b"\x00" in raw)

    def _check(self, data: bytes, end: bool) -> None:
        if self.check is None:
            return
        try:
            self.check.decode(data, end)
        except UnicodeDecodeError:
            self.check = None  # reported once per line
            self.ctx.issue("bad_line", _BAD_UTF8, self.number)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


_STRICT = codecs.getincrementaldecoder("utf-8")


def _complete_lines(block: bytes, before: int, ctx: Context) -> Lines:
    try:
        text = block.decode("utf-8")
        lines = text.split("\n")
    except UnicodeDecodeError:
        lines = [_decode(raw, before + i + 1, ctx) for i, raw in enumerate(block.split(b"\n"))]
        text = "\n".join(lines)
    holes = b"\x00" in block
    plain = not holes and single(text, False, max(map(len, lines)))
    return Lines(before, lines, text, plain, holes)
