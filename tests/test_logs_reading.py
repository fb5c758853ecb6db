"""Reading damaged, odd and hostile log text: never raise, keep what can be read."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.ingest.logformats import PARSERS, fast
from analyzer.ingest.logformats import reader as reader_module
from analyzer.ingest.logformats import store as store_module
from analyzer.ingest.logformats.reader import LINE_CAP
from analyzer.ingest.logs import LogRead, read_log

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
SHARED_TMP = [HealthCheck.function_scoped_fixture]
"""Examples overwrite the same file in tmp_path, which is what they should do."""


def write(tmp_path: Path, data: bytes | str, name: str = "train.log") -> str:
    path = tmp_path / name
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return str(path)


def points(read: LogRead) -> list[tuple[str, int | None, int, str, int]]:
    """(tag, rank, step, repr(value), line) of every point, in line order."""
    out = []
    for s in read.series:
        for step, value, line in zip(s.steps, s.values, s.positions, strict=True):
            out.append((s.tag, s.rank, int(step), repr(float(value)), int(line)))
    return sorted(out, key=lambda p: (p[4], p[0], p[2]))


def test_carriage_return_runs_keep_the_last_state_and_the_nonfinite_ones(tmp_path: Path) -> None:
    bar = "Epoch 0:  {p}%|#| {n}/4 [00:01<00:01, 3.1it/s, loss={v}, v_num=1]"
    line = "\r".join(
        bar.format(p=25 * n, n=n, v=v) for n, v in ((1, "1.5"), (2, "nan"), (3, "1.2"))
    )
    path = write(tmp_path, "header\n" + line + "\r\nnext\n")
    (loss,) = read_log(path).series
    assert loss.steps.tolist() == [1, 2]
    assert loss.positions.tolist() == [2, 2]
    assert math.isnan(loss.values[0])


def test_regression_a_padded_bar_frame_is_a_redraw_not_a_record(tmp_path: Path) -> None:
    """tqdm pads a frame that is shorter than the one it draws over with spaces (the rate
    went from 125.60it/s to 95.21it/s). The padded frame was taken for a record printed
    onto the bar and kept, a stale value among the last states: Lightning's first frame of
    a count still shows the step before's loss, so the console read 2.97e+25 at the step
    whose loss was 7.02e+26, on a loaded machine only."""
    frames = [
        "Epoch 2:  12%|#1        | 1/8 [00:00<00:00, 125.60it/s, v_num=0, train_loss=2.97e+25]",
        "Epoch 2:  25%|##5       | 2/8 [00:00<00:00, 95.21it/s, v_num=0, train_loss=2.97e+25] ",
        "Epoch 2:  25%|##5       | 2/8 [00:00<00:00, 93.63it/s, v_num=0, train_loss=7.02e+26]",
        "Epoch 2:  38%|###7      | 3/8 [00:00<00:00, 119.74it/s, v_num=0, train_loss=inf]",
    ]
    path = write(tmp_path, "header\n" + "\r".join(frames) + "\n")
    (loss,) = read_log(path).series
    assert loss.values.tolist() == [float("inf")]  # the last state, and it is non-finite


def test_record_glued_after_a_progress_bar_is_found(tmp_path: Path) -> None:
    text = "  1%|1 | 7/500 [00:02<02:40,  3.07it/s]{'loss': nan, 'grad_norm': nan, 'epoch': 0.01}\n"
    read = read_log(write(tmp_path, text))
    assert {(t, step) for t, _, step, _, _ in points(read)} == {("loss", 7), ("grad_norm", 7)}


def test_crlf_bom_and_backspaces(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbfstep 1 loss 2.0\r\nstep 2 loss 1.0\x08\x08\x08step 3 loss nan\r\n"
    read = read_log(write(tmp_path, data))
    assert [(p[2], p[4]) for p in points(read)] == [(1, 1), (2, 2), (3, 2)]


def test_ansi_colours_are_dropped(tmp_path: Path) -> None:
    read = read_log(write(tmp_path, "\x1b[32mstep 5 loss\x1b[0m nan\n"))
    assert [(p[0], p[2]) for p in points(read)] == [("loss", 5)]


def test_invalid_utf8_is_replaced_counted_and_located(tmp_path: Path) -> None:
    data = b"step 1 loss 1.0\nstep 2 \xff\xfe loss 2.0\nstep 3 loss nan\n"
    read = read_log(write(tmp_path, data))
    assert [p[2] for p in points(read)] == [1, 2, 3]
    (issue,) = read.issues
    assert issue.kind == "bad_line" and issue.location.line == 2


def test_many_bad_lines_are_summarised(tmp_path: Path) -> None:
    read = read_log(write(tmp_path, b"\xff junk\n" * 500 + b"step 9 loss 1.0\n"))
    bad = [i for i in read.issues if i.kind == "bad_line"]
    assert len(bad) == 21 and "500 lines" in bad[-1].message
    assert points(read)[0][4] == 501


def test_long_line_is_cut_with_a_marker_and_reading_goes_on(tmp_path: Path) -> None:
    data = "step 1 loss 1.0\n" + "x" * (LINE_CAP * 3) + " loss nan\nstep 3 loss nan\n"
    read = read_log(write(tmp_path, data))
    (issue,) = read.issues
    assert issue.kind == "long_line" and issue.location.line == 2
    assert [(p[2], p[4]) for p in points(read)] == [(1, 1), (3, 3)]


def test_endless_line_without_newline_is_bounded(tmp_path: Path) -> None:
    # Longer than one read chunk, so the cut happens while the line is still pending.
    data = "step 1 loss 1.0\n" + "y" * (5 << 20)
    read = read_log(write(tmp_path, data))
    assert [i.kind for i in read.issues] == ["long_line"]
    assert len(points(read)) == 1


def test_endless_progress_bar_collapses(tmp_path: Path) -> None:
    states = [
        f"Epoch 0: 1%|#| {n}/99999 [00:01<9:00, 9.9it/s, loss=1.0, v_num=0]"
        for n in range(1, 60001)
    ]
    read = read_log(
        write(tmp_path, "\r".join(states) + "\rEpoch 0: 1%|#| 60001/99999 [, loss=nan]")
    )
    (loss,) = read.series
    assert loss.steps.tolist() == [60000] and math.isnan(loss.values[-1])
    assert loss.positions.tolist() == [1]
    assert read.issues == ()


def test_truncated_last_line_is_read(tmp_path: Path) -> None:
    read = read_log(write(tmp_path, "iter 0: loss 4.2, time 1ms, mfu 1%\niter 10: loss nan, t"))
    assert [(p[2], p[4]) for p in points(read)] == [(0, 1), (10, 2)]


@pytest.mark.parametrize(
    ("prefix", "rank"),
    [("> ", None), (">> ", None), ("[rank3]: ", 3), ("[default2]:", 2), ("[1,5]<stdout>:", 5)],
)
def test_pasted_and_launcher_prefixes(tmp_path: Path, prefix: str, rank: int | None) -> None:
    text = "".join(
        f"{prefix}iter {n}: loss {v}, time 1ms, mfu 1%\n" for n, v in ((1, 2), (2, "nan"))
    )
    read = read_log(write(tmp_path, text))
    assert [(p[1], p[2]) for p in points(read)] == [(rank, 1), (rank, 2)]
    assert read.framework == "nanogpt"


def test_srun_labels_are_ranks_and_cat_n_numbers_are_not(tmp_path: Path) -> None:
    srun = "".join(f"{r}: iter {n}: loss 1.0, time 1ms, mfu 1%\n" for n in range(3) for r in (0, 1))
    read = read_log(write(tmp_path, srun))
    assert {p[1] for p in points(read)} == {0, 1}
    numbered = "".join(f"{i + 1:6d}\titer {i}: loss 1.0, time 1ms, mfu 1%\n" for i in range(5))
    read = read_log(write(tmp_path, numbered, "pasted.txt"))
    assert [(p[1], p[2]) for p in points(read)] == [(None, i) for i in range(5)]


def test_empty_unreadable_and_binary_files(tmp_path: Path) -> None:
    assert [i.kind for i in read_log(write(tmp_path, b"")).issues] == ["empty_file"]
    assert [i.kind for i in read_log(str(tmp_path)).issues] == ["not_regular"]
    assert [i.kind for i in read_log(write(tmp_path, b"\x00" * 4096, "x.out")).issues] == [
        "empty_file"
    ]
    assert [i.kind for i in read_log(write(tmp_path, bytes(range(256)) * 64, "y.out")).issues] == [
        "not_text"
    ]
    missing = read_log(str(tmp_path / "gone.log"))
    assert missing.issues[0].kind == "unreadable" and missing.series == ()


ADVERSARIAL = [
    "1" * LINE_CAP,
    "a" * LINE_CAP,
    "nan" * (LINE_CAP // 3),
    "loss: " * (LINE_CAP // 6),
    "loss=" * (LINE_CAP // 5),
    "{'" * (LINE_CAP // 2),
    "{'a': " * (LINE_CAP // 6),
    '"a": "' * (LINE_CAP // 6),
    "1." * (LINE_CAP // 2),
    "1e" * (LINE_CAP // 2),
    "- a: " * (LINE_CAP // 5),
    "iteration 1/ 2 |" + " |" * (LINE_CAP // 2 - 20),
    "Epoch 0: " + "1/" * (LINE_CAP // 2 - 10),
    "step " * (LINE_CAP // 5),
    "a.b." * (LINE_CAP // 4),
    "Error" * (LINE_CAP // 5),
    '  File "' * (LINE_CAP // 8),
    "| epoch 001 |" + " x" * (LINE_CAP // 2 - 10),
    "     0/299 " + "1 " * (LINE_CAP // 2 - 10),
    "loss " + " " * (LINE_CAP - 10) + "x",
    "Test:" + " " * (LINE_CAP - 20) + "eta: ",
    "[" + " " * (LINE_CAP - 20) + "1/2] eta: ",
    "Epoch: [1]" + "[1/2]" * (LINE_CAP // 5 - 10) + " eta: ",
    "A" * 40 + ": [1/2]\teta: " * (LINE_CAP // 60),
    "Averaged stats:" + " loss: 1 (1)" * (LINE_CAP // 12 - 10),
    "* Acc@" + "1 " * (LINE_CAP // 2 - 10),
    "Loss is nan, stopping training",
    "{'a': tensor(" * (LINE_CAP // 13),
    "Loss is nan, stopping training",
    "{'" + "a" * (LINE_CAP - 40) + "': tensor(nan)}",
    "Train: 1 [" + " " * (LINE_CAP - 20),
    "Train: 1 [ 1/2 (" * (LINE_CAP // 16),
    "Test: [ 1/2]  Loss:" * (LINE_CAP // 19),
    "Epoch: [1][1/2]\t" + "Loss 1 (" * (LINE_CAP // 8 - 4),
    "Test: [1/2]\t" + "a 1 (1)\t" * (LINE_CAP // 8 - 4),
    "Epoch: [" * (LINE_CAP // 8),
    "\x1b]" * (LINE_CAP // 2),
    "\x1b]0;" + "a" * (LINE_CAP - 10),
]


@pytest.mark.timeout(60)
def test_adversarial_long_lines_are_read_in_linear_time(tmp_path: Path) -> None:
    # Each line alone would take minutes under a pattern that backtracks quadratically.
    data = "\n".join(ADVERSARIAL * 3) + "\n"
    read = read_log(write(tmp_path, data))
    assert all(i.kind != "unreadable" for i in read.issues)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=2000))
def test_any_bytes_never_raise(tmp_path: Path, data: bytes) -> None:
    read = read_log(write(tmp_path, data))
    for s in read.series:
        assert len(s.steps) == len(s.values) == len(s.positions)


LINES = st.sampled_from(
    [
        "iter 3: loss nan, time 1ms, mfu 1%",
        "{'loss': 1.0, 'grad_norm': inf, 'epoch': 0.1}",
        "Epoch 0:  50%|#| 2/4 [00:01<00:01, 3.1it/s, loss=nan, v_num=1]",
        " iteration 10/ 100 | lm loss: 1.0E+00 | number of nan iterations: 2 |",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4, reducing to 2",
        "RuntimeError: Function 'MulBackward0' returned nan values in its 1th output.",
        "[rank1]: step 4 loss -inf",
        "Batch 3: Invalid loss, terminating training",
        "step " + "7" * 4400 + " loss nan",
        "step ٣٤ loss inf",
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.one_of(LINES, st.text(max_size=80)), max_size=30),
    st.sampled_from(["\n", "\r", "\r\n"]),
)
def test_any_text_never_raises(tmp_path: Path, lines: list[str], sep: str) -> None:
    read_log(write(tmp_path, sep.join(lines)))


FIXTURE_NAMES = sorted(p.name for p in FIXTURES.glob("*.*"))


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(FIXTURE_NAMES), st.floats(0.0, 1.0))
def test_a_cut_log_keeps_every_complete_line(tmp_path: Path, name: str, where: float) -> None:
    data = (FIXTURES / name).read_bytes()
    cut = data[: int(len(data) * where)]
    whole = points(read_log(write(tmp_path, data, name)))
    part = points(read_log(write(tmp_path, cut, "cut_" + name)))
    complete = cut.count(b"\n")
    kept = [p for p in whole if p[4] <= complete]
    assert [p for p in part if p[4] <= complete] == kept


RICH_BAR = "Epoch 3/9  ━━━━━━━━━━━━━━━━━━━━ 40/50 0:00:12 • 0:00:03 3.21it/s v_num: 0 loss: nan"
ALL_LINES = [
    line
    for path in sorted(FIXTURES.glob("*.*"))
    for line in path.read_text(encoding="utf-8").splitlines()
    if line.strip()
] + [RICH_BAR, "{'AP': 41.2, 'AP50': 60.1}"] * 5


@pytest.mark.parametrize(
    "lines",
    [
        # a Keras bar makes Keras the last parser; Lightning, earlier in the order, owns this bar
        ["Epoch 1/10", "  1/1875 [>.....] - ETA: 1s - loss: 2.3", RICH_BAR],
        # a metrics dict makes the Hugging Face parser the last one; detectron2 owns loss_dict
        [
            "{'AP': 41.2, 'AP50': 60.1}",
            "FloatingPointError: Loss became infinite or NaN at iteration=66!",
            "loss_dict = {'loss_cls': nan, 'loss_box_reg': 4.871}",
        ],
    ],
)
def test_order_wins_over_the_last_parser(tmp_path: Path, lines: list[str]) -> None:
    read = read_log(write(tmp_path, "\n".join(lines) + "\n"))
    first_bad = next(p for p in points(read) if p[3] in ("nan", "inf", "-inf"))
    assert first_bad[4] == 3
    assert first_bad[:3] in (("loss", None, 3 * 50 + 40 - 1), ("loss_cls", None, 66))


def _summary(read: LogRead) -> tuple[object, ...]:
    events = [(e.kind, e.step, e.location.line, sorted(e.detail.items())) for e in read.events]
    return (points(read), repr(events), read.framework, read.notes)


def _without_shortcuts(patch: pytest.MonkeyPatch, which: str) -> None:
    """Switch one of the dispatcher's shortcuts off: bulk reading (no parser is ever the
    recent one), or the per-shape memo (every record is looked at afresh)."""
    from analyzer.ingest.logformats import dispatch

    if which == "bulk":
        for parser in PARSERS:
            patch.setattr(parser, "repeats", False)
    else:
        patch.setattr(dispatch, "MEMO_CHARS", -1)


@settings(max_examples=60, deadline=None, suppress_health_check=SHARED_TMP)
@given(lines=st.lists(st.sampled_from(ALL_LINES), min_size=1, max_size=60))
def test_the_dispatch_shortcuts_change_no_result(
    tmp_path: Path, lines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Oracle: record by record with each shortcut switched off in turn.
    path = write(tmp_path, "\n".join(lines) + "\n")
    fast = _summary(read_log(path))
    for which in ("bulk", "memo"):
        with monkeypatch.context() as patch:
            _without_shortcuts(patch, which)
            assert _summary(read_log(path)) == fast, which


def test_huge_numbers_never_raise(tmp_path: Path) -> None:
    # Python refuses int() on thousands of digits, and numpy refuses steps past int64.
    digits = "9" * 5000
    text = (
        f"step {digits} loss 1.0\n"
        f"iteration {digits}/ 5 | lm loss: 1.0 |\n"
        f"Epoch 1: 10%|#| 5/{digits} [00:01<00:09, loss=nan, v_num=0]\n"
        "epoch 001:    100 / 1102 loss=9.6, num_updates=1e300\n"
        f"RuntimeError: Function 'XBackward0' returned nan values in its {digits}th output.\n"
        f"  1%|1 | {digits}/{digits} [00:02<02:40,  3.07it/s]{{'loss': nan}}\n"
    )
    read = read_log(write(tmp_path, text))
    assert "bad_step" in {i.kind for i in read.issues}
    for s in read.series:
        assert all(-(2**63) <= int(step) < 2**63 for step in s.steps)


STATE_LINES = st.sampled_from(
    ['  "log_history": [', "    {", "    }", "  ],", '      "step": 10,', '      "loss": NaN,']
)


@settings(max_examples=100, deadline=None, suppress_health_check=SHARED_TMP)
@given(st.lists(st.one_of(STATE_LINES, st.text(max_size=40)), max_size=30))
def test_any_trainer_state_never_raises(tmp_path: Path, lines: list[str]) -> None:
    read_log(write(tmp_path, "{\n" + "\n".join(lines), "trainer_state.json"))


def _everything(read: LogRead) -> tuple[object, ...]:
    order = [(s.tag, s.rank, s.steps.dtype.str, s.values.dtype.str) for s in read.series]
    issues = [(i.kind, i.location.line, i.message) for i in read.issues]
    return (*_summary(read), order, issues, read.confidence)


def _plain(path: str, monkeypatch: pytest.MonkeyPatch) -> LogRead:
    with monkeypatch.context() as patch:
        patch.setattr(fast, "ENABLED", False)
        return read_log(path)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fast_readers_match_the_plain_parsers_on_fixtures(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(FIXTURES / name)
    assert _everything(read_log(path)) == _everything(_plain(path, monkeypatch))


_PLAIN_NUMBERS = st.sampled_from(["0", "0", "1", "0.0", "2.5E+00", "1.000E-04", "65536.0", "4."])
_ODD_NUMBERS = st.sampled_from(
    ["32768.0", "nan", "-nan", "inf", "-inf", "1.#INF", "3", "-2", "1e400", "12,000", "7" * 20,
     "x", "", ".5", "1_0", "٣"]
)
_NUMBERS = st.one_of(_PLAIN_NUMBERS, _PLAIN_NUMBERS, _PLAIN_NUMBERS, _ODD_NUMBERS)
_SHAPES = [
    " iteration <s>/  500 | consumed samples: <n> | learning rate: <n> | lm loss: <n> |"
    " loss scale: <n> | grad norm: <n> | number of skipped iterations: <z> |"
    " number of nan iterations: <z> |",
    " iteration <s>/  500 | learning rate: <n> | loss scale: <n> | grad norm: <n> |"
    " number of skipped iterations: <z> | number of nan iterations: <z> |",
    "2024/06/19 01:21:51 - mmengine - INFO - Epoch(train)  [<s>][<s>/1509]  lr: <n>"
    "  eta: 8:27:55  time: <n>  grad_norm: <n>  loss: <n>  loss_cls: <n>",
    "2024/06/19 01:21:51 - mmengine - INFO - Iter(val) [<s>/80]  eta: 0:00:01  loss: <n>",
    "Epoch [<s>][<s>/500]\tlr: <n>, eta: 0:01:02, time: 0.1, loss: <n>, loss_cls: <n>",
    "{'loss': <n>, 'grad_norm': <n>, 'learning_rate': <n>, 'epoch': <n>}",
    "  1%|1         | <s>/5000 [00:02<02:40,  3.07it/s]",
    "[2024-03-11 10:02:40,004] [INFO] [logging.py:96:log_dist] [Rank 0] step=<s>, skipped=<z>,"
    " lr=[<n>], mom=[(0.9, 0.999)]",
]
_FIELDS = {
    "<n>": _PLAIN_NUMBERS,
    "<s>": st.integers(0, 10**6).map(str),
    "<z>": st.sampled_from(["0", "0", "0", "  0", "0.0", "1"]),
}


@st.composite
def _dense_runs(draw: st.DrawFn) -> list[str]:
    """A run of lines of one shape, each differing from the first in at most one field."""
    pieces = re.split("(<[nsz]>)", draw(st.sampled_from(_SHAPES)))
    base = [draw(_FIELDS[p]) if p in _FIELDS else p for p in pieces]
    holes = [i for i, p in enumerate(pieces) if p in _FIELDS]
    prefix = draw(st.sampled_from(["", "", "", "[rank1]: ", "[rank0]: ", "> "]))
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        values = list(base)
        if draw(st.booleans()):
            hole = draw(st.sampled_from(holes))
            values[hole] = draw(st.one_of(_FIELDS[pieces[hole]], _ODD_NUMBERS))
        lines.append(prefix + "".join(values))
    return lines


@settings(max_examples=80, deadline=None, suppress_health_check=SHARED_TMP)
@given(
    runs=st.lists(
        st.one_of(_dense_runs(), _dense_runs(), st.lists(st.sampled_from(ALL_LINES), max_size=3)),
        max_size=8,
    ),
    sep=st.sampled_from(["\n", "\n", "\r\n", "\r"]),
)
def test_fast_readers_match_the_plain_parsers_on_generated_lines(
    tmp_path: Path, runs: list[list[str]], sep: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fast readers learn a shape from one line, then meet lines that differ from it
    # in one number: each such line must come out as the plain parser reads it.
    path = write(tmp_path, sep.join(line for run in runs for line in run) + "\n")
    assert _everything(read_log(path)) == _everything(_plain(path, monkeypatch))


_BAR_PIECES = st.sampled_from([
    " <d>%|#  | <d>/500 [00:<d><00:<d>,  4.<d>it/s]",
    "Epoch <d>:  <d>%|# | <d>/90 [00:<d><00:<d>, <d>.5it/s, loss=<v>, v_num=0]",
    "{'loss': <v>, 'grad_norm': <v>, 'learning_rate': 5e-05, 'epoch': 0.<d>}",
    "   ",
    "",
    "step <d> loss <v>",
])


def _filler(numbers: Iterator[str]) -> Callable[[re.Match[str]], str]:
    """For re.sub: a value for <v>, a one-digit count (the value's length) for <d>."""
    return lambda m: next(numbers) if m[0] == "<v>" else str(len(next(numbers)))


@settings(max_examples=60, deadline=None, suppress_health_check=SHARED_TMP)
@given(
    layouts=st.lists(st.lists(_BAR_PIECES, min_size=1, max_size=6), min_size=1, max_size=3),
    fills=st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.sampled_from(["0", "7", "12", "3.25", "nan",
                                                               "inf", "9e9"]), min_size=30,
                                              max_size=30)),
        min_size=1, max_size=12,
    ),
)
def test_lines_split_at_carriage_returns_by_a_remembered_layout_match_the_plain_split(
    tmp_path: Path, layouts: list[list[str]], fills: list[tuple[int, list[str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Physical lines of a few layouts (bar redraws and records joined by carriage
    # returns), their numbers changing from line to line, a NaN or Inf now and then:
    # the pieces kept by the layout remembered from an earlier line of the same key are
    # those the reader keeps when it splits each line afresh.
    lines = []
    for which, values in fills:
        pieces = "\r".join(layouts[which % len(layouts)])
        lines.append(re.sub("<[dv]>", _filler(iter(values)), pieces))
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert _everything(read_log(path)) == _everything(_plain(path, monkeypatch))


def test_fast_readers_take_long_runs_in_bulk_like_the_plain_parsers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Windows of lines grow while every line fits the shape; a line that breaks the
    # run (scale change, NaN count, another format) must be read as the plain parser reads it.
    lines = []
    for i in range(1, 3000):
        scale = "65536.0" if i < 1500 else "32768.0"
        nans = "1" if i == 2222 else "0"
        lines.append(
            f" [2024-08-01 09:44:55] iteration {i:8d}/  500000 | learning rate: 1.0E-04 |"
            f" lm loss: {i / 1000:.6E} | loss scale: {scale} | grad norm: 1.5 |"
            f" number of skipped iterations:   0 | number of nan iterations:   {nans} |"
        )
        if i % 701 == 0:
            lines.append("2024-03-11 10:02:05 | INFO | worker 5 prefetched shard 1553")
        if i % 997 == 0:
            lines.append(f"Epoch(train)  [1][{i:4d}/3000]  lr: 1.0e-04  loss: {i}.5")
    path = write(tmp_path, "\n".join(lines) + "\n")
    fast_read = read_log(path)
    assert _everything(fast_read) == _everything(_plain(path, monkeypatch))
    assert {e.kind for e in fast_read.events} == {"loss_scale", "nonfinite"}


def test_prefilters_agree_with_what_they_guard() -> None:
    from analyzer.ingest.logformats.generic import _METRIC, _may_name_a_metric

    for text in ["Grad Norm", "LOSS", "learning-rate", "ſcale", "K", "prose only", "Perplexity"]:
        assert _may_name_a_metric(text) or _METRIC.search(text) is None
    # The progress-bar test skips lower-casing when no 'a' or 'f' could appear in it.
    assert all(
        not any(x in c.lower() for x in "af") for c in map(chr, range(0x80, 0x110000))
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_metric_prefilter_never_hides_a_match(text: str) -> None:
    from analyzer.ingest.logformats.generic import _METRIC, _may_name_a_metric

    assert _may_name_a_metric(text) or _METRIC.search(text) is None


@settings(max_examples=60, deadline=None, suppress_health_check=SHARED_TMP)
@given(
    records=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
            st.sampled_from([None, 0, 1]),
            st.booleans(),
        ),
        max_size=60,
    )
)
def test_point_store_keeps_arrival_order(
    records: list[tuple[list[str], int | None, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Oracle: one list per (tag, rank), appended point by point, as the store replaced.
    monkeypatch.setattr(store_module, "PACK_ROWS", 3)
    store = store_module.PointStore()
    expected: dict[tuple[str, int | None], list[tuple[int, float, int]]] = {}
    for n, (tags, rank, text) in enumerate(records):
        values = [float(n * 10 + i) for i in range(len(tags))]
        if text:
            block = store.block(tuple(tags), rank, 1)
            store.add(block, n, n + 1, (str(n), *map(repr, values)))
        else:
            store.add(store.block(tuple(tags), rank), n, n + 1, tuple(values))
        for tag, value in zip(tags, values, strict=True):
            expected.setdefault((tag, rank), []).append((n, value, n + 1))
    got = {
        key: list(zip(steps.tolist(), values.tolist(), lines.tolist(), strict=True))
        for key, steps, values, lines in store.series()
    }
    assert list(got) == list(expected)
    assert got == expected


@pytest.mark.timeout(60)
def test_learned_shapes_stay_linear_on_adversarial_lines(tmp_path: Path) -> None:
    # A shape is learned from the first lines; then long lines that almost fit it
    # reach both the per-record and the bulk matching.
    learned = [
        " iteration 1/ 5 | lm loss: 1.0 | loss scale: 1.0 | number of nan iterations: 0 |",
        "Epoch(train)  [1][ 5/1509]  lr: 1.0e-04  loss: 2.5",
        "Iter(train) [ 5/80000]  lr: 1.0e-04  loss: 2.5",
        "{'loss': 1.0, 'grad_norm': 2.0, 'epoch': 0.1}",
    ]
    half = LINE_CAP // 2 - 40
    hostile = [
        "E" * (LINE_CAP - 1),
        "I" * (LINE_CAP - 1),
        "i" * (LINE_CAP - 1),
        "Epoch" * (LINE_CAP // 5),
        "iteration " * (LINE_CAP // 10),
        "Epoch(train)  [1][ 5/1509]  lr:" + " 1" * half,
        "Epoch(train)  [1][ 5/1509]  lr: " + "1" * (LINE_CAP - 40),
        " iteration 1/ 5 | lm loss: " + "1" * (LINE_CAP - 40),
        " iteration 1/ 5 | lm loss: 1.0 |" + " " * (LINE_CAP - 40),
        "{'loss': 1.0, 'grad_norm': " + "9" * (LINE_CAP - 40),
    ]
    lines = []
    for line in hostile:
        lines += [*learned, line, learned[0], learned[0], line, learned[1], learned[1], line]
    read = read_log(write(tmp_path, "\n".join(lines) + "\n"))
    assert read.framework is not None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=" \t:|ab1", max_size=30))
def test_megatron_fields_match_the_findall_they_replace(tail: str) -> None:
    from analyzer.ingest.logformats.megatron import _FIELD, fields_of

    assert fields_of(tail) == _FIELD.findall(tail)


_RANKED = "[rank1]:  iteration {}/ 99 | lm loss: 2.0 | grad norm: 1.5 | nan iterations: 0 |"
_OTHER = " iteration {}/ 99 | lm loss: 2.0 | nan iterations: 0 |"
_PLAIN = " iteration {}/ 99 | lm loss: 2.0 | grad norm: 1.5 | nan iterations: 0 |"


@pytest.mark.parametrize("chunk", [100, 150, 220, 300, 450])
def test_bulk_reading_across_batches_matches_the_plain_parsers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    # Small batches: a shape learned on a rank's line at the end of one batch meets
    # unprefixed lines of another shape, or of its own, at the start of the next.
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    lines = [_RANKED.format(1)] + [_OTHER.format(i) for i in range(2, 6)]
    lines += [rng.choice([_RANKED, _OTHER, _PLAIN]).format(i) for i in range(6, 120)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert _everything(read_log(path)) == _everything(_plain(path, monkeypatch))


def _mmengine_run(count: int) -> list[str]:
    lines = []
    for i in range(1, count):
        epoch, it = divmod(i, 400)
        loss = "nan" if i == 1711 else f"{i / 100:.4f}"
        pad = "\t" if i % 313 == 0 else "  "  # a line padded unlike the learned one
        lines.append(
            f"2024/06/19 01:21:51 - mmengine - INFO - Epoch(train)  [{epoch + 1}][{it:4d}/400]"
            f"  lr: 2.0000e-04  eta: 8:27:55  time: 0.2526{pad}grad_norm: {i % 7}.5"
            f"  loss: {loss}  loss_cls: 1.25"
        )
        if i % 997 == 0:
            lines.append(f"2024/06/19 01:21:51 - mmengine - INFO - Iter(val) [{i}/80]  loss: 0.5")
        if i % 1200 == 0:
            lines.append(f"Iter(train) [{i:5d}/90000]  lr: 1.0e-04  loss: {i}.25")
    return lines


@pytest.mark.parametrize("pack_rows", [7, 1 << 14])
def test_mmengine_bulk_and_packed_steps_match_the_plain_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack_rows: int
) -> None:
    # Long by-epoch runs go through the bulk path, their steps worked out per packed
    # block from the counters; a NaN, other padding, validation and by-iteration lines
    # break the run.
    monkeypatch.setattr(store_module, "PACK_ROWS", pack_rows)
    path = write(tmp_path, "\n".join(_mmengine_run(2500)) + "\n")
    fast_read = read_log(path)
    assert _everything(fast_read) == _everything(_plain(path, monkeypatch))
    loss = next(s for s in fast_read.series if s.tag == "loss" and len(s) > 100)
    assert loss.steps[:3].tolist() == [1, 2, 3]
    bad = int(np.flatnonzero(np.isnan(loss.values))[0])
    assert int(loss.steps[bad]) == 1711


def test_common_lines_take_the_fast_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Plain parsing stores points through Context.points_at; the fast paths do not.
    # A fast path that stopped matching its format's common line would leave the
    # results right and only the speed lost, so count what went the plain way.
    from analyzer.ingest.logformats.context import Context

    plain: list[tuple[str, ...]] = []
    original = Context.points_at

    def counting(self: Context, step: int, items: list[tuple[str, float]]) -> None:
        plain.append(tuple(tag for tag, _ in items))
        original(self, step, items)

    monkeypatch.setattr(Context, "points_at", counting)
    ds = (
        "[2024-03-11 10:02:40,004] [INFO] [logging.py:96:log_dist] [Rank 0] step={}, "
        "skipped=0, lr=[2.035667e-05], mom=[(0.9, 0.999)]"
    )
    megatron = (
        " [2024-08-01 09:44:55] iteration {:8d}/  500000 | consumed samples: 96 |"
        " learning rate: 1.274E-04 | lm loss: 7.486590E+00 | loss scale: 65536.0 |"
        " grad norm: 1.865 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    lines = [ds.format(i) for i in range(200)]
    lines += [megatron.format(i) for i in range(200)]
    lines += _mmengine_run(200)
    read = read_log(write(tmp_path, "\n".join(lines) + "\n"))
    assert sum(len(s) for s in read.series) > 1000
    # One plain record per shape learned (Megatron's and mmengine's first lines).
    assert len(plain) == 2, plain


_NEEDLE_TEXT = st.text(alphabet="ikpv{'=Lloss scaleiteration:_]/ \n", max_size=60)


@settings(max_examples=300, deadline=None)
@given(_NEEDLE_TEXT)
def test_sentinel_prefilter_agrees_with_plain_substring_search(text: str) -> None:
    from analyzer.ingest.logformats.dispatch import _holds_any, _needles

    triggers = tuple(t for parser in PARSERS for t in parser.triggers)
    for trigger in triggers:
        assert _holds_any(text, _needles((trigger,))) == (trigger in text)
    assert _holds_any(text, _needles(triggers)) == any(t in text for t in triggers)


_DIGIT_SWAP = str.maketrans("0123456789", "7418529630")


@settings(max_examples=200, deadline=None)
@given(
    line=st.sampled_from(ALL_LINES),
    noise=st.text(alphabet="0123456789 [rank]:>\tab{'=", max_size=12),
    numbered=st.booleans(),
)
def test_record_shapes_do_not_depend_on_digits(line: str, noise: str, numbered: bool) -> None:
    # The dispatcher remembers its answer per record with the digits zeroed; that is
    # right only if records differing in their digits alone get the same answer.
    from analyzer.ingest.logformats.context import Context
    from analyzer.ingest.logformats.dispatch import Dispatcher
    from analyzer.ingest.logformats.prefixes import PrefixRule

    rule = PrefixRule("rank" if numbered else "none")
    for text in (line, noise + line, line + noise):
        other = text.translate(_DIGIT_SWAP)
        shapes = []
        for sample in (text, other):
            prefixed, holders, fallback = Dispatcher(rule, Context("x")).shape_of(sample)
            shapes.append((prefixed, [type(p) for p in holders], fallback))
        assert shapes[0] == shapes[1]
