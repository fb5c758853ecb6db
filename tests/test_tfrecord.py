"""Damage to event files: every case gives a typed issue and keeps what could be read."""

from __future__ import annotations

import os
import struct

import eventgen
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest.tb import read_event_file
from analyzer.ingest.tfrecord import frame


def _records(n: int = 6) -> list[bytes]:
    out = [eventgen.version_record(1.7e9)]
    out += [eventgen.scalar_record("train/loss", float(i), i, 1.7e9 + i) for i in range(n)]
    return out


def _write(tmp_path, data: bytes, name: str = "events.out.tfevents.1.host") -> str:  # type: ignore[no-untyped-def]
    path = os.path.join(str(tmp_path), name)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _steps(result) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(x) for s in result.series for x in s.steps]


def _kinds(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [i.kind for i in result.issues]


def test_intact_file_has_no_issue(tmp_path):  # type: ignore[no-untyped-def]
    result = read_event_file(_write(tmp_path, b"".join(_records())))
    assert result.issues == () and _steps(result) == list(range(6))


def test_empty_file(tmp_path):  # type: ignore[no-untyped-def]
    result = read_event_file(_write(tmp_path, b""))
    assert _kinds(result) == ["empty_file"]


def test_truncated_last_record_keeps_prefix(tmp_path):  # type: ignore[no-untyped-def]
    data = b"".join(_records())
    result = read_event_file(_write(tmp_path, data[:-5]))
    assert _kinds(result) == ["truncated"]
    assert _steps(result) == list(range(5))
    last = sum(len(r) for r in _records()[:-1])
    assert result.issues[0].location.offset == last


def test_bad_length_crc_in_the_middle_resynchronises(tmp_path):  # type: ignore[no-untyped-def]
    recs = _records()
    broken = bytearray(recs[3])
    broken[9] ^= 0xFF  # the stored length CRC
    data = b"".join(recs[:3]) + bytes(broken) + b"".join(recs[4:])
    result = read_event_file(_write(tmp_path, data))
    assert _kinds(result) == ["bad_length_crc"]
    assert result.issues[0].location.offset == sum(len(r) for r in recs[:3])
    assert _steps(result) == [0, 1, 3, 4, 5]


def test_corrupt_length_field_resynchronises(tmp_path):  # type: ignore[no-untyped-def]
    recs = _records()
    broken = bytearray(recs[2])
    broken[0:8] = struct.pack("<Q", 3)  # a length that lands inside the next record
    data = b"".join(recs[:2]) + bytes(broken) + b"".join(recs[3:])
    result = read_event_file(_write(tmp_path, data))
    assert _kinds(result) == ["bad_length_crc"]
    assert _steps(result) == [0, 2, 3, 4, 5]


def test_bad_payload_crc_skips_one_record(tmp_path):  # type: ignore[no-untyped-def]
    recs = _records()
    broken = bytearray(recs[2])
    broken[20] ^= 0x01  # inside the payload
    data = b"".join(recs[:2]) + bytes(broken) + b"".join(recs[3:])
    result = read_event_file(_write(tmp_path, data))
    assert _kinds(result) == ["bad_payload_crc"]
    assert _steps(result) == [0, 2, 3, 4, 5]


def test_bad_payload_crc_unnoticed_without_verification(tmp_path):  # type: ignore[no-untyped-def]
    recs = _records()
    broken = bytearray(recs[2])
    broken[-1] ^= 0x01  # the stored payload CRC only
    data = b"".join(recs[:2]) + bytes(broken) + b"".join(recs[3:])
    result = read_event_file(_write(tmp_path, data), verify=False)
    assert result.issues == () and _steps(result) == list(range(6))


@pytest.mark.parametrize("with_crc", [True, False])
def test_absurd_length_allocates_nothing(tmp_path, with_crc):  # type: ignore[no-untyped-def]
    header = struct.pack("<Q", 2**62)
    crc = eventgen._masked(header) if with_crc else b"\0\0\0\0"
    data = b"".join(_records(3)) + header + crc + b"x" * 40
    result = read_event_file(_write(tmp_path, data))
    assert _kinds(result) == ["absurd_length" if with_crc else "bad_length_crc"]
    assert _steps(result) == [0, 1, 2]


def test_payload_that_is_not_an_event(tmp_path):  # type: ignore[no-untyped-def]
    garbage = eventgen.frame(b"\xff\xff\xff\xff\xff")  # valid framing, invalid protobuf
    data = b"".join(_records(2)) + garbage + eventgen.scalar_record("train/loss", 9.0, 2, 1.0)
    result = read_event_file(_write(tmp_path, data))
    assert _kinds(result) == ["not_an_event"]
    assert _steps(result) == [0, 1, 2]


def test_zero_filled_tail(tmp_path):  # type: ignore[no-untyped-def]
    data = b"".join(_records(3)) + b"\0" * 4096
    result = read_event_file(_write(tmp_path, data))
    assert _kinds(result) == ["zero_tail"]
    assert _steps(result) == [0, 1, 2]


def test_non_event_file_named_tfevents(tmp_path):  # type: ignore[no-untyped-def]
    text = b"this is a log file that someone named events.out.tfevents\n" * 50
    result = read_event_file(_write(tmp_path, text))
    assert _kinds(result) == ["not_event_file"]
    assert result.series == ()


def test_unreadable_path_is_an_issue(tmp_path):  # type: ignore[no-untyped-def]
    result = read_event_file(str(tmp_path))  # a folder, not a file
    assert _kinds(result) == ["unreadable"]


def _small_records() -> list[bytes]:
    recs = [eventgen.version_record(1.7e9)]
    for i in range(4):
        recs.append(eventgen.scalar_record("loss", float(i), i, 1.7e9 + i))
        recs.append(eventgen.scalar_record("grad_norm/fc.weight", float(i), i, 1.7e9 + i))
    return recs


def _small_file() -> bytes:
    return b"".join(_small_records())


def test_cut_at_every_offset_yields_the_exact_prefix(tmp_path):  # type: ignore[no-untyped-def]
    recs = _small_records()
    data = b"".join(recs)
    ends = np.cumsum([len(r) for r in recs])
    for cut in range(len(data) + 1):
        result = read_event_file(_write(tmp_path, data[:cut], "cut.tfevents"))
        whole = int((ends <= cut).sum())  # records wholly inside the cut
        assert result.records == whole, cut
        assert sum(len(s) for s in result.series) == max(whole - 1, 0)
        at_boundary = cut == 0 or cut in ends
        assert bool(result.issues) != at_boundary or cut == 0, cut
        if not at_boundary:
            assert _kinds(result) == ["truncated"], (cut, _kinds(result))


def test_flip_any_byte_never_raises(tmp_path):  # type: ignore[no-untyped-def]
    data = _small_file()
    for pos in range(len(data)):
        broken = bytearray(data)
        broken[pos] ^= 0x5A
        result = read_event_file(_write(tmp_path, bytes(broken), "flip.tfevents"))
        if pos >= 12:  # outside the first header, most records must survive
            assert sum(len(s) for s in result.series) >= 6


def test_appending_the_cut_byte_restores_the_file(tmp_path):  # type: ignore[no-untyped-def]
    data = _small_file()
    path = _write(tmp_path, data[:-1], "grow.tfevents")
    assert _kinds(read_event_file(path)) == ["truncated"]
    with open(path, "ab") as fh:
        fh.write(data[-1:])
    assert read_event_file(path).issues == ()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_never_raise(data: bytes) -> None:
    arr = np.frombuffer(data, dtype=np.uint8)
    framing = frame(arr, "x")
    assert framing.offsets.shape == framing.lengths.shape
    assert all(i.location.file == "x" for i in framing.issues)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_garbage_between_records_is_skipped(data) -> None:  # type: ignore[no-untyped-def]
    recs = _records(4)
    junk = data.draw(st.binary(min_size=1, max_size=64))
    where = data.draw(st.integers(min_value=1, max_value=len(recs) - 1))
    blob = b"".join(recs[:where]) + junk + b"".join(recs[where:])
    framing = frame(np.frombuffer(blob, dtype=np.uint8), "x")
    # Every record before the junk is kept, and so is the last record after it.
    assert framing.offsets.shape[0] >= where
    assert int(framing.offsets[-1]) == len(blob) - len(recs[-1])
