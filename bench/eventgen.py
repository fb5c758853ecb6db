"""Large event files for benchmarks, written fast.

Records are serialised with TensorBoard's own ``Event`` protobuf and framed exactly as its
``RecordWriter`` frames them (tests check the bytes against ``SummaryWriter``'s), but the
CRCs come from the C implementation, so 100 MB take seconds instead of many minutes.

``write_spec`` writes a ``bench/realwriters.py`` spec's content in that real writer's layout
(torch's ``add_scalar``, ``add_histogram`` with TensorFlow's bins, tensorboardX, ``new_style``
tensor scalars); ``tests/test_bench_ingest.py`` and the benchmark itself check its records
byte for byte against the real writer's on smaller files.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import ClassVar

import google_crc32c
import numpy as np
import realwriters
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2

_MASK_DELTA = 0xA282EAD8
_FLOAT, _U32 = struct.Struct("<f"), struct.Struct("<I")


def _masked(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA)
                       & 0xFFFFFFFF)


def frame(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return header + _masked(header) + payload + _masked(payload)


def scalar_record(tag: str, value: float, step: int, wall_time: float) -> bytes:
    event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]))
    return frame(event.SerializeToString())


def histogram_record(tag: str, values: np.ndarray, step: int, wall_time: float) -> bytes:
    counts, edges = np.histogram(values[np.isfinite(values)], bins=30)
    histo = summary_pb2.HistogramProto(
        min=float(values.min()), max=float(values.max()), num=float(values.size),
        sum=float(values.sum()), sum_squares=float((values * values).sum()),
        bucket_limit=edges[1:].tolist(), bucket=counts.astype(float).tolist())
    event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, histo=histo)]))
    return frame(event.SerializeToString())


def tensor_scalar_record(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """A scalar as ``add_scalar(..., new_style=True)`` writes it: a float tensor with the
    ``scalars`` plugin's metadata on every record."""
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    value_pb = summary_pb2.Summary.Value(
        tag=tag, tensor=tensor_pb2.TensorProto(float_val=[value], dtype="DT_FLOAT"),
        metadata=meta)
    event = event_pb2.Event(wall_time=wall_time, step=step,
                            summary=summary_pb2.Summary(value=[value_pb]))
    return frame(event.SerializeToString())


def _tensorflow_bins() -> np.ndarray:
    # torch's SummaryWriter builds its default bins this way (from TensorBoard's test data)
    v, buckets = 1e-12, []
    while v < 1e20:
        buckets.append(v)
        v *= 1.1
    return np.array([-b for b in reversed(buckets)] + [0] + buckets)


_TF_BINS = _tensorflow_bins()


def torch_histogram_record(tag: str, values: np.ndarray, step: int, wall_time: float) -> bytes:
    """A histogram as torch's ``add_histogram(tag, values, step)`` writes it (its default
    ``bins="tensorflow"``): the buckets from the first to the last non-empty one, with an
    empty one before, so the record's length varies with the data."""
    values = values.astype(float).reshape(-1)
    counts, limits = np.histogram(values, bins=_TF_BINS)
    cum = np.cumsum(np.greater(counts, 0))
    start, end = np.searchsorted(cum, [0, cum[-1] - 1], side="right")
    start, end = int(start), int(end) + 1
    counts = counts[start - 1: end] if start > 0 else np.concatenate([[0], counts[:end]])
    limits = limits[start: end + 1]
    histo = summary_pb2.HistogramProto(
        min=values.min(), max=values.max(), num=len(values), sum=values.sum(),
        sum_squares=values.dot(values), bucket_limit=limits.tolist(), bucket=counts.tolist())
    event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, histo=histo)]))
    return frame(event.SerializeToString())


def version_record(wall_time: float) -> bytes:
    return frame(event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2")
                 .SerializeToString())


