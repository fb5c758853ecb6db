"""The dashboard under Streamlit's AppTest, on a copy of the sample runs.

Expectations come from each run's scenario.json, what the run is known to have died of.
The copy keeps the tests away from a regeneration of sample_runs/ and shows that the app
writes nothing into the folders it analyses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "app" / "streamlit_app.py"
SAMPLES = ROOT / "sample_runs"
PAGES = ["run", "timeline", "compare", "layers", "findings", "replay", "logs"]
TIMEOUT = 300.0

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402


def scenarios(root: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(root.glob("*/scenario.json")):
        out[path.parent.name] = json.loads(path.read_text())
    return out


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below root with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def served_samples(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A copy of sample_runs/ as the dashboard's root while the generator is held open."""
    if not any(SAMPLES.glob("*/scenario.json")):
        pytest.skip("sample_runs/ holds no scenario (make samples)")
    root = tmp_path_factory.mktemp(name) / "runs"
    shutil.copytree(SAMPLES, root, ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORENSICS_RUNS", str(root))
        yield root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from served_samples(tmp_path_factory, "app")


def texts(at: AppTest) -> str:
    """Everything the page shows as text, one element per line."""
    parts: list[str] = []
    for kind in ("title", "header", "subheader", "markdown", "caption", "info", "warning",
                 "success", "code", "text"):
        parts += [str(e.value) for e in at.get(kind)]
    for frame in at.dataframe:
        parts.append(frame.value.to_string())
    return "\n".join(parts)


def frame_with(at: AppTest, column: str) -> Any:
    """The first table on the page that has this column."""
    for frame in at.dataframe:
        if column in frame.value.columns:
            return frame.value
    raise AssertionError(f"no table with a column {column!r}")


def no_error(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def settle(at: AppTest) -> AppTest:
    """The page again once the replay it queued is done: a run page paints before its
    replay (ui.replay_pending) and shows what the replay found on a rerun."""
    from app import data

    if any(str(c.value).startswith("Replaying the captured step") for c in at.caption):
        data.replays.drain()
        at.run()
    return at


def open_app(run: str | None = None) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    if run is not None:
        at.query_params["run"] = run  # as a link to the run does
    return at.run()


def test_runs_table(runs: Path) -> None:
    at = open_app()
    no_error(at)
    table = at.dataframe[0].value.set_index("run")
    expected = scenarios(runs)
    assert set(expected) <= set(table.index)
    for name, sc in expected.items():
        row = table.loc[name]
        step = sc["expected"]["first_nonfinite_step"]
        if step is None:
            assert row["status"] == "finite", name
        else:
            assert row["status"] == "failed", name
            assert int(row["first_step"]) == step, name
            assert isinstance(row["cause"], str) and row["cause"], name
            assert "capture" in row["sources"], name


def test_runs_table_filters(runs: Path) -> None:
    at = open_app()
    at.text_input(key="runs_filter_name").input("healthy").run()
    no_error(at)
    assert list(at.dataframe[0].value["run"]) == ["healthy_control"]
    at.text_input(key="runs_filter_name").input("").run()
    at.multiselect(key="runs_filter_status").set_value(["finite"]).run()
    shown = set(at.dataframe[0].value["run"])
    healthy = {n for n, sc in scenarios(runs).items()
               if sc["expected"]["first_nonfinite_step"] is None}
    assert shown == healthy


def _check_page(at: AppTest, page: str, name: str, sc: dict[str, Any]) -> None:
    exp = sc["expected"]
    step = exp["first_nonfinite_step"]
    shown = texts(at)
    assert f"**{name}**" in shown, page
    if step is None and sc.get("benign_skips"):
        # the charts mark the skipped steps' non-finite gradients: the headline says why
        assert "the loss scaler's overflow skips, benign" in shown, page
        assert "every logged value is finite" not in shown, page
    elif step is None:
        assert "every logged value is finite" in shown, page
    else:
        assert f"step {step}**" in shown, page
    if page == "timeline":
        assert at.get("plotly_chart"), name
        if step is not None:
            marks = frame_with(at, "mark")
            firsts = marks[marks["mark"] == "first non-finite"]
            assert list(firsts["step"]) == [step], name
    elif page == "layers":
        # The page's place is the headline's, in the same words (one source: failing_place
        # and place_words): Layers said "first layer fc1" under a headline naming the loss.
        (head,) = [m.value for m in at.markdown if m.value.startswith(f"**{name}**")]
        made = [m.value for m in at.markdown
                if m.value.startswith("Where the failure was made: ")]
        for line in made:
            place = line.removeprefix("Where the failure was made: ").split(" (")[0]
            assert f" · {place} · " in f"{head} · ", (name, place, head)
        assert made or exp["layer"] is None, name
        if exp["layer"] is not None:
            assert f"**{exp['layer']}**" in shown, name
        assert at.get("plotly_chart"), name
    elif page == "findings":
        if exp["cause"] is not None:
            assert f"**{exp['cause']}**" in shown, name
        elif not any("**" in m.value and "`NF" in m.value for m in at.markdown):
            assert "No findings are available for this run" in shown, name
    elif page == "replay":
        if sc.get("capture"):
            assert f"Verdict: {exp['verdict']}" in shown, name
            assert f"**{exp['phase']}**" in shown, name
            op = exp["op"].split("::")[-1]
            assert f"aten.{op}" in shown, name
        else:
            assert "no capture of its failing step" in shown, name
    elif page == "logs" and step is not None:
        assert any(">" in c.value for c in at.code), name


@pytest.mark.parametrize("page", PAGES)
def test_page_for_every_run(runs: Path, page: str) -> None:
    at = open_app()
    for name, sc in scenarios(runs).items():
        at.selectbox(key="run_picker").set_value(name)  # the sidebar's run picker
        settle(at.switch_page(f"app_pages/{page}.py").run())
        no_error(at)
        _check_page(at, page, name, sc)


def test_growth_onset_is_where_the_exploding_gradients_finding_dates_it(runs: Path) -> None:
    at = open_app()
    checked = 0
    for name in scenarios(runs):
        at.selectbox(key="run_picker").set_value(name)
        at.switch_page("app_pages/findings.py").run()
        cards = [m.value for m in at.markdown if "**exploding-gradients**" in m.value]
        at.switch_page("app_pages/timeline.py").run()
        no_error(at)
        marks = frame_with(at, "mark")
        onsets = list(marks[marks["mark"] == "growth onset"]["step"])
        if not cards:
            continue
        checked += 1
        assert len(onsets) == 1, name
        assert f"from step {onsets[0]} " in texts(at.switch_page("app_pages/findings.py")
                                                  .run()), name
    if not checked:
        pytest.skip("no sample run has an exploding-gradients finding")


def _failed_with_capture(root: Path) -> str:
    for name, sc in scenarios(root).items():
        if sc.get("capture") and sc["expected"]["verdict"] == "math-fault":
            return name
    pytest.skip("no failed sample run with a capture")


def test_replay_button_runs_a_replay(runs: Path) -> None:
    name = _failed_with_capture(runs)
    at = open_app(name)
    at.switch_page("app_pages/replay.py").run()
    at.selectbox(key="replay_dtype").set_value("float64")
    at.button(key="replay_button").click().run()
    no_error(at)
    shown = texts(at)
    assert "Replay on cpu, float64" in shown
    assert "Verdict: " in shown
    passes = frame_with(at, "fingerprint")
    assert (passes["dtype"] == "float64").all()


def test_evidence_links_open_the_right_places(runs: Path) -> None:
    name = _failed_with_capture(runs)
    at = open_app(name)
    at.switch_page("app_pages/findings.py").run()
    links = at.get("page_link")
    assert links, "a finding's evidence links to the timeline, the logs or the layers"
    targets = [link.proto.page for link in links]
    assert any("timeline" in t for t in targets)
    step = scenarios(runs)[name]["expected"]["first_nonfinite_step"]
    at.query_params["run"] = name
    at.query_params["step"] = str(step)
    at.switch_page("app_pages/timeline.py").run()
    no_error(at)
    assert f"Step {step} in every source" in texts(at)


def test_nothing_is_written_into_the_runs(runs: Path) -> None:
    before = tree(runs)
    name = _failed_with_capture(runs)
    at = open_app(name)
    for page in PAGES:
        at.switch_page(f"app_pages/{page}.py").run()
        no_error(at)
    at.switch_page("app_pages/replay.py").run()
    at.button(key="replay_button").click().run()
    no_error(at)
    assert tree(runs) == before


def test_a_changed_run_is_analysed_again(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = next((n for n, sc in scenarios(SAMPLES).items()
                    if sc["expected"]["first_nonfinite_step"] is None), None)
    if healthy is None:
        pytest.skip("no healthy sample run")
    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / healthy, root / healthy)
    monkeypatch.setenv("FORENSICS_RUNS", str(root))
    saves = sorted((root / healthy).rglob("*.pt"))
    assert saves
    at = open_app()
    before = at.dataframe[0].value.set_index("run").loc[healthy, "sources"]
    assert f"{len(saves)} checkpoints" in before
    saves[-1].unlink()
    from app import data

    data.list_runs.clear()  # the listing is trusted for a few seconds; do not wait for it
    at.run()
    no_error(at)
    after = at.dataframe[0].value.set_index("run").loc[healthy, "sources"]
    assert f"{len(saves) - 1} checkpoint" in after


def test_no_runs_is_said_plainly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path))
    at = open_app()
    no_error(at)
    assert "no runs" in texts(at)


