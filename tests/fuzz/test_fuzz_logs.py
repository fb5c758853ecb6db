"""Fuzz target: text logs and ``trainer_state.json``.

Inputs are structure-aware: metric lines in the styles the readers know (Hugging Face
dicts, tqdm and Lightning bars redrawn with carriage returns, Keras, DeepSpeed, plain
``step N loss X``) with NaN and Inf among their values, mixed with NUL runs, CR and
backspace runs, invalid UTF-8, noise and lines longer than the record cap. They are read
with a small record cap and small read chunks (both monkeypatched), so that chunk
boundaries fall inside records, separators, holes and multi-byte characters.

Properties, each of which a reader bug can break:

- ``read_log`` never raises, and each series' arrays have one length;
- what a file gives (points, events, issues, the first non-finite value) does not depend
  on where its chunks end: the oracle is the same file read as one chunk;
- a run of NUL bytes put between two lines loses neither: the points and events are those
  of the file without it, and the run is reported;
- a ``trainer_state.json`` (indented as the Trainer writes it, or compact) cut anywhere
  keeps exactly the records that end before the cut: the oracle is where each record
  ends in the text that was written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest.logformats import reader as reader_module
from analyzer.ingest.logs import LogRead, read_log
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.make_corpus import corpus_files

pytestmark = pytest.mark.fuzz

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
ONE_CHUNK = 1 << 40

VALUES = st.sampled_from(
    ["nan", "inf", "-inf", "NaN", "-nan", "1.#INF", "Infinity", "0.25", "1.0", "3e-05", "12.5"]
) | st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: f"{v:.4g}")
STEPS = st.integers(0, 5000)

LINES = st.one_of(
    st.builds("{{'loss': {}, 'grad_norm': {}, 'learning_rate': 1e-05, 'epoch': 0.{}}}".format,
              VALUES, VALUES, STEPS),
    st.builds(" {}%|#         | {}/5000 [00:01<04:11,  4.95it/s]".format, STEPS, STEPS),
    st.builds("Epoch {}:  50%|#| {}/40 [00:01<00:01, 3.1it/s, loss={}, v_num=0]".format,
              st.integers(0, 9), st.integers(0, 40), VALUES),
    st.builds("{}/40 [==============================] - 1s 5ms/step - loss: {} - acc: 0.5".format,
              st.integers(0, 40), VALUES),
    st.builds("Epoch {}/10".format, st.integers(1, 10)),
    st.builds("[2024-03-11 10:02:31,378] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
              "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {}, reducing to {}".format,
              st.sampled_from(["65536", "2", "1"]), st.sampled_from(["32768", "1", "1.0"])),
    st.builds("[Rank 0] step={}, skipped={}, lr=[{}], mom=[(0.9, 0.999)]".format,
              STEPS, st.integers(0, 9), VALUES),
    st.builds("step {} loss {}".format, STEPS, VALUES),
    st.builds("step={} loss={} grad_norm={}".format, STEPS, VALUES, VALUES),
    st.builds("iter {}: loss {}, time 12.5ms, mfu 1.2%".format, STEPS, VALUES),
    st.just("Current loss scale already at minimum - Attempted loss scale: 1, reducing to 1"),
    st.just("RuntimeError: Function 'LogBackward0' returned nan values in its 0th output."),
    st.text(max_size=30),
)
"""One record's text, in a style some reader knows (or noise)."""

DAMAGE = st.sampled_from(
    [b"\x00", b"\x00" * 7, b"\x00" * 300, b"\r", b"\r\r", b"\x08", b"\x08\x08\x08", b"\xff",
     b"\xe2\x82", b"\xc3", b"\xef\xbb\xbf", b"\x1b[32m", b"\x1b[0m", b"\x1b[", b"\x1b[m\x0f",
     b"\x1b(B", b"\x1b]0;train\x07", b"\x1b]0;", b"\x07", b"\x0f"]
)
ENCODINGS = st.sampled_from(["utf-8"] * 5 + ["utf-16"])
"""Mostly UTF-8; sometimes UTF-16 with its byte-order mark, as Windows PowerShell writes."""
ENDS = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r", b"\x08\x08", b"\x00" * 5, b""])


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    """A log: records, each followed by a line end or separator, with damage put in."""
    out = []
    for _ in range(draw(st.integers(1, 25))):
        text = draw(LINES).encode("utf-8", "surrogatepass")
        if draw(st.integers(0, 9)) == 0:
            text = text * draw(st.integers(2, 12))  # past a small record cap
        if draw(st.booleans()):
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(DAMAGE) + text[at:]
        out.append(text + draw(ENDS))
    return b"".join(out)


