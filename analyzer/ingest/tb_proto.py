"""Decoding of ``Event`` protobufs that do not fit the fast scalar layout.

Imported only when such records exist, so that reading plain scalar files does not pay for
loading the protobuf runtime.

Each record is decoded on its own, under a guard: whatever is wrong inside an intact
record ends that record only, never the file's reading. Policies:

    not_an_event   the payload is not an ``Event`` protobuf: the record is skipped
    bad_record     an ``Event`` whose contents are malformed: a summary value that cannot
                   be read (a ``tensor_content`` that is not a whole number of elements, a
                   ``half_val`` beyond 16 bits) is skipped and the record's other values are
                   kept; a record that fails in any other way is skipped whole. A
                   non-finite wall time is reported once per file (count and first offset)
                   and the record is kept, since its step and values are intact
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from tensorboard.compat.proto import event_pb2, types_pb2

from analyzer.ingest.issuelog import IssueLog
from analyzer.ingest.tfrecord import HEADER
from analyzer.model import Event, Histogram, Location

if TYPE_CHECKING:
    from analyzer.ingest.tbpoints import Points
    from analyzer.ingest.tfwindow import Window

_FLOAT_DTYPES: dict[int, np.dtype[Any]] = {
    types_pb2.DT_FLOAT: np.dtype("<f4"),
    types_pb2.DT_DOUBLE: np.dtype("<f8"),
    types_pb2.DT_HALF: np.dtype("<f2"),
    types_pb2.DT_INT32: np.dtype("<i4"),
    types_pb2.DT_INT64: np.dtype("<i8"),
}
_SESSION_START = event_pb2.SessionLog.START


def parse_event(payload: bytes) -> Any:
    return event_pb2.Event.FromString(payload)


def is_session_start(event: Any) -> bool:
    return bool(event.session_log.status == _SESSION_START)


@dataclass
class ScalarSink:
    record: list[int] = field(default_factory=list)  # the file offset of each value's record
    tag: list[str] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    def add(self, record: int, tag: str, step: int, value: float, wall: float) -> None:
        self.record.append(record)
        self.tag.append(tag)
        self.step.append(step)
        self.value.append(value)
        self.wall.append(wall)

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.object_],
                              npt.NDArray[np.int64], npt.NDArray[np.float64],
                              npt.NDArray[np.float64]]:
        return (np.asarray(self.record, dtype=np.int64), np.asarray(self.tag, dtype=object),
                np.asarray(self.step, dtype=np.int64), np.asarray(self.value, dtype=np.float64),
                np.asarray(self.wall, dtype=np.float64))


@dataclass
class HistogramSink:
    rows: dict[str, list[tuple[int, float, float, float, float, float, float, int]]] = field(
        default_factory=dict)

    def add(self, tag: str, step: int, wall: float, stats: tuple[float, float, float, float,
                                                                  float], offset: int) -> None:
        lo, hi, total, count, squares = stats
        self.rows.setdefault(tag, []).append((step, wall, lo, hi, total, count, squares, offset))

    def build(self, path: str) -> tuple[Histogram, ...]:
        out = []
        for tag, rows in sorted(self.rows.items()):
            cols = list(zip(*rows, strict=True))
            f = [np.asarray(c, dtype=np.float64) for c in cols[1:7]]
            out.append(Histogram(tag=tag, steps=np.asarray(cols[0], dtype=np.int64),
                                 wall_times=f[0], mins=f[1], maxs=f[2], sums=f[3], counts=f[4],
                                 sum_squares=f[5], source=path,
                                 positions=np.asarray(cols[7], dtype=np.int64)))
        return tuple(out)


class BadValue(ValueError):
    """A summary value whose contents cannot be read."""


class SlowDecoder:
    """Decodes, record by record, what the fast path left, across a file's windows."""

    def __init__(self, path: str, log: IssueLog) -> None:
        self.path = path
        self.log = log
        self.scalars = ScalarSink()
        self.hists = HistogramSink()
        self.events: list[Event] = []
        self.file_version: str | None = None

    def decode(self, window: Window, which: npt.NDArray[np.int64], first: int,
               points: Points) -> None:
        """Decode records ``which`` of ``window`` (numbered from ``first``) into ``points``
        (scalars, by the file offset of their record) and this decoder (histograms,
        restarts, the file version)."""
        raw = window.data.data
        for i in which.tolist():
            rel = int(window.offsets[i])
            offset, record = window.base + rel, first + i
            payload = bytes(raw[rel + HEADER: rel + HEADER + int(window.lengths[i])])
            try:
                event = parse_event(payload)
            except Exception as exc:  # DecodeError, or whatever else the parser raises
                self.log.add(offset, "not_an_event",
                             f"record is not an Event protobuf ({exc}); skipped")
                continue
            try:
                self._event(event, record, offset, points)
            except Exception as exc:  # a malformed record ends that record, not the file
                self.log.add(offset, "bad_record", f"record could not be read "
                             f"({type(exc).__name__}: {exc}); skipped")
        if self.scalars.record:
            record_ids, tags, steps, values, walls = self.scalars.arrays()
            ids = np.array([points.tag_id(t) for t in tags], dtype=np.int64)
            points.add(record_ids, ids, steps, values, walls)
            self.scalars = ScalarSink()

    def _event(self, event: Any, record: int, offset: int, points: Points) -> None:
        wall = event.wall_time
        if not math.isfinite(wall):
            points.check_walls(np.array([offset], dtype=np.int64), np.array([wall]))
        what = event.WhichOneof("what")
        if what == "summary":
            problems = collect_summary(event, offset, self.scalars, self.hists, offset)
            if problems:
                self.log.add(offset, "bad_record", "; ".join(problems))
        elif what == "file_version":
            if self.file_version is not None or record != 0:
                self.events.append(Event("restart", int(event.step),
                                         Location(self.path, offset=offset),
                                         "writer restarted (a new file_version record)",
                                         {"reason": "file_version"}))
            self.file_version = self.file_version or str(event.file_version)
        elif what == "session_log" and is_session_start(event):
            self.events.append(Event("restart", int(event.step), Location(self.path, offset=offset),
                                     "session restarted (SessionLog START)",
                                     {"reason": "session_log"}))


