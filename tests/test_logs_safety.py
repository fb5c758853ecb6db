"""Logs from a stranger's folder: holes of NUL bytes, special files, lines that outgrow a
read chunk, cut trainer states, time budgets. Each defect of issue #12 in the log reader
has a regression test named after it."""

from __future__ import annotations

import builtins
import gzip
import hashlib
import json
import logging
import math
import os
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest import logs as logs_module
from analyzer.ingest.logformats import reader as reader_module
from analyzer.ingest.logformats import trainer_state_compact as compact_module
from analyzer.ingest.logformats import trainer_state_records as state_records
from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.source import HOLES_LISTED
from analyzer.ingest.logs import LogRead, read_log
from analyzer.ingest.safeio import Deadline
from tests.fuzz.budget import fuzz_settings

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
HF_LOG = (FIXTURES / "hf_trainer_nan_filter.log").read_bytes()


def snapshot(folder: Path) -> dict[str, tuple[str, int, str]]:
    """Name, type, size and hash of everything under ``folder``, special files unread."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            digest = ""
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    digest = hashlib.file_digest(handle, "sha256").hexdigest()
            out[os.path.relpath(path, folder)] = (oct(info.st_mode), info.st_size, digest)
    return out


def read_unchanged(path: Path, deadline: Deadline | None = None) -> LogRead:
    """``read_log`` that checks nothing in the file's folder was written."""
    before = snapshot(path.parent)
    read = read_log(str(path), deadline)
    assert snapshot(path.parent) == before
    return read


def points(read: LogRead) -> list[tuple[str, int, str, int]]:
    """(tag, step, repr(value), line) of every point, in line order."""
    out = [
        (s.tag, int(step), repr(float(value)), int(line))
        for s in read.series
        for step, value, line in zip(s.steps, s.values, s.positions, strict=True)
    ]
    return sorted(out, key=lambda p: (p[3], p[0], p[1]))


def first_nonfinite(read: LogRead) -> tuple[str, int, int] | None:
    """(tag, step, line) of the first non-finite point, in line order."""
    bad = ((t, s, line) for t, s, v, line in points(read) if not math.isfinite(float(v)))
    return next(bad, None)


def kinds(read: LogRead) -> list[str]:
    return [i.kind for i in read.issues]


