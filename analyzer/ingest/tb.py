"""TensorBoard event files: every scalar and histogram, exactly as written.

This reader keeps every event. TensorBoard's ``EventAccumulator`` reservoir-samples scalars
(1,000 per tag by default) and purges "orphaned" events after a restart; either can drop the
one step at which a value first went NaN, which is the step this tool exists to find.

Scalars are read from every writer: ``simple_value`` (torch ``SummaryWriter``, tensorboardX,
TF1) and tensor-encoded scalars (TF2 ``tf.summary.scalar`` and ``new_style`` torch scalars:
``float_val``, ``double_val``, ``half_val`` or ``tensor_content``). NaN and both infinities
are kept bit for bit.

Speed: a scalar record from ``SummaryWriter`` has one fixed byte layout (wall time, step,
one summary value holding tag and float, either as ``simple_value`` or as a float32 tensor
with the scalars plugin's metadata). Records of equal length that match one are decoded
together with numpy, a few thousand at a time; so is the writers' file_version record.
Everything else goes through the compiled ``Event`` protobuf, which is imported only then.
Points go into their tag's series window by window (:mod:`analyzer.ingest.tbpoints`), so
memory holds the series, one window and what is decoded from it.

Read issues: the framing's are described in :mod:`analyzer.ingest.tfrecord`, the windowed
reading's in :mod:`analyzer.ingest.tfwindow`, the decoding's in
:mod:`analyzer.ingest.tb_proto`. Opening reports two more, and then nothing is read:

    not_regular   a FIFO, device or socket (a symlink is followed to what it names):
                  refused by its type before it is opened, so nothing can block or stream
    unreadable    the file cannot be looked at or opened (a folder, no permission)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.ingest.issuelog import IssueLog
from analyzer.ingest.safeio import Deadline, NotRegularFile, open_regular
from analyzer.ingest.tbpoints import Points
from analyzer.ingest.tfrecord import HEADER, Framer, rows
from analyzer.ingest.tfwindow import RecordReader, Window
from analyzer.model import Event, Histogram, IngestIssue, Location, Series

EVENT_FILE = re.compile(r"tfevents")
_TIMESTAMP = re.compile(r"tfevents\.(\d+)")

# Fast-path layouts (protobuf wire bytes):
#   09 <f64 wall_time> [10 <varint step>] 2a <len> 0a <len> 0a <taglen> <tag> <value>
# where <value> is either simple_value, 15 <f32> (torch SummaryWriter, tensorboardX, TF1),
# or a float32 tensor scalar with the scalars plugin's metadata (torch's
# add_scalar(new_style=True), the layout of TF2's tf.summary.scalar for a float32):
#   42 08 08 01 2a 04 <f32> 4a 0b 0a 09 0a 07 "scalars"
_WALL, _STEP, _SUMMARY, _VALUE, _TAG, _SIMPLE = 0x09, 0x10, 0x2A, 0x0A, 0x0A, 0x15
_TENSOR_HEAD = bytes.fromhex("420808012a04")
_TENSOR_TAIL = bytes.fromhex("4a0b0a090a07") + b"scalars"
# Each value layout: the bytes between the tag and the f32, and those after the f32.
_LAYOUTS = ((bytes([_SIMPLE]), b""), (_TENSOR_HEAD, _TENSOR_TAIL))
_FAST_MIN, _FAST_MAX = 20, 137  # shortest possible such record; single-byte length fields
# Records of one length are decoded in blocks of about this many bytes.
_BLOCK_BYTES = 1 << 21
# The file_version record writers put first: 09 <f64 wall_time> 1a <len> <version>, with
# torch's 52 <len> 0a <len> <writer name> (source_metadata) after it.
_VERSION, _SOURCE = 0x1A, 0x52

Bytes = npt.NDArray[np.uint8]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def is_event_file(name: str) -> bool:
    return bool(EVENT_FILE.search(os.path.basename(name)))


def event_file_order(path: str) -> tuple[int, str]:
    """Sort key: the writer's start timestamp in the file name, then the name."""
    match = _TIMESTAMP.search(os.path.basename(path))
    return (int(match.group(1)) if match else 0, os.path.basename(path))


