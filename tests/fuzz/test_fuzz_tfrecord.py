"""Fuzz target: TFRecord framing and Event decoding.

Inputs are structure-aware: files are built from records with valid CRCs whose payloads
are random ``Event`` protobufs (summaries with ``simple_value``, tensors of random dtype
with ``tensor_content`` of random length, histograms with NaN and Inf among their fields,
``file_version``, ``session_log``; random wall times and steps), then damaged: cut
anywhere, bytes flipped, inserted or deleted, runs of zeros written or inserted, two files
glued, a record cut and another file appended, a run of headers that check inserted, each
claiming a payload that runs to the end of the file. The committed corpus (files from the
real writers) is damaged the same way.

Properties, each of which a reader bug can break:

- ``read_event_file`` never raises nor warns, and every issue names the file;
- on an undamaged file every record is recovered, and every scalar and histogram point
  equals what an obvious oracle gives (a plain Python record walk, ``Event.FromString``
  and a direct reading of each value);
- after damage at offset D, every valid record that ends before D is still recovered;
  with CRCs verified, so is every record wholly after the damaged bytes;
- what a file gives does not depend on the size of the windows it is read by;
- with a check budget made tiny, the payload bytes hashed stay within what the budget
  allows, and the records before the damage are still kept.
"""

from __future__ import annotations

import math
import os
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

from analyzer.ingest import crc32c, tfrecord, tfsearch, tfwalk, tfwindow
from analyzer.ingest.tb import EventFile, read_event_file
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.make_corpus import corpus_files

# A numpy warning on odd input (a signalling NaN, an overflow) would reach the user's terminal.
pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("error::RuntimeWarning")]

NAME = "events.out.tfevents.1700000000.fuzz"
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0]


def _masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def framed(payload: bytes) -> bytes:
    """One record exactly as TensorBoard's RecordWriter frames it."""
    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", _masked(head)) + payload + struct.pack("<I", _masked(payload))


# -- random Event protobufs -----------------------------------------------------------------

FLOATS = st.floats(width=32) | st.sampled_from(SPECIAL)
DOUBLES = st.floats() | st.sampled_from(SPECIAL)
TAGS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["train/loss", "grad_norm/fc.weight", "lr", "a"])
# Signalling NaNs, infinities and the largest numbers, as float32, float64 and 16-bit bits.
ODD_NUMBERS = [b"\x01\x00\x80\x7f", b"\x00\x00\x80\xff", b"\xff\xff\x7f\x7f",
               b"\x01\x00\x00\x00\x00\x00\xf0\x7f", b"\x01\x7c", b"\x81\x7f"]
ODD_HALVES = [0x7C01, 0x7F81, 0xFC00, 0x7BFF, 0xFFFF]
DTYPES = st.sampled_from([types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF,
                          types_pb2.DT_BFLOAT16, types_pb2.DT_INT32, types_pb2.DT_INT64,
                          types_pb2.DT_STRING, types_pb2.DT_BOOL, 77])


@st.composite
def tensors(draw: Any) -> tensor_pb2.TensorProto:
    tensor = tensor_pb2.TensorProto(dtype=draw(DTYPES))
    how = draw(st.sampled_from(["content", "float", "double", "half", "int", "int64", "none"]))
    if how == "content":
        tensor.tensor_content = draw(st.binary(max_size=18) | st.sampled_from(ODD_NUMBERS))
    elif how == "float":
        tensor.float_val.extend(draw(st.lists(FLOATS, max_size=3)))
    elif how == "double":
        tensor.double_val.extend(draw(st.lists(DOUBLES, max_size=3)))
    elif how == "half":
        tensor.half_val.extend(draw(st.lists(st.integers(-2**31, 2**31 - 1)
                                             | st.integers(0, 0xFFFF)
                                             | st.sampled_from(ODD_HALVES), max_size=3)))
    elif how == "int":
        tensor.int_val.extend(draw(st.lists(st.integers(-2**31, 2**31 - 1), max_size=3)))
    elif how == "int64":
        tensor.int64_val.extend(draw(st.lists(st.integers(-2**63, 2**63 - 1), max_size=3)))
    return tensor