def collect_summary(event: Any, record: int, scalars: ScalarSink, hists: HistogramSink,
                    offset: int) -> list[str]:
    """Add the scalars and histograms of a summary event; returns what could not be read.

    Everything is read before anything is added, so that a record failing part way adds
    nothing.
    """
    step, wall = int(event.step), float(event.wall_time)
    found_scalars: list[tuple[str, float]] = []
    found_hists: list[tuple[str, tuple[float, float, float, float, float]]] = []
    problems: list[str] = []
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            found_scalars.append((value.tag, float(value.simple_value)))
        elif kind == "histo":
            h = value.histo
            found_hists.append((value.tag, (h.min, h.max, h.sum, h.num, h.sum_squares)))
        elif kind == "tensor":
            try:
                _tensor_value(value, found_scalars, found_hists)
            except BadValue as exc:
                problems.append(f"summary value {value.tag[:200]!r} cannot be read: {exc}; "
                                "that value skipped")
    for tag, number in found_scalars:
        scalars.add(record, tag, step, number, wall)
    for tag, stats in found_hists:
        hists.add(tag, step, wall, stats, offset)
    return problems


def _tensor_value(value: Any, scalars: list[tuple[str, float]],
                  hists: list[tuple[str, tuple[float, float, float, float, float]]]) -> None:
    plugin = value.metadata.plugin_data.plugin_name
    if plugin in ("scalars", ""):
        number = tensor_scalar(value.tensor)
        if number is not None:
            scalars.append((value.tag, number))
    elif plugin == "histograms":
        stats = _bucket_stats(value.tensor)
        if stats is not None:
            hists.append((value.tag, stats))


