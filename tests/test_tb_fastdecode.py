"""An oracle for the event reader's fast paths: files from the real writers (torch's
SummaryWriter with its file_version record and histograms, the same with
``add_scalar(new_style=True)`` tensor scalars, tensorboardX), whole, cut and flipped, read
with every fast path on and with them all off, whole and by small windows, with CRCs
verified or not: the series, histograms, events, issues and file version must be the same
word for word (values bit for bit).

With the fast paths off, every record goes through the protobuf decoder and every payload
CRC is checked record by record; the framing's prediction of record lengths is the
subject of tests/test_tfrecord_fastpath.py.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analyzer.ingest import tb, tfwalk, tfwindow
from analyzer.ingest.tb import EventFile, read_event_file

NAME = "events.out.tfevents.1700000000.fastdecode"


def _torch_file(folder: Path, *, new_style: bool = False, histograms: bool = False) -> bytes:
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(0)
    writer = SummaryWriter(str(folder))
    for step in range(400):
        loss = float("nan") if step == 300 else 1.0 / (step + 1)
        writer.add_scalar("train/loss", loss, step, new_style=new_style)
        writer.add_scalar("train/lr", 0.1, step, new_style=new_style)
        writer.add_scalar("grad_norm/layer1.weight", float(rng.random()), step,
                          new_style=new_style)
        writer.add_scalar("g", float("inf") if step == 310 else float(rng.random()), step,
                          new_style=new_style)
        if histograms and step % 10 == 0:
            writer.add_histogram("weights/fc1", rng.normal(size=256), step)
            writer.add_histogram("grads/fc1", rng.normal(size=32), step, bins=8)
    writer.close()
    return _only_file(folder)


def _tbx_file(folder: Path) -> bytes:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step in range(100, 700):
        writer.add_scalar("loss", 2.0 - step * 1e-3, step)
        writer.add_scalar("accuracy", 0.5, step)
    writer.close()
    return _only_file(folder)


def _only_file(folder: Path) -> bytes:
    (name,) = [n for n in os.listdir(folder) if "tfevents" in n]
    return (folder / name).read_bytes()


_WRITERS: dict[str, Any] = {
    "torch": _torch_file,
    "torch_new_style": lambda folder: _torch_file(folder, new_style=True),
    "torch_histograms": lambda folder: _torch_file(folder, histograms=True),
    "tensorboardX": _tbx_file,
}


@pytest.fixture(scope="module", params=list(_WRITERS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[str, bytes]:
    return request.param, _WRITERS[request.param](tmp_path_factory.mktemp(request.param))


@contextmanager
def plain() -> Iterator[None]:
    """Every fast path off: no fast layouts, no fast file_version, no run-wide CRC."""
    saved = tb._LAYOUTS, tb._version_of, tfwalk._run_ok
    tb._LAYOUTS = ()
    tb._version_of = lambda payload: None
    tfwalk._run_ok = lambda data, offsets, lengths: False
    try:
        yield
    finally:
        tb._LAYOUTS, tb._version_of, tfwalk._run_ok = saved


@contextmanager
def window(size: int | None) -> Iterator[None]:
    saved = tfwindow.WINDOW
    if size is not None:
        tfwindow.WINDOW = size
    try:
        yield
    finally:
        tfwindow.WINDOW = saved


def words(result: EventFile) -> list[Any]:
    """Everything a read gives, as comparable values (arrays by dtype and bytes)."""
    out: list[Any] = [result.records, result.file_version, repr(result.events),
                      [(i.kind, i.location.offset, i.message) for i in result.issues]]
    for s in result.series:
        out.append((s.tag, s.source, [(a.dtype.str, a.tobytes()) for a in
                                      (s.steps, s.values, s.wall_times, s.positions)]))
    for h in result.histograms:
        out.append((h.tag, [(a.dtype.str, a.tobytes()) for a in
                            (h.steps, h.wall_times, h.mins, h.maxs, h.sums, h.counts,
                             h.sum_squares, h.positions)]))
    return out


def check(path: Path, data: bytes, where: str) -> None:
    path.write_bytes(data)
    for verify in (True, False):
        with plain():
            expected = words(read_event_file(str(path), verify=verify))
        for size in (None, 4096 + 13):
            with window(size):
                got = words(read_event_file(str(path), verify=verify))
            assert got == expected, f"{where}, verify={verify}, window={size}"


def _records(data: bytes) -> list[tuple[int, int]]:
    out, pos = [], 0
    while pos + 12 <= len(data):
        n = int.from_bytes(data[pos: pos + 8], "little")
        out.append((pos, n))
        pos += 16 + n
    return out


def test_intact_files_read_the_same_and_fast(written: tuple[str, bytes], tmp_path: Path
                                             ) -> None:
    name, data = written
    check(tmp_path / NAME, data, name)
    result = read_event_file(str(tmp_path / NAME))
    assert result.file_version == "brain.Event:2" and not result.issues
    assert {s.tag for s in result.series} >= ({"loss", "accuracy"} if name == "tensorboardX"
                                              else {"train/loss", "g"})
    if name.startswith("torch"):
        loss = next(s for s in result.series if s.tag == "train/loss")
        assert np.isnan(loss.values[300]) and len(loss) == 400


def test_the_fast_paths_take_the_writers_records(written: tuple[str, bytes],
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: no scalar record of these writers, nor their file_version record, goes
    through the protobuf decoder."""
    _, data = written
    path = tmp_path / NAME
    path.write_bytes(data)
    slow: list[int] = []
    real = tb._decode_fast

    def counted(window: Any, points: Any) -> Any:
        left = real(window, points)
        slow.append(int(left.shape[0]))
        return left

    monkeypatch.setattr(tb, "_decode_fast", counted)
    result = read_event_file(str(path))
    histograms = sum(len(h) for h in result.histograms)
    assert sum(slow) == 1 + histograms  # the version record is read before _decode_fast