@st.composite
def values(draw: Any) -> summary_pb2.Summary.Value:
    value = summary_pb2.Summary.Value(tag=draw(TAGS))
    kind = draw(st.sampled_from(["simple", "simple", "histo", "tensor"]))
    if kind == "simple":
        value.simple_value = draw(FLOATS)
    elif kind == "histo":
        value.histo.CopyFrom(summary_pb2.HistogramProto(
            min=draw(DOUBLES), max=draw(DOUBLES), num=draw(DOUBLES), sum=draw(DOUBLES),
            sum_squares=draw(DOUBLES), bucket_limit=draw(st.lists(DOUBLES, max_size=4)),
            bucket=draw(st.lists(DOUBLES, max_size=4))))
    else:
        value.tensor.CopyFrom(draw(tensors()))
        plugin = draw(st.sampled_from(["scalars", "", "histograms", "text", None]))
        if plugin is not None:
            value.metadata.plugin_data.plugin_name = plugin
    return value


WALLS = st.floats(1e9, 2e9) | st.sampled_from([math.nan, math.inf, -math.inf, 0.0])
STEPS = st.integers(0, 10**6) | st.integers(-2**63, 2**63 - 1)


@st.composite
def events(draw: Any) -> event_pb2.Event:
    event = event_pb2.Event(wall_time=draw(WALLS), step=draw(STEPS))
    what = draw(st.sampled_from(["summary", "summary", "summary", "version", "session", "none"]))
    if what == "summary":
        event.summary.value.extend(draw(st.lists(values(), min_size=1, max_size=3)))
    elif what == "version":
        event.file_version = draw(st.sampled_from(["brain.Event:2", "brain.Event:1", ""]))
    elif what == "session":
        event.session_log.status = draw(st.integers(0, 3))
    return event


RECORDS = st.lists(events().map(lambda e: e.SerializeToString()), min_size=1, max_size=14)


# -- the oracle -----------------------------------------------------------------------------

_ITEM = {types_pb2.DT_FLOAT: "<f", types_pb2.DT_DOUBLE: "<d", types_pb2.DT_INT32: "<i",
         types_pb2.DT_INT64: "<q", types_pb2.DT_HALF: "<e"}


def _one_number(tensor: tensor_pb2.TensorProto) -> float | None:
    """The number of a one-element numeric tensor, read the obvious way; else None."""
    dtype = tensor.dtype
    if dtype not in _ITEM and dtype != types_pb2.DT_BFLOAT16:
        return None
    if tensor.tensor_content:
        content = tensor.tensor_content
        if dtype == types_pb2.DT_BFLOAT16:
            if len(content) != 2:
                return None
            return float(struct.unpack("<f", b"\0\0" + content)[0])
        fmt = _ITEM[dtype]
        if len(content) != struct.calcsize(fmt):
            return None
        return float(struct.unpack(fmt, content)[0])
    if dtype in (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16):
        if len(tensor.half_val) != 1 or not 0 <= tensor.half_val[0] <= 0xFFFF:
            return None
        bits = struct.pack("<H", tensor.half_val[0])
        if dtype == types_pb2.DT_HALF:
            return float(struct.unpack("<e", bits)[0])
        return float(struct.unpack("<f", b"\0\0" + bits)[0])
    source = {types_pb2.DT_FLOAT: tensor.float_val, types_pb2.DT_DOUBLE: tensor.double_val,
              types_pb2.DT_INT32: tensor.int_val, types_pb2.DT_INT64: tensor.int64_val}[dtype]
    return float(source[0]) if len(source) == 1 else None


def _is_bucket_tensor(tensor: tensor_pb2.TensorProto) -> bool:
    """Whether a histogram-plugin tensor holds k x 3 readable numbers."""
    dtype = tensor.dtype
    if dtype not in _ITEM and dtype != types_pb2.DT_BFLOAT16:
        return False
    if tensor.tensor_content:
        size = 2 if dtype == types_pb2.DT_BFLOAT16 else struct.calcsize(_ITEM[dtype])
        count, rest = divmod(len(tensor.tensor_content), size)
        return rest == 0 and count % 3 == 0
    if dtype in (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16):
        return all(0 <= v <= 0xFFFF for v in tensor.half_val) and len(tensor.half_val) % 3 == 0
    source = {types_pb2.DT_FLOAT: tensor.float_val, types_pb2.DT_DOUBLE: tensor.double_val,
              types_pb2.DT_INT32: tensor.int_val, types_pb2.DT_INT64: tensor.int64_val}[dtype]
    return len(source) % 3 == 0


