"""An oracle for the framing's fast path (``tfwalk._predict``, taken once a recent stretch of
record lengths repeats with a period, and again after each one-off record): files of
thousands of records from the real writers, cut and flipped, framed with the prediction and
with it turned off, and compared with a plain record-by-record reader written here.

The plain reader knows the intact file's records; after damage the framing must keep
exactly the records the damage did not touch (CRCs verified, a single flipped byte always
fails its CRC) and report one issue per damaged stretch at its first record. Without the
prediction the module walks record by record: both ways must give the same offsets,
lengths and issues, word for word, with CRCs verified or not, and whatever the windows.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest import tfwalk
from analyzer.ingest.safeio import Deadline
from analyzer.ingest.tfrecord import Framer, frame
from analyzer.ingest.tfwindow import RecordReader
from tests.fuzz.budget import fuzz_settings

NAME = "events.out.tfevents.1700000000.fastpath"


def _masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def plain_records(data: bytes) -> list[tuple[int, int]]:
    """(offset, payload length) of each record, one after the other: u64 length, masked
    CRC32C of the length, payload, masked CRC32C of the payload; stops at the first
    record that is cut or fails a CRC."""
    out = []
    pos = 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        end = pos + 16 + n
        if end > len(data) or struct.unpack_from("<I", data, pos + 8)[0] != _masked(
                data[pos: pos + 8]):
            break
        if struct.unpack_from("<I", data, end - 4)[0] != _masked(data[pos + 12: end - 4]):
            break
        out.append((pos, n))
        pos = end
    return out


@dataclass(frozen=True)
class EventData:
    """An intact file from a real writer and its records by the plain reader."""

    name: str
    data: bytes
    records: list[tuple[int, int]]


def _torch_file(folder: Path) -> bytes:
    """torch's SummaryWriter: three scalars a step, steps past 127 (a varint one byte
    longer: every length changes), two histograms (records of their own length) and a NaN
    at the end."""
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(0)
    writer = SummaryWriter(str(folder))
    for step in range(1000):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        writer.add_scalar("train/lr", 0.1, step)
        writer.add_scalar("train/grad_norm", float(rng.random()), step)
        if step % 500 == 0:
            writer.add_histogram("weights/fc1", rng.normal(size=64), step, bins=8)
    writer.add_scalar("train/loss", float("nan"), 1000)
    writer.close()
    return _only_file(folder)


def _tbx_file(folder: Path) -> bytes:
    """tensorboardX: two scalars a step across step 16384 (a third varint byte)."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step in range(15800, 17300):
        writer.add_scalar("loss", 2.0 - step * 1e-4, step)
        writer.add_scalar("accuracy", 0.5, step)
    writer.close()
    return _only_file(folder)


def _histogram_file(folder: Path) -> bytes:
    """torch's SummaryWriter logging histograms among its scalars every 10 steps, as
    training loops do: records of lengths of their own (one-offs) break every cycle of
    scalar lengths; one histogram is long (TensorBoard's default bins), one short."""
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(1)
    writer = SummaryWriter(str(folder))
    for step in range(950):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        writer.add_scalar("train/lr", 0.1, step)
        writer.add_scalar("train/grad_norm", float(rng.random()), step)
        if step % 10 == 0:
            writer.add_histogram("weights/fc1", rng.normal(size=512), step)
            writer.add_histogram("grads/fc1", rng.normal(size=64), step, bins=8)
    writer.close()
    return _only_file(folder)


def _only_file(folder: Path) -> bytes:
    (name,) = [n for n in os.listdir(folder) if "tfevents" in n]
    return (folder / name).read_bytes()


_WRITERS = {"torch": _torch_file, "tensorboardX": _tbx_file, "histograms": _histogram_file}


