"""Event files from a stranger: crashed writers, shrinking files, hostile contents.

Fixtures are written by torch's SummaryWriter (and tensorboardX) in tmp_path, then damaged
on purpose; records the real writers cannot produce (malformed tensors) are real ``Event``
protobufs framed as the writers frame them.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import subprocess
import sys
import textwrap
import tracemalloc

import eventgen
import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

from analyzer.ingest import issuelog, tb, tb_proto, tfrecord, tfwindow
from analyzer.ingest.safeio import Deadline
from analyzer.ingest.tb import read_event_file
from tests.conftest import ROOT, write_summary_run


def _writer_bytes(tmp_path, name: str, steps: range, tag: str = "train/loss") -> bytes:  # type: ignore[no-untyped-def]
    path = write_summary_run(str(tmp_path / name), {tag: [float(s) for s in steps]},
                             start=steps.start)
    with open(path, "rb") as fh:
        return fh.read()


def _spans(data: bytes) -> list[tuple[int, int]]:
    """(offset, end) of each record of an intact file, by a plain walk."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, pos + 16 + n))
        pos += 16 + n
    return out


def _write(tmp_path, data: bytes, name: str = "events.out.tfevents.1.host") -> str:  # type: ignore[no-untyped-def]
    path = str(tmp_path / name)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _steps(result, tag: str = "train/loss") -> list[int]:  # type: ignore[no-untyped-def]
    return [int(x) for s in result.series if s.tag == tag for x in s.steps]


def _kinds(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [i.kind for i in result.issues]


def _framed(event: event_pb2.Event) -> bytes:
    return eventgen.frame(event.SerializeToString())


def _tensor_record(tag: str, tensor: tensor_pb2.TensorProto, step: int) -> bytes:
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    return _framed(event_pb2.Event(wall_time=1.7e9, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)])))


# -- defect 4: records lost behind a CRC-valid wrong length ---------------------------------

@pytest.mark.parametrize("verify", [True, False])
def test_regression_killed_writer_then_another_keeps_the_second_writers_records(
        tmp_path, verify) -> None:  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    folder = str(tmp_path / "a")
    writer = SummaryWriter(folder)
    for step in range(10):
        writer.add_scalar("train/loss", float(step), step)
    writer.add_histogram("weights", np.arange(100.0), 10)
    writer.close()
    (name,) = os.listdir(folder)
    with open(os.path.join(folder, name), "rb") as fh:
        first = fh.read()
    second = _writer_bytes(tmp_path, "b", range(10, 210))
    last_start, last_end = _spans(first)[-1]
    killed = first[: last_start + 20]  # the header and a little of the histogram's payload
    # Its length points well inside the second writer's records.
    assert 200 < last_end - len(killed) < len(second) - 200
    result = read_event_file(_write(tmp_path, killed + second), verify=verify)
    assert _steps(result) == list(range(0, 210))
    (issue,) = result.issues
    assert issue.kind == "bad_payload_crc" and issue.location.offset == last_start
    assert f"skipped {len(killed) - last_start} bytes" in issue.message
    assert f"at offset {len(killed)}" in issue.message


@pytest.mark.parametrize("verify", [True, False])
def test_regression_valid_length_past_the_end_keeps_the_records_after_it(
        tmp_path, verify) -> None:  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    folder = str(tmp_path / "a")
    writer = SummaryWriter(folder)
    writer.add_scalar("train/loss", 0.5, 0)
    writer.add_histogram("weights", np.arange(4000.0), 0, bins=1000)  # a long record
    writer.close()
    (name,) = os.listdir(folder)
    with open(os.path.join(folder, name), "rb") as fh:
        first = fh.read()
    big_start, big_end = max(_spans(first), key=lambda s: s[1] - s[0])
    second = _writer_bytes(tmp_path, "b", range(1, 6))
    assert len(second) < big_end - big_start - 100  # what follows ends before the long record
    data = first[: big_start + 100] + second
    result = read_event_file(_write(tmp_path, data), verify=verify)
    assert _steps(result) == [0, 1, 2, 3, 4, 5]
    (issue,) = result.issues
    assert issue.kind == "truncated" and issue.location.offset == big_start
    assert f"next valid record at offset {big_start + 100}" in issue.message