@dataclass(frozen=True)
class EventFile:
    """What one event file holds."""

    path: str
    size: int
    records: int
    series: tuple[Series, ...]
    histograms: tuple[Histogram, ...]
    events: tuple[Event, ...]
    issues: tuple[IngestIssue, ...]
    file_version: str | None = None


def read_event_file(path: str, *, verify: bool = True,
                    deadline: Deadline | None = None) -> EventFile:
    """Read one event file. Damage becomes issues; nothing is raised for bad content.

    The file is opened only when it is a regular file and read by windows, never past the
    size it had when opened; reading stops, keeping what it read, once ``deadline`` (by
    default :data:`~analyzer.ingest.safeio.READ_SECONDS` from now) has passed.
    """
    try:
        handle, size = open_regular(path)
    except OSError as exc:
        return EventFile(path, 0, 0, (), (), (), (_refused(path, exc),))
    deadline = deadline or Deadline()
    framer = Framer(path, size, verify=verify, deadline=deadline)
    decoder = _Decoder(path, size, framer.log)
    with handle:
        for window in RecordReader(handle, size, framer, deadline):
            decoder.add(window)
    return decoder.result(size, framer)


def _refused(path: str, exc: OSError) -> IngestIssue:
    if isinstance(exc, NotRegularFile) and exc.kind != "folder":
        return IngestIssue(Location(path), "not_regular", str(exc))
    return IngestIssue(Location(path), "unreadable", f"cannot read: {exc.strerror or exc}")


class _Decoder:
    """Decodes the records of each window as it comes, then assembles the file."""

    def __init__(self, path: str, size: int, log: IssueLog) -> None:
        self.path = path
        self.log = log
        self.points = Points(size)
        self.count = 0
        self.file_version: str | None = None
        self.slow: Any = None  # a tb_proto.SlowDecoder, made when a record needs one

    def add(self, window: Window) -> None:
        skip = self.count == 0 and window.offsets.size and self._version(window)
        leftover = _decode_fast(window, self.points)
        if skip:
            leftover = leftover[1:] if leftover.size and leftover[0] == 0 else leftover
        if leftover.size:
            if self.slow is None:
                from analyzer.ingest import tb_proto

                self.slow = tb_proto.SlowDecoder(self.path, self.log)
                self.slow.file_version = self.file_version
            self.slow.decode(window, leftover, self.count, self.points)
        self.points.flush(window.base + int(window.data.shape[0]))
        self.count += int(window.offsets.shape[0])

    def _version(self, window: Window) -> bool:
        """Read the file's first record when it is the file_version record in one of the
        writers' layouts, as the protobuf path would (see :func:`_version_of`)."""
        rel, n = int(window.offsets[0]), int(window.lengths[0])
        found = _version_of(bytes(window.data[rel + HEADER: rel + HEADER + n]))
        if found is None:
            return False
        wall, self.file_version = found
        self.points.check_walls(np.array([window.base + rel], dtype=np.int64),
                                np.array([wall]))
        return True

    def result(self, size: int, framer: Framer) -> EventFile:
        points = self.points
        if points.bad_walls:
            self.log.add(points.first_bad_wall, "bad_record", (
                f"{points.bad_walls} record(s) with a non-finite wall time (NaN or Inf), the "
                "first at this offset; their steps and values are kept"))
        series = points.series(self.path)
        slow = self.slow
        events = (list(slow.events) if slow else []) + _step_restarts(series)
        events.sort(key=lambda e: e.location.offset or 0)
        return EventFile(
            path=self.path,
            size=size,
            records=self.count,
            series=series,
            histograms=slow.hists.build(self.path) if slow else (),
            events=tuple(events),
            issues=tuple(framer.finish()),
            file_version=slow.file_version if slow else self.file_version,
        )