def _dtype_name(dtype: int) -> str:
    try:
        return str(types_pb2.DataType.Name(dtype))
    except ValueError:
        return f"dtype {dtype}"


def tensor_values(tensor: Any, most: int | None = None) -> npt.NDArray[np.float64] | None:
    """The numbers of a numeric TensorProto as float64; None for other dtypes, or for more
    than ``most`` numbers (counted before anything is converted).

    Raises :class:`BadValue` for contents that cannot be numbers of the tensor's dtype.
    """
    with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, without a warning
        return _tensor_values(tensor, most)


def _tensor_values(tensor: Any, most: int | None) -> npt.NDArray[np.float64] | None:
    dtype = tensor.dtype
    if dtype == types_pb2.DT_BFLOAT16:
        return _bits16(tensor, most, lambda b: (b.astype(np.uint32) << 16).view(np.float32))
    np_dtype = _FLOAT_DTYPES.get(dtype)
    if np_dtype is None:
        return None
    if tensor.tensor_content:
        content: bytes = tensor.tensor_content
        if len(content) % np_dtype.itemsize:
            raise BadValue(f"tensor_content of {len(content)} bytes is not a whole number of "
                           f"{np_dtype.itemsize}-byte {_dtype_name(dtype)} elements")
        if most is not None and len(content) // np_dtype.itemsize > most:
            return None
        return np.asarray(np.frombuffer(content, dtype=np_dtype), dtype=np.float64)
    if dtype == types_pb2.DT_HALF:
        return _bits16(tensor, most, lambda b: b.view(np.float16))
    source = {types_pb2.DT_FLOAT: tensor.float_val, types_pb2.DT_DOUBLE: tensor.double_val,
              types_pb2.DT_INT32: tensor.int_val, types_pb2.DT_INT64: tensor.int64_val}[dtype]
    if most is not None and len(source) > most:
        return None
    return np.asarray(source, dtype=np.float64)


def _bits16(tensor: Any, most: int | None, convert: Any) -> npt.NDArray[np.float64] | None:
    """Half or bfloat16 numbers, from ``tensor_content`` or from ``half_val`` (which holds
    each number's 16 bits in an int32)."""
    if tensor.tensor_content:
        content: bytes = tensor.tensor_content
        if len(content) % 2:
            raise BadValue(f"tensor_content of {len(content)} bytes is not a whole number of "
                           f"2-byte {_dtype_name(tensor.dtype)} elements")
        bits = np.frombuffer(content, "<u2")
    else:
        ints = np.asarray(tensor.half_val, dtype=np.int64)
        if ints.size and (int(ints.min()) < 0 or int(ints.max()) > 0xFFFF):
            raise BadValue("half_val holds a number beyond 16 bits")
        bits = ints.astype(np.uint16)
    if most is not None and bits.shape[0] > most:
        return None
    return np.asarray(convert(bits), dtype=np.float64)


def tensor_scalar(tensor: Any) -> float | None:
    values = tensor_values(tensor, most=1)
    if values is None or values.size != 1:
        return None
    return float(values[0])


def _bucket_stats(tensor: Any) -> tuple[float, float, float, float, float] | None:
    """min, max, sum, count, sum of squares of a TF2 histogram tensor (k x 3 buckets).

    TF2 histograms keep only (left edge, right edge, count) per bucket, so the sums are
    estimated from bucket centres; a NaN or Inf in the data shows up as a non-finite edge.
    """
    values = tensor_values(tensor)
    if values is None or values.size % 3:
        return None
    buckets = values.reshape(-1, 3)
    counts = buckets[:, 2]
    used = buckets[counts > 0]
    if not used.shape[0]:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    with np.errstate(all="ignore"):
        centres = (used[:, 0] + used[:, 1]) / 2
        total = float((centres * used[:, 2]).sum())
        squares = float((centres * centres * used[:, 2]).sum())
    return (float(used[0, 0]), float(used[-1, 1]), total, float(counts.sum()), squares)