def test_runs_root_comes_from_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.data import runs_root

    monkeypatch.delenv("FORENSICS_RUNS", raising=False)
    assert runs_root(["--runs", "/data/x"]) == "/data/x"
    assert runs_root([]) == "sample_runs"
    monkeypatch.setenv("FORENSICS_RUNS", "elsewhere")
    assert runs_root(["-q", "tests/test_app.py"]) == "elsewhere"


def test_launch_command_is_local_headless_and_quiet(tmp_path: Path) -> None:
    from analyzer.dashboard import app_script, command

    assert Path(app_script()) == ENTRY
    cmd = command(str(tmp_path), port=8765)
    assert cmd[0] == sys.executable and cmd[2] == "run"
    assert cmd[1] == str(Path(cmd[3]).with_name("serve.py")) and os.path.isabs(cmd[1])
    opts = dict(zip(cmd[4:-3:2], cmd[5:-3:2], strict=True))
    assert opts["--server.address"] == "127.0.0.1"
    assert opts["--server.port"] == "8765"
    assert opts["--server.headless"] == "true"
    assert opts["--browser.gatherUsageStats"] == "false"
    assert cmd[-3:] == ["--", "--runs", str(tmp_path)]


def test_launch_refuses_a_missing_folder(tmp_path: Path) -> None:
    from analyzer.dashboard import launch
    from analyzer.errors import UsageError

    with pytest.raises(UsageError, match="no such file"):
        launch(str(tmp_path / "nowhere"))