def test_cut_record_with_nothing_valid_after_it_is_still_the_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 5))
    result = read_event_file(_write(tmp_path, data[:-3] + b"\x07" * 50))
    assert _steps(result) == [0, 1, 2, 3]
    assert _kinds(result) == ["bad_payload_crc"]
    assert "no valid record after it" in result.issues[0].message


# -- defect 6: malformed contents inside an intact record -----------------------------------

def test_regression_tensor_content_not_a_whole_number_of_elements_is_a_bad_record(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    from analyzer.api import analyze

    good = _writer_bytes(tmp_path, "a", range(0, 3))
    bad = _tensor_record("train/loss", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_content=b"\x00\x00\xc0\x7f\x01\x02\x03"), 3)
    after = eventgen.scalar_record("train/loss", float("nan"), 4, 1.7e9)
    run = tmp_path / "run"
    run.mkdir()
    path = _write(run, good + bad + after)
    result = read_event_file(path)
    assert _steps(result) == [0, 1, 2, 4]
    (issue,) = result.issues
    assert issue.kind == "bad_record" and issue.location.offset == len(good)
    assert "7 bytes" in issue.message and "DT_FLOAT" in issue.message
    report = analyze(str(run), replay=False)  # the whole analysis goes on, and sees the NaN
    assert report.failed and report.results[0].incident.step == 4  # type: ignore[union-attr]


def test_regression_half_val_beyond_16_bits_is_a_bad_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = _writer_bytes(tmp_path, "a", range(0, 2))
    bad = _tensor_record("train/loss", tensor_pb2.TensorProto(dtype=types_pb2.DT_HALF,
                                                              half_val=[70000]), 2)
    result = read_event_file(_write(tmp_path, good + bad))
    assert _steps(result) == [0, 1]
    assert _kinds(result) == ["bad_record"] and "16 bits" in result.issues[0].message


def test_bad_value_leaves_the_other_values_of_its_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    values = [summary_pb2.Summary.Value(tag="lr", simple_value=0.25),
              summary_pb2.Summary.Value(tag="loss", metadata=meta, tensor=tensor_pb2.TensorProto(
                  dtype=types_pb2.DT_DOUBLE, tensor_content=b"\x01" * 12))]
    record = _framed(event_pb2.Event(wall_time=1.7e9, step=7,
                                     summary=summary_pb2.Summary(value=values)))
    result = read_event_file(_write(tmp_path, eventgen.version_record(1.7e9) + record))
    assert _steps(result, "lr") == [7] and _steps(result, "loss") == []
    assert _kinds(result) == ["bad_record"] and "'loss'" in result.issues[0].message


def test_any_failure_inside_one_record_skips_that_record_only(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = tb_proto.collect_summary

    def fails_at_step_2(event, *args):  # type: ignore[no-untyped-def]
        if event.step == 2:
            raise RuntimeError("unexpected")
        return real(event, *args)

    monkeypatch.setattr(tb_proto, "collect_summary", fails_at_step_2)
    # float64 tensor scalars: the protobuf path reads them (float32 ones in the writers'
    # layout are decoded without it, where collect_summary is not called)
    records = [eventgen.version_record(1.7e9)] + [
        _tensor_record("loss", tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE,
                                                      double_val=[float(i)]), i)
        for i in range(4)]
    result = read_event_file(_write(tmp_path, b"".join(records)))
    assert _steps(result, "loss") == [0, 1, 3]
    (issue,) = result.issues
    assert issue.kind == "bad_record" and "RuntimeError: unexpected" in issue.message
    assert issue.location.offset == sum(len(r) for r in records[:3])


# -- defect 7: no memory map, a shrinking file is a truncation ------------------------------

_SHRINK = textwrap.dedent("""
    import mmap, os, sys
    sys.path.insert(0, sys.argv[2])
    path = sys.argv[1]
    real_mmap, real_fdopen = mmap.mmap, os.fdopen

    def shrink():
        os.truncate(path, 4096)

    class ShrinkingMap(real_mmap):
        def __new__(cls, *args, **kwargs):
            m = real_mmap.__new__(cls, *args, **kwargs)
            shrink()
            return m

    class ShrinkingHandle:
        def __init__(self, handle):
            self.handle, self.reads = handle, 0

        def readinto(self, view):
            self.reads += 1
            if self.reads == 2:
                shrink()
            return self.handle.readinto(view)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    mmap.mmap = ShrinkingMap
    os.fdopen = lambda *a, **k: ShrinkingHandle(real_fdopen(*a, **k))
    try:
        from analyzer.ingest import tfwindow
        tfwindow.WINDOW = 8192
    except ImportError:
        pass
    from analyzer.ingest.tb import read_event_file
    result = read_event_file(path)
    print(result.records, [i.kind for i in result.issues])
""")