@contextmanager
def chunking(monkeypatch: pytest.MonkeyPatch, chunk: int, cap: int | None = None) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setattr(reader_module, "CHUNK_BYTES", chunk)
        if cap is not None:
            patch.setattr(reader_module, "LINE_CAP", cap)
        yield


def outcome(read: LogRead) -> tuple[Any, ...]:
    """Everything a read gives that a chunk boundary must not change."""
    pts = sorted(
        (int(line), s.tag, -1 if s.rank is None else s.rank, int(step), repr(float(v)))
        for s in read.series
        for step, v, line in zip(s.steps, s.values, s.positions, strict=True)
    )
    first = next(((p[0], p[1]) for p in pts if not math.isfinite(float(p[4]))), None)
    events = [(e.kind, e.step, e.location.line, e.message, sorted(map(str, e.detail.items())))
              for e in read.events]
    # Issues are listed as they are found, which a boundary may reorder.
    issues = sorted(str(i) for i in read.issues)
    return pts, first, events, issues, read.framework, read.confidence


def _write(tmp_path: Path, data: bytes, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@fuzz_settings(300)
@given(logs(), st.integers(1, 160), st.sampled_from([24, 64, 1 << 16]), ENCODINGS)
def test_records_do_not_depend_on_where_chunks_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, chunk: int, cap: int,
    encoding: str,
) -> None:
    if encoding != "utf-8":  # odd chunk sizes split its code units
        data = data.decode("utf-8", "replace").encode(encoding)
    path = _write(tmp_path, data)
    with chunking(monkeypatch, ONE_CHUNK, cap):
        whole = read_log(str(path))
    with chunking(monkeypatch, chunk, cap):
        read = read_log(str(path))
    for s in read.series:
        assert len(s.steps) == len(s.values) == len(s.positions)
    assert outcome(read) == outcome(whole)


@st.composite
def clean_logs(draw: st.DrawFn) -> list[bytes]:
    """Whole lines, each ending in a newline."""
    lines = draw(st.lists(LINES, min_size=2, max_size=20))
    # One line each: no NUL (the run is put in by the test) and no newline inside.
    raw = (line.encode("utf-8", "surrogatepass") for line in lines)
    return [r.replace(b"\x00", b"").replace(b"\n", b" ") + b"\n" for r in raw]


@fuzz_settings(200)
@given(clean_logs(), st.data(), st.integers(1, 5000), st.integers(1, 200))
def test_a_nul_run_between_two_lines_loses_neither(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lines: list[bytes],
    data: st.DataObject,
    run: int,
    chunk: int,
) -> None:
    at = data.draw(st.integers(1, len(lines) - 1))
    without = _write(tmp_path, b"".join(lines), "plain.log")
    holed = _write(tmp_path, b"".join(lines[:at]) + b"\x00" * run + b"".join(lines[at:]))
    with chunking(monkeypatch, chunk):
        plain, read = read_log(str(without)), read_log(str(holed))
    pts, first, events, *_ = outcome(read)
    assert (pts, first) == outcome(plain)[:2]
    assert [e[:4] for e in events] == [e[:4] for e in outcome(plain)[2]]
    refused = {"empty_file", "not_text"} & {i.kind for i in plain.issues}
    if refused:  # judged on the text, NULs aside: the same either way
        assert refused <= {i.kind for i in read.issues}
        return
    holes = [i for i in read.issues if i.kind == "zero_run"]  # text follows the run
    assert len(holes) == 1 and f"{run} NUL bytes" in holes[0].message
    assert holes[0].location.line == at + 1
    assert holes[0].location.offset == len(b"".join(lines[:at]))


