"""Lines read by layout (``fast.Shape``'s remembered layouts, ``layouts``): word for word
what matching each line, and the plain parsers, give."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest.logformats import fast, layouts
from analyzer.ingest.logformats import reader as reader_module
from analyzer.ingest.logformats import store as store_module
from analyzer.ingest.logs import read_log
from tests.test_logs_reading import _everything, _plain, write

_DIGITS = st.text(alphabet="0123456789", max_size=9)


@st.composite
def _decimal(draw: st.DrawFn) -> str:
    """A number as ``fast.DECIMAL`` takes it: sign, digits, point, exponent."""
    whole, decimals = draw(_DIGITS), draw(_DIGITS)
    if not whole and not decimals:
        whole = "0"
    point = "." if decimals or draw(st.booleans()) else ""
    text = draw(st.sampled_from(["", "", "-", "+"])) + whole + point + decimals
    if draw(st.booleans()):
        text += draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "-", "+"]))
        text += draw(st.text(alphabet="0123456789", min_size=1, max_size=2))
    return text


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(_decimal(), min_size=1, max_size=4), seed=st.integers(0, 2**32))
def test_numbers_read_from_bytes_are_what_float_reads(tokens: list[str], seed: int) -> None:
    # Lines of one layout: the first line's digits replaced at random. Each value read in
    # numpy must be float()'s of its text, bit for bit (repr tells -0.0 from 0.0).
    line, spans = "", []
    for token in tokens:
        line += " x: "
        spans.append((len(line), len(line) + len(token)))
        line += token
    form = layouts.numeric(line, spans, 0, (), ())
    if form is None:  # out of bounds: a mantissa past 15 digits
        assert any(len(re.sub(r"[eE].*|\D", "", t)) > layouts.MANTISSA_DIGITS for t in tokens)
        return
    rng = random.Random(seed)
    lines = [line] + [re.sub(r"\d", lambda _: rng.choice("0123456789"), line) for _ in range(30)]
    data = np.frombuffer("\n".join(lines).encode(), dtype=np.uint8)
    starts = np.arange(len(lines), dtype=np.int64) * (len(line) + 1)
    fits, _, values = layouts.evaluate(form, data, starts, lines, np.arange(len(lines)))
    assert fits.all()
    for row, text in zip(values.tolist(), lines, strict=True):
        assert [repr(v) for v in row] == [repr(float(text[a:b])) for a, b in spans]


def _megatron(i: int, lm: str, scale: str = "65536.0", nans: str = "0") -> str:
    return (
        f" [2024-08-01 09:44:55] iteration {i:8d}/  500000 | consumed samples: {96 * i} |"
        f" learning rate: 1.000E-04 | lm loss: {lm} | loss scale: {scale} | grad norm: 1.5 |"
        f" number of skipped iterations:   0 | number of nan iterations:   {nans} |"
    )


def _mmengine(i: int, loss: str, extra: str = "  loss_cls: 1.25") -> str:
    epoch, it = divmod(i, 400)
    return (
        f"2024/06/19 01:21:51 - mmengine - INFO - Epoch(train)  [{epoch + 1}][{it:4d}/400]"
        f"  lr: 2.0000e-04  eta: 8:27:55  time: 0.2526  grad_norm: {i % 7}.5  loss: {loss}{extra}"
    )


_SPELLINGS = ["{:.6E}", "{:.4f}", "{:.2e}", "{:.0f}.", "{:.17f}", "-{:.3f}", "+{:.1f}", "{:.3e}"]
"""Numbers in many spellings; 17 decimals give mantissas past 15 digits."""


def _value(rng: random.Random, i: int) -> str:
    if i % 211 == 0:
        return "-0.0000"
    if i % 223 == 0:
        return f"{rng.uniform(1, 9):.4f}e-{rng.randint(23, 99)}"  # a scale past 10**22
    if i % 227 == 0:
        return f"{rng.uniform(1, 9):.4f}E+{rng.randint(23, 99)}"
    return rng.choice(_SPELLINGS).format(rng.uniform(0, 50))


def _runs(seed: int) -> list[str]:
    """Long Megatron and mmengine runs, their numbers in many spellings, broken by lines
    of the same layout whose literal digits differ (a loss scale of the same width, a
    NaN count, a tag that differs by a digit), a NaN, non-ASCII text, a hole, a bar
    glued to a record and invalid UTF-8 (as \\udcff, written out as a raw byte)."""
    rng = random.Random(seed)
    lines = []
    for i in range(1, 1500):
        scale = "65536.0" if i < 700 else "32768.0"
        nans = "1" if i == 1111 else "0"
        lines.append(_megatron(i, _value(rng, i), scale, nans))
        if i % 301 == 0:
            lines.append(_megatron(i, "nan"))
    for i in range(1, 1500):
        loss = "nan" if i == 901 else _value(rng, i)
        extra = "  top1: 0.5" if i % 50 < 25 else "  top2: 0.5"  # one layout, two tags
        line = _mmengine(i, loss, extra)
        if i % 97 == 0:
            line = line.replace("eta: 8:27:55", "eta: 8:27:55µ")
        if i % 389 == 0:
            line = line.replace("time:", "time:\x00")
        if i % 401 == 0:
            line = "  5%|5   | 20/400 [00:01<00:19, 19.5it/s]\r" + line
        if i % 409 == 0:
            line = line.replace("INFO", "IN\udcffFO")
        lines.append(line)
    return lines


@pytest.mark.parametrize(("chunk", "pack_rows"), [(1 << 22, 1 << 14), (4099, 7), (65537, 1000)])
def test_lines_read_by_layout_match_the_plain_parsers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, pack_rows: int
) -> None:
    # Chunks of odd sizes cut lines at batch edges; packing every 7 rows mixes rows kept
    # as strings with rows read from bytes in one block.
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(store_module, "PACK_ROWS", pack_rows)
    text = "\n".join(_runs(chunk)) + "\n"
    path = write(tmp_path, text.encode("utf-8", "surrogateescape"))
    read = read_log(path)
    assert _everything(read) == _everything(_plain(path, monkeypatch))
    assert {e.kind for e in read.events} >= {"loss_scale", "nonfinite"}
    assert {s.tag for s in read.series} >= {"top1", "top2", "lm loss", "loss"}


def test_regression_same_layout_other_literal_digit_is_matched_not_sliced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 'top1' and 'top2' have one layout (digits aside); the shape learned on 'top1'
    # holds the digit literally, so a 'top2' line must not be read by its layout.
    lines = [_mmengine(i, "1.5", "  top1: 0.5" if i < 300 else "  top2: 0.5") for i in range(600)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    read = read_log(path)
    assert _everything(read) == _everything(_plain(path, monkeypatch))
    assert [len(s) for s in read.series if s.tag in ("top1", "top2")] == [300, 300]


def test_layouts_take_the_common_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A layout path that stopped taking its format's lines would leave the results right
    # and only the speed lost: count the windows read from bytes.
    taken: list[int] = []
    original = store_module.PointStore.extend_arrays

    def counting(self: store_module.PointStore, block, first, steps, values) -> None:  # type: ignore[no-untyped-def]
        taken.append(len(steps))
        original(self, block, first, steps, values)

    monkeypatch.setattr(store_module.PointStore, "extend_arrays", counting)
    megatron = [_megatron(i, f"{i / 1000:.6E}") for i in range(1, 2000)]
    mmengine = [_mmengine(i, f"{i / 100:.4f}") for i in range(1, 2000)]
    for lines in (megatron, mmengine):  # a batch holding Megatron's trigger is not mmengine's
        taken.clear()
        read = read_log(write(tmp_path, "\n".join(lines) + "\n"))
        assert sum(taken) > 1990
        assert sum(len(s) for s in read.series) > 1990 * 4


def test_the_fast_switch_turns_layouts_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "ENABLED", False)
    shape = fast.Shape("", r"x: (\d++)", store_module.PointStore().block(("x",), None, 0), len)
    assert not shape.keyed


def _interleaved(seed: int) -> list[str]:
    """Formats interleaved line by line (no bulk reading): each record goes through the
    per-record path, where Megatron, mmengine, Hugging Face and DeepSpeed records of a
    layout seen are sliced. Broken by the same kinds of lines as ``_runs``."""
    rng = random.Random(seed)
    lines = []
    for i in range(1, 700):
        value = _value(rng, i)
        bars = "\r".join(f"  {s // 50:2d}%|#  | {s}/5000 [00:01<04:11,  4.95it/s]"
                         for s in range(i, i + 3))
        lines.append(f"{bars}\r{{'loss': {value}, 'grad_norm': {rng.uniform(0, 4):.4f}, "
                     f"'learning_rate': {rng.uniform(1e-5, 5e-5):.6e}, 'epoch': 0.{i % 10}}}")
        lines.append(f"[2024-03-11 10:02:40,004] [INFO] [logging.py:96:log_dist] [Rank 0] "
                     f"step={i}, skipped={i // 97}, lr=[{value}], mom=[(0.9, 0.999)]")
        lines.append(_megatron(i, value, "65536.0" if i < 350 else "32768.0",
                               "1" if i == 500 else "0"))
        line = _mmengine(i, "nan" if i == 600 else value)
        if i % 97 == 0:
            line = line.replace("eta:", "eta\x00:")
        if i % 101 == 0:
            line = line.replace("INFO", "IN\udcffFO")
        lines.append(line)
    return lines


@pytest.mark.parametrize("chunk", [1 << 22, 5003])
def test_records_read_by_layout_match_the_plain_parsers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", chunk)
    text = "\n".join(_interleaved(chunk)) + "\n"
    path = write(tmp_path, text.encode("utf-8", "surrogateescape"))
    read = read_log(path)
    assert _everything(read) == _everything(_plain(path, monkeypatch))
    assert {"lm loss", "loss", "lr", "skipped", "grad_norm"} <= {s.tag for s in read.series}


def test_every_training_header_key_holds_the_mark_searched_first() -> None:
    # HuggingFaceParser._header looks for ' = ' before it looks for each key.
    from analyzer.ingest.logformats.hf import _HEADER

    assert all(" = " in key for key, _ in _HEADER)