def write_run(path: str, *, steps: int, tags: int, nan_step: int | None = None,
              hist_every: int = 0, first_step: int = 0, seed: int = 0) -> int:
    """Write ``steps`` x ``tags`` scalars (tag 0 is ``train/loss``); return the file size.

    The loss is NaN at ``nan_step``; with ``hist_every`` two histogram tags are logged every
    that many steps.
    """
    rng = np.random.default_rng(seed)
    names = ["train/loss"] + [f"grad_norm/layer{k}.weight" for k in range(1, tags)]
    spliced = [_Spliced(scalar_record, name) for name in names]
    t0 = 1.7e9
    size = 0
    with open(path, "wb") as fh:
        size += fh.write(version_record(t0))
        chunk: list[bytes] = []
        for step in range(first_step, first_step + steps):
            values = rng.random(tags)
            if step == nan_step:
                values[0] = np.nan
            wall = t0 + step * 0.01
            prefix = _Spliced.prefix(step, wall)
            chunk.extend(s.record(prefix, v)
                         for s, v in zip(spliced, values.tolist(), strict=True))
            if hist_every and step % hist_every == 0:
                for h in ("weights/layer1.weight", "grads/layer1.weight"):
                    chunk.append(histogram_record(h, rng.standard_normal(256), step, wall))
            if len(chunk) > 50_000:
                size += fh.write(b"".join(chunk))
                chunk.clear()
        size += fh.write(b"".join(chunk))
    return size


class _Spliced:
    """Scalar records of one tag, built without a protobuf message per record.

    An Event's fields are serialised in field-number order (wall_time 1, step 2, summary 5),
    and a scalar's summary differs from record to record only in the four bytes of its float:
    the summary is serialised once by protobuf with two values, and each record is the wall
    time, the step (absent at 0, as protobuf omits it) and the summary with its value's bytes
    put in. ``write_spec``'s files are checked against the real writers' byte for byte."""

    def __init__(self, record: Callable[[str, float, int, float], bytes], tag: str) -> None:
        a = record(tag, 0.5, 0, 1.0)[12:-4]
        b = record(tag, 0.25, 0, 1.0)[12:-4]
        at = a.rfind(struct.pack("<f", 0.5))
        if at < 0 or b[at: at + 4] != struct.pack("<f", 0.25) or (a[:at], a[at + 4:]) != (
                b[:at], b[at + 4:]):
            raise ValueError(f"the value of {tag!r} is not one float32 in its record")
        if not a.startswith(b"\x09" + struct.pack("<d", 1.0)):
            raise ValueError("the wall time was not serialised first")
        self.head, self.tail = a[9:at], a[at + 4:]

    @staticmethod
    def prefix(step: int, wall_time: float) -> bytes:
        if step < 0:
            raise ValueError("a negative step takes ten bytes: not written here")
        out = bytearray(b"\x09" + struct.pack("<d", wall_time))
        if step:
            out.append(0x10)
            while step >= 0x80:
                out.append(step & 0x7F | 0x80)
                step >>= 7
            out.append(step)
        return bytes(out)

    _headers: ClassVar[dict[int, bytes]] = {}  # a header and its CRC: the length alone

    def record(self, prefix: bytes, value: float) -> bytes:
        payload = prefix + self.head + _FLOAT.pack(value) + self.tail
        header = self._headers.get(len(payload))
        if header is None:
            header = self._headers[len(payload)] = frame(payload)[:12]
        crc = google_crc32c.value(payload)
        return header + payload + _U32.pack(
            ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF)


def write_spec(path: str, spec: realwriters.Spec, wall_time: float = realwriters.WALL0) -> int:
    """Write ``spec``'s content as its real writer lays it out; return the file size. Only the
    ``file_version`` record's wall time (``wall_time`` here, the clock's there) differs."""
    scalar = tensor_scalar_record if spec.kind == "tensor_scalars" else scalar_record
    spliced = {tag: _Spliced(scalar, tag) for tag in spec.tag_names()}
    size, last, prefix = 0, (-1, 0.0), b""
    with open(path, "wb") as fh:
        size += fh.write(version_record(wall_time))
        chunk: list[bytes] = []
        for what, tag, value, step, wall in realwriters.content(spec):
            if what == "scalar":
                assert isinstance(value, float)
                if (step, wall) != last:
                    last, prefix = (step, wall), _Spliced.prefix(step, wall)
                chunk.append(spliced[tag].record(prefix, value))
            else:
                assert isinstance(value, np.ndarray)
                chunk.append(torch_histogram_record(tag, value, step, wall))
            if len(chunk) > 50_000:
                size += fh.write(b"".join(chunk))
                chunk.clear()
        size += fh.write(b"".join(chunk))
    return size