def test_cuts_and_flips_read_the_same(written: tuple[str, bytes], tmp_path: Path) -> None:
    """Cut at and inside records, bytes flipped in lengths, CRCs, wall times, steps, tags,
    values and the plugin name; two equal flips at the same place of two records of one
    length (which would cancel in an XOR of the records)."""
    name, data = written
    records = _records(data)
    rng = random.Random(7)
    picks = [0, 1, *rng.sample(range(2, len(records)), 4)]
    for k, i in enumerate(picks):
        off, n = records[i]
        spots = (0, 9, 13, 12 + n // 2, 12 + n - 1, 15 + n)
        for at in spots[k % 2::2]:
            flipped = bytearray(data)
            flipped[off + at] ^= 0x20
            check(tmp_path / NAME, bytes(flipped), f"{name}: flip at {off + at}")
        check(tmp_path / NAME, data[: off + 12 + n // 2], f"{name}: cut at {off}")
    same = [i for i in range(5, len(records) - 40) if records[i][1] == records[i + 4][1]]
    for i in rng.sample(same, 1):
        (a, n), (b, _) = records[i], records[i + 4]
        flipped = bytearray(data)
        flipped[a + 12 + n // 2] ^= 0x01
        flipped[b + 12 + n // 2] ^= 0x01
        check(tmp_path / NAME, bytes(flipped), f"{name}: equal flips at {a} and {b}")
        result = read_event_file(str(tmp_path / NAME))
        assert [i.kind for i in result.issues] == ["bad_payload_crc", "bad_payload_crc"]


def test_runs_of_records_fail_where_one_record_fails(written: tuple[str, bytes]) -> None:
    """The run-wide CRC check against the record-by-record one, on runs with one bad byte
    anywhere (including a CRC field and a record too long for the run's table)."""
    name, data = written
    records = _records(data)
    offsets = np.array([o for o, _ in records], dtype=np.int64)
    lengths = np.array([n for _, n in records], dtype=np.int64)
    arr = np.frombuffer(data, dtype=np.uint8)
    assert tfwalk.payloads_ok(arr, offsets, lengths).all()
    rng = random.Random(3)
    for at in rng.sample(range(len(data)), 20):
        flipped = arr.copy()
        flipped[at] ^= 0x80
        hit = int(np.searchsorted(offsets, at, side="right")) - 1
        if at < offsets[hit] + 12:
            continue  # a header: the run check is of payloads
        ok = tfwalk.payloads_ok(flipped, offsets, lengths)
        assert ok.tolist() == tfwalk._each_ok(flipped, offsets, lengths).tolist()
        assert not ok[hit] and ok.sum() == len(records) - 1, f"{name}: byte {at}"


def test_a_record_of_megabytes_is_checked_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run check copies its bytes: a piece holding a record of megabytes is checked
    record by record instead (no copy of it), with the same answers."""
    import struct

    import google_crc32c

    def masked(data: bytes) -> bytes:
        crc = google_crc32c.value(data)
        return struct.pack("<I", ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8)
                           & 0xFFFFFFFF)

    def framed(payload: bytes) -> bytes:
        head = struct.pack("<Q", len(payload))
        return head + masked(head) + payload + masked(payload)

    rng = np.random.default_rng(5)
    payloads = [rng.bytes(40) for _ in range(30)] + [rng.bytes(3 << 20)] + [
        rng.bytes(40) for _ in range(30)]
    data = b"".join(framed(p) for p in payloads)
    offsets = np.cumsum([0] + [16 + len(p) for p in payloads[:-1]]).astype(np.int64)
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    copied: list[int] = []
    real = tfwalk._run_ok

    def run_ok(data: Any, offs: Any, lens: Any) -> bool:
        copied.append(int(offs[-1] + 16 + lens[-1] - offs[0]))
        return real(data, offs, lens)

    monkeypatch.setattr(tfwalk, "_run_ok", run_ok)
    arr = np.frombuffer(data, dtype=np.uint8)
    assert tfwalk.payloads_ok(arr, offsets, lengths).all()
    assert copied and max(copied) <= 2 * tfwalk._RUN_BYTES
    flipped = arr.copy()
    flipped[int(offsets[30]) + 12 + (1 << 20)] ^= 1
    assert np.flatnonzero(~tfwalk.payloads_ok(flipped, offsets, lengths)).tolist() == [30]
