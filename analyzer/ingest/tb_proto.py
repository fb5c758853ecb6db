"""Decoding of ``Event`` protobufs that do not fit the fast scalar layout.

Imported only when such records exist, so that reading plain scalar files does not pay for
loading the protobuf runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tensorboard.compat.proto import event_pb2, types_pb2

from analyzer.model import Histogram

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
    record: list[int] = field(default_factory=list)
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


def collect_summary(event: Any, record: int, scalars: ScalarSink, hists: HistogramSink,
                    offset: int) -> None:
    step, wall = int(event.step), float(event.wall_time)
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        plugin = value.metadata.plugin_data.plugin_name
        if kind == "simple_value":
            scalars.add(record, value.tag, step, float(value.simple_value), wall)
        elif kind == "histo":
            h = value.histo
            hists.add(value.tag, step, wall, (h.min, h.max, h.sum, h.num, h.sum_squares), offset)
        elif kind == "tensor" and plugin in ("scalars", ""):
            number = tensor_scalar(value.tensor)
            if number is not None:
                scalars.add(record, value.tag, step, number, wall)
        elif kind == "tensor" and plugin == "histograms":
            stats = _bucket_stats(value.tensor)
            if stats is not None:
                hists.add(value.tag, step, wall, stats, offset)


def tensor_values(tensor: Any) -> npt.NDArray[np.float64] | None:
    """The numbers of a numeric TensorProto as float64, or None for other dtypes."""
    dtype = tensor.dtype
    if dtype == types_pb2.DT_BFLOAT16:
        bits = (np.frombuffer(tensor.tensor_content, "<u2") if tensor.tensor_content
                else np.asarray(tensor.half_val, dtype=np.uint16))
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    np_dtype = _FLOAT_DTYPES.get(dtype)
    if np_dtype is None:
        return None
    if tensor.tensor_content:
        content: bytes = tensor.tensor_content
        return np.asarray(np.frombuffer(content, dtype=np_dtype), dtype=np.float64)
    if dtype == types_pb2.DT_HALF:
        return np.asarray(tensor.half_val, dtype=np.uint16).view(np.float16).astype(np.float64)
    source = {types_pb2.DT_FLOAT: tensor.float_val, types_pb2.DT_DOUBLE: tensor.double_val,
              types_pb2.DT_INT32: tensor.int_val, types_pb2.DT_INT64: tensor.int64_val}[dtype]
    return np.asarray(source, dtype=np.float64)


def tensor_scalar(tensor: Any) -> float | None:
    values = tensor_values(tensor)
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