def test_regression_file_shrinking_while_read_is_a_truncation_not_a_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    records = [eventgen.version_record(1.7e9)] + [
        eventgen.scalar_record("train/loss", float(i), i, 1.7e9 + i) for i in range(2000)]
    path = _write(tmp_path, b"".join(records))
    done = subprocess.run([sys.executable, "-c", _SHRINK, path, ROOT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # SIGBUS: -7
    count, kinds = done.stdout.split(" ", 1)
    assert 0 < int(count) < len(records) and "truncated" in kinds


def test_event_files_are_read_without_memory_maps(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mmap

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("event files must not be memory-mapped")

    monkeypatch.setattr(mmap, "mmap", refuse)
    monkeypatch.setattr(np, "memmap", refuse)
    path = _write(tmp_path, _writer_bytes(tmp_path, "a", range(0, 5)))
    result = read_event_file(path)
    assert result.issues == () and _steps(result) == [0, 1, 2, 3, 4]


class _Handle:
    """A real file handle whose reads do something to the file, or fail, part way."""

    def __init__(self, handle, path: str, *, shrink_to: int | None = None,  # type: ignore[no-untyped-def]
                 fail: bool = False) -> None:
        self.handle, self.path, self.shrink_to, self.fail = handle, path, shrink_to, fail
        self.reads = 0

    def readinto(self, view) -> int:  # type: ignore[no-untyped-def]
        self.reads += 1
        if self.reads == 2 and self.shrink_to is not None:
            os.truncate(self.path, self.shrink_to)
        if self.reads == 2 and self.fail:
            raise OSError(5, "Input/output error")
        return int(self.handle.readinto(view))

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.handle, name)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self.handle.close()


def _patch_open(monkeypatch, **how) -> None:  # type: ignore[no-untyped-def]
    real = tb.open_regular

    def opener(path: str):  # type: ignore[no-untyped-def]
        handle, size = real(path)
        return _Handle(handle, path, **how), size

    monkeypatch.setattr(tb, "open_regular", opener)


def test_file_shrinking_keeps_the_records_read_before(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 300))
    path = _write(tmp_path, data)
    monkeypatch.setattr(tfwindow, "WINDOW", 4096)
    _patch_open(monkeypatch, shrink_to=6000)
    result = read_event_file(path)
    whole = [s for s in _spans(data) if s[1] <= 6000]
    assert result.records == len(whole)
    shrank = [i for i in result.issues if "shrank" in i.message]
    assert len(shrank) == 1 and shrank[0].kind == "truncated"
    assert shrank[0].location.offset == 6000 and str(len(data)) in shrank[0].message


def test_read_error_part_way_keeps_the_records_read_before(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 300))
    monkeypatch.setattr(tfwindow, "WINDOW", 4096)
    _patch_open(monkeypatch, fail=True)
    result = read_event_file(_write(tmp_path, data))
    assert 0 < result.records < len(_spans(data))
    assert _kinds(result) == ["unreadable"] and "Input/output error" in result.issues[0].message


# -- defect 12: zero runs in constant memory ------------------------------------------------

def test_regression_zero_tail_is_skipped_in_constant_memory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 20))
    path = _write(tmp_path, data)
    os.truncate(path, len(data) + (64 << 20))  # a sparse 64 MiB zero tail: no disk used
    monkeypatch.setattr(tfwindow, "WINDOW", 1 << 20)
    tracemalloc.start()
    try:
        result = read_event_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _steps(result) == list(range(20))
    assert _kinds(result) == ["zero_tail"] and result.issues[0].location.offset == len(data)
    assert peak < 8 << 20, peak  # a few windows, not the 64 MiB of the tail