RECORD = st.fixed_dictionaries(
    {"loss": VALUES, "grad_norm": VALUES, "learning_rate": st.just("1e-05")},
    optional={"epoch": st.just("0.5"), "eval_loss": VALUES},
)


def _json_value(text: str) -> float:
    return float(text.replace("1.#INF", "inf").replace("-nan", "nan"))


@fuzz_settings(200)
@given(st.lists(RECORD, min_size=1, max_size=12), st.booleans(), st.floats(0, 1))
def test_a_cut_trainer_state_keeps_exactly_the_records_before_the_cut(
    tmp_path: Path, records: list[dict[str, str]], indented: bool, where: float
) -> None:
    history = [
        {**{k: _json_value(v) for k, v in r.items()}, "step": 10 * (i + 1)}
        for i, r in enumerate(records)
    ]
    if indented:  # how the Trainer writes it: json.dumps(indent=2, sort_keys=True)
        state = {"best_metric": None, "global_step": 10 * len(history),
                 "log_history": history, "max_steps": 500}
        text = json.dumps(state, indent=2, sort_keys=True)
        ends, pos = [], 0
        for _ in history:
            pos = text.index("\n    }", pos) + len("\n    }")
            ends.append(pos)
    else:
        head = '{"best_metric": null, "global_step": 10, "log_history": ['
        parts = [json.dumps(h) for h in history]
        text = head + ", ".join(parts) + '], "max_steps": 500}'
        ends = [len(head) + sum(len(p) + 2 for p in parts[:i]) + len(parts[i])
                for i in range(len(parts))]
    cut = int(len(text) * where)
    path = _write(tmp_path, text.encode(), "trainer_state.json")
    full = outcome(read_log(str(path)))[0]
    path.write_bytes(text[:cut].encode())
    read = read_log(str(path))
    kept = {10 * (i + 1) for i, end in enumerate(ends) if end <= cut}
    assert outcome(read)[0] == [p for p in full if p[3] in kept]
    if cut < ends[-1]:
        damage = {"truncated", "bad_json"} if text[:cut].strip() else {"empty_file"}
        assert {i.kind for i in read.issues} & damage


def _state_text(records: list[dict[str, str]], indented: bool) -> tuple[str, list[tuple[int, int]]]:
    """A trainer state as the Trainer (indented) or ``json.dumps`` (compact) writes it, and
    where each record of its log_history begins and ends."""
    history = [
        {**{k: _json_value(v) for k, v in r.items()}, "step": 10 * (i + 1)}
        for i, r in enumerate(records)
    ]
    state = {"best_metric": None, "global_step": 10 * len(history), "log_history": history,
             "max_steps": 500}
    text = json.dumps(state, indent=2 if indented else None, sort_keys=True)
    spans, pos = [], text.index("[", text.index('"log_history"'))
    for _ in history:
        pos = text.index("{", pos)
        end = text.index("}", pos) + 1
        spans.append((pos, end))
        pos = end
    return text, spans


def _points(read: LogRead, lines: bool) -> list[tuple[Any, ...]]:
    return [p if lines else p[1:] for p in outcome(read)[0]]


@fuzz_settings(300)
@given(st.lists(RECORD, min_size=1, max_size=8), st.booleans(), st.floats(0, 1),
       st.integers(1, 600), st.sampled_from(["insert", "insert", "lose"]))
