"""The ingest benchmark's parts: the real writers' files, eventgen's copies of their layouts,
and the rustboard harness (started, complete, stopped). Nothing here is timed."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile

import eventgen
import pytest
import realwriters
import rustboard

from analyzer.ingest.tb import read_event_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"steps": 60, "tags": 3, "hist_every": 20, "hist_size": 64}


def _real(tmp_path, kind: str) -> tuple[realwriters.Spec, str]:  # type: ignore[no-untyped-def]
    spec = realwriters.Spec(kind=kind, **SMALL)  # type: ignore[arg-type]
    return spec, realwriters.write(spec, str(tmp_path / "real" / kind))


def _accumulated(folder: str) -> dict[str, list[str]]:
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(folder, size_guidance={k: 0 for k in ea.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    tags: dict[str, list[str]] = acc.Tags()
    return tags


@pytest.mark.parametrize("kind", realwriters.KINDS)
def test_eventgen_writes_each_real_writers_records(tmp_path, kind):  # type: ignore[no-untyped-def]
    spec, real = _real(tmp_path, kind)
    fast = tmp_path / "fast" / kind / "events.out.tfevents.1700000000.host"
    fast.parent.mkdir(parents=True)
    size = eventgen.write_spec(str(fast), spec)
    assert size == fast.stat().st_size
    with open(real, "rb") as fh:
        assert realwriters.same_bytes(fh.read(), fast.read_bytes()) is None
    # TensorBoard's own reader finds every tag in both, where TensorBoard files them
    where = "tensors" if kind == "tensor_scalars" else "scalars"
    for folder in (os.path.dirname(real), str(fast.parent)):
        tags = _accumulated(folder)
        assert sorted(tags[where]) == sorted(spec.tag_names())
        assert sorted(tags["histograms"]) == (
            sorted(realwriters.HIST_TAGS) if kind == "histograms" else [])
    result = read_event_file(str(fast))
    assert result.issues == ()
    assert sorted(s.tag for s in result.series) == sorted(spec.tag_names())
    loss = next(s for s in result.series if s.tag == "train/loss")
    assert len(loss.values) == spec.steps and int(loss.steps[spec.nan_step]) == spec.nan_step


def test_histogram_records_vary_in_length(tmp_path):  # type: ignore[no-untyped-def]
    _, real = _real(tmp_path, "histograms")
    with open(real, "rb") as fh:
        lengths = {len(r) for r in realwriters.records(fh.read())}
    assert len(lengths) > 4  # scalars of one length per tag, then histograms of several


def test_same_bytes_finds_a_changed_record(tmp_path):  # type: ignore[no-untyped-def]
    spec, real = _real(tmp_path, "scalars")
    with open(real, "rb") as fh:
        data = fh.read()
    fast = tmp_path / "fast"
    eventgen.write_spec(str(fast), spec)
    mine = bytearray(fast.read_bytes())
    assert realwriters.same_bytes(data, bytes(mine)) is None
    mine[-6] ^= 1  # the last record's payload
    assert "differs" in (realwriters.same_bytes(data, bytes(mine)) or "")
    assert "not whole records" in (realwriters.same_bytes(data, bytes(mine[:-30])) or "")
    assert "records against" in (realwriters.same_bytes(data, data[:-len(
        realwriters.records(data)[-1])]) or "")


@pytest.mark.parametrize("step", [0, 1, 127, 128, 16_383, 16_384, 2**21, 2**40])
@pytest.mark.parametrize("value", [0.0, -1.5, 3.25e-8, float("nan"), float("inf")])
def test_spliced_scalar_records_are_protobufs(step, value):  # type: ignore[no-untyped-def]
    for record in (eventgen.scalar_record, eventgen.tensor_scalar_record):
        spliced = eventgen._Spliced(record, "grad_norm/layer7.weight")
        prefix = eventgen._Spliced.prefix(step, 1.7e9 + step / 100)
        assert spliced.record(prefix, value) == record(
            "grad_norm/layer7.weight", value, step, 1.7e9 + step / 100)


def test_ensure_caches_the_real_writers_file(tmp_path):  # type: ignore[no-untyped-def]
    spec = realwriters.Spec(kind="tensorboardx", steps=20, tags=2)
    path = realwriters.ensure(spec, root=str(tmp_path))
    stamp = os.stat(path).st_mtime_ns
    assert realwriters.ensure(spec, root=str(tmp_path)) == path
    assert os.stat(path).st_mtime_ns == stamp
    assert os.listdir(tmp_path) == [spec.key()]  # no staging folder left
    assert read_event_file(path).records == 1 + 20 * 2


def _server_or_skip(logdir: str) -> rustboard.Server:
    try:
        rustboard.binary()
    except rustboard.Unavailable as exc:
        pytest.skip(str(exc))
    return rustboard.Server(logdir)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


def test_rustboard_sees_every_tag_complete_then_stops(tmp_path):  # type: ignore[no-untyped-def]
    spec = realwriters.Spec(kind="scalars", steps=200, tags=4)
    (tmp_path / "run").mkdir()
    eventgen.write_spec(str(tmp_path / "run" / "events.out.tfevents.1.host"), spec)
    server = _server_or_skip(str(tmp_path))
    try:
        server.start()
    except rustboard.Unavailable as exc:
        pytest.skip(f"rustboard cannot run here: {exc}")
    with server:
        assert server.proc is not None
        pid = server.proc.pid
        server.wait_complete(dict.fromkeys(spec.tag_names(), 199), timeout=60)
        assert server.list_scalars() == {f"run/{t}": 199 for t in spec.tag_names()}
        _, points, nonfinite = server.read_scalars()
        assert points == {f"run/{t}": 200 for t in spec.tag_names()} and nonfinite == 1
        assert server.peak_rss() > 0
    assert not _alive(pid)


def test_rustboard_times_out_and_stops(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "run").mkdir()
    eventgen.write_run(str(tmp_path / "run" / "events.out.tfevents.1.host"), steps=5, tags=1)
    server = _server_or_skip(str(tmp_path))
    try:
        server.start()
    except rustboard.Unavailable as exc:
        pytest.skip(f"rustboard cannot run here: {exc}")
    assert server.proc is not None
    pid = server.proc.pid
    with server, pytest.raises(TimeoutError):
        server.wait_complete({"train/loss": 10**6}, timeout=1.0)
    assert not _alive(pid)


def test_measure_counts_what_rustboard_read(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "run").mkdir()
    eventgen.write_run(str(tmp_path / "run" / "events.out.tfevents.1.host"), steps=50, tags=2,
                       nan_step=7)
    try:
        rustboard.binary()
    except rustboard.Unavailable as exc:
        pytest.skip(str(exc))
    names = realwriters.Spec(tags=2).tag_names()
    result = rustboard.measure(str(tmp_path), dict.fromkeys(names, 49), timeout=60)
    assert result.points == {f"run/{t}": 50 for t in names} and result.nonfinite == 1
    assert result.ingest_s > 0 and result.read_s > 0 and result.peak_rss > 0


def test_the_benchmark_runs_small_and_leaves_nothing_running(tmp_path):  # type: ignore[no-untyped-def]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "ingest.py"), "--steps", "300",
         "--check-steps", "100", "--repeat", "1", "--only", "scalars"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "its records equal to the real writer's on 100 steps" in out
    assert "Done when" in out and "scalars" in out.split("Done when")[1]
    try:
        rustboard.binary()
        assert "same points" in out
    except rustboard.Unavailable:
        pass
    assert [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, str(tmp_path))] == []
    assert [n for n in os.listdir(tmp_path) if n.startswith("forensics-")] == []


def test_a_huge_length_header_is_framed_as_the_benchmark_writes_it(tmp_path):  # type: ignore[no-untyped-def]
    # the hostile file's last header must pass its CRC, so the reader sees the claimed length
    header = struct.pack("<Q", 1 << 60)
    path = tmp_path / "events.out.tfevents.1.host"
    eventgen.write_run(str(path), steps=3, tags=1)
    with open(path, "ab") as fh:
        fh.write(header + eventgen._masked(header) + b"\x5a" * 64)
    assert [i.kind for i in read_event_file(str(path)).issues] == ["absurd_length"]


def test_a_server_that_writes_no_port_is_stopped(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    fake = tmp_path / "server"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(rustboard, "binary", lambda: str(fake))
    server = rustboard.Server(str(tmp_path), start_timeout=0.5)
    before = _port_folders()
    with pytest.raises(TimeoutError):
        server.start()
    assert server.proc is None and server._tmp is None and _port_folders() == before
    assert [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, str(fake))] == []


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return text.encode() in fh.read()
    except OSError:
        return False


def test_a_binary_that_cannot_run_is_unavailable(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    fake = tmp_path / "server"
    fake.write_bytes(b"\x7fELF not a program for this machine")
    fake.chmod(0o755)
    monkeypatch.setattr(rustboard, "binary", lambda: str(fake))
    server = rustboard.Server(str(tmp_path))
    before = _port_folders()
    with pytest.raises(rustboard.Unavailable):
        server.start()
    assert server.proc is None and server._tmp is None and _port_folders() == before


def test_a_server_that_cannot_start_leaves_no_folder(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    def missing() -> str:
        raise rustboard.Unavailable("tensorboard_data_server is not installed")

    monkeypatch.setattr(rustboard, "binary", missing)
    before = _port_folders()
    with pytest.raises(rustboard.Unavailable), rustboard.Server(str(tmp_path)):
        pass
    assert _port_folders() == before


def _port_folders() -> set[str]:
    """The servers' port-file folders in the temporary folder."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("forensics-rustboard-")}