def test_dashboard_module_does_not_import_streamlit() -> None:
    code = ("import sys, analyzer.dashboard; "
            "sys.exit(1 if 'streamlit' in sys.modules or 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_views_are_pure_of_streamlit() -> None:
    code = ("import sys, app.views, app.charts, app.runinfo; "
            "sys.exit(1 if 'streamlit' in sys.modules else 0)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env).returncode == 0


def _series(tag: str, steps: list[int], values: list[float], source: str = "ev",
            unit: str = "offset") -> Any:
    import numpy as np

    from analyzer.model import Series

    return Series(tag, np.array(steps, dtype=np.int64), np.array(values, dtype=np.float64),
                  np.zeros(len(steps)), source, np.arange(1, len(steps) + 1, dtype=np.int64),
                  unit)  # type: ignore[arg-type]


def test_layer_grid_marks_only_logged_nonfinite_cells() -> None:
    from analyzer.model import Run
    from app.views import layer_grid

    inf, nan = float("inf"), float("nan")
    run = Run("r", "r", (), series=(_series("grad_norm/fc1.weight", [0, 1, 2], [1.0, nan, 3.0]),
                                    _series("grad_norm/fc2.weight", [0, 2], [1.0, inf])))
    grid = layer_grid(run, ["grad_norm/fc1.weight", "grad_norm/fc2.weight"],
                      {"grad_norm/fc1.weight": "fc1", "grad_norm/fc2.weight": "fc2"})
    assert list(grid.steps) == [0, 1, 2]
    assert grid.layers == ["fc1", "fc2"]
    assert grid.nonfinite.tolist() == [[False, True, False], [False, False, True]]
    assert grid.logged.tolist() == [[True, True, True], [True, False, True]]


def test_log_scale_only_for_positive_values_spanning_decades() -> None:
    import numpy as np

    from app.views import Curve, log_scale

    def curve(values: list[float]) -> Curve:
        return Curve("t", "t", "s", np.arange(len(values)), np.array(values))

    assert log_scale([curve([1.0, 1e3, float("nan")])])
    assert not log_scale([curve([1.0, 50.0])])
    assert not log_scale([curve([0.0, 1e3])])


def test_sources_line_up_at_a_step() -> None:
    from analyzer.model import Run
    from app.views import step_at_line, view_rows, views_at

    run = Run("r", "r", (), series=(
        _series("loss", [1, 2, 3], [0.5, 0.4, float("nan")], "train.log", "line"),
        _series("train/loss", [1, 2, 3], [0.5, 0.4, float("nan")], "events.out.tfevents.1"),
        _series("train/lr", [1, 2], [0.1, 0.1], "events.out.tfevents.1")))
    assert step_at_line(run, "train.log", 3) == 3
    seen = views_at(run, 3)
    assert {(v.source, v.tag) for v in seen} == {("train.log", "loss"), ("events", "train/loss")}
    rows = view_rows(seen, "r", 3)
    assert {r["step 3"] for r in rows} == {"nan"}
    assert {r["step before"] for r in rows} == {"0.4"}


def test_a_text_search_finds_the_first_nan_line(tmp_path: Path) -> None:
    from app.data import first_mention

    log = tmp_path / "train.log"
    log.write_text("INFO start\nstep 1 loss 0.5 infinite patience\nstep 2 loss nan\n"
                   "step 3 loss inf\n")
    assert first_mention(str(log), "d1") == 3
    log.write_text("INFO start\nstep 1 loss 0.5\n")
    assert first_mention(str(log), "d2") is None


def test_log_only_runs_on_every_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Folders holding nothing but a log: one whose failure has no step (an anomaly error
    # before any numbered step), one in the torchvision references' MetricLogger format.
    fixtures = ROOT / "tests" / "fixtures" / "logs"
    for name in ("autograd_anomaly.err", "torchvision_classification_nan.log",
                 "detr_loss_stop.log"):
        folder = tmp_path / "runs" / Path(name).stem
        folder.mkdir(parents=True)
        shutil.copy(fixtures / name, folder / name)
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    before = tree(tmp_path / "runs")
    at = open_app()
    no_error(at)
    expected = {
        "autograd_anomaly": "with **no step**",
        "torchvision_classification_nan": "at **step 30**",
        "detr_loss_stop": "after **step 20**",
    }
    table = at.dataframe[0].value
    for i, name in enumerate(table["run"]):
        # Picking the row, as a click does, shows the run's first step in words.
        at.session_state["runs_table"] = {"selection": {"rows": [i], "columns": []}}
        at.run()
        no_error(at)
        assert expected[name] in texts(at), name
    for name, verdict in expected.items():
        at.selectbox(key="run_picker").set_value(name)
        for page in PAGES:
            at.switch_page(f"app_pages/{page}.py").run()
            no_error(at)
            assert verdict in texts(at), (name, page)
    assert tree(tmp_path / "runs") == before


def test_regression_layers_page_with_two_checkpoints_at_one_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "runs" / "version_0"
    writer = SummaryWriter(str(run))
    for step, loss in enumerate([1.0, 0.5, float("nan")]):
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    (run / "checkpoints").mkdir()
    state = {"fc.weight": torch.ones(2, 2), "fc.bias": torch.full((2,), float("nan"))}
    for name in ("epoch=0-step=10.ckpt", "last.ckpt"):  # Lightning's pair at one step
        torch.save({"state_dict": state, "global_step": 10}, run / "checkpoints" / name)
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    at = open_app()
    at.switch_page("app_pages/layers.py").run()
    no_error(at)
    counts = next(f.value for f in at.dataframe if "step 10 (last.ckpt)" in f.value.columns)
    # the layer is a column (tables.show draws no index), then one column per save
    assert list(counts.columns) == ["layer", "step 10 (epoch=0-step=10.ckpt)",
                                    "step 10 (last.ckpt)"]


def test_save_labels_are_distinct() -> None:
    from analyzer.model.checkpoints import SaveRef
    from app.views import save_labels

    saves = [SaveRef("a/epoch=0-step=10.ckpt", 10, 0, None), SaveRef("a/last.ckpt", 10, 0, None),
             SaveRef("b/last.ckpt", 10, 0, None), SaveRef("final.pt", None, 1, None),
             SaveRef("c/final.pt", None, 1, None), SaveRef("x/step_20.pt", 20, 0, None)]
    labels = save_labels(saves)
    assert len(set(labels)) == len(labels)
    assert labels == ["step 10 (epoch=0-step=10.ckpt)", "step 10 (last.ckpt)",
                      "step 10 (last.ckpt) #2", "final.pt", "final.pt #2", "step 20"]


# The one step axis (issue 14): logs drawn and worded on the run's global step, a log that
# could not be placed drawn and worded in its own numbers.

def _figure(at: AppTest, key: str) -> dict[str, Any]:
    chart = next(c for c in at.get("plotly_chart") if key in c.proto.id)
    return dict(json.loads(chart.proto.spec))


def _array(raw: Any) -> list[float]:
    """A trace's x or y as numbers: plotly sends numpy arrays as base64 typed arrays."""
    import base64

    import numpy as np

    if isinstance(raw, dict):
        data = np.frombuffer(base64.b64decode(raw["bdata"]), dtype=np.dtype(raw["dtype"]))
        return [float(v) for v in data]
    return [float("nan") if v is None else float(v) for v in raw]


def _traces(figure: dict[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    return {t["name"]: (_array(t["x"]), _array(t["y"])) for t in figure["data"]
            if t.get("mode") == "lines+markers"}


def test_log_and_event_file_curves_share_their_steps(runs: Path) -> None:
    # The Trainer's dict lines used to be drawn at their record number, one step to the
    # right of the event file's curve of the same loss.
    import math

    at = open_app()
    checked = []
    for name in scenarios(runs):
        if not (runs / name / "train.log").exists():
            continue
        at.selectbox(key="run_picker").set_value(name)
        at.switch_page("app_pages/timeline.py").run()
        no_error(at)
        traces = _traces(_figure(at, "timeline_chart"))
        log = traces.get("loss (train.log)")
        events = traces.get("train/loss (events)")
        if log is None or events is None:
            continue
        at_step = dict(zip(*events, strict=True))
        shared = [(s, v) for s, v in zip(*log, strict=True) if s in at_step]
        assert len(shared) >= 0.9 * len(log[0]), name
        finite = [(s, v) for s, v in shared if math.isfinite(v) and math.isfinite(at_step[s])]
        assert finite, name
        if len(finite) < 5:  # torchvision's MetricLogger prints a window's median: too
            continue         # few points to tell a shift from the smoothing
        # A log prints its values rounded (4 places): agreement within the rounding, as
        # on nearly every step (a step off, the two zigzags would rarely agree).
        agree = [math.isclose(v, at_step[s], rel_tol=2e-3, abs_tol=1e-4) for s, v in finite]
        assert sum(agree) >= 0.9 * len(agree), name
        checked.append(name)
    assert "nan_in_batch" in checked


def _nan_line(log: Path) -> tuple[int, int]:
    """(line number, record number) of the first dict line of a Trainer log whose loss is
    NaN, counted from the file."""
    record = 0
    for number, text in enumerate(log.read_text().splitlines(), start=1):
        if text.startswith("{"):
            record += 1
            if "'loss': nan" in text:
                return number, record
    raise AssertionError(f"{log} has no NaN loss line")


def test_logs_page_gives_the_aligned_step_and_the_logs_own_record(runs: Path) -> None:
    # nan_in_batch's Logs page said "step 29" (the record's position) where the headline
    # said 28.
    step = scenarios(runs)["nan_in_batch"]["expected"]["first_nonfinite_step"]
    line, record = _nan_line(runs / "nan_in_batch" / "train.log")
    assert record == step + 1  # the Trainer's records count from 1, its steps from 0 here
    at = open_app("nan_in_batch")
    at.switch_page("app_pages/logs.py").run()
    no_error(at)
    heads = [s.value for s in at.subheader]
    assert f"train.log line {line}: step {step} (record {record})" in heads
    assert f"Step {step} in the other sources" in heads
    assert not any(f"step {record}" in h for h in heads)
    assert f"**step {step}**" in texts(at)
    assert "steps inferred: step = record - 1" in texts(at)


def test_runs_and_timeline_pages_say_how_a_log_was_placed(runs: Path) -> None:
    at = open_app()
    table = at.dataframe[0].value.set_index("run")
    assert "train.log: inferred: step = record - 1" in table.loc["nan_in_batch", "placement"]
    row = list(at.dataframe[0].value["run"]).index("nan_in_batch")
    at.session_state["runs_table"] = {"selection": {"rows": [row], "columns": []}}
    at.run()
    no_error(at)
    assert "Steps placed: train.log: inferred: step = record - 1" in texts(at)
    at.selectbox(key="run_picker").set_value("nan_in_batch")
    at.switch_page("app_pages/timeline.py").run()
    (placed,) = [e for e in at.expander if "steps were placed" in e.label]
    assert any("`train.log`: inferred: step = record - 1, by matching loss" in m.value
               for m in placed.markdown)


def _unaligned_runs(root: Path) -> None:
    """Two runs: an event file whose loss goes NaN at step 61 beside a Trainer log that
    shares no value with it (its NaN at record 2); and a Trainer log alone (NaN from record
    13), with nothing to place its records on."""
    import math

    from torch.utils.tensorboard import SummaryWriter

    mixed = root / "mixed"
    writer = SummaryWriter(str(mixed))
    for step in range(70):
        loss = float("nan") if step >= 61 else 2.0 * math.exp(-step / 40) + 0.01 * (step % 7)
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    lines = ["{'loss': nan, 'epoch': 0.1}" if k == 2 else "{'loss': 9.5, 'epoch': 0.1}"
             for k in range(1, 6)]
    (mixed / "train.log").write_text("\n".join(lines) + "\n")
    alone = root / "records_only"
    alone.mkdir(parents=True)
    lines = [f"{{'loss': {'nan' if k >= 13 else round(1.0 / k, 4)}, 'learning_rate': 5e-05, "
             f"'epoch': {k / 20:.2f}}}" for k in range(1, 16)]
    (alone / "train.log").write_text("\n".join(lines) + "\n")


@pytest.fixture
def unaligned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "runs"
    _unaligned_runs(root)
    monkeypatch.setenv("FORENSICS_RUNS", str(root))
    before = tree(root)
    yield root
    assert tree(root) == before


def test_an_unaligned_log_is_drawn_apart_over_its_records(unaligned: Path) -> None:
    at = open_app("mixed")
    at.switch_page("app_pages/timeline.py").run()
    no_error(at)
    assert "at **step 61**" in texts(at)
    on_steps = _traces(_figure(at, "timeline_chart"))
    assert set(on_steps) == {"train/loss"}  # the log's records are not on the step axis
    own = _figure(at, "timeline_own_0")
    assert "record" in own["layout"]["xaxis"]["title"]["text"]
    (log,) = _traces(own).values()
    assert log[0] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert "train.log, by its own record numbers" in [s.value for s in at.subheader]
    shown = texts(at)
    assert "Its first non-finite value: record 2" in shown
    marks = frame_with(at, "mark")
    assert list(marks[marks["mark"] == "first non-finite"]["step"]) == [61]
    (placed,) = [e for e in at.expander if "steps were placed" in e.label]
    assert any("`train.log`: unaligned: its records are its own" in m.value
               for m in placed.markdown)


def test_an_unaligned_log_line_is_worded_in_its_records(unaligned: Path) -> None:
    at = open_app("mixed")
    at.switch_page("app_pages/logs.py").run()
    no_error(at)
    heads = [s.value for s in at.subheader]
    assert "train.log line 2: record 2" in heads
    assert not any("in the other sources" in h for h in heads)
    assert "records are not placed on the run's steps" in texts(at)


def test_an_unaligned_first_incident_is_worded_in_records_everywhere(unaligned: Path) -> None:
    at = open_app()
    no_error(at)
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["mixed", "first_when"] == "61"
    assert "train.log: unaligned" in table.loc["mixed", "placement"]
    assert table.loc["records_only", "first_when"] == "#13"
    assert table.loc["records_only", "last_when"] == "#12"
    row = list(at.dataframe[0].value["run"]).index("records_only")
    at.session_state["runs_table"] = {"selection": {"rows": [row], "columns": []}}
    at.run()
    no_error(at)
    assert "First non-finite at **record 13** in `loss`" in texts(at)
    at.selectbox(key="run_picker").set_value("records_only")
    for page in PAGES:
        at.switch_page(f"app_pages/{page}.py").run()
        no_error(at)
        shown = texts(at)
        assert "first non-finite at **record 13**" in shown, page
        assert "last finite record 12" in shown, page
        assert "step 13" not in shown, page


# Runs as real frameworks lay them out (issue 15): one training is one run, with its
# segments, files by role, metadata and the checkpoints' bookkeeping shown apart.

FRAMEWORK_RUNS = ("lightning_restart", "lightning_healthy", "hf_healthy", "hf_nan")


@pytest.fixture(scope="module")
def framework_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Copies of real Lightning and Trainer runs from the corpus, side by side."""
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from tests.frameworks import corpus

    root = tmp_path_factory.mktemp("app_frameworks") / "runs"
    for name in FRAMEWORK_RUNS:
        shutil.copytree(corpus.get(name, tmp_path_factory), root / name)
    before = tree(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORENSICS_RUNS", str(root))
        yield root
    assert tree(root) == before


def _rows(frame: Any, column: str, value: str) -> Any:
    return frame[frame[column] == value]


def test_each_training_is_one_row_with_its_layout(framework_runs: Path) -> None:
    at = open_app()
    no_error(at)
    table = at.dataframe[0].value.set_index("run")
    assert sorted(table.index) == sorted(FRAMEWORK_RUNS)
    assert table.loc["lightning_restart", "status"] == "failed"
    assert table.loc["lightning_healthy", "status"] == "finite"
    assert table.loc["hf_healthy", "status"] == "finite"
    assert table.loc["hf_nan", "status"] == "failed"
    assert table.loc["lightning_restart", "grouping"] == (
        "lightning: 2 segments (version_0, version_1)")
    assert table.loc["hf_healthy", "grouping"].startswith("huggingface: 1 segment")


def test_run_page_shows_segments_files_by_role_and_settings(framework_runs: Path) -> None:
    at = open_app("lightning_restart")
    at.switch_page("app_pages/run.py").run()
    no_error(at)
    assert "Layout recognised: **lightning**" in texts(at)
    segments = frame_with(at, "segment")
    assert list(segments["segment"]) == ["lightning_logs/version_0", "lightning_logs/version_1"]
    files = frame_with(at, "role")
    version_1 = _rows(files, "segment", "lightning_logs/version_1")
    assert sorted(version_1["role"]) == ["checkpoint", "checkpoint", "event file", "metadata"]
    assert list(_rows(files, "role", "log")["file"]) == ["train.log"]
    assert list(_rows(files, "role", "log")["segment"]) == ["(none)"]
    settings = frame_with(at, "setting").set_index("setting")
    assert settings.loc["learning_rate", "value"] == "0.02"
    assert settings.loc["learning_rate", "from"] == os.path.join(
        "lightning_logs", "version_1", "checkpoints", "last.ckpt")
    meta = frame_with(at, "status")
    assert sorted(_rows(meta, "kind", "hparams")["file"]) == [
        os.path.join("lightning_logs", f"version_{n}", "hparams.yaml") for n in (0, 1)]
    assert set(meta["status"]) == {"read"}


def test_run_page_gives_each_trainer_setting_with_its_file(framework_runs: Path) -> None:
    at = open_app("hf_healthy")
    at.switch_page("app_pages/run.py").run()
    no_error(at)
    settings = frame_with(at, "setting").set_index("setting")
    args = os.path.join("checkpoint-20", "training_args.bin")
    expected = {"learning_rate": "0.005", "warmup_steps": "0", "fp16": "false",
                "bf16": "false", "max_grad_norm": "1", "logging_steps": "1",
                "gradient_accumulation_steps": "1", "seed": "0"}
    for name, value in expected.items():
        assert (settings.loc[name, "value"], settings.loc[name, "from"]) == (value, args), name
    # The settings asked about first come first.
    assert list(settings.index[:len(expected)]) == [
        n for n in ("learning_rate", "warmup_steps", "fp16", "bf16", "max_grad_norm",
                    "logging_steps", "gradient_accumulation_steps", "seed")]
    assert settings.loc["global_step", "from"] == os.path.join("checkpoint-20",
                                                               "trainer_state.json")
    meta = frame_with(at, "status").set_index("file")
    assert meta.loc[os.path.join("checkpoint-10", "rng_state.pth"), "status"] == "listed"
    assert meta.loc[os.path.join("checkpoint-20", "trainer_state.json"), "status"] == "read"
    files = frame_with(at, "role")
    assert os.path.join("checkpoint-10", "trainer_state.json") in set(
        _rows(files, "role", "listed, not read")["file"])


def test_checkpoint_bookkeeping_is_shown_apart_and_not_as_a_failure(
        framework_runs: Path) -> None:
    at = open_app("lightning_healthy")
    at.switch_page("app_pages/layers.py").run()
    no_error(at)
    assert not at.warning
    shown = texts(at)
    assert "every logged value is finite" in shown
    assert "4 saves; every tensor of evidence (weights, optimizer, loss scaler) is finite" \
        in shown
    (note,) = [i.value for i in at.info if "bookkeeping" in i.value]
    assert "`ModelCheckpoint.kth_value (callback)`" in note and "Not a failure" in note
    saves = frame_with(at, "saved by")
    import lightning

    assert set(saves["saved by"]) == {f"lightning {lightning.__version__}"}
    assert sorted(saves["global step"]) == [16, 32, 32, 40]
    assert (saves["non-finite tensors"] == 0).all()
    assert (saves["bookkeeping non-finite"] == 1).all()  # the periodic callback's kth_value
    states = frame_with(at, "monitor")
    periodic = _rows(states, "monitor", "(none)")
    assert len(periodic) == 4 and all("kth_value=+inf" in v for v in periodic["values"])
    assert set(states["state"]) == {"ModelCheckpoint", "EarlyStopping"}


def _lightning_version(runs: Path, hparams: str) -> Path:
    """A Lightning ``version_0`` folder below ``runs/train``: a finite loss written by the
    real SummaryWriter and ``hparams`` as its hparams.yaml."""
    from torch.utils.tensorboard import SummaryWriter

    version = runs / "train" / "lightning_logs" / "version_0"
    writer = SummaryWriter(str(version))
    for step, loss in enumerate([1.0, 0.5, 0.25]):
        writer.add_scalar("train_loss", loss, step)
    writer.close()
    (version / "hparams.yaml").write_text(hparams)
    return version


def test_regression_a_changed_metadata_file_is_analysed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fingerprint held event files, logs, checkpoints and captures but no metadata
    # file: a rewritten hparams.yaml kept the old learning rate on screen.
    version = _lightning_version(tmp_path / "runs", "lr: 0.02\n")
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    at = open_app()
    at.switch_page("app_pages/run.py").run()
    no_error(at)
    assert frame_with(at, "setting").set_index("setting").loc["learning_rate", "value"] == "0.02"
    (version / "hparams.yaml").write_text("lr: 5.0\n")
    from app import data

    data.list_runs.clear()  # the listing is trusted for a few seconds; do not wait for it
    at.run()
    no_error(at)
    assert frame_with(at, "setting").set_index("setting").loc["learning_rate", "value"] == "5"


def test_regression_logs_page_shows_every_numbering_of_a_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Trainer's records and DeepSpeed's step counter in one console log are two
    # alignments; the page said only how the records were placed.
    from tests.test_align_blocks import _events, _mixed_log

    run = tmp_path / "runs" / "deepspeed"
    _events(run)
    _mixed_log(run)
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    at = open_app()
    at.switch_page("app_pages/logs.py").run()
    no_error(at)
    (caption,) = [c.value for c in at.caption if c.value.startswith("`train.log`")]
    assert "record lines: inferred: step = 5 x record" in caption
    assert "step lines: exact: step = step - 1, by DeepSpeed's step counter" in caption
    at.switch_page("app_pages/timeline.py").run()
    (placed,) = [e for e in at.expander if "steps were placed" in e.label]
    names = [m.value.split(":")[0] for m in placed.markdown]
    assert names == ["`train.log (record lines)`", "`train.log (step lines)`"]


def test_trainer_saves_say_who_saved_them_and_at_which_step(framework_runs: Path) -> None:
    import transformers

    at = open_app("hf_healthy")
    at.switch_page("app_pages/layers.py").run()
    no_error(at)
    saves = frame_with(at, "saved by").set_index("file")
    assert set(saves["saved by"]) == {f"transformers {transformers.__version__}"}
    latest = saves.loc[os.path.join("checkpoint-20", "model.safetensors")]
    # from trainer_state.json; the earlier save's global step is blank, so the column is
    # right-aligned text (st.dataframe draws a missing number as "None", whatever its dtype)
    assert (latest["step"], latest["global step"]) == (20, "20")
    assert "The saves hold no callback state." in texts(at)


def _marked(at: AppTest) -> list[str]:
    """The rows of the Logs page's excerpt that belong to the line it points at."""
    (code,) = [c.value for c in at.code if "\n>" in c.value or c.value.startswith(">")]
    return [row for row in code.splitlines() if row.startswith(">")]


def test_regression_logs_page_counts_lines_as_the_log_reader_does(
        framework_runs: Path) -> None:
    # The excerpt split lines at every bare carriage return, which tqdm writes before each
    # redraw: "train.log line 44" of a Trainer's console pointed at a progress bar frame
    # dozens of lines above the `'grad_norm': 'nan'` record the reader found there.
    log = framework_runs / "hf_nan" / "train.log"
    number = next(n for n, text in enumerate(log.read_bytes().split(b"\n"), start=1)
                  if b"'grad_norm': 'nan'" in text)
    at = open_app("hf_nan")
    at.switch_page("app_pages/logs.py").run()
    no_error(at)
    assert f"train.log line {number}: step 9" in [s.value for s in at.subheader]
    marked = _marked(at)
    assert marked[0].startswith(f"> {number:>6} | ")
    assert any("'grad_norm': 'nan'" in row for row in marked), marked
    assert not any("\r" in row or "\x1b" in row for row in marked)


def test_a_bar_line_shows_its_last_frame_and_the_frames_naming_a_nan() -> None:
    from app.views import frames

    line = "\x1b[A 1/8 [loss=1.0]\r 2/8 [loss=nan.0]\r 3/8 [loss=nan.0]\r\r"
    assert frames(line) == ["(2 earlier frames of this line drawn over)", " 3/8 [loss=nan.0]"]
    assert frames(line, marked=True) == ["(1 earlier frame of this line drawn over)",
                                         " 2/8 [loss=nan.0]", " 3/8 [loss=nan.0]"]
    assert frames("step 3 loss 0.5") == ["step 3 loss 0.5"]


def test_regression_a_resumed_lightning_version_is_marked_where_it_resumes(
        framework_runs: Path) -> None:
    # The restart of version_1 was marked at step 0: its event file's first record (and
    # Lightning's hp_metric) is at step 0, its training values from step 16 on.
    at = open_app("lightning_restart")
    at.switch_page("app_pages/timeline.py").run()
    no_error(at)
    marks = frame_with(at, "mark")
    restarts = marks[marks["mark"] == "restart"]
    assert list(restarts["step"]) == [16]
    assert restarts["what"].iloc[0].startswith("lightning_logs/version_1 begins: ")


def test_a_damaged_metadata_file_is_listed_with_its_issue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _lightning_version(tmp_path / "runs", "lr: 0.02\nwarmup: [1, 2\n")  # cut off
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    before = tree(tmp_path / "runs")
    at = open_app()
    at.switch_page("app_pages/run.py").run()
    no_error(at)
    assert "No training setting could be read for this run" in texts(at)
    (row,) = frame_with(at, "status").to_dict("records")
    assert (row["file"], row["status"]) == (
        os.path.join("lightning_logs", "version_0", "hparams.yaml"), "failed")
    assert row["issues"].startswith("line 3: bad_record: not valid YAML")
    assert tree(tmp_path / "runs") == before


def test_a_row_picked_on_runs_is_the_run_of_every_page_and_of_the_sidebar(runs: Path) -> None:
    at = open_app()
    names = list(at.dataframe[0].value["run"])
    first, picked = names[0], names[-1]
    assert first != picked
    assert at.selectbox(key="run_picker").value == first
    at.session_state["runs_table"] = {"selection": {"rows": [len(names) - 1], "columns": []}}
    at.run()
    no_error(at)
    assert at.selectbox(key="run_picker").value == picked
    assert at.query_params["run"] in (picked, [picked])
    at.switch_page("app_pages/timeline.py").run()  # the sidebar's navigation, no link
    no_error(at)
    assert f"**{picked}**" in texts(at)
    # A run picked in the sidebar afterwards is not taken back by the row still selected.
    at.selectbox(key="run_picker").set_value(first)
    at.switch_page("app_pages/runs.py").run()
    no_error(at)
    assert at.selectbox(key="run_picker").value == first
    at.switch_page("app_pages/layers.py").run()
    assert f"**{first}**" in texts(at)


def test_regression_table_cells_show_no_none_and_no_float_digits_run_on() -> None:
    import pandas as pd

    from app import tables

    # pandas makes a missing count NaN in a float column; st.dataframe drew "None" or "nan"
    # for it and printed 9.640987946362755e+37 whole.
    raw = pd.DataFrame([{"step": 4, "norm": 9.640987946362755e+37, "layer": "fc1"},
                        {"step": None, "norm": float("inf"), "layer": None}])
    shown, numbers = tables.display(raw)
    assert list(shown["step"]) == ["4", ""]
    assert list(shown["norm"]) == ["9.641e+37", "+inf"]
    assert list(shown["layer"]) == ["fc1", ""]
    assert numbers == {"step", "norm"}
    # In a frame of objects None is missing and a NaN is a logged value.
    kept, _ = tables.display(tables.frame([{"value": None}, {"value": float("nan")},
                                           {"value": 0.123456789}]))
    assert list(kept["value"]) == ["", "nan", "0.12346"]
    # Whole numbers with nothing missing stay numbers (they sort as numbers).
    ints, _ = tables.display(pd.DataFrame({"step": [1.0, 20.0]}))
    assert ints["step"].tolist() == [1, 20] and ints["step"].dtype.kind == "i"
    # A whole float past int64 (a gradient norm of 1e20) is no count: it stays text.
    big, _ = tables.display(pd.DataFrame({"max": [1e20, 2.0]}))
    assert list(big["max"]) == ["1e+20", "2"]
    # A nullable integer column (the Fleet table's first step) drew pd.NA as "None".
    steps, numbers = tables.display(pd.DataFrame({"step": pd.array([40, None], dtype="Int64")}))
    assert list(steps["step"]) == ["40", ""] and "step" in numbers


def test_regression_a_column_blank_in_every_row_is_left_out_when_asked() -> None:
    from app import tables

    # The Replay page's frames table spent a column on "non-finite params" with nothing in
    # it, and the module outputs beside it were cut at the page's edge.
    rows = tables.frame([{"module": "fc1", "params": "", "note": None, "error": "boom"},
                         {"module": "fc2", "params": "", "note": None, "error": ""}])
    kept = tables.without_blank(rows, ["params", "note", "error", "absent"])
    assert list(kept.columns) == ["module", "error"]
    assert list(tables.without_blank(rows, []).columns) == list(rows.columns)


def test_regression_an_ordinary_table_has_no_inner_scroll_and_counts_read_right() -> None:
    from app import tables

    # st.dataframe's own height shows 10 rows, then scrolls inside the page.
    assert tables.height(20) == tables.ROW_PX * 21 + 3
    assert tables.height(3) < tables.height(20) < tables.height(200) == tables.height(25)
    assert tables.plural(1, "run") == "1 run" and tables.plural(2, "run") == "2 runs"
    assert tables.plural(1, "read issue") == "1 read issue"
    assert tables.plural(0, "read issue") == "0 read issues"


def _luminance(colour: str) -> float:
    def channel(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(int(colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _over(colour: str, alpha: float, background: str) -> str:
    mixed = [round(int(colour[i:i + 2], 16) * alpha + int(background[i:i + 2], 16) * (1 - alpha))
             for i in (1, 3, 5)]
    return "#" + "".join(f"{v:02x}" for v in mixed)


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_regression_small_text_reaches_4_5_to_1_and_the_theme_is_not_red() -> None:
    from analyzer.dashboard import THEME, command

    # Streamlit draws captions and the sidebar's small text at 60 % of the text colour;
    # with its default text (#2f2d2b) that measured 3.8:1 on the sidebar in Chromium.
    text = THEME["theme.textColor"]
    for background in ("#ffffff", "#f8f8f7"):  # the page, the sidebar (measured)
        assert _contrast(_over(text, 0.6, background), background) >= 4.5, background
    primary = THEME["theme.primaryColor"]
    red, green, blue = (int(primary[i:i + 2], 16) for i in (1, 3, 5))
    assert blue > red and blue > green  # red is left to failures and non-finite values
    assert _contrast(primary, "#ffffff") >= 4.5
    line = command("runs", port=8599)
    for key, value in THEME.items():
        assert line[line.index(f"--{key}") + 1] == value
    assert line.index("--theme.primaryColor") < line.index("--")


def test_each_tab_is_titled_by_its_page_and_run() -> None:
    from app import ui

    assert ui.tab_title("Timeline", "nan_in_batch") == "Timeline · nan_in_batch · NaN Forensics"
    assert ui.tab_title("Runs", "nan_in_batch") == "Runs · NaN Forensics"
    assert ui.tab_title("Fleet", None) == "Fleet · NaN Forensics"


def test_regression_a_column_configured_as_text_is_still_shown_without_none() -> None:
    import streamlit as st

    from app import tables

    # The Runs table names its columns through TextColumn configs: show() left every
    # configured column as it was, so a missing step was drawn "None" and a float in full.
    raw = tables.frame([{"first_when": "12", "norm": 9.640987946362755e+37, "n": 3},
                        {"first_when": None, "norm": None, "n": 4}])
    keep = [c for c, cfg in {"first_when": st.column_config.TextColumn("first"),
                             "n": st.column_config.NumberColumn("n", format="%d")}.items()
            if not tables._text(cfg)]
    shown, numbers = tables.display(raw, keep=keep)
    assert list(shown["first_when"]) == ["12", ""] and list(shown["norm"]) == ["9.641e+37", ""]
    assert list(shown["n"]) == [3, 4]
    config = tables._config(shown, numbers, {"norm": st.column_config.TextColumn("norm")})
    assert config["norm"]["label"] == "norm" and config["norm"]["alignment"] == "right"


def test_regression_siblings_are_looked_up_once_per_folder_not_once_per_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app import data

    # A page loading n runs of one folder looked every sibling's facts up for each run (n²
    # cached copies: 199 sibling look-ups per run on a folder of 200).
    refs = [data.RunRef(f"r{i}", str(tmp_path / "sweep" / f"r{i}"), f"d{i}") for i in range(30)]
    refs.append(data.RunRef("other", str(tmp_path / "elsewhere" / "other"), "d"))
    calls: list[str] = []

    def facts(path: str, digest: str) -> Any:
        calls.append(path)
        return data._Facts(path.endswith("r3"), {"seed": path[-1]})

    monkeypatch.setattr(data, "_facts", facts)
    monkeypatch.setattr(data, "_PARENTS", {}, raising=False)
    seen = [data.siblings_of(ref, refs) for ref in refs]
    assert len(calls) == len(refs)  # each run once, not once per run asking
    assert set(seen[0].envs) == {f"r{i}" for i in range(1, 30) if i != 3}
    assert "r0" not in seen[0].envs and seen[-1].envs == {}
    # the siblings' digest names them with their fingerprints: a changed run changes it
    refs[1] = data.RunRef("r1", refs[1].path, "changed")
    again = data.siblings_of(refs[0], refs)
    assert len(calls) == 2 * len(refs) - 1 and again.digest != seen[0].digest


def test_status_of_is_the_runs_health_from_its_read(tmp_path: Path) -> None:
    import os
    import shutil

    from app import data

    samples = ENTRY.parent.parent / "sample_runs"
    if not (samples / "healthy_control").is_dir():
        pytest.skip("no sample runs")
    shutil.copytree(samples / "healthy_control", tmp_path / "healthy")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "events.out.tfevents.1.host").write_bytes(os.urandom(4096))
    refs = data.list_runs(str(tmp_path))
    assert not isinstance(refs, str)
    status = {r.name: data.status_of(r, refs) for r in refs}
    assert status == {"healthy": "finite", "junk": "unreadable"}


def test_regression_the_runs_table_fits_the_page_and_draws_no_none(runs: Path) -> None:
    """The Runs table went to st.dataframe as it was: 'None' in every cell a healthy run
    has no value for, fifteen columns cut at the page's edge at 1440 px."""
    import json

    at = open_app()
    no_error(at)
    frame = at.dataframe[0]
    table = frame.value
    shown = [c for c in table.columns if c in frame.proto.column_order]
    assert not table[shown].isna().any().any()
    assert not (table[shown].astype(str) == "None").any().any()
    healthy = table[table["status"] == "finite"]
    assert len(healthy) and (healthy["first_when"] == "").all() and (healthy["tag"] == "").all()
    config = json.loads(frame.proto.columns)
    widths = [config[c]["width"] for c in frame.proto.column_order]
    assert all(isinstance(w, int) for w in widths) and sum(widths) + 40 <= 980, widths
    at.toggle(key="runs_every_column").set_value(True).run()
    assert "first_issue" in at.dataframe[0].proto.column_order
    # a picked row links to every run page, Compare too
    at.session_state["runs_table"] = {"selection": {"rows": [0], "columns": []}}
    at.run()
    pages = {link.proto.page.rsplit("/", 1)[-1] for link in at.get("page_link")}
    assert "compare" in " ".join(pages), pages


def test_regression_the_runs_page_writes_no_stray_text_above_its_title(runs: Path) -> None:
    # A bare string at a page's top level is written on the page by Streamlit's magic.
    at = open_app()
    assert not [m.value for m in at.markdown if "columns shown by default" in m.value]


def test_regression_the_links_to_the_other_pages_leave_no_blank_slot(runs: Path) -> None:
    at = open_app("nan_in_batch")
    at.switch_page("app_pages/run.py").run()
    no_error(at)
    holding = [c for c in at.columns if any(True for _ in c.get("page_link"))]
    assert len(holding) == len(ui_pages()) - 1
    assert not [c for c in at.columns if not c.children], "an empty column beside the links"


def ui_pages() -> list[str]:
    from app import ui

    return ui.RUN_PAGES