@contextmanager
def never_opened(monkeypatch: pytest.MonkeyPatch, path: Path) -> Iterator[None]:
    """Opening ``path`` fails the test instead of blocking it (a FIFO) or never ending
    (a device)."""
    real_open, real_os_open = builtins.open, os.open

    def guard(target: Any) -> None:
        if os.fspath(target) == str(path):
            raise AssertionError(f"{path} was opened")

    def guarded_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | Path):
            guard(file)
        return real_open(file, *args, **kwargs)

    def guarded_os_open(file: Any, *args: Any, **kwargs: Any) -> int:
        guard(file)
        return real_os_open(file, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", guarded_open)
        patch.setattr(os, "open", guarded_os_open)
        yield


class Expiring(Deadline):
    """A deadline that passes at its ``checks + 1``-th look: time without a clock."""

    def __init__(self, checks: int) -> None:
        super().__init__(60.0)
        self.left = checks

    def expired(self) -> bool:
        self.left -= 1
        return self.left < 0


# -- NUL bytes are holes, not text (#12, defect 3; defect 12 for logs) ------------------


def test_regression_nul_heavy_head_keeps_the_nan_line(tmp_path: Path) -> None:
    # copytruncate: the writer goes on at its old offset, leaving a hole at the head.
    path = tmp_path / "train.log"
    path.write_bytes(b"\x00" * 300_000 + HF_LOG)
    whole = tmp_path / "whole.log"
    whole.write_bytes(HF_LOG)
    read = read_unchanged(path)
    assert points(read) == points(read_log(str(whole)))
    assert first_nonfinite(read) == ("grad_norm", 40, 9)
    (hole,) = read.issues
    assert hole.kind == "zero_run" and "300000 NUL bytes" in hole.message
    assert (hole.location.line, hole.location.offset) == (1, 0)


def test_regression_small_log_with_a_zero_filled_tail_is_not_dropped(tmp_path: Path) -> None:
    # A crash that leaves the file's size written and its last blocks never: the head
    # window holds a little text and many NULs.
    path = tmp_path / "train.log"
    path.write_bytes(HF_LOG + b"\x00" * 60_000)
    read = read_unchanged(path)
    assert first_nonfinite(read) == ("grad_norm", 40, 9)
    (tail,) = read.issues
    assert tail.kind == "zero_tail" and "ends in them" in tail.message
    assert (tail.location.line, tail.location.offset) == (HF_LOG.count(b"\n") + 1, len(HF_LOG))


def test_regression_gigabyte_zero_tail_is_skipped_in_constant_memory(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(HF_LOG)
    os.truncate(path, 1 << 30)  # sparse: a gigabyte of NULs that takes no disk
    before = snapshot(tmp_path)
    tracemalloc.start()
    try:
        read = read_log(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert snapshot(tmp_path) == before
    assert first_nonfinite(read) == ("grad_norm", 40, 9)
    assert peak < 48 << 20, peak
    (tail,) = read.issues
    assert f"{(1 << 30) - len(HF_LOG)} NUL bytes" in tail.message


def test_regression_hole_after_a_cut_line_does_not_glue_the_next_record(tmp_path: Path) -> None:
    # A crash cut a record mid-line and its last block reads as zeros; the restarted
    # run appends. The first record after the hole is the NaN one.
    cut = b"{'loss': 1.2034, 'grad_norm': 2.1, 'learning_rate': 1e-05, 'epo"
    after = b"{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.11}\n"
    path = tmp_path / "train.log"
    path.write_bytes(b"***** Running training *****\n" + cut + b"\x00" * 4096 + after)
    read = read_unchanged(path)
    assert {(t, line) for t, _, v, line in points(read) if v == "nan"} == {
        ("loss", 2),
        ("grad_norm", 2),
    }
    assert kinds(read) == ["zero_run"]


def test_many_holes_are_listed_then_summarised(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"".join(b"step %d loss 1.0\n" % i + b"\x00" * 7 for i in range(30)))
    read = read_unchanged(path)
    assert [p[1] for p in points(read)] == list(range(30))
    holes = [i for i in read.issues if i.kind == "zero_run"]
    assert [h.location.line for h in holes[:-1]] == list(range(2, 2 + HOLES_LISTED))
    assert "30 runs of NUL bytes in all, 210 bytes" in holes[-1].message


def test_regression_zero_tail_is_reported_after_the_listed_holes(tmp_path: Path) -> None:
    # More holes than are listed one by one, then a crash's zero-filled tail.
    body = b"".join(b"step %d loss 1.0\n" % i + b"\x00" * 7 for i in range(30))
    path = tmp_path / "train.log"
    path.write_bytes(body + b"step 30 loss nan\n" + b"\x00" * 5000)
    for chunk in (1 << 22, 64):  # the tail followed across chunks as well
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reader_module, "CHUNK_BYTES", chunk)
            read = read_unchanged(path)
        (tail,) = [i for i in read.issues if i.kind == "zero_tail"]
        assert "5000 NUL bytes" in tail.message
        assert (tail.location.line, tail.location.offset) == (32, len(body) + 17)
        assert first_nonfinite(read) == ("loss", 30, 31)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_regression_utf16_hole_lengths_are_bytes_of_the_file(
    tmp_path: Path, encoding: str
) -> None:
    line = "step 1 loss nan\n".encode(encoding)
    path = tmp_path / "train.log"
    path.write_bytes(b"\xff\xfe" if encoding == "utf-16-le" else b"\xfe\xff")
    with open(path, "ab") as out:
        out.write(line + b"\x00" * 300 + line + b"\x00" * 64)
    read = read_unchanged(path)
    hole, tail = read.issues
    assert hole.kind == "zero_run" and hole.message.startswith("300 NUL bytes")
    assert tail.kind == "zero_tail" and tail.message.startswith("64 NUL bytes")
    assert [p[3] for p in points(read)] == [1, 2]


def test_a_file_of_nul_bytes_only_is_empty_and_a_binary_one_is_not_text(tmp_path: Path) -> None:
    nuls = tmp_path / "zeros.log"
    nuls.write_bytes(b"\x00" * 100_000)
    assert kinds(read_unchanged(nuls)) == ["empty_file"]
    packed = tmp_path / "train.log"
    packed.write_bytes(gzip.compress(HF_LOG * 20))  # a compressed log under its old name
    assert kinds(read_unchanged(packed)) == ["not_text"]


def test_a_log_captured_from_screen_is_text_and_read(tmp_path: Path) -> None:
    # Under TERM=screen a colour reset is ESC [ m SI, after every coloured word; the
    # shell set the window title first.
    line = "".join(f"\x1b[3{i}m{w}\x1b[m\x0f " for i, w in enumerate(["step", "3"]))
    path = tmp_path / "train.log"
    path.write_text("\x1b]0;train\x07" + (line + "loss \x1b[31mnan\x1b[m\x0f\n") * 50)
    read = read_unchanged(path)
    assert "not_text" not in kinds(read)
    assert first_nonfinite(read) == ("loss", 3, 1)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_log_is_read_as_text(tmp_path: Path, encoding: str) -> None:
    # Windows PowerShell redirects a program's output to UTF-16 (with a byte-order mark).
    text = HF_LOG.decode("utf-8")
    path = tmp_path / "train.log"
    with open(path, "w", encoding=encoding, newline="") as out:
        out.write(text)
    plain = tmp_path / "plain.log"
    plain.write_bytes(HF_LOG)
    read = read_unchanged(path)
    assert points(read) == points(read_log(str(plain)))
    assert read.issues == ()


# -- special files and growing files (#12, defect 8) ------------------------------------


def test_regression_fifo_named_log_is_refused_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.log"
    os.mkfifo(path)
    with never_opened(monkeypatch, path):
        read = read_unchanged(path)
    (issue,) = read.issues
    assert issue.kind == "not_regular" and "FIFO" in issue.message


def test_regression_symlink_to_dev_urandom_is_refused_not_read_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trainer_state.json"
    os.symlink("/dev/urandom", path)
    other = tmp_path / "train.log"
    os.symlink("/dev/zero", other)
    for link in (path, other):
        with never_opened(monkeypatch, link):
            read = read_unchanged(link)
        (issue,) = read.issues
        assert issue.kind == "not_regular" and "character device" in issue.message


def test_a_log_growing_while_read_is_read_as_it_stood(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"step 1 loss 1.0\nstep 2 loss 0.9\n")
    real = logs_module.open_regular

    def open_then_append(name: str) -> tuple[Any, int]:
        opened = real(name)
        with open(name, "ab") as out:  # the run is still writing
            out.write(b"step 3 loss nan\n" * 1000)
        return opened

    monkeypatch.setattr(logs_module, "open_regular", open_then_append)
    read = read_log(str(path))
    assert [p[1] for p in points(read)] == [1, 2]


# -- records do not depend on where read chunks end (#12, defect 15) ---------------------


def _records_read(path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> LogRead:
    with monkeypatch.context() as patch:
        patch.setattr(reader_module, "CHUNK_BYTES", chunk)
        return read_log(str(path))


def test_regression_backspace_records_across_a_chunk_boundary_are_all_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A line of 8,000 records separated by backspaces, longer than LINE_CAP, that a read
    # chunk ends inside: the reader used to cut it at LINE_CAP and skip the rest.
    line = "\b".join(f"step {i} loss {1 + i / 1e4:.4f}" for i in range(8000))
    path = tmp_path / "train.log"
    path.write_text("epoch 0\n" + line + "\nstep 8000 loss nan\n")
    assert len(line) > reader_module.LINE_CAP
    whole = points(_records_read(path, monkeypatch, 1 << 30))
    assert [p[1] for p in whole] == list(range(8001))
    for chunk in (100_000, 70_000, 4096):
        read = _records_read(path, monkeypatch, chunk)
        assert points(read) == whole, chunk
        assert read.issues == ()


def test_regression_bar_state_before_a_record_survives_a_chunk_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tqdm redraws with carriage returns on one endless line; the dict after a redraw is
    # logged at that redraw's count. A chunk ending right after the redraw used to drop
    # it, and the dict lost its step.
    bars = "\r".join(
        f" {n // 50:2d}%|#         | {n}/5000 [00:{n % 60:02d}<04:11,  4.95it/s]"
        for n in range(1, 1500)
    )
    head = "***** Running training *****\n" + bars + "\r"
    path = tmp_path / "train.log"
    path.write_text(head + "{'loss': nan, 'grad_norm': nan, 'epoch': 0.3}\n")
    whole = _records_read(path, monkeypatch, 1 << 30)
    assert first_nonfinite(whole) == ("grad_norm", 1499, 2)
    read = _records_read(path, monkeypatch, len(head.encode()))
    assert points(read) == points(whole)


def test_regression_colour_code_inside_a_rank_prefix_keeps_the_rank(tmp_path: Path) -> None:
    # Found by the fuzz target: whether the rank was read depended on whether another
    # line of the same read batch held a plain '[Rank' mark.
    coloured = "[\x1b[32mRank 3\x1b[0m] step 7 loss nan\n"
    alone = tmp_path / "alone.log"
    alone.write_text("epoch 0\n" + coloured)
    beside = tmp_path / "beside.log"
    beside.write_text("[Rank 1] step 6 loss 0.5\n" + coloured)
    for path in (alone, beside):
        (loss,) = [s for s in read_unchanged(path).series if s.rank == 3]
        assert loss.steps.tolist() == [7] and math.isnan(loss.values[0])


SEPARATORS = st.sampled_from(["\r", "\b", "\b\b\b", "\x00", "\x00" * 9, "\r\x00", " "])
RECORDS = st.sampled_from(
    [
        "step {} loss 0.5",
        "step {} loss nan",
        " {}%|#| {}/99 [00:01<00:01, 3.1it/s]",
        "{{'loss': inf, 'epoch': 0.{}}}",
        "\x1b[32mstep {} loss\x1b[0m -inf",
        "iter {}: loss 2.{}, time 1ms",
        "x" * 90 + "{}",
    ]
)


@fuzz_settings(150)
@given(
    st.lists(st.tuples(RECORDS, SEPARATORS, st.integers(0, 999)), min_size=1, max_size=40),
    st.integers(1, 300),
    st.sampled_from([40, 64, 1000]),
    st.booleans(),
)
def test_records_do_not_depend_on_chunk_boundaries(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parts: list[tuple[str, str, int]],
    chunk: int,
    cap: int,
    newlines: bool,
) -> None:
    text = "".join(
        form.format(n, n) + ("\n" if newlines and n % 3 == 0 else sep) for form, sep, n in parts
    )
    path = tmp_path / "train.log"
    path.write_bytes(text.encode())
    monkeypatch.setattr(reader_module, "LINE_CAP", cap)
    whole = _records_read(path, monkeypatch, 1 << 30)
    read = _records_read(path, monkeypatch, chunk)
    assert points(read) == points(whole)
    assert [(e.kind, e.location.line, e.message) for e in read.events] == [
        (e.kind, e.location.line, e.message) for e in whole.events
    ]
    # Issues are listed as they are found, which a chunk boundary may reorder.
    assert sorted(map(str, read.issues)) == sorted(map(str, whole.issues))


# -- trainer_state.json (#12, defect 16) --------------------------------------------------


def _state(records: int) -> dict[str, Any]:
    history: list[dict[str, Any]] = [
        {"epoch": i / 100, "grad_norm": 1.5, "learning_rate": 1e-05, "loss": 2 - i / 100,
         "step": 10 * i}
        for i in range(1, records + 1)
    ]
    history[-1]["loss"] = float("nan")
    return {"best_metric": None, "epoch": records / 100, "global_step": 10 * records,
            "log_history": history, "logging_steps": 10, "max_steps": 500,
            "trial_params": None}


def test_regression_cut_compact_trainer_state_keeps_every_whole_record(tmp_path: Path) -> None:
    text = json.dumps(_state(5))  # what json.dump writes without indent: one line
    record = text.index('{"epoch": 0.05')
    path = tmp_path / "trainer_state.json"
    path.write_text(text[: record + 30])
    read = read_unchanged(path)
    loss = next(s for s in read.series if s.tag == "loss")
    assert loss.steps.tolist() == [10, 20, 30, 40]
    (issue,) = read.issues
    assert issue.kind == "truncated" and "record 5" in issue.message
    assert (issue.location.line, issue.location.offset) == (1, record)


def test_regression_compact_trainer_state_cut_right_after_a_record_keeps_it(
    tmp_path: Path,
) -> None:
    # The last record is whole, its delimiter is not: the record (the NaN one) is kept.
    text = json.dumps(_state(5))
    end = text.index("}]") + 1
    path = tmp_path / "trainer_state.json"
    path.write_text(text[:end])
    read = read_unchanged(path)
    assert first_nonfinite(read) == ("loss", 50, 1)
    (issue,) = read.issues
    assert issue.kind == "truncated" and issue.location.offset == end


def test_regression_compact_trainer_state_cut_after_log_history_keeps_it(tmp_path: Path) -> None:
    text = json.dumps(_state(5))
    path = tmp_path / "trainer_state.json"
    path.write_text(text[: text.index('"max_steps"') + 5])
    read = read_unchanged(path)
    assert first_nonfinite(read) == ("loss", 50, 1)
    assert kinds(read) == ["truncated"]


def test_compact_trainer_state_malformed_inside_keeps_the_records_before(tmp_path: Path) -> None:
    text = json.dumps(_state(5)).replace('"step": 30}', '"step": 30 ]', 1)
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    read = read_unchanged(path)
    assert next(s for s in read.series if s.tag == "loss").steps.tolist() == [10, 20]
    assert kinds(read) == ["bad_json"]


def test_trainer_state_ending_in_nul_bytes_keeps_its_records(tmp_path: Path) -> None:
    text = json.dumps(_state(4), indent=2)  # how the Trainer writes it
    path = tmp_path / "trainer_state.json"
    path.write_bytes(text[: text.index('"step": 40')].encode() + b"\x00" * 8192)
    read = read_unchanged(path)
    assert next(s for s in read.series if s.tag == "loss").steps.tolist() == [10, 20, 30]
    assert kinds(read) == ["zero_tail", "truncated"]


def _indented(records: int) -> str:
    return json.dumps(_state(records), indent=2, sort_keys=True)  # as the Trainer writes it


def _hole_at(text: str, at: int, size: int = 4096) -> bytes:
    return text[:at].encode() + b"\x00" * size + text[at:].encode()


def test_regression_nul_run_between_indented_records_loses_nothing_and_is_reported(
    tmp_path: Path,
) -> None:
    text = _indented(5)
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    whole = points(read_log(str(path)))
    at = text.index("    {", text.index('"step": 20'))  # the line that opens record 3
    path.write_bytes(_hole_at(text, at))
    read = read_unchanged(path)
    assert points(read) == whole
    (hole,) = read.issues
    assert hole.kind == "zero_run" and "4096 NUL bytes" in hole.message
    assert (hole.location.line, hole.location.offset) == (text.count("\n", 0, at) + 1, at)


def test_regression_nul_run_inside_an_indented_record_is_reported_and_glues_nothing(
    tmp_path: Path,
) -> None:
    # The committed corpus file's case: a run at the start of a line inside record 3.
    # The fields after it (with the step) are kept; those before it cannot be told from
    # the end of a record whose rest was lost, so they are dropped, and the issue says so.
    text = _indented(5)
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    whole = points(read_log(str(path)))
    record = text.index('"epoch": 0.03')
    at = text.index('      "learning_rate"', record)
    path.write_bytes(_hole_at(text, at))
    read = read_unchanged(path)
    lost = {("epoch", 30), ("grad_norm", 30)}
    assert points(read) == [p for p in whole if (p[0], p[1]) not in lost]
    assert [p[1] for p in points(read) if p[0] == "lr"] == [10, 20, 30, 40, 50]
    (hole,) = read.issues
    assert hole.kind == "zero_run" and "fields before it" in hole.message
    assert (hole.location.line, hole.location.offset) == (text.count("\n", 0, at) + 1, at)


def test_regression_lost_block_never_puts_a_value_under_another_records_step(
    tmp_path: Path,
) -> None:
    # A block that never reached the disk reads as NULs in place of the end of record 2
    # and the start of record 4; each side is read on its own.
    for indent in (2, None):
        text = json.dumps(_state(5), indent=indent, sort_keys=True)
        start = text.index('"learning_rate"', text.index('"epoch": 0.02'))
        end = text.index('"loss"', text.index('"epoch": 0.04'))
        path = tmp_path / "trainer_state.json"
        path.write_text(text)
        whole = {p[:3] for p in points(read_log(str(path)))}
        path.write_bytes(text[:start].encode() + b"\x00" * (end - start) + text[end:].encode())
        read = read_unchanged(path)
        got = {p[:3] for p in points(read)}
        assert got <= whole
        kept = {p for p in whole if p[1] in (10, 50) or p[:2] in {("loss", 40)}}
        assert got == kept, indent
        assert kinds(read) == ["zero_run"]


def test_regression_nul_run_between_compact_records_keeps_the_records_after_it(
    tmp_path: Path,
) -> None:
    text = json.dumps(_state(5))
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    whole = points(read_log(str(path)))
    at = text.index('{"epoch": 0.03')
    path.write_bytes(_hole_at(text, at, 300))
    read = read_unchanged(path)
    assert points(read) == whole
    (hole,) = read.issues
    assert (hole.kind, hole.location.line, hole.location.offset) == ("zero_run", 1, at)


class CountingText(str):
    """A text that counts the characters its Python-level scans go over: counts,
    searches and slices."""

    scanned = 0

    def count(self, sub: str, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        lo, hi, _ = slice(start, end).indices(len(self))
        CountingText.scanned += max(hi - lo, 0)
        return super().count(sub, start, end)

    def __getitem__(self, key: Any) -> str:  # type: ignore[override]
        if isinstance(key, slice):
            lo, hi, _ = key.indices(len(self))
            CountingText.scanned += max(hi - lo, 0)
        return super().__getitem__(key)


def test_regression_compact_trainer_state_is_read_in_linear_work() -> None:
    # Each record's line and offset used to be counted from the start of the file: 15 MB
    # of records took minutes. Counted on from the record before, the lookups of all the
    # records scan the text a few times at most, however many records it holds.
    state = _state(3000)
    state["log_history"][1500]["note_é"] = 1.0  # non-ASCII: offsets are counted in bytes
    text = json.dumps(state, ensure_ascii=False)
    cut = text.index('{"epoch": 29.99')
    ctx = Context("trainer_state.json")
    CountingText.scanned = 0
    compact_module.read_compact(CountingText(text[: cut + 20]), ctx, Deadline(600))
    # One pass for the lines, one for the byte offset of the cut, one for the json
    # module's own error message (which counts the lines of its document).
    assert CountingText.scanned <= 4 * cut, CountingText.scanned
    steps = next(s for (tag, _), s, _, _ in ctx.store.series() if tag == "loss")
    assert steps.tolist() == [10 * i for i in range(1, 2999)]  # 2999 is the one cut
    (issue,) = ctx.issues()
    assert issue.kind == "truncated"
    assert issue.location.offset == len(text[:cut].encode("utf-8"))


def test_oversized_trainer_state_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(_state(50), indent=2))
    monkeypatch.setattr(logs_module, "_TRAINER_STATE_CAP", 1000)
    read = read_unchanged(path)
    assert kinds(read) == ["too_large"] and read.series == ()


# -- time budgets ---------------------------------------------------------------------------


def test_read_limit_keeps_the_lines_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.log"
    handler = logging.FileHandler(path)  # a log written by the logging module
    log = logging.getLogger("forensics-test-train")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        for step in range(200):
            log.info("step %d loss %s", step, "nan" if step == 150 else f"{1 / (step + 1):.4f}")
    finally:
        log.removeHandler(handler)
        handler.close()
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", 256)
    read = read_unchanged(path, Expiring(4))
    (issue,) = read.issues
    assert issue.kind == "read_limit" and issue.location.offset == 4 * 256
    complete = path.read_bytes()[: 4 * 256].count(b"\n")
    assert [p[1] for p in points(read)] == list(range(complete))
    assert issue.location.line == complete + 1


def test_read_limit_in_a_trainer_state_keeps_the_records_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Compact files are checked every few records, indented ones every few lines.
    for indent, every in ((None, 3), (2, 20)):
        monkeypatch.setattr(state_records, "CHECK_EVERY", every)
        path = tmp_path / "trainer_state.json"
        path.write_text(json.dumps(_state(8), indent=indent))
        read = read_unchanged(path, Expiring(0))
        assert kinds(read) == ["read_limit"]
        steps = next(s for s in read.series if s.tag == "loss").steps.tolist()
        assert steps and steps == [10 * i for i in range(1, len(steps) + 1)]
        assert len(steps) < 8
