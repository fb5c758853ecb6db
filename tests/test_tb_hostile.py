"""Event files built to make the reader work: the check budget and the time budget after
damage.

Records come from torch's SummaryWriter; the hostile parts are TFRecord headers whose CRCs
check, each claiming a payload that runs (nearly) to the end of the file, so that checking
every one costs the rest of the file. The work is measured in bytes hashed, counted by
wrapping the CRC routines, never in seconds.
"""

from __future__ import annotations

import os
import struct

import pytest

from analyzer.ingest import crc32c, tfrecord, tfsearch, tfwalk, tfwindow
from analyzer.ingest.crc32c import masked_crc32c
from analyzer.ingest.safeio import Deadline
from analyzer.ingest.tb import read_event_file
from tests.conftest import write_summary_run


class _TooMuchWork(Exception):
    pass


class _Work:
    """Bytes hashed by every CRC routine the reader uses; raises past ``limit``, so that a
    reader doing quadratic work fails at once instead of running for minutes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
        self.hashed = 0
        self.limit = limit
        extend, rows = crc32c.crc32c_extend, crc32c.masked_crc32c_rows

        def counted_extend(crc: int, data: bytes | memoryview) -> int:
            self._add(len(data))
            return extend(crc, data)

        def counted_rows(block):  # type: ignore[no-untyped-def]
            self._add(int(block.size))
            return rows(block)

        monkeypatch.setattr(crc32c, "crc32c_extend", counted_extend)
        monkeypatch.setattr(tfwindow, "crc32c_extend", counted_extend)
        monkeypatch.setattr(tfwalk, "masked_crc32c_rows", counted_rows)
        monkeypatch.setattr(tfsearch, "masked_crc32c_rows", counted_rows)

    def _add(self, n: int) -> None:
        self.hashed += n
        if self.hashed > self.limit:
            raise _TooMuchWork(f"{self.hashed} bytes hashed, more than {self.limit}")


def _records(tmp_path, name: str, steps: range) -> list[bytes]:  # type: ignore[no-untyped-def]
    path = write_summary_run(str(tmp_path / name), {"train/loss": [0.5] * len(steps)},
                             start=steps.start)
    with open(path, "rb") as fh:
        data = fh.read()
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos: pos + 16 + n])
        pos += 16 + n
    return out


def _claim(n: int) -> bytes:
    """A header whose CRC checks, claiming ``n`` payload bytes."""
    length = struct.pack("<Q", n)
    return length + struct.pack("<I", masked_crc32c(length))


def _claims_to(end: int, start: int, count: int) -> bytes:
    """``count`` headers back to back from offset ``start``, each claiming a payload that
    ends one byte before ``end`` (so its CRC can never check)."""
    return b"".join(_claim(end - (start + 12 * i) - 17) for i in range(count))


def _write(tmp_path, data: bytes) -> str:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "events.out.tfevents.1.host")
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _steps(result) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(x) for s in result.series if s.tag == "train/loss" for x in s.steps]


def _bound(size: int) -> int:
    """What the budget lets a file cost: failing checks, plus each byte checked once by the
    first walk and once more where a resumed walk reuses none of it."""
    return tfrecord.CHECK_FLOOR + (tfrecord.CHECK_FACTOR + 2) * size


@pytest.mark.parametrize("window", [None, 4096])
def test_regression_headers_claiming_the_rest_of_the_file_cost_linear_work(
        tmp_path, monkeypatch, window) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(tfrecord, "CHECK_FLOOR", 1 << 20)
    if window:  # the claims then run past the window: each would be read in before its check
        monkeypatch.setattr(tfwindow, "WINDOW", window)
    first = b"".join(_records(tmp_path, "a", range(0, 50)))
    second = b"".join(_records(tmp_path, "b", range(50, 100)))
    count = 40_000  # 480 KB of claims: checking each one costs ~10 GB in all
    size = len(first) + 12 * count + len(second)
    data = first + _claims_to(size, len(first), count) + second
    work = _Work(monkeypatch, _bound(size))
    result = read_event_file(_write(tmp_path, data))
    assert work.hashed <= _bound(size)
    assert _steps(result) == list(range(100))  # both writers' records, before and after
    kinds = [i.kind for i in result.issues]
    assert kinds == ["bad_payload_crc", "read_limit"]
    damage, limit = result.issues
    assert damage.location.offset == len(first)
    assert f"next valid record at offset {size - len(second)}" in damage.message
    assert "were not followed" in damage.message
    assert len(first) <= (limit.location.offset or 0) < size - len(second)
    assert "header(s) that check" in limit.message


def test_regression_valid_records_each_before_a_long_claim_cost_linear_work(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # After each valid record the walk meets a header that checks and claims nearly all the
    # rest: the walk itself would check it, then the search resumes at the next record.
    monkeypatch.setattr(tfrecord, "CHECK_FLOOR", 1 << 20)
    records = _records(tmp_path, "a", range(0, 3000))
    tail = b"".join(_records(tmp_path, "b", range(3000, 3010)))
    size = sum(len(r) for r in records) + 12 * len(records) + len(tail)
    parts, pos = [], 0
    for r in records:
        parts += [r, _claim(size - (pos + len(r)) - 17)]
        pos += len(r) + 12
    work = _Work(monkeypatch, _bound(size))
    result = read_event_file(_write(tmp_path, b"".join(parts) + tail))
    assert work.hashed <= _bound(size)
    assert _steps(result) == list(range(3010))  # every record between the claims, and after
    assert {i.kind for i in result.issues} == {"bad_payload_crc", "read_limit"}
    (limit,) = [i for i in result.issues if i.kind == "read_limit"]
    assert "a walk after damage reached were not checked" in limit.message


def test_honest_damage_is_far_from_the_budget(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    records = _records(tmp_path, "a", range(0, 2000))
    for i in range(1, 2000, 7):  # every seventh record damaged, each followed by a valid one
        broken = bytearray(records[i])
        broken[14] ^= 0xFF
        records[i] = bytes(broken)
    data = b"".join(records)
    work = _Work(monkeypatch, 3 * len(data))  # a few times the file, whatever the floor
    result = read_event_file(_write(tmp_path, data))
    assert work.hashed <= 3 * len(data)
    assert len(_steps(result)) == 2000 - len(range(1, 2000, 7))
    assert {i.kind for i in result.issues} == {"bad_payload_crc"}  # nothing left unchecked


def test_regression_time_budget_is_honoured_inside_one_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The whole file fits in one window: only the search inside it can see the deadline.
    first = b"".join(_records(tmp_path, "a", range(0, 50)))
    second = b"".join(_records(tmp_path, "b", range(50, 60)))
    count = 4000
    size = len(first) + 12 * count + len(second)
    path = _write(tmp_path, first + _claims_to(size, len(first), count) + second)
    assert os.path.getsize(path) < tfwindow.WINDOW
    result = read_event_file(path, deadline=Deadline(0))
    assert _steps(result) == list(range(50))  # what came before the damage is kept
    assert [i.kind for i in result.issues] == ["bad_payload_crc", "read_limit"]
    damage, limit = result.issues
    assert damage.location.offset == len(first) and "reading stopped" in damage.message
    assert limit.location.offset == len(first) + 1 and "time budget" in limit.message
