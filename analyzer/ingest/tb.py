"""TensorBoard event files: every scalar and histogram, exactly as written.

This reader keeps every event. TensorBoard's ``EventAccumulator`` reservoir-samples scalars
(1,000 per tag by default) and purges "orphaned" events after a restart; either can drop the
one step at which a value first went NaN, which is the step this tool exists to find.

Scalars are read from every writer: ``simple_value`` (torch ``SummaryWriter``, tensorboardX,
TF1) and tensor-encoded scalars (TF2 ``tf.summary.scalar`` and ``new_style`` torch scalars:
``float_val``, ``double_val``, ``half_val`` or ``tensor_content``). NaN and both infinities
are kept bit for bit.

Speed: a scalar record from ``SummaryWriter`` has one fixed byte layout (wall time, step,
one summary value holding tag and float). Records of equal length that match it are decoded
together with numpy; everything else goes through the compiled ``Event`` protobuf.

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

# Fast-path layout (protobuf wire bytes):
#   09 <f64 wall_time> [10 <varint step>] 2a <len> 0a <len> 0a <taglen> <tag> 15 <f32 value>
_WALL, _STEP, _SUMMARY, _VALUE, _TAG, _SIMPLE = 0x09, 0x10, 0x2A, 0x0A, 0x0A, 0x15
_FAST_MIN, _FAST_MAX = 20, 137  # shortest possible such record; single-byte length fields

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
    decoder = _Decoder(path, framer.log)
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

    def __init__(self, path: str, log: IssueLog) -> None:
        self.path = path
        self.log = log
        self.points = Points()
        self.offsets: list[IntArray] = []
        self.count = 0
        self.slow: Any = None  # a tb_proto.SlowDecoder, made when a record needs one

    def add(self, window: Window) -> None:
        leftover = _decode_fast(window.data, window.offsets, window.lengths, self.points,
                                self.count)
        if leftover.size:
            if self.slow is None:
                from analyzer.ingest import tb_proto

                self.slow = tb_proto.SlowDecoder(self.path, self.log)
            self.slow.decode(window, leftover, self.count, self.points)
        self.offsets.append(window.offsets + window.base)
        self.count += int(window.offsets.shape[0])

    def result(self, size: int, framer: Framer) -> EventFile:
        offsets = np.concatenate(self.offsets) if self.offsets else np.zeros(0, np.int64)
        points = self.points
        if points.bad_walls:
            self.log.add(int(offsets[points.first_bad_wall]), "bad_record", (
                f"{points.bad_walls} record(s) with a non-finite wall time (NaN or Inf), the "
                "first at this offset; their steps and values are kept"))
        series = _group_series(self.path, offsets, points)
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
            file_version=slow.file_version if slow else None,
        )


def _decode_fast(data: Bytes, offsets: IntArray, lengths: IntArray, points: Points,
                 first: int) -> IntArray:
    """Decode every record with the common scalar layout; return the indices left over.
    Records are numbered from ``first`` on."""
    leftover = [np.flatnonzero((lengths < _FAST_MIN) | (lengths > _FAST_MAX))]
    in_range = np.flatnonzero((lengths >= _FAST_MIN) & (lengths <= _FAST_MAX))
    for n in np.unique(lengths[in_range]).tolist():
        idx = in_range[lengths[in_range] == n]
        block = rows(data, offsets[idx] + HEADER, n)
        has_step = block[:, 9] == _STEP
        # Length of the step varint: the first byte at 10.. without the continuation bit.
        width = min(10, n - 10)
        ends = block[:, 10: 10 + width] < 0x80
        vlen = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, 99)
        start = np.where(has_step, 10 + vlen, 9)  # where the summary field begins
        ok_head = block[:, 0] == _WALL
        for s in np.unique(start[ok_head]).tolist():
            sel = np.flatnonzero(ok_head & (start == s))
            taken = _decode_layout(block[sel], n, s, idx[sel] + first, points)
            leftover.append(idx[sel[~taken]])
        leftover.append(idx[~ok_head])
    return np.sort(np.concatenate(leftover)) if leftover else np.zeros(0, dtype=np.int64)


def _decode_layout(block: Bytes, n: int, s: int, record: IntArray,
                   points: Points) -> npt.NDArray[np.bool_]:
    """Decode block whose summary field starts at byte ``s``; return which ones matched."""
    taglen = n - s - 11
    if taglen < 0 or n - s - 2 >= 0x80:
        return np.zeros(block.shape[0], dtype=bool)
    match: npt.NDArray[np.bool_] = (
        (block[:, s] == _SUMMARY)
        & (block[:, s + 1] == n - s - 2)
        & (block[:, s + 2] == _VALUE)
        & (block[:, s + 3] == n - s - 4)
        & (block[:, s + 4] == _TAG)
        & (block[:, s + 5] == taglen)
        & (block[:, s + 6 + taglen] == _SIMPLE)
    )
    block = block[match]
    if not block.shape[0]:
        return match
    wall = np.ascontiguousarray(block[:, 1:9]).view("<f8")[:, 0].astype(np.float64)
    step = np.zeros(block.shape[0], dtype=np.uint64)
    for k in range(s - 10):
        step |= (block[:, 10 + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    value = np.ascontiguousarray(block[:, s + 7 + taglen: s + 11 + taglen]).view("<f4")[:, 0]
    tag_ids = _tag_ids(np.ascontiguousarray(block[:, s + 6: s + 6 + taglen]), points)
    with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, without a warning
        value64 = value.astype(np.float64)
    points.add(record[match], tag_ids, step.view(np.int64), value64, wall)
    points.check_walls(record[match], wall)
    return match


def _tag_ids(tag_bytes: Bytes, points: Points) -> IntArray:
    """Map each row of tag bytes to a tag id by hashing rows, not sorting byte strings."""
    n, width = tag_bytes.shape
    padded = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = tag_bytes
    words = padded.view("<u8")
    h = words[:, 0].copy()
    with np.errstate(over="ignore"):
        for j in range(1, words.shape[1]):
            h = (h * np.uint64(0x9E3779B97F4A7C15)) ^ words[:, j]
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not (words == words[first][inverse]).all():  # a hash collision: use exact keys
        _, first, inverse = np.unique(padded.view(f"V{padded.shape[1]}")[:, 0],
                                      return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    ids = np.array([points.tag_id(bytes(tag_bytes[i]).decode("utf-8", "replace"))
                    for i in first.tolist()], dtype=np.int64)
    return ids[inverse]


def _group_series(path: str, offsets: IntArray, points: Points) -> tuple[Series, ...]:
    if not points.record:
        return ()
    record = _take(points.record)
    tags = _take(points.tag)
    order = np.lexsort((record, tags))  # by tag, then file order
    tags = tags[order]
    record = record[order]
    steps = _take(points.step)[order]
    values = _take(points.value)[order]
    walls = _take(points.wall)[order]
    bounds = np.searchsorted(tags, np.arange(len(points.names) + 1))
    out = []
    for name, t in sorted(points.names.items()):
        lo, hi = int(bounds[t]), int(bounds[t + 1])
        out.append(Series(tag=name, steps=steps[lo:hi], values=values[lo:hi],
                          wall_times=walls[lo:hi], source=path, positions=offsets[record[lo:hi]]))
    return tuple(out)


def _take(parts: list[Any]) -> Any:
    """One array from a list of parts, emptying the list so that the parts can be freed."""
    whole = np.concatenate(parts)
    parts.clear()
    return whole


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