def test_a_nul_run_in_a_trainer_state_loses_only_the_record_it_falls_in(
    tmp_path: Path, records: list[dict[str, str]], indented: bool, where: float, run: int,
    how: str,
) -> None:
    # "insert": NULs put in (the oracle: the file without them); "lose": bytes replaced by
    # NULs, as a block that never reached the disk leaves them.
    text, spans = _state_text(records, indented)
    path = _write(tmp_path, text.encode(), "trainer_state.json")
    full = read_log(str(path))
    first = text.index("[", text.index('"log_history"')) + 1  # the list's key stays whole
    at = first + int((len(text) - first - 1) * where)
    if how == "insert":
        damaged, end = text[:at] + "\0" * run + text[at:], at
    else:
        end = min(at + run, len(text))
        damaged = text[:at] + "\0" * (end - at) + text[end:]
    path.write_bytes(damaged.encode())
    read = read_log(str(path))
    lines = how == "insert"  # a lost block takes its newlines, moving the lines after it
    got, whole = _points(read, lines), _points(full, lines)
    # Never a value the file did not hold, nor one under another record's step.
    assert set(got) <= set(whole)
    # Every record the run does not reach is kept whole.
    untouched = {10 * (i + 1) for i, (a, b) in enumerate(spans) if b <= at or a >= end}
    step = 3 if lines else 2
    assert [p for p in whole if p[step] in untouched] == [p for p in got if p[step] in untouched]
    if how == "insert" and not any(a < at < b for a, b in spans):
        assert got == whole  # a run between records (or outside them) loses nothing
    # The run is reported where it begins.
    kind = "zero_tail" if end == len(text) else "zero_run"
    holes = [i for i in read.issues if i.kind == kind]
    assert len(holes) == 1 and holes[0].location.offset == at
    assert holes[0].location.line == text.count("\n", 0, at) + 1


@pytest.mark.parametrize("path", corpus_files("logs"), ids=lambda p: Path(p).name)
@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_corpus_files_read_the_same_in_any_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, chunk: int
) -> None:
    name = "trainer_state.json" if path.endswith("trainer_state.json") else "train.log"
    target = _write(tmp_path, Path(path).read_bytes(), name)
    with chunking(monkeypatch, ONE_CHUNK, 64):
        whole = read_log(str(target))
    with chunking(monkeypatch, chunk, 64):
        assert outcome(read_log(str(target))) == outcome(whole)


# -- the seed corpus ----------------------------------------------------------------------


def _hole(data: bytes, size: int = 4096) -> bytes:
    """A zero-filled block in the middle, at a line start, as a lost write leaves it."""
    at = data.index(b"\n", len(data) // 2) + 1
    return data[:at] + b"\x00" * size + data[at:]


def _cut(data: bytes) -> bytes:
    return data[: int(len(data) * 0.6)]


def _state_seed(indent: int | None) -> bytes:
    history = [{"epoch": i / 50, "grad_norm": 2.0 - i / 10, "learning_rate": 1e-05 * i,
                "loss": 2.5 - i / 20, "step": 10 * i} for i in range(1, 6)]
    history[3]["grad_norm"] = float("inf")
    history[4]["loss"] = float("nan")
    state = {"best_metric": None, "best_model_checkpoint": None, "epoch": 0.1,
             "global_step": 50, "is_world_process_zero": True, "log_history": history,
             "logging_steps": 10, "max_steps": 500, "trial_params": None}
    return json.dumps(state, indent=indent, sort_keys=True).encode()


def seeds() -> dict[str, bytes]:
    """Small real-looking logs and trainer states, each also cut and with a NUL hole."""
    bases = {
        "hf_trainer_nan.log": (FIXTURES / "hf_trainer_nan_filter.log").read_bytes(),
        "lightning_bar.log": (FIXTURES / "lightning_nan.log").read_bytes(),
        "keras.log": (FIXTURES / "keras3_terminate_on_nan.log").read_bytes(),
        "deepspeed.log": (FIXTURES / "deepspeed_overflow.log").read_bytes(),
        "generic_loop.txt": (FIXTURES / "generic_loop.txt").read_bytes(),
        "indented-trainer_state.json": _state_seed(2),
        "compact-trainer_state.json": _state_seed(None),
    }
    out = {}
    for name, data in bases.items():
        # The damage goes in front of the name's ending, which decides the reader.
        stem, ending = name.split("-") if "-" in name else name.split(".")
        ending = "-" + ending if "-" in name else "." + ending
        out[name] = data
        out[f"{stem}_cut{ending}"] = _cut(data)
        out[f"{stem}_hole{ending}"] = _hole(data) if b"\n" in data else data + bytes(4096)
    out["zero_tail.log"] = bases["hf_trainer_nan.log"][:2000] + bytes(8192)
    return out