def valid_records(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset, end, payload) of the records from the start of ``data`` whose two CRCs
    check, up to the first that does not: a plain walk."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        head = data[pos: pos + 8]
        (n,) = struct.unpack("<Q", head)
        if struct.unpack("<I", data[pos + 8: pos + 12])[0] != _masked(head):
            break
        end = pos + 16 + n
        if end > len(data):
            break
        payload = data[pos + 12: pos + 12 + n]
        if struct.unpack("<I", data[end - 4: end])[0] != _masked(payload):
            break
        out.append((pos, end, payload))
        pos = end
    return out


Point = tuple[str, int, str, int, str]  # kind, offset, tag, step, value repr


def _repr(x: float) -> str:
    return "nan" if math.isnan(x) else repr(x)


def oracle(records: list[tuple[int, int, bytes]]) -> set[Point]:
    """Every scalar ("s") and histogram point ("h") the records hold, by record offset."""
    out: set[Point] = set()
    for offset, _, payload in records:
        try:
            event = event_pb2.Event.FromString(payload)
        except Exception:  # not an Event: nothing to read
            continue
        if event.WhichOneof("what") != "summary":
            continue
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            plugin = value.metadata.plugin_data.plugin_name
            number = None
            if kind == "simple_value":
                number = float(value.simple_value)
            elif kind == "tensor" and plugin in ("scalars", ""):
                number = _one_number(value.tensor)
            elif kind == "histo" or (kind == "tensor" and plugin == "histograms"
                                     and _is_bucket_tensor(value.tensor)):
                out.add(("h", offset, value.tag, event.step, ""))
            if number is not None:
                out.add(("s", offset, value.tag, event.step, _repr(number)))
    return out


def points(result: EventFile) -> set[Point]:
    out: set[Point] = set()
    for s in result.series:
        for pos, step, value in zip(s.positions.tolist(), s.steps.tolist(), s.values.tolist(),
                                    strict=True):
            out.add(("s", pos, s.tag, step, _repr(value)))
    for h in result.histograms:
        for pos, step in zip(h.positions.tolist(), h.steps.tolist(), strict=True):
            out.add(("h", pos, h.tag, step, ""))
    return out


# -- reading --------------------------------------------------------------------------------

@contextmanager
def window(size: int) -> Iterator[None]:
    saved = tfwindow.WINDOW
    tfwindow.WINDOW = size
    try:
        yield
    finally:
        tfwindow.WINDOW = saved


def read(folder: str, data: bytes, *, verify: bool = True) -> EventFile:
    path = os.path.join(folder, NAME)
    with open(path, "wb") as fh:
        fh.write(data)
    result = read_event_file(path, verify=verify)
    assert all(i.location.file == path for i in result.issues)
    for s in result.series:
        assert len(s.steps) == len(s.values) == len(s.wall_times) == len(s.positions)
    return result


def summary(result: EventFile) -> tuple[Any, ...]:
    return (result.records, [(i.kind, i.location.offset, i.message) for i in result.issues],
            sorted(points(result)), [(e.kind, e.location.offset) for e in result.events],
            result.file_version)


Records = list[tuple[int, int, bytes]]


@st.composite
def damaged(draw: Any, data: bytes, other: bytes) -> tuple[bytes, int, Records]:
    """``data`` damaged: the new bytes, D where the damage starts, and the intact records
    wholly after the damaged bytes, where they now lie."""
    size = len(data)
    records, appended = valid_records(data), valid_records(other)

    def moved(start: int, shift: int) -> Records:  # the records from ``start`` on, moved
        return [(o + shift, e + shift, p) for o, e, p in records if o >= start]

    d = draw(st.integers(0, size))
    how = draw(st.sampled_from(["cut", "flip", "insert", "delete", "zeros", "insert zeros",
                                "glue", "cut and append", "claims"]))
    if how == "cut":
        return data[:d], d, []
    if how == "flip" and d < size:
        flip = draw(st.integers(1, 255))
        return data[:d] + bytes([data[d] ^ flip]) + data[d + 1:], d, moved(d + 1, 0)
    if how == "insert":
        junk = draw(st.binary(min_size=1, max_size=40))
        return data[:d] + junk + data[d:], d, moved(d, len(junk))
    if how == "delete" and d < size:
        k = draw(st.integers(1, min(40, size - d)))
        return data[:d] + data[d + k:], d, moved(d + k, -k)
    if how == "zeros" and d < size:
        k = draw(st.integers(1, min(5000, size - d)))
        return data[:d] + b"\0" * k + data[d + k:], d, moved(d + k, 0)
    if how == "insert zeros":
        k = draw(st.integers(1, 5000))
        return data[:d] + b"\0" * k + data[d:], d, moved(d, k)
    if how == "claims":
        k = draw(st.integers(1, 60))
        return data[:d] + claims(d, k, size + 12 * k) + data[d:], d, moved(d, 12 * k)
    if how == "glue":
        d = size
    return data[:d] + other, d, [(o + d, e + d, p) for o, e, p in appended]


