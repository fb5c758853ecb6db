"""Large event files for benchmarks, written fast.

Records are serialised with TensorBoard's own ``Event`` protobuf and framed exactly as its
``RecordWriter`` frames them (tests check the bytes against ``SummaryWriter``'s), but the
CRCs come from the C implementation, so 100 MB take seconds instead of many minutes.
"""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2

_MASK_DELTA = 0xA282EAD8


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
            chunk.extend(scalar_record(n, float(v), step, wall)
                         for n, v in zip(names, values, strict=True))
            if hist_every and step % hist_every == 0:
                for h in ("weights/layer1.weight", "grads/layer1.weight"):
                    chunk.append(histogram_record(h, rng.standard_normal(256), step, wall))
            if len(chunk) > 50_000:
                size += fh.write(b"".join(chunk))
                chunk.clear()
        size += fh.write(b"".join(chunk))
    return size
