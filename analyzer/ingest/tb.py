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
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from analyzer.ingest.tfrecord import HEADER, frame, rows
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


@dataclass
class _Points:
    """Scalar points gathered from both decoding paths, before grouping by tag.

    Tags are kept as small integers into ``names`` so that grouping never compares strings.
    """

    names: dict[str, int] = field(default_factory=dict)
    record: list[IntArray] = field(default_factory=list)
    tag: list[IntArray] = field(default_factory=list)
    step: list[IntArray] = field(default_factory=list)
    value: list[FloatArray] = field(default_factory=list)
    wall: list[FloatArray] = field(default_factory=list)

    def tag_id(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def add(self, record: IntArray, tag: IntArray, step: IntArray, value: FloatArray,
            wall: FloatArray) -> None:
        self.record.append(record)
        self.tag.append(tag)
        self.step.append(step)
        self.value.append(value)
        self.wall.append(wall)


def read_event_file(path: str, *, verify: bool = True) -> EventFile:
    """Read one event file. Damage becomes issues; nothing is raised for bad content."""
    try:
        size = os.path.getsize(path)
        # A plain ndarray view of the map: memmap's own indexing is several times slower.
        data: Bytes = (np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray) if size
                       else np.zeros(0, dtype=np.uint8))
    except OSError as exc:
        issue = IngestIssue(Location(path), "unreadable", f"cannot read: {exc.strerror or exc}")
        return EventFile(path, 0, 0, (), (), (), (issue,))
    framing = frame(data, path, verify=verify)
    offsets, lengths = framing.offsets, framing.lengths
    points = _Points()
    slow = _decode_fast(data, offsets, lengths, points)
    decoded = _decode_slow(data, path, offsets, lengths, slow, points)
    series = _group_series(path, offsets, points)
    events = list(decoded.events) + _step_restarts(series)
    events.sort(key=lambda e: e.location.offset or 0)
    return EventFile(
        path=path,
        size=size,
        records=int(offsets.shape[0]),
        series=series,
        histograms=decoded.histograms,
        events=tuple(events),
        issues=tuple(framing.issues) + decoded.issues,
        file_version=decoded.file_version,
    )


def _decode_fast(data: Bytes, offsets: IntArray, lengths: IntArray, points: _Points) -> IntArray:
    """Decode every record with the common scalar layout; return the indices left over."""
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
            taken = _decode_layout(block[sel], n, s, idx[sel], points)
            leftover.append(idx[sel[~taken]])
        leftover.append(idx[~ok_head])
    return np.sort(np.concatenate(leftover)) if leftover else np.zeros(0, dtype=np.int64)


def _decode_layout(block: Bytes, n: int, s: int, record: IntArray,
                   points: _Points) -> npt.NDArray[np.bool_]:
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
    points.add(record[match], tag_ids, step.view(np.int64), value.astype(np.float64), wall)
    return match


def _tag_ids(tag_bytes: Bytes, points: _Points) -> IntArray:
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


@dataclass(frozen=True)
class _Decoded:
    histograms: tuple[Histogram, ...]
    events: tuple[Event, ...]
    issues: tuple[IngestIssue, ...]
    file_version: str | None


def _decode_slow(data: Bytes, path: str, offsets: IntArray, lengths: IntArray,
                 which: IntArray, points: _Points) -> _Decoded:
    from google.protobuf.message import DecodeError

    from analyzer.ingest import tb_proto

    raw = data.data
    scalars = tb_proto.ScalarSink()
    hists = tb_proto.HistogramSink()
    events: list[Event] = []
    issues: list[IngestIssue] = []
    file_version: str | None = None
    for i in which.tolist():
        off = int(offsets[i])
        start = off + HEADER
        try:
            event = tb_proto.parse_event(bytes(raw[start: start + int(lengths[i])]))
        except DecodeError as exc:
            issues.append(IngestIssue(Location(path, offset=off), "not_an_event",
                                      f"record is not an Event protobuf ({exc}); skipped"))
            continue
        what = event.WhichOneof("what")
        if what == "file_version":
            if file_version is not None or i != 0:
                events.append(Event("restart", int(event.step), Location(path, offset=off),
                                    "writer restarted (a new file_version record)",
                                    {"reason": "file_version"}))
            file_version = file_version or event.file_version
        elif what == "summary":
            tb_proto.collect_summary(event, i, scalars, hists, off)
        elif what == "session_log" and tb_proto.is_session_start(event):
            events.append(Event("restart", int(event.step), Location(path, offset=off),
                                "session restarted (SessionLog START)", {"reason": "session_log"}))
    if scalars.record:
        record, tags, steps, values, walls = scalars.arrays()
        ids = np.array([points.tag_id(t) for t in tags], dtype=np.int64)
        points.add(record, ids, steps, values, walls)
    return _Decoded(hists.build(path), tuple(events), tuple(issues), file_version)


def _group_series(path: str, offsets: IntArray, points: _Points) -> tuple[Series, ...]:
    if not points.record:
        return ()
    record = np.concatenate(points.record)
    tags = np.concatenate(points.tag)
    order = np.lexsort((record, tags))  # by tag, then file order
    tags = tags[order]
    record = record[order]
    steps = np.concatenate(points.step)[order]
    values = np.concatenate(points.value)[order]
    walls = np.concatenate(points.wall)[order]
    bounds = np.searchsorted(tags, np.arange(len(points.names) + 1))
    out = []
    for name, t in sorted(points.names.items()):
        lo, hi = int(bounds[t]), int(bounds[t + 1])
        out.append(Series(tag=name, steps=steps[lo:hi], values=values[lo:hi],
                          wall_times=walls[lo:hi], source=path, positions=offsets[record[lo:hi]]))
    return tuple(out)


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