def _version_of(payload: bytes) -> tuple[float, str] | None:
    """Wall time and version of a file_version record with no step, laid out as torch's
    and tensorboardX's writers lay it out; None for anything else (the protobuf path
    reads it then)."""
    n = len(payload)
    if n < 11 or payload[0] != _WALL or payload[9] != _VERSION or payload[10] >= 0x80:
        return None
    end = 11 + payload[10]
    if end != n:  # then only torch's source_metadata may follow, one string in it
        if (end + 4 > n or payload[end] != _SOURCE or payload[end + 1] != n - end - 2
                or payload[end + 2] != 0x0A or payload[end + 3] != n - end - 4
                or n - end - 2 >= 0x80):
            return None
        try:
            payload[end + 4:].decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        version = payload[11:end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    wall = float(np.frombuffer(payload, "<f8", 1, 1)[0])
    return wall, version


def _decode_fast(window: Window, points: Points) -> IntArray:
    """Decode every record of the window with a common scalar layout into ``points``;
    return the indices of the records left over (in order)."""
    lengths = window.lengths
    fits = (lengths >= _FAST_MIN) & (lengths <= _FAST_MAX)
    leftover = [np.flatnonzero(~fits)]
    candidates = np.flatnonzero(fits)
    if candidates.size:
        # A stable sort of one-byte keys is a radix sort: records grouped by length, each
        # group in file order.
        order = candidates[np.argsort(lengths[candidates].astype(np.uint8), kind="stable")]
        cuts = np.flatnonzero(np.diff(lengths[order])) + 1
        for group in np.split(order, cuts):
            n = int(lengths[group[0]])
            per_block = max(1, _BLOCK_BYTES // n)
            for lo in range(0, group.shape[0], per_block):
                idx = group[lo: lo + per_block]
                block = rows(window.data, window.offsets[idx] + HEADER, n)
                taken = _decode_block(block, n, window.offsets[idx] + window.base, points)
                leftover.append(idx[~taken])
    return np.sort(np.concatenate(leftover))


def _decode_block(block: Bytes, n: int, positions: IntArray,
                  points: Points) -> npt.NDArray[np.bool_]:
    """Decode the records of ``block`` (payloads of ``n`` bytes, one a row) that have a
    fast-path layout; return which ones did."""
    taken = np.zeros(block.shape[0], dtype=bool)
    has_step = block[:, 9] == _STEP
    # Length of the step varint: the first byte at 10.. without the continuation bit.
    width = min(10, n - 10)
    ends = block[:, 10: 10 + width] < 0x80
    vlen = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, 99)
    start = np.where(has_step, 10 + vlen, 9)  # where the summary field begins
    ok_head = block[:, 0] == _WALL
    for s in np.unique(start[ok_head]).tolist():
        at_s = np.flatnonzero(ok_head & (start == s))
        part = block if at_s.shape[0] == block.shape[0] else block[at_s]
        for head, tail in _LAYOUTS:
            match = _match(part, n, s, head, tail)
            if match is None:
                continue
            hit = at_s[match]
            matched = part if hit.shape[0] == part.shape[0] else part[match]
            _decode_layout(matched, n, s, head, tail, positions[hit], points)
            taken[hit] = True
            if hit.shape[0] == part.shape[0]:  # every row has this layout: no other can fit
                break
    return taken


def _match(block: Bytes, n: int, s: int, head: bytes, tail: bytes
           ) -> npt.NDArray[np.bool_] | None:
    """Which rows have the layout whose summary field starts at byte ``s``, with ``head``
    and ``tail`` around the value after the tag; None when none can."""
    taglen = n - s - 6 - len(head) - 4 - len(tail)
    if taglen < 0 or n - s - 2 >= 0x80:
        return None
    match: npt.NDArray[np.bool_] = (
        (block[:, s] == _SUMMARY)
        & (block[:, s + 1] == n - s - 2)
        & (block[:, s + 2] == _VALUE)
        & (block[:, s + 3] == n - s - 4)
        & (block[:, s + 4] == _TAG)
        & (block[:, s + 5] == taglen)
    )
    at = s + 6 + taglen
    for k, byte in enumerate(head):
        match &= block[:, at + k] == byte
    at += len(head) + 4
    for k, byte in enumerate(tail):
        match &= block[:, at + k] == byte
    return match if match.any() else None


def _decode_layout(block: Bytes, n: int, s: int, head: bytes, tail: bytes,
                   positions: IntArray, points: Points) -> None:
    """Decode rows that all have the layout :func:`_match` checked."""
    taglen = n - s - 6 - len(head) - 4 - len(tail)
    wall = np.ascontiguousarray(block[:, 1:9]).view("<f8")[:, 0].astype(np.float64)
    step = np.zeros(block.shape[0], dtype=np.uint64)
    for k in range(s - 10):
        step |= (block[:, 10 + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    at = s + 6 + taglen + len(head)
    value = np.ascontiguousarray(block[:, at: at + 4]).view("<f4")[:, 0]
    tag_ids = _tag_ids(block, s + 6, taglen, points)
    points.add(positions, tag_ids, step.view(np.int64), value, wall)
    points.check_walls(positions, wall)


def _tag_ids(block: Bytes, col: int, width: int, points: Points) -> IntArray:
    """The tag id of each row, whose tag is bytes ``col`` to ``col + width`` of the row.

    Rows are told apart by a hash of their tag bytes, read as 8-byte words in place; the
    distinct hashes are looked up among those of the first rows, where every tag of a
    writer's cycle appears, and only rows whose hash is not among them are sorted. Each
    row's words are then compared with those of the row its tag was named from, so that a
    collision can only cost speed (exact keys are used then), never a wrong tag.
    """
    words = _words(block, col, width)
    h = words[0].copy()
    with np.errstate(over="ignore"):
        for w in words[1:]:
            h = (h * np.uint64(0x9E3779B97F4A7C15)) ^ w
    known, first = np.unique(h[:_SAMPLE], return_index=True)
    inverse = np.minimum(np.searchsorted(known, h), known.shape[0] - 1)
    if not (known[inverse] == h).all():
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    if not all((w == w[first][inverse]).all() for w in words):  # a collision: exact keys
        # (tags under 8 bytes are their own hash and cannot collide)
        tags = np.ascontiguousarray(block[:, col: col + width])
        _, first, inverse = np.unique(tags.view(f"V{width}")[:, 0], return_index=True,
                                      return_inverse=True)
        inverse = inverse.reshape(-1)
    ids = np.array([points.tag_id(bytes(block[i, col: col + width]).decode("utf-8", "replace"))
                    for i in first.tolist()], dtype=np.int64)
    tag_ids: IntArray = ids[inverse]
    return tag_ids


# Rows whose hashes name the tags a block is expected to hold.
_SAMPLE = 256


def _words(block: Bytes, col: int, width: int) -> list[npt.NDArray[np.uint64]]:
    """The tag bytes of every row as 8-byte words: read in place where the tag holds at
    least 8 bytes (the last word ends at the tag's end, overlapping the one before), from
    a zero-padded copy otherwise."""
    rows_, n = block.shape
    if width < 8:
        padded = np.zeros((rows_, 8), dtype=np.uint8)
        padded[:, :width] = block[:, col: col + width]
        return [padded.view("<u8")[:, 0]]
    if not block.flags.c_contiguous:
        block = np.ascontiguousarray(block)
    starts = [*range(col, col + width - 8, 8), col + width - 8]
    return [np.ndarray((rows_,), dtype="<u8", buffer=block, offset=c, strides=(n,))
            for c in starts]


def _step_restarts(series: tuple[Series, ...]) -> list[Event]:
    """Restarts seen as a tag's step going backwards, one event per restart.

    Every tag of a resumed run steps back at about the same place; decreases are merged
    while they fall back into the range the run had already reached.
    """
    drops: list[tuple[int, int, int, str, str]] = []
    for s in series:
        back = np.flatnonzero(np.diff(s.steps) < 0) + 1
        for j in back.tolist():
            drops.append((int(s.positions[j]), int(s.steps[j - 1]), int(s.steps[j]), s.tag,
                          s.source))
    drops.sort()
    events: list[Event] = []
    reached = -1
    for offset, before, after, tag, source in drops:
        if events and after <= reached and before <= reached:
            continue
        reached = before
        events.append(Event("restart", after, Location(source, offset=offset),
                            f"step went back from {before} to {after} (tag {tag})",
                            {"reason": "step_backwards", "from_step": before, "to_step": after}))
    return events