@pytest.mark.parametrize("verify", [True, False])
def test_regression_zero_hole_between_records_resynchronises(tmp_path, verify) -> None:  # type: ignore[no-untyped-def]
    first = _writer_bytes(tmp_path, "a", range(0, 10))
    second = _writer_bytes(tmp_path, "b", range(10, 20))
    hole = b"\0" * 100_000  # a preallocated region written later, or a copytruncate hole
    result = read_event_file(_write(tmp_path, first + hole + second), verify=verify)
    assert _steps(result) == list(range(20))
    (issue,) = result.issues
    assert issue.kind == "zero_run" and issue.location.offset == len(first)
    assert f"{len(hole)} zero bytes" in issue.message
    assert f"at offset {len(first) + len(hole)}" in issue.message


def test_zero_hole_at_the_start_of_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 10))
    result = read_event_file(_write(tmp_path, b"\0" * 8192 + data))
    assert _steps(result) == list(range(10))
    assert _kinds(result) == ["zero_run"] and result.issues[0].location.offset == 0


def test_cut_record_then_zeros_reports_both(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 10))
    start = _spans(data)[-1][0]
    result = read_event_file(_write(tmp_path, data[: start + 20] + b"\0" * 10_000))
    assert _steps(result) == list(range(9))
    assert _kinds(result) == ["bad_payload_crc", "zero_tail"]
    assert result.issues[1].location.offset == start + 20


# -- defect 16: the truncation message, wall times, the time budget -------------------------

def test_regression_truncation_message_counts_payload_bytes_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 4))
    start, end = _spans(data)[-1]
    length = end - start - 16
    for present in (0, 1, length - 1, length):
        result = read_event_file(_write(tmp_path, data[: start + 12 + present]))
        (issue,) = result.issues
        assert issue.kind == "truncated"
        assert f" {present} of {length} payload bytes present" in issue.message, issue.message
    result = read_event_file(_write(tmp_path, data[:-2]))
    assert f"all {length} payload bytes and 2 of 4 CRC bytes" in result.issues[0].message


@pytest.mark.parametrize("new_style", [False, True])
def test_regression_nonfinite_wall_times_are_one_issue_per_file(tmp_path, new_style) -> None:  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    folder = str(tmp_path / "w")
    writer = SummaryWriter(folder)
    walls = [1.7e9, float("nan"), 1.7e9 + 2, float("inf"), float("nan"), 1.7e9 + 5]
    for step, wall in enumerate(walls):
        writer.add_scalar("train/loss", float(step), step, walltime=wall, new_style=new_style)
    writer.close()
    (name,) = os.listdir(folder)
    result = read_event_file(os.path.join(folder, name))
    assert _steps(result) == list(range(6))  # kept, with their wall times as written
    (issue,) = result.issues
    loss = result.series[0]
    assert issue.kind == "bad_record" and issue.message.startswith("3 record(s)")
    assert issue.location.offset == int(loss.positions[1])
    assert math.isnan(loss.wall_times[1]) and loss.wall_times[3] == math.inf


def test_regression_time_budget_stops_reading_and_keeps_what_came_before(tmp_path,  # type: ignore[no-untyped-def]
                                                                         monkeypatch) -> None:
    data = _writer_bytes(tmp_path, "a", range(0, 500))
    monkeypatch.setattr(tfwindow, "WINDOW", 4096)
    result = read_event_file(_write(tmp_path, data), deadline=Deadline(0))
    first_window = [s for s in _spans(data) if s[1] <= 4096]
    assert result.records == len(first_window)
    assert _steps(result) == list(range(len(first_window) - 1))
    (issue,) = result.issues
    assert issue.kind == "read_limit" and issue.location.offset == first_window[-1][1]


# -- non-regular files ----------------------------------------------------------------------

def test_regression_fifo_named_tfevents_is_refused_by_its_type(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "events.out.tfevents.1.fifo")
    os.mkfifo(path)
    result = read_event_file(path)  # opening it would block until a writer came
    assert _kinds(result) == ["not_regular"] and "FIFO" in result.issues[0].message


def test_device_and_socket_named_tfevents_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    device = str(tmp_path / "events.out.tfevents.1.dev")
    os.symlink("/dev/zero", device)
    assert _kinds(read_event_file(device)) == ["not_regular"]
    sock_path = str(tmp_path / "events.out.tfevents.1.sock")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(sock_path)
        assert _kinds(read_event_file(sock_path)) == ["not_regular"]


# -- records too long to load, issue floods, windows ----------------------------------------