def claims(at: int, count: int, size: int) -> bytes:
    """``count`` headers that check from offset ``at`` of a file of ``size`` bytes, each
    claiming a payload that ends one byte before the end of the file."""
    out = b""
    for i in range(count):
        length = struct.pack("<Q", max(1, size - (at + 12 * i) - 17))
        out += length + struct.pack("<I", _masked(length))
    return out


@contextmanager
def counted(floor: int) -> Iterator[list[int]]:
    """The check budget's floor set to ``floor``; yields the bytes hashed so far."""
    hashed = [0]
    extend, rows = crc32c.crc32c_extend, crc32c.masked_crc32c_rows

    def counted_extend(crc: int, data: bytes | memoryview) -> int:
        hashed[0] += len(data)
        return extend(crc, data)

    def counted_rows(block: Any) -> Any:
        hashed[0] += int(block.size)
        return rows(block)

    saved = tfrecord.CHECK_FLOOR
    tfrecord.CHECK_FLOOR = floor
    crc32c.crc32c_extend = tfwindow.crc32c_extend = counted_extend  # type: ignore[assignment]
    tfwalk.masked_crc32c_rows = tfsearch.masked_crc32c_rows = counted_rows
    try:
        yield hashed
    finally:
        tfrecord.CHECK_FLOOR = saved
        crc32c.crc32c_extend = tfwindow.crc32c_extend = extend  # type: ignore[assignment]
        tfwalk.masked_crc32c_rows = tfsearch.masked_crc32c_rows = rows


@pytest.fixture(scope="module")
def folder() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="fuzz-tfrecord-") as path:
        yield path


@fuzz_settings(100)
@given(RECORDS)
def test_intact_file_agrees_with_the_oracle(folder: str, payloads: list[bytes]) -> None:
    data = b"".join(framed(p) for p in payloads)
    records = valid_records(data)
    assert len(records) == len(payloads)
    for verify in (True, False):
        result = read(folder, data, verify=verify)
        assert result.records == len(payloads)
        assert {i.kind for i in result.issues} <= {"bad_record", "not_an_event"}
        assert points(result) == oracle(records)


@fuzz_settings(150)
@given(st.data(), RECORDS, RECORDS)
def test_damage_keeps_the_records_before_it_and_after_it(folder: str, data: Any,
                                                         first: list[bytes],
                                                         second: list[bytes]) -> None:
    original = b"".join(framed(p) for p in first)
    blob, d, after = data.draw(damaged(original, b"".join(framed(p) for p in second)))
    before = oracle([r for r in valid_records(original) if r[1] <= d])
    for verify in (True, False):
        result = read(folder, blob, verify=verify)
        got = points(result)
        assert before <= got, sorted(before - got)[:3]
        if verify:
            missing = oracle(after) - got
            assert not missing, (sorted(missing)[:3], [str(i) for i in result.issues])


@fuzz_settings(100)
@given(st.data(), RECORDS, RECORDS, st.sampled_from([1, 5, 13, 64, 200, 1000]))
def test_window_size_changes_nothing(folder: str, data: Any, first: list[bytes],
                                     second: list[bytes], size: int) -> None:
    original = b"".join(framed(p) for p in first)
    blob, _, _ = data.draw(damaged(original, b"".join(framed(p) for p in second)))
    for verify in (True, False):
        whole = summary(read(folder, blob, verify=verify))
        with window(size):
            assert summary(read(folder, blob, verify=verify)) == whole


@fuzz_settings(100)
@given(st.data(), RECORDS, RECORDS, st.sampled_from([0, 64, 4096]),
       st.sampled_from([None, 13, 200]))
