"""The event-file reader against files written by the real writers."""

from __future__ import annotations

import math
import os

import eventgen
import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

from analyzer.ingest.tb import read_event_file
from tests.conftest import only_event_file


def _series(result, tag):  # type: ignore[no-untyped-def]
    (found,) = [s for s in result.series if s.tag == tag]
    return found


def test_summary_writer_scalars_kept_exactly(summary_run):  # type: ignore[no-untyped-def]
    values = [0.5, float("nan"), 2.0, float("inf"), float("-inf"), 1e-30, -3.25]
    path = summary_run({"train/loss": values, "lr": [0.1] * 7})
    result = read_event_file(path)
    assert result.issues == ()
    assert result.file_version == "brain.Event:2"
    loss = _series(result, "train/loss")
    assert loss.steps.tolist() == list(range(7))
    got = loss.values.tolist()
    assert got[0] == 0.5 and math.isnan(got[1]) and got[2] == 2.0
    assert got[3] == math.inf and got[4] == -math.inf
    assert got[5] == pytest.approx(1e-30, rel=1e-6) and got[6] == -3.25
    assert (np.diff(loss.positions) > 0).all()
    assert (loss.wall_times > 1e9).all()


def test_large_and_negative_steps(summary_run):  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    folder = os.path.dirname(summary_run({"a": [1.0]}, name="steps"))
    writer = SummaryWriter(folder)
    for step in (0, 127, 128, 16384, 2**40, -5):
        writer.add_scalar("s", float(step), step)
    writer.close()
    files = sorted(os.listdir(folder))
    result = read_event_file(os.path.join(folder, files[-1]))
    s = _series(result, "s")
    assert s.steps.tolist() == [0, 127, 128, 16384, 2**40, -5]
    assert s.values.tolist() == [0.0, 127.0, 128.0, 16384.0, float(2**40), -5.0]


def test_event_generator_writes_summary_writer_bytes(summary_run):  # type: ignore[no-untyped-def]
    """The benchmark generator must produce byte-for-byte what SummaryWriter writes."""
    path = summary_run({"train/loss": [0.25, float("nan")]})
    with open(path, "rb") as fh:
        data = fh.read()
    result = read_event_file(path)
    loss = _series(result, "train/loss")
    for i in range(2):
        start = int(loss.positions[i])
        length = int.from_bytes(data[start: start + 8], "little")
        record = data[start: start + 16 + length]
        value = float(np.float32(loss.values[i]))
        assert eventgen.scalar_record("train/loss", value, int(loss.steps[i]),
                                      float(loss.wall_times[i])) == record


def _tensor_event(tag: str, tensor: tensor_pb2.TensorProto, step: int,
                  plugin: str = "scalars") -> bytes:
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)
    event = event_pb2.Event(wall_time=1.7e9, step=step, summary=summary_pb2.Summary(value=[value]))
    return eventgen.frame(event.SerializeToString())


def test_tf2_tensor_scalars(tmp_path):  # type: ignore[no-untyped-def]
    nan = float("nan")
    tensors = [
        tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.5]),
        tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[nan]),
        tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT,
                               tensor_content=np.array([np.inf], "<f4").tobytes()),
        tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE,
                               tensor_content=np.array([-np.inf], "<f8").tobytes()),
        tensor_pb2.TensorProto(dtype=types_pb2.DT_HALF,
                               half_val=[int(np.array(np.nan, np.float16).view(np.uint16))]),
    ]
    path = tmp_path / "events.out.tfevents.1.host"
    with open(path, "wb") as fh:
        fh.write(eventgen.version_record(1.7e9))
        for step, t in enumerate(tensors):
            fh.write(_tensor_event("epoch_loss", t, step))
        # A text summary is a tensor too, and must not become a scalar.
        text = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"hello"])
        fh.write(_tensor_event("notes", text, 9, plugin="text"))
    result = read_event_file(str(path))
    assert result.issues == ()
    assert [s.tag for s in result.series] == ["epoch_loss"]
    values = result.series[0].values
    assert values[0] == 1.5 and math.isnan(values[1])
    assert values[2] == math.inf and values[3] == -math.inf and math.isnan(values[4])


def test_tensorboardx_writer(tmp_path):  # type: ignore[no-untyped-def]
    tensorboardX = pytest.importorskip("tensorboardX")
    writer = tensorboardX.SummaryWriter(str(tmp_path / "tbx"))
    for step in range(5):
        writer.add_scalar("loss", float("nan") if step == 3 else step / 10, step)
    writer.close()
    result = read_event_file(only_event_file(str(tmp_path / "tbx")))
    assert result.issues == ()
    loss = _series(result, "loss")
    assert loss.steps.tolist() == [0, 1, 2, 3, 4]
    assert math.isnan(loss.values[3]) and np.isfinite(np.delete(loss.values, 3)).all()


def test_histograms_kept_and_flagged(tmp_path):  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "h"))
    for step in range(3):
        writer.add_histogram("weights/fc1.weight", np.arange(10.0) * (step + 1), step)
    writer.close()
    path = only_event_file(str(tmp_path / "h"))
    # torch refuses to histogram NaN, TF does not: append a TF1-style histogram with NaN.
    histo = summary_pb2.HistogramProto(min=float("nan"), max=float("nan"), num=4,
                                       sum=float("nan"), sum_squares=float("nan"))
    event = event_pb2.Event(wall_time=1.7e9, step=3, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="weights/fc1.weight", histo=histo)]))
    with open(path, "ab") as fh:
        fh.write(eventgen.frame(event.SerializeToString()))
    result = read_event_file(path)
    (hist,) = result.histograms
    assert hist.steps.tolist() == [0, 1, 2, 3]
    assert hist.maxs[:3].tolist() == [9.0, 18.0, 27.0]
    assert hist.counts[:3].tolist() == [10.0, 10.0, 10.0]
    assert hist.nonfinite_mask().tolist() == [False, False, False, True]


def test_restart_file_version_and_step_backwards(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "events.out.tfevents.100.host"
    with open(path, "wb") as fh:
        fh.write(eventgen.version_record(1.0))
        for step in range(10):
            fh.write(eventgen.scalar_record("loss", 1.0, step, 1.0 + step))
            fh.write(eventgen.scalar_record("acc", 1.0, step, 1.0 + step))
        fh.write(eventgen.version_record(50.0))  # the writer opened the file again
        for step in range(6, 12):
            fh.write(eventgen.scalar_record("loss", 2.0, step, 50.0 + step))
            fh.write(eventgen.scalar_record("acc", 1.0, step, 50.0 + step))
    result = read_event_file(str(path))
    reasons = [e.detail["reason"] for e in result.events if e.kind == "restart"]
    assert reasons == ["file_version", "step_backwards"]
    back = next(e for e in result.events if e.detail.get("reason") == "step_backwards")
    assert back.detail["from_step"] == 9 and back.detail["to_step"] == 6
    loss = _series(result, "loss")
    assert loss.steps.tolist() == list(range(10)) + list(range(6, 12))  # nothing deduplicated