def _long_record_file(tmp_path) -> tuple[bytes, tuple[int, int]]:  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    folder = str(tmp_path / "long")
    writer = SummaryWriter(folder)
    writer.add_scalar("train/loss", 0.5, 0)
    writer.add_histogram("weights", np.arange(4000.0), 0, bins=1000)
    for step in range(1, 4):
        writer.add_scalar("train/loss", 0.5, step)
    writer.close()
    (name,) = os.listdir(folder)
    with open(os.path.join(folder, name), "rb") as fh:
        data = fh.read()
    return data, max(_spans(data), key=lambda s: s[1] - s[0])


@pytest.mark.parametrize("verify", [True, False])
def test_record_too_long_to_load_is_checked_and_skipped(tmp_path, monkeypatch, verify) -> None:  # type: ignore[no-untyped-def]
    data, (start, end) = _long_record_file(tmp_path)
    monkeypatch.setattr(tfrecord, "MAX_LOADED", 1024)
    monkeypatch.setattr(tfwindow, "WINDOW", 512)
    result = read_event_file(_write(tmp_path, data), verify=verify)
    assert _steps(result) == [0, 1, 2, 3] and result.histograms == ()
    (issue,) = result.issues
    assert issue.kind == "too_large" and issue.location.offset == start
    broken = bytearray(data)
    broken[start + 500] ^= 0xFF
    result = read_event_file(_write(tmp_path, bytes(broken), "broken.tfevents"), verify=verify)
    assert _steps(result) == [0, 1, 2, 3]
    if verify:  # checked piece by piece: the scan resumes after it
        assert _kinds(result) == ["bad_payload_crc"]
        assert f"at offset {end}" in result.issues[0].message
    else:  # lengths are trusted without verify
        assert _kinds(result) == ["too_large"]


def test_time_budget_also_stops_checking_a_record_too_long_to_load(tmp_path,  # type: ignore[no-untyped-def]
                                                                   monkeypatch) -> None:
    data, (start, _) = _long_record_file(tmp_path)
    monkeypatch.setattr(tfrecord, "MAX_LOADED", 1024)
    monkeypatch.setattr(tfwindow, "WINDOW", 512)
    result = read_event_file(_write(tmp_path, data), deadline=Deadline(0))
    assert _steps(result) == [0]
    (issue,) = result.issues
    assert issue.kind == "read_limit" and issue.location.offset == start


def test_many_issues_of_one_kind_are_summed_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    records = [bytearray(eventgen.scalar_record("loss", 1.0, i, 1.7e9)) for i in range(300)]
    for r in records[1::2]:  # every other record damaged, each followed by a valid one
        r[20] ^= 0xFF
    result = read_event_file(_write(tmp_path, b"".join(records)))
    assert _steps(result, "loss") == list(range(0, 300, 2))
    assert _kinds(result) == ["bad_payload_crc"] * (issuelog.MAX_LISTED + 1)
    assert result.issues[-1].message.startswith(f"{150 - issuelog.MAX_LISTED} more issues")


def _damaged_files(tmp_path) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    data, _ = _long_record_file(tmp_path)
    other = _writer_bytes(tmp_path, "o", range(10, 30))
    spans = _spans(data)
    return {
        "intact": data,
        "cut": data[:-7],
        "zero tail": data + b"\0" * 5000,
        "hole": data[:3000] + b"\0" * 3000 + data[3000:],
        "flip": data[:200] + bytes([data[200] ^ 0xFF]) + data[201:],
        "killed then appended": data[: spans[1][0] + 40] + other,
        "garbage inside": data[:100] + os.urandom(300) + data[100:],
        "text": b"not an event file\n" * 300,
    }


@pytest.mark.parametrize("window", [1, 13, 100, 1000])
def test_reading_by_small_windows_gives_what_one_window_gives(tmp_path, monkeypatch,  # type: ignore[no-untyped-def]
                                                              window) -> None:
    def summary(result):  # type: ignore[no-untyped-def]
        return (result.records, [(i.kind, i.location.offset, i.message) for i in result.issues],
                [(s.tag, s.steps.tolist(), s.positions.tolist()) for s in result.series],
                [(h.tag, h.positions.tolist()) for h in result.histograms])

    for name, data in _damaged_files(tmp_path).items():
        path = _write(tmp_path, data, "w.tfevents")
        for verify in (True, False):
            whole = summary(read_event_file(path, verify=verify))
            monkeypatch.setattr(tfwindow, "WINDOW", window)
            assert summary(read_event_file(path, verify=verify)) == whole, (name, verify)
            monkeypatch.undo()


