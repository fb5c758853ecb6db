"""Bytes of a log file to numbered text records.

Policy for damage, one rule each:

- invalid UTF-8: replaced with U+FFFD, the line is kept and counted (``bad_line``);
- a record longer than LINE_CAP characters: the first LINE_CAP are kept, the rest
  of it is skipped (``long_line``); a physical line that grows past the cap with no
  newline in sight is not buffered: its rest, up to the next newline, is skipped;
- a carriage return (or a run of backspaces) separates records inside one physical
  line, all under that line's number. A run of progress-bar redraws collapses to
  what a terminal would show, its last segment, but a segment is kept when it is not
  a bar redraw (a record printed between two redraws), when it holds a NaN or Inf,
  or when the next segment is not a redraw (the bar state a record belongs to);
- a last line without a newline is read like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from analyzer.ingest.logformats.context import Context

CHUNK_BYTES = 1 << 22
LINE_CAP = 1 << 16
"""Characters kept of one record; longer ones are cut here and reported."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*+[A-Za-z]")
_BACKSPACES = re.compile(r"\x08++")
_REDRAW_ENDS = ("]", "it/s", "s/it")
"""How tqdm and Lightning bars end a redraw; a record printed onto a bar does not."""


def _decode(raw: bytes, line: int, ctx: Context) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        ctx.issue(
            "bad_line",
            f"invalid UTF-8 at byte {exc.start} of the line; replaced with U+FFFD",
            line,
        )
        return raw.decode("utf-8", errors="replace")


def _records(line: str, number: int, ctx: Context, open_end: bool = False) -> list[tuple[int, str]]:
    """The records of one physical line; ``open_end`` when more of it is still to come.

    One pass over the segments: a bar redraw is held until the next segment shows
    whether it was redrawn over."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "\x08" in line:
        line = _BACKSPACES.sub("\r", line)
    out: list[tuple[int, str]] = []
    held: str | None = None  # the last segment, when it is a bar redraw
    for part in line.split("\r"):
        if not part or part.isspace():
            continue
        redraw = part.endswith(_REDRAW_ENDS)
        if held is not None and (not redraw or _mentions_nonfinite(held)):
            out.append((number, held))
        if redraw:
            held = part
        else:
            held = None
            out.append((number, part))
    if held is not None and (not open_end or _mentions_nonfinite(held)):
        out.append((number, held))
    if len(line) > LINE_CAP:
        for i, (at, part) in enumerate(out):
            if len(part) > LINE_CAP:
                ctx.issue(
                    "long_line",
                    f"record of {len(part)} characters cut to its first {LINE_CAP}",
                    at,
                )
                out[i] = (at, part[:LINE_CAP])
    return out


def _mentions_nonfinite(segment: str) -> bool:
    # Only 'a'/'A' lower-case to a text holding 'a', and only 'f'/'F' to one holding 'f':
    # a bar without them needs no lower-cased copy.
    if "a" not in segment and "f" not in segment and "A" not in segment and "F" not in segment:
        return False
    low = segment.lower()
    return "nan" in low or "inf" in low


class Lines:
    """Complete physical lines read together: ``lines[i]`` is line ``before + i + 1``.

    ``plain`` is True when no line holds a carriage return, backspace or escape
    sequence and none is longer than LINE_CAP: then every non-empty line is one
    record as it stands, and ``text`` (the lines joined) may be searched as a whole.
    """

    __slots__ = ("before", "lines", "plain", "text")

    def __init__(self, before: int, lines: list[str], text: str, plain: bool) -> None:
        self.before = before
        self.lines = lines
        self.text = text
        self.plain = plain


Batch = Lines | list[tuple[int, str]]
"""Complete lines, or the records of a line cut short or left without a newline."""


def iter_records(stream: BinaryIO, ctx: Context) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, record text) for every record of the stream."""
    for batch in iter_batches(stream, ctx):
        if not isinstance(batch, Lines):
            yield from batch
            continue
        number = batch.before
        for line in batch.lines:
            number += 1
            yield from line_records(line, number, ctx)


def line_records(line: str, number: int, ctx: Context) -> list[tuple[int, str]]:
    """The records of one complete physical line."""
    if not line:
        return []
    if "\r" in line or len(line) > LINE_CAP or "\x1b" in line or "\x08" in line:
        return _records(line, number, ctx)
    return [(number, line)]


def iter_batches(stream: BinaryIO, ctx: Context) -> Iterator[Batch]:
    """The stream as batches of complete lines, in order."""
    number = 0
    pending = b""
    skipping = False  # inside a physical line already cut at LINE_CAP
    first = True
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if first:
            first = False
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
        if not chunk:
            break
        if skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                continue
            chunk = chunk[cut + 1 :]
            skipping = False
            number += 1
        buffer = pending + chunk if pending else chunk
        cut = buffer.rfind(b"\n")
        if cut < 0:
            complete, pending = b"", buffer
        else:
            complete, pending = buffer[: cut + 1], buffer[cut + 1 :]
        if complete:
            yield _complete_lines(complete[:-1], number, ctx)
            number += complete.count(b"\n")
        if len(pending) > LINE_CAP:
            # A physical line with no newline in sight: emit what a progress bar
            # already finished, and cut the rest rather than buffer it whole.
            cr = pending.rfind(b"\r")
            if cr >= 0:
                head, pending = pending[:cr], pending[cr + 1 :]
                yield _records(_decode(head, number + 1, ctx), number + 1, ctx, True)
            if len(pending) > LINE_CAP:
                ctx.issue(
                    "long_line",
                    f"line longer than {LINE_CAP} bytes; the rest of it was skipped",
                    number + 1,
                )
                text = pending[:LINE_CAP].decode("utf-8", errors="replace")
                yield _records(text, number + 1, ctx)
                pending = b""
                skipping = True
    if pending and not skipping:
        number += 1
        yield _records(_decode(pending, number, ctx), number, ctx)


def _complete_lines(block: bytes, before: int, ctx: Context) -> Lines:
    try:
        text = block.decode("utf-8")
        lines = text.split("\n")
    except UnicodeDecodeError:
        lines = [_decode(raw, before + i + 1, ctx) for i, raw in enumerate(block.split(b"\n"))]
        text = "\n".join(lines)
    plain = (
        "\r" not in text
        and "\x1b" not in text
        and "\x08" not in text
        and max(map(len, lines)) <= LINE_CAP
    )
    return Lines(before, lines, text, plain)