def test_tiny_check_budget_bounds_the_work_and_keeps_what_came_before(
        folder: str, data: Any, first: list[bytes], second: list[bytes], floor: int,
        size: int | None) -> None:
    original = b"".join(framed(p) for p in first)
    blob, d, _ = data.draw(damaged(original, b"".join(framed(p) for p in second)))
    before = oracle([r for r in valid_records(original) if r[1] <= d])
    for verify in (True, False):
        with counted(floor) as hashed, window(size or tfwindow.WINDOW):
            got = points(read(folder, blob, verify=verify))
        assert before <= got, sorted(before - got)[:3]
        # Failing checks within the budget, plus each byte hashed by the first walk, once
        # more by a resumed walk, and twice as a header (the search, then the walk).
        assert hashed[0] <= floor + (tfrecord.CHECK_FACTOR + 4) * len(blob) + 64


CORPUS = corpus_files("tfrecord")


@fuzz_settings(100)
@given(st.data())
def test_damaged_corpus_keeps_what_came_before(folder: str, data: Any) -> None:
    if not CORPUS:
        pytest.skip("no corpus")
    original = Path(data.draw(st.sampled_from(CORPUS))).read_bytes()
    other = Path(data.draw(st.sampled_from(CORPUS))).read_bytes()
    blob, d, _ = data.draw(damaged(original, other))
    expected = oracle([r for r in valid_records(original) if r[1] <= d])
    for verify in (True, False):
        assert expected <= points(read(folder, blob, verify=verify))


@pytest.mark.parametrize("path", CORPUS, ids=os.path.basename)
def test_corpus_file_reads_the_same_by_any_window(folder: str, path: str) -> None:
    blob = Path(path).read_bytes()
    for verify in (True, False):
        result = read(folder, blob, verify=verify)
        assert oracle(valid_records(blob)) <= points(result)
        whole = summary(result)
        for size in (7, 300):
            with window(size):
                assert summary(read(folder, blob, verify=verify)) == whole


# -- the seed corpus ------------------------------------------------------------------------

def seeds() -> dict[str, bytes]:
    """Small event files from torch's SummaryWriter and tensorboardX, some damaged."""
    import numpy as np
    import tensorboardX
    from torch.utils.tensorboard import SummaryWriter

    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def written(name: str, make: Any, writer_type: Any = SummaryWriter) -> bytes:
            folder = os.path.join(tmp, name)
            writer = writer_type(folder)
            make(writer)
            writer.close()
            (file,) = os.listdir(folder)
            return Path(folder, file).read_bytes()

        def scalars(w: Any) -> None:
            for step in range(12):
                w.add_scalar("train/loss", 1.0 / (step + 1), step)
                w.add_scalar("lr", 0.1, step)

        def with_nan(w: Any) -> None:
            for step in range(8):
                w.add_scalar("train/loss", math.nan if step == 5 else step * 0.5, step)
            w.add_scalar("grad_norm", math.inf, 8, walltime=math.nan)

        def new_style(w: Any) -> None:  # tensor-encoded scalars: the slow path
            for step in range(6):
                w.add_scalar("train/loss", math.inf if step == 4 else 0.5, step, new_style=True)

        def histograms(w: Any) -> None:
            for step in range(3):
                w.add_histogram("weights/fc.weight", np.linspace(-1, 1, 50) * (step + 1), step,
                                bins=8)
                w.add_scalar("train/loss", 0.5, step)

        torch_scalars = written("scalars", scalars)
        out["events.out.tfevents.1.summarywriter-scalars"] = torch_scalars
        out["events.out.tfevents.2.summarywriter-nan"] = written("nan", with_nan)
        out["events.out.tfevents.3.summarywriter-histograms"] = written("hist", histograms)
        out["events.out.tfevents.8.summarywriter-new-style"] = written("new", new_style)
        tbx = written("tbx", with_nan, tensorboardX.SummaryWriter)
        out["events.out.tfevents.4.tensorboardx-nan"] = tbx
        out["events.out.tfevents.5.cut"] = torch_scalars[: len(torch_scalars) - 9]
        out["events.out.tfevents.6.zero-tail"] = torch_scalars + b"\0" * 2048
        out["events.out.tfevents.7.two-writers"] = torch_scalars[:700] + tbx
        # Headers that check, each claiming the rest of the file, between two records.
        d = valid_records(torch_scalars)[len(valid_records(torch_scalars)) // 2][0]
        size = len(torch_scalars) + 12 * 40
        out["events.out.tfevents.9.claims-to-the-end"] = (
            torch_scalars[:d] + claims(d, 40, size) + torch_scalars[d:])
    return out