def _signalling_nan_scalar() -> bytes:
    """A SummaryWriter-layout scalar record whose float is a signalling NaN."""
    event = event_pb2.Event(wall_time=1.7e9, step=3, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="train/loss", simple_value=0.0)]))
    payload = bytearray(event.SerializeToString())
    payload[-4:] = struct.pack("<I", 0x7F800001)
    return eventgen.frame(bytes(payload))


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("record", [
    _signalling_nan_scalar(),
    _tensor_record("train/loss", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_content=struct.pack("<I", 0x7F800001)), 3),
    _tensor_record("train/loss", tensor_pb2.TensorProto(dtype=types_pb2.DT_BFLOAT16,
                                                        half_val=[0x7F81]), 3),
], ids=["simple_value", "tensor_content", "bfloat16"])
def test_regression_signalling_nan_is_read_as_nan_without_a_warning(tmp_path, record) -> None:  # type: ignore[no-untyped-def]
    result = read_event_file(_write(tmp_path, eventgen.version_record(1.7e9) + record))
    assert result.issues == ()
    (loss,) = result.series
    assert loss.steps.tolist() == [3] and math.isnan(loss.values[0])


def _sparse(tmp_path, pieces, name: str = "events.out.tfevents.2.host") -> str:  # type: ignore[no-untyped-def]
    """A file of ``pieces``: bytes written, or ints, holes of that many bytes left unwritten."""
    path = str(tmp_path / name)
    with open(path, "wb") as fh:
        for piece in pieces:
            if isinstance(piece, int):
                fh.seek(piece, os.SEEK_CUR)
            else:
                fh.write(piece)
        fh.truncate()
    return path


def _has_holes(path: str) -> bool:
    info = os.stat(path)
    return hasattr(os, "SEEK_DATA") and info.st_blocks * 512 < info.st_size


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("window", [1 << 20, 4096 * 3 + 5])
def test_holes_are_filled_without_reading_them_and_read_the_same(tmp_path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                   verify, window) -> None:
    first = _writer_bytes(tmp_path, "a", range(0, 400))
    second = _writer_bytes(tmp_path, "b", range(400, 800))
    # a hole between records (a preallocated region), records, then a hole to the end
    path = _sparse(tmp_path, [first, 8 << 20, second, 16 << 20])
    if not _has_holes(path):
        pytest.skip("this file system allocates holes")
    monkeypatch.setattr(tfwindow, "WINDOW", window)
    read: list[int] = []
    real = tfwindow.RecordReader._read_plain

    def counting(self, view, at):  # type: ignore[no-untyped-def]
        n = real(self, view, at)
        read.append(n)
        return n

    monkeypatch.setattr(tfwindow.RecordReader, "_read_plain", counting)
    holes = read_event_file(path, verify=verify)
    bytes_read = sum(read)
    monkeypatch.setattr(tfwindow, "_sparse_fd", lambda handle, size: None)
    read.clear()
    plain = read_event_file(path, verify=verify)
    assert sum(read) == os.path.getsize(path)  # the plain reading reads the holes
    assert bytes_read < len(first) + len(second) + 3 * window  # this one does not
    assert _steps(holes) == _steps(plain) == list(range(800))
    assert [(i.kind, i.location.offset, i.message) for i in holes.issues] == \
        [(i.kind, i.location.offset, i.message) for i in plain.issues]
    assert _kinds(holes) == ["zero_run", "zero_tail"]


def test_a_sparse_file_shrinking_while_read_is_still_a_truncation(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = _writer_bytes(tmp_path, "a", range(0, 300))
    path = _sparse(tmp_path, [data, 4 << 20, data, 4 << 20])
    if not _has_holes(path):
        pytest.skip("this file system allocates holes")
    monkeypatch.setattr(tfwindow, "WINDOW", 1 << 20)
    real = tb.open_regular

    def opener(p: str):  # type: ignore[no-untyped-def]
        handle, size = real(p)
        os.truncate(p, len(data) + (1 << 20))  # cut inside the first hole, once opened
        return handle, size

    monkeypatch.setattr(tb, "open_regular", opener)
    result = read_event_file(path)
    assert _steps(result) == list(range(300))
    shrank = [i for i in result.issues if i.kind == "truncated"]
    assert len(shrank) == 1 and shrank[0].location.offset == len(data) + (1 << 20)