@pytest.fixture(scope="module", params=list(_WRITERS))
def events(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> EventData:
    folder = tmp_path_factory.mktemp(request.param)
    data = _WRITERS[request.param](folder)
    records = plain_records(data)
    last_off, last_n = records[-1]
    assert last_off + 16 + last_n == len(data), "the plain reader did not reach the end"
    assert len(records) > 2900
    return EventData(request.param, data, records)


class Predictions:
    """Counts the calls of ``tfwalk._predict`` and the records they accepted."""

    def __init__(self) -> None:
        self.calls = 0
        self.records = 0
        self._predict = tfwalk._predict

    def __call__(self, *args: Any) -> tuple[int, Any]:
        self.calls += 1
        pos, accepted = self._predict(*args)
        self.records += int(accepted.shape[0])
        return pos, accepted


@pytest.fixture
def predictions(monkeypatch: pytest.MonkeyPatch) -> Predictions:
    counter = Predictions()
    monkeypatch.setattr(tfwalk, "_predict", counter)
    return counter


@contextmanager
def no_prediction() -> Iterator[None]:
    """The module's own plain walk: no period is ever found, so nothing is predicted."""
    period = tfwalk._period
    tfwalk._period = lambda lengths: None
    try:
        yield
    finally:
        tfwalk._period = period


Result = tuple[list[int], list[int], list[tuple[str, int | None, str]]]


def framed(data: bytes, *, verify: bool = True) -> Result:
    out = frame(np.frombuffer(data, dtype=np.uint8), NAME, verify=verify)
    return (out.offsets.tolist(), out.lengths.tolist(),
            [(i.kind, i.location.offset, i.message) for i in out.issues])


def by_windows(path: Path, window: int, *, verify: bool = True) -> Result:
    """The records and issues as read_event_file frames them, window by window."""
    size = path.stat().st_size
    framer = Framer(NAME, size, verify=verify)
    offsets: list[int] = []
    lengths: list[int] = []
    with open(path, "rb") as handle:
        for w in RecordReader(handle, size, framer, Deadline(), window=window):
            offsets += (w.offsets + w.base).tolist()
            lengths += w.lengths.tolist()
    return offsets, lengths, [(i.kind, i.location.offset, i.message) for i in framer.finish()]


def damaged(data: bytes, flips: list[int], cut: int) -> bytes:
    out = bytearray(data[:cut])
    for at in flips:
        if at < cut:
            out[at] ^= 0x5A
    return bytes(out)


def expected(records: list[tuple[int, int]], flips: list[int], cut: int
             ) -> tuple[list[int], list[tuple[str, int]]]:
    """What the plain reader says a verified framing keeps, and the issue of each damaged
    stretch (a run of records that are flipped or cut): at its first record, bad_length_crc
    for a flipped header, truncated for a record the cut runs through, else
    bad_payload_crc."""
    kept: list[int] = []
    issues: list[tuple[str, int]] = []
    in_damage = False
    for off, n in records:
        end = off + 16 + n
        if off >= cut:
            break
        hit = [f for f in flips if off <= f < min(end, cut)]
        if not hit and end <= cut:
            kept.append(off)
            in_damage = False
            continue
        if not in_damage:
            kind = ("bad_length_crc" if any(f < off + 12 for f in hit)
                    else "truncated" if end > cut else "bad_payload_crc")
            issues.append((kind, off))
        in_damage = True
    return kept, issues


def check(events: EventData, flips: list[int], cut: int, *, every_way: bool = False,
          tmp_path: Path | None = None) -> None:
    """The framing of the damaged file, with the prediction and without, against the plain
    reader; ``every_way`` also without CRCs verified (fast against slow only) and, given a
    folder, by windows that end anywhere in a record."""
    data = damaged(events.data, flips, cut)
    fast = framed(data)
    with no_prediction():
        slow = framed(data)
        slow_unverified = framed(data, verify=False) if every_way else None
    where = f"{events.name}: flips {flips}, cut {cut}"
    assert fast == slow, f"the fast path differs from the plain walk ({where})"
    kept, issues = expected(events.records, flips, cut)
    assert fast[0] == kept, where
    keep = set(kept)
    assert fast[1] == [n for off, n in events.records if off in keep], where
    assert [(kind, off) for kind, off, _ in fast[2]] == issues, where
    if every_way:
        assert framed(data, verify=False) == slow_unverified, where
    if tmp_path is not None:
        path = tmp_path / NAME
        path.write_bytes(data)
        for window in (4096 + 13, 65536 - 7):
            assert by_windows(path, window) == fast, f"window {window}, {where}"


def test_intact_files_are_mostly_predicted(events: EventData, predictions: Predictions,
                                           tmp_path: Path) -> None:
    offsets, lengths, issues = framed(events.data)
    assert list(zip(offsets, lengths, strict=True)) == events.records and issues == []
    assert predictions.calls >= 1 and predictions.records >= 800
    check(events, [], len(events.data), every_way=True, tmp_path=tmp_path)
    with no_prediction():
        calls = predictions.calls
        assert framed(events.data)[0] == offsets
        assert predictions.calls == calls


def _points(events: EventData, count: int, seed: int) -> Iterator[tuple[int, int]]:
    """Records spread over the file, past the first two (which no prediction covers),
    with more of them where a record's length differs from the one before (where the
    period breaks): (offset, payload length)."""
    records = events.records
    changes = [i for i in range(3, len(records)) if records[i][1] != records[i - 1][1]]
    rng = random.Random(seed)
    picks = rng.sample(range(2, len(records)), count // 2) + rng.sample(changes, min(
        count - count // 2, len(changes)))
    for i in sorted(picks):
        yield records[i]


def test_cuts_everywhere_in_a_record(events: EventData, predictions: Predictions) -> None:
    """Cut at each part of a record: at its start, inside the length, inside the length
    CRC, at the payload's start and middle, before its last byte; and the file's last byte."""
    for off, n in _points(events, 10, seed=1):
        for at in (0, 1, 11, 12, 12 + n // 2, 15 + n):
            check(events, [], off + at)
    check(events, [], len(events.data) - 1)
    assert predictions.calls > 0


def test_flips_everywhere_in_a_record(events: EventData, predictions: Predictions) -> None:
    """One byte flipped in the length, the length CRC, the payload or the payload CRC; and
    one in the length with the file cut 40 bytes after the record."""
    for off, n in _points(events, 10, seed=2):
        for at in (0, 8, 12, 12 + n // 2, 12 + n, 15 + n):
            check(events, [off + at], len(events.data))
        check(events, [off + 5], min(len(events.data), off + 16 + n + 40))
    assert predictions.calls > 0


def test_flips_in_neighbouring_records(events: EventData, predictions: Predictions) -> None:
    """Damage to two records in a row is one stretch; to records a period apart, two."""
    records = events.records
    for i in (40, 700, len(records) // 2, len(records) - 40):
        (a, _), (b, _), (c, _) = records[i], records[i + 1], records[i + 4]
        check(events, [a + 2, b + 14], len(events.data))
        check(events, [a + 14, c + 2], len(events.data))
    assert predictions.calls > 0


def test_damage_at_every_record_of_a_predicted_stretch(events: EventData,
                                                      predictions: Predictions) -> None:
    """The prediction checks blocks of records that grow (16 cycles, then 64, ...) from
    where a walk starts: a wrong length must be caught wherever it falls in a block, its
    last record included (a wrong length the block does not check is caught by the header
    CRC when CRCs are verified, so the walk without them is compared too). A wrong length
    in record 2 makes the walk start again at record 3 (a bad payload would not: the walk
    from 0 goes on past it and is reused), so the blocks begin a few records later, once a
    suffix of 8 or more records shows the period; then the length of each record from 36 on
    is damaged in turn (and the file cut right after the start of every fifth)."""
    records = events.records
    end = records[300][0]
    first = records[2][0]
    for k, (off, _) in enumerate(records[36:300]):
        check(events, [first, off], end, every_way=True)
        if k % 5 == 0:
            check(events, [first], off + 1)
    assert predictions.calls > 200


@fuzz_settings(ci_examples=30)
@given(data=st.data())
def test_random_flips_and_cut_agree(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory,
                                    events: EventData) -> None:
    """Any few bytes flipped past the first records, and any cut after them."""
    start = events.records[2][0]
    size = len(events.data)
    flips = sorted(set(data.draw(st.lists(st.integers(start, size - 1), max_size=4))))
    cut = data.draw(st.integers(start, size) | st.just(size))
    check(events, flips, cut, every_way=True, tmp_path=tmp_path_factory.mktemp("fuzz"))


def test_the_oracle_itself_sees_damage(events: EventData) -> None:
    """The plain reader and the expectation are not vacuous: a flip costs the record it hit."""
    off, _ = events.records[100]
    data = damaged(events.data, [off + 12], len(events.data))
    assert plain_records(data) == events.records[:100]
    kept, issues = expected(events.records, [off + 12], len(events.data))
    assert off not in kept and len(kept) == len(events.records) - 1
    assert issues == [("bad_payload_crc", off)]


def test_regression_one_off_records_do_not_stop_prediction(tmp_path: Path,
                                                          predictions: Predictions) -> None:
    """Histograms every 10 steps among three scalars a step (and the file_version record at
    the head) put a record of another length into every 32 records: a period looked for
    over the whole history never showed, and the walk went record by record through the
    whole file. Found in recent suffixes and picked up again after each one-off, most
    records are predicted; the framing is the plain walk's all the same."""
    data = _histogram_file(tmp_path)
    offsets, lengths, issues = framed(data)
    assert list(zip(offsets, lengths, strict=True)) == plain_records(data) and issues == []
    assert predictions.records >= 0.7 * len(offsets)
    with no_prediction():
        assert framed(data) == (offsets, lengths, issues)
