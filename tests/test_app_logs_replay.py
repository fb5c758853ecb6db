"""The Logs and Replay pages under AppTest, on a copy of the sample runs.

Logs: a run none of whose lines is non-finite still shows its log (first and last lines, a
line to go to, a filter) and the lines the analysis marked, with a way to jump to each.
Replay: a replay in float64 of a run that failed in float32 says so in one consistent way
and its passes table says what each pass ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest

from tests.test_app import frame_with, no_error, open_app, served_samples, texts


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from served_samples(tmp_path_factory, "logs_replay")


def _settled(at: AppTest) -> AppTest:
    """The page again once the replay it queued in the background is done."""
    from app import data

    if any(str(c.value).startswith("Replaying the captured step") for c in at.caption):
        data.replays.drain()
        at.run()
    return at


def _skips_run(root: Path) -> str:
    for path in sorted(root.glob("*/scenario.json")):
        sc = json.loads(path.read_text())
        if sc.get("benign_skips") and sc["expected"]["first_nonfinite_step"] is None:
            return path.parent.name
    pytest.skip("no sample run with benign overflow skips")


def _log_lines(root: Path, run: str) -> list[str]:
    return (root / run / "train.log").read_text(encoding="utf-8").splitlines()


def _logs(run: str) -> AppTest:
    at = open_app(run)
    at.switch_page("app_pages/logs.py").run()
    no_error(at)
    return at


def _viewer(at: AppTest) -> str:
    """The text of the log viewer (the last code block of the page)."""
    return str(at.code[-1].value)


def test_regression_logs_page_of_a_run_with_no_nonfinite_line_shows_the_log(
        runs: Path) -> None:
    name = _skips_run(runs)
    lines = _log_lines(runs, name)
    skips = [i + 1 for i, text in enumerate(lines) if "OVERFLOW" in text]
    assert skips, "the run's log holds overflow-skip lines"
    at = _logs(name)
    shown = texts(at)
    assert "reports a non-finite value" in shown
    assert f"The analysis marked {len(skips)} lines" in shown
    # the marked lines: every overflow skip, by line, with its message
    marked = frame_with(at, "event")
    assert list(marked["line"]) == skips
    assert set(marked["event"]) == {"overflow skip"}
    assert all("OVERFLOW" in m for m in marked["message"])
    # the log itself: its first lines, numbered, the skip lines flagged
    view = _viewer(at)
    assert f"{1:>6} | {lines[0].strip()}" in view
    assert f"* {skips[0]:>6} | " in view
    assert f"{len(lines)} lines in `train.log`" in shown
    _drawn_by_tables(at)


def test_logs_viewer_last_lines_go_to_a_line_and_filter(runs: Path) -> None:
    name = _skips_run(runs)
    lines = _log_lines(runs, name)
    at = _logs(name)
    at.radio(key="logs_mode").set_value("Last lines").run()
    no_error(at)
    assert f"{len(lines):>6} | {lines[-1].strip()}" in _viewer(at)
    assert f"{1:>6} | " not in _viewer(at) or len(lines) <= 40
    middle = len(lines) // 2
    at.number_input(key="logs_goto").set_value(middle).run()
    no_error(at)
    assert at.radio(key="logs_mode").value == "Around a line"
    assert f"→ {middle:>6} | " in _viewer(at)
    at.text_input(key="logs_filter").input("overflow").run()
    no_error(at)
    view = _viewer(at).splitlines()
    expected = [i + 1 for i, text in enumerate(lines) if "overflow" in text.lower()]
    assert [int(row[2:8]) for row in view] == expected


def test_a_marked_lines_button_shows_that_line(runs: Path) -> None:
    name = _skips_run(runs)
    at = _logs(name)
    marked = frame_with(at, "event")
    last = int(marked["line"].iloc[-1])
    buttons = [b for b in at.button if b.label.startswith(f"Line {last} (")]
    assert buttons, [b.label for b in at.button]
    buttons[0].click().run()
    no_error(at)
    assert at.radio(key="logs_mode").value == "Around a line"
    assert f"→ {last:>6} | " in _viewer(at)


def test_logs_of_a_failed_run_keep_the_nonfinite_line_and_add_the_viewer(
        runs: Path) -> None:
    for path in sorted(runs.glob("*/scenario.json")):
        sc = json.loads(path.read_text())
        if sc["expected"]["first_nonfinite_step"] is not None:
            name = path.parent.name
            break
    else:
        pytest.skip("no failed sample run")
    at = _logs(name)
    heads = [str(s.value) for s in at.subheader]
    (head,) = [h for h in heads if " line " in h and h.split(" line ")[0].endswith(".log")]
    line = int(head.split(" line ")[1].split(":")[0])
    blocks = [str(c.value) for c in at.code]
    assert f"> {line:>6} | " in blocks[0]  # the first non-finite line, in its context
    assert "The log" in heads and f"→ {line:>6} | " in _viewer(at)  # the viewer opens there
    at.radio(key="logs_mode").set_value("First lines").run()
    no_error(at)
    assert _viewer(at).startswith(f"  {1:>6} | ")
    # a link to another line of the log (as the Findings page makes) moves the viewer there
    at.query_params["file"] = str(runs / name / "train.log")
    at.query_params["line"] = "5"
    at.run()
    no_error(at)
    assert at.radio(key="logs_mode").value == "Around a line"
    assert f"→ {5:>6} | " in _viewer(at)


def test_replay_page_of_a_float64_replay_of_a_float32_failure(runs: Path) -> None:
    name = "log_softmax_underflow"
    if not (runs / name / "capture").is_dir():
        pytest.skip(f"sample run {name} has no capture")
    at = open_app(name)
    _settled(at.switch_page("app_pages/replay.py").run())
    no_error(at)
    shown = texts(at)
    # the analysis's replay (as-run): the op undefined at its values, the step finite in
    # float64 from the start, without "even in float64" beside "stays finite in float64"
    assert "Verdict: math-fault" in shown
    assert "even in float64" not in shown
    assert "run in float64 from the start, the whole step stays finite" in shown
    passes = frame_with(at, "fingerprint")
    assert list(passes["pass"]) == ["as-run #1", "float64 (cpu)"]
    assert list(passes["autocast"]) == ["off", "off"]
    assert passes["runs"].iloc[-1].startswith("float64 reference")
    at.selectbox(key="replay_dtype").set_value("float64")
    at.button(key="replay_button").click().run()
    no_error(at)
    shown = texts(at)
    assert "Replay on cpu, float64" in shown
    assert "Verdict: range-overflow" in shown
    assert "Verdict: not-reproducible" not in shown and "GPU" not in shown
    passes = frame_with(at, "fingerprint")
    assert list(passes["pass"]) == ["float64 #1"]
    assert not any(p.startswith("as-run") for p in passes["pass"])
    assert (passes["dtype"] == "float64").all()
    assert passes["runs"].iloc[0].startswith("cast to float64")


def test_replay_page_shows_the_analysis_replay_on_its_first_render(runs: Path) -> None:
    """The Replay page waits for the replay (ui.run_page(..., replay=True)) instead of
    painting an empty page with 'Replaying...' under it: the page is the replay."""
    name = "division_by_zero"
    if not (runs / name / "capture").is_dir():
        pytest.skip(f"sample run {name} has no capture")
    at = open_app(name).switch_page("app_pages/replay.py").run()
    no_error(at)
    assert not any(str(c.value).startswith("Replaying the captured step") for c in at.caption)
    shown = texts(at)
    assert "Replay made by the analysis (cpu, as-run)" in shown
    assert "Verdict: " in shown
    passes = frame_with(at, "fingerprint")
    assert "error" not in passes.columns  # no pass failed: a column of blanks says nothing
    _drawn_by_tables(at)


def _drawn_by_tables(at: AppTest) -> None:
    """Every table went through tables.show: no float column left with all its digits, no
    missing cell drawn as "None"."""
    assert at.dataframe
    for frame in at.dataframe:
        table = frame.value
        floats = [c for c in table.columns if table[c].dtype.kind == "f"]
        assert not floats, (floats, table.head())
        assert not table.isna().any().any(), table.head()


def test_regression_a_log_cut_mid_line_is_said_to_stop_there(
        runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log cut in the middle of a record (the process killed while writing) read as a
    whole log: nothing on the Logs page said that it stops mid-line."""
    whole = (runs / "nan_in_batch" / "train.log").read_bytes()
    root = tmp_path / "runs"
    (root / "cut").mkdir(parents=True)
    (root / "cut" / "train.log").write_bytes(whole[: len(whole) // 2 + 7])
    (root / "whole").mkdir()
    (root / "whole" / "train.log").write_bytes(whole)
    assert not whole[: len(whole) // 2 + 7].endswith(b"\n")
    monkeypatch.setenv("FORENSICS_RUNS", str(root))
    at = _logs("cut")
    total = len(whole[: len(whole) // 2 + 7].split(b"\n"))
    warned = [w.value for w in at.warning if "stops mid-line" in w.value]
    assert warned and f"The last line ({total})" in warned[0], [w.value for w in at.warning]
    assert not any("stops mid-line" in w.value for w in _logs("whole").warning)


def test_regression_a_logs_own_nonfinite_value_is_found_when_the_incident_is_the_event_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log and an event file log the same tag, non-finite at the same step: the locator's
    one incident for the tag points at the event file, and the Logs page said 'the log
    reader recognised no non-finite value in this line' of the log line whose +inf the
    step table beside it listed (lightning_nan's train_loss)."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "runs" / "tie"
    values = [1.7764, 1.2501, 1.536, 1.4939, 1.3972, 1.2717, 1.2822, 1.2579, 1.1337]
    values += [float("inf")] * 3
    writer = SummaryWriter(str(run))
    for step, value in enumerate(values):
        writer.add_scalar("loss", value, step)
    writer.close()
    (run / "train.log").write_text("".join(
        f"{{'loss': {'inf' if value == float('inf') else value}, 'grad_norm': 1.5, "
        f"'learning_rate': 0.001, 'epoch': {(step + 1) / 12:.2f}}}\n"
        for step, value in enumerate(values)))
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    at = _logs("tie")
    assert "train.log line 10: step 9 (record 10)" in [s.value for s in at.subheader]
    shown = texts(at)
    assert "loss = +inf" in shown
    assert "recognised no non-finite value" not in shown


def test_regression_a_blank_log_line_is_one_row_of_the_viewer(
        runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The viewer drew each blank line of a log twice (its frame, then a row of its own)."""
    lines = _log_lines(runs, "nan_in_batch")[:6]
    root = tmp_path / "runs"
    (root / "gaps").mkdir(parents=True)
    (root / "gaps" / "train.log").write_text("\n".join([*lines[:3], "", *lines[3:]]) + "\n",
                                             encoding="utf-8")
    monkeypatch.setenv("FORENSICS_RUNS", str(root))
    rows = _viewer(_logs("gaps")).splitlines()
    numbers = [row.split("|", 1)[0].strip(" *→") for row in rows]
    assert numbers == [str(n) for n in range(1, 8)], rows
