"""The Compare page and its plain logic (app/compare.py), on a real small sweep.

The sweep is trained for real by :mod:`analyzer.scenarios.sweep`'s trainer (Lightning's
TensorBoard logger, an hparams.yaml, a checkpoint for trial_000): four trials in one folder
that differ only in the learning rate, two that train and two that diverge at steps the
trainer reports, and one more healthy trial in another folder below the same root. Each
trial folder gets the env.json the flight recorder writes, so that every trial has the same
environment keys.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.test_app import ENTRY, TIMEOUT, no_error, served_samples, texts, tree

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
pytest.importorskip("lightning")

from streamlit.testing.v1 import AppTest

from analyzer.model import RunResult
from app import compare, views

COMPARE = "app_pages/compare.py"
TRIALS = {"sweep/trial_000": 0.1, "sweep/trial_001": 0.2, "sweep/trial_002": 20.0,
          "sweep/trial_004": 1.0, "other/trial_009": 0.1}
"""Where each trial is trained, and its learning rate: the only key that differs."""


@dataclass(frozen=True)
class Sweep:
    root: Path
    truth: dict[str, int | None]
    """Each trial's first non-finite step, as its trainer saw it (None: it trained)."""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    import torch

    from analyzer.capture.env import write_env
    from analyzer.scenarios import sweep as trainer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("compare") / "runs"
    ratings = trainer._ratings()
    truth = {}
    for where, lr in TRIALS.items():
        folder, name = where.split("/")
        done = trainer.train(trainer.Trial(name, lr, False, "relu", 7), str(root / folder),
                             ratings)
        write_env(root / folder / name, seed=7)
        truth[name] = done.first_nonfinite_step
    assert truth["trial_002"] is not None and truth["trial_004"] is not None
    assert truth["trial_002"] != truth["trial_004"]
    assert truth["trial_000"] is None and truth["trial_001"] is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORENSICS_RUNS", str(root))
        yield Sweep(root, truth)


@pytest.fixture(scope="module")
def results(sweep: Sweep) -> dict[str, RunResult]:
    """The sweep analysed as ``forensics analyze`` does, by trial name."""
    from analyzer import pipeline

    found = pipeline.discover(str(sweep.root)).runs
    ranked = pipeline.rank_all([pipeline.locate(pipeline.align(pipeline.read_run(f)))
                                for f in found])
    return {r.run.path.rsplit("/", 1)[-1]: r for r in ranked}


def test_defaults_are_the_siblings_healthy_first(results: dict[str, RunResult]) -> None:
    cands = [compare.Candidate(r.run.name, r.run.path, r.status == "finite")
             for r in results.values()]
    chosen = next(c for c in cands if c.path.endswith("trial_002"))
    names = {c.path.rsplit("/", 1)[-1]: c.name for c in cands}
    assert compare.default_picks(chosen, cands) == [names["trial_000"], names["trial_001"],
                                                    names["trial_004"]]
    assert compare.default_picks(chosen, cands, cap=1) == [names["trial_000"]]
    # The run in another folder is offered, after the siblings.
    assert [c.name for c in compare.ordered(chosen, cands)][-1] == names["trial_009"]


def test_the_learning_rate_row_differs_and_equal_keys_are_hidden(
        results: dict[str, RunResult]) -> None:
    runs = {n: results[n] for n in ("trial_002", "trial_000", "trial_001")}
    diff = compare.key_diff(runs)
    assert diff.columns == ["group", "key", *runs]
    rows = {(r["group"], r["key"]): r for r in diff.rows}
    lr = rows[("setting", "learning_rate")]
    assert [lr[n] for n in runs] == ["20", "0.1", "0.2"]
    # Only trial_000 saved a checkpoint: its dtype is a difference.
    saved = rows[("checkpoint", "checkpoint.weights dtype")]
    assert [saved[n] for n in runs] == [None, "float32", None]
    shown = {key for _, key in rows}
    for equal in ("seed", "optimizer", "max_steps", "env.torch", "env.default_dtype",
                  "activation", "model.dim"):
        assert equal not in shown, equal
    # The file's own key for the rate is the setting already shown, not a second row.
    assert "lr" not in shown
    assert set(shown) == {"learning_rate", "checkpoint.weights dtype"}, shown
    every = compare.key_diff(runs, show_all=True)
    assert len(every.rows) == len(diff.rows) + diff.same
    assert {r["key"] for r in every.rows} >= {"seed", "env.torch", "optimizer"}
    assert diff.same == len(every.rows) - 2


def test_aligned_at_the_failure_each_failed_run_counts_from_its_own(
        sweep: Sweep, results: dict[str, RunResult]) -> None:
    runs = {n: results[n] for n in ("trial_002", "trial_000", "trial_004")}
    roles = {n: views.tag_roles(r.run.tags()) for n, r in runs.items()}
    start = compare.panels(runs, roles, compare.ALIGN_START)
    aligned = compare.panels(runs, roles, compare.ALIGN_FAILURE)
    assert list(aligned) == ["loss", "grad norm", "learning rate"]
    shift = {"trial_002": sweep.truth["trial_002"], "trial_004": sweep.truth["trial_004"],
             "trial_000": sweep.truth["trial_002"]}  # a healthy run: the chosen run's
    for run, by in shift.items():
        before = [ln.curve for ln in start["loss"] if ln.run == run]
        after = [ln.curve for ln in aligned["loss"] if ln.run == run]
        assert len(before) == len(after) == 1
        assert before[0].steps[0] == 0
        assert np.array_equal(after[0].steps, before[0].steps - by)
    for run in ("trial_002", "trial_004"):  # every failed run's first non-finite at 0
        lines = [ln.curve for p in aligned.values() for ln in p if ln.run == run]
        first = min(int(c.steps[c.bad].min()) for c in lines if c.bad.any())
        assert first == 0
    assert [ln.chosen for ln in aligned["loss"]] == [True, False, False]
    fig: Any = compare.figure(aligned, list(runs), compare.ALIGN_FAILURE,
                              {n: compare.failure_step(r) for n, r in runs.items()})
    crosses = [t for t in fig.data if t.name == compare.NONFINITE]
    assert crosses and all(t.marker.color == "#d62728" for t in crosses)
    lines = [t for t in fig.data if t.name not in (compare.NONFINITE, compare.SKIPPED)]
    assert "#d62728" not in {t.line.color for t in lines}  # red is for the failure only
    assert {t.line.width for t in lines if t.name == "trial_002"} == {compare.CHOSEN_WIDTH}
    assert {t.line.width for t in lines if t.name != "trial_002"} == {compare.OTHER_WIDTH}


def test_findings_the_failed_run_has_and_the_healthy_ones_have_not(
        results: dict[str, RunResult]) -> None:
    failed = results["trial_002"]
    healthy = {n: results[n] for n in ("trial_000", "trial_001")}
    codes = {f.code for f in failed.findings}
    assert "NF202" in codes  # learning-rate-too-high
    only_mine, only_theirs, shared = compare.finding_diff(failed, healthy)
    assert {r["code"] for r in only_mine} == codes
    row = next(r for r in only_mine if r["code"] == "NF202")
    assert row["rule"] == "learning-rate-too-high" and row["confidence"] in (
        "low", "medium", "high")
    assert only_theirs == [] and shared == 0
    # The reverse: the healthy run set beside the failed one.
    mine, theirs, _ = compare.finding_diff(results["trial_000"], {"trial_002": failed})
    assert mine == []
    assert "NF202" in {r["code"] for r in theirs}
    assert "trial_002 (" in next(r for r in theirs if r["code"] == "NF202")["runs"]


def xs(trace: dict[str, Any]) -> list[float]:
    """A trace's x values as the page sent them (plotly packs arrays as base64)."""
    raw = trace["x"]
    if isinstance(raw, dict):
        return list(np.frombuffer(base64.b64decode(raw["bdata"]), dtype=np.dtype(raw["dtype"])))
    return list(raw)


def open_compare(run: str) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.query_params["run"] = run
    at.run()
    at.switch_page(COMPARE).run()
    no_error(at)
    return at


def frame_keys(at: AppTest) -> list[str]:
    frame = next(f.value for f in at.dataframe if "group" in f.value.columns)
    return list(frame["key"])


def test_page_on_the_sweep(sweep: Sweep, results: dict[str, RunResult]) -> None:
    before = tree(sweep.root)
    name = {k: r.run.name for k, r in results.items()}
    at = open_compare(name["trial_002"])
    picked = at.multiselect(key=compare.picker_key(name["trial_002"]))
    assert picked.value == [name["trial_000"], name["trial_001"], name["trial_004"]]
    assert picked.options[-1] == name["trial_009"]
    assert frame_keys(at) == ["learning_rate", "checkpoint.weights dtype"]
    shown = texts(at)
    assert f"**{name['trial_004']}**: first non-finite at step {sweep.truth['trial_004']}" \
        in shown
    assert f"**{name['trial_000']}**: finite · " in shown
    mine = next(f.value for f in at.dataframe if "title" in f.value.columns)
    assert list(mine["code"]) == ["NF202"] and list(mine["rule"]) == ["learning-rate-too-high"]
    assert not any("runs" in f.value.columns for f in at.dataframe)  # nothing the other way
    assert f"0 rules fired both on {name['trial_002']} and on a run beside it" in texts(at)
    at.radio(key="compare_align").set_value(compare.ALIGN_FAILURE).run()
    no_error(at)
    figure = json.loads(at.get("plotly_chart")[0].proto.spec)
    for trial, by in (("trial_002", "trial_002"), ("trial_004", "trial_004"),
                      ("trial_000", "trial_002")):
        drawn = next(t for t in figure["data"] if t["name"] == name[trial])
        assert xs(drawn)[0] == -sweep.truth[by]  # type: ignore[operator]
    at.toggle(key="compare_all_keys").set_value(True).run()
    assert "seed" in frame_keys(at)
    at.multiselect(key=compare.picker_key(name["trial_002"])).set_value(
        [name["trial_009"]]).run()  # a run elsewhere below the root
    no_error(at)
    assert frame_keys(at)  # every key shown: the toggle is on
    # Another run picked in the sidebar starts from its own siblings, not from these picks.
    at.selectbox(key="run_picker").set_value(name["trial_001"]).run()
    no_error(at)
    assert at.multiselect(key=compare.picker_key(name["trial_001"])).value == [
        name["trial_000"], name["trial_002"], name["trial_004"]]
    at.selectbox(key="run_picker").set_value(name["trial_002"]).run()
    assert at.multiselect(key=compare.picker_key(name["trial_002"])).value == [
        name["trial_009"]]
    assert tree(sweep.root) == before


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from served_samples(tmp_path_factory, "compare_samples")


def test_page_on_the_sample_runs(samples: Path) -> None:
    at = open_compare("adam_eps_fp16")
    picked = at.multiselect(key=compare.picker_key("adam_eps_fp16"))
    # Finite siblings first (by name), then the failed ones.
    assert picked.value == ["amp_benign_skips", "healthy_control", "amp_scale_collapse"]
    figure = json.loads(at.get("plotly_chart")[0].proto.spec)
    # amp_benign_skips's non-finite gradients are its scaler's skips: not marked as failures.
    skips = [t for t in figure["data"] if t["name"] == compare.SKIPPED]
    assert any(t["text"][0].startswith("amp_benign_skips: ") for t in skips)
    red = [t for t in figure["data"] if t["name"] == compare.NONFINITE]
    assert not any(x.startswith("amp_benign_skips: ") for t in red for x in t["text"])
    assert "On adam_eps_fp16 and on none of the others" in texts(at)


def test_regression_a_damaged_sibling_is_no_healthy_default(
        sweep: Sweep, tmp_path: Path) -> None:
    """A healthy trial whose event file is cut in half reads as finite (no value of it is
    non-finite) but is damaged: it comes after the whole healthy runs, not among them."""
    import shutil

    from analyzer import pipeline

    root = tmp_path / "runs"
    for name in ("trial_000", "trial_001", "trial_002"):
        shutil.copytree(sweep.root / "sweep" / name, root / name)
    event = next((root / "trial_000").rglob("events.out.tfevents.*"))
    data = event.read_bytes()
    event.write_bytes(data[: len(data) // 2])
    found = pipeline.discover(str(root)).runs
    results = {r.run.name: r for r in pipeline.rank_all(
        [pipeline.locate(pipeline.align(pipeline.read_run(f))) for f in found])}
    assert results["trial_000"].status == "finite"  # the run's own word: no NaN in it
    assert not compare.healthy(results["trial_000"])
    assert compare.healthy(results["trial_001"])
    cands = [compare.Candidate(n, r.run.path, compare.healthy(r)) for n, r in results.items()]
    chosen = next(c for c in cands if c.name == "trial_002")
    assert compare.default_picks(chosen, cands) == ["trial_001", "trial_000"]
    assert not compare.healthy(None, "cannot be read")


def test_run_colours_are_neither_red_nor_the_skip_colour() -> None:
    from app.charts import COLOURS

    names = [f"run_{k}" for k in range(12)]
    given = compare.colours(names)
    assert len(set(given[n] for n in names[:6])) == 6  # the first six all differ
    assert not {COLOURS["first non-finite"], COLOURS["overflow skip"]} & set(given.values())


def test_the_health_of_a_few_siblings_only_is_looked_at(
        results: dict[str, RunResult]) -> None:
    """A sweep folder may hold hundreds of runs: the defaults need the first healthy few."""
    by_name = {r.run.name: r for r in results.values()}
    cands = [compare.Candidate(n, r.run.path) for n, r in by_name.items()]
    chosen = next(c for c in cands if c.name.endswith("trial_002"))
    asked: list[str] = []

    def healthy_of(c: compare.Candidate) -> bool:
        asked.append(c.name)
        return compare.healthy(by_name[c.name])

    known = compare.with_health(chosen, cands, healthy_of, cap=1)
    assert asked == ["sweep/trial_000"]  # healthy: one was wanted
    assert compare.default_picks(chosen, known, cap=1) == ["sweep/trial_000"]
    asked.clear()
    known = compare.with_health(chosen, cands, healthy_of, cap=3, look=2)
    assert asked == ["sweep/trial_000", "sweep/trial_001"]
    assert {c.name: c.healthy for c in known} == {
        "other/trial_009": None, "sweep/trial_000": True, "sweep/trial_001": True,
        "sweep/trial_002": None, "sweep/trial_004": None}


def test_a_healthy_chosen_run_lends_the_earliest_failure_compared(
        sweep: Sweep, results: dict[str, RunResult]) -> None:
    runs = {n: results[n] for n in ("trial_000", "trial_004", "trial_002")}
    assert compare.reference_step(runs) == sweep.truth["trial_002"]  # the earlier of two
    assert compare.offsets(runs, compare.ALIGN_FAILURE) == {
        "trial_000": sweep.truth["trial_002"], "trial_004": sweep.truth["trial_004"],
        "trial_002": sweep.truth["trial_002"]}
    assert compare.offsets(runs, compare.ALIGN_START) == dict.fromkeys(runs, 0)
    finite = {n: results[n] for n in ("trial_000", "trial_001", "trial_009")}
    assert compare.reference_step(finite) is None  # nothing to align at: the page offers
    assert set(compare.offsets(finite, compare.ALIGN_FAILURE).values()) == {0}  # step 0


def test_an_environment_one_run_lacks_is_a_difference(sweep: Sweep, tmp_path: Path) -> None:
    import shutil

    import torch

    from analyzer import pipeline

    root = tmp_path / "runs"
    for name in ("trial_000", "trial_002"):
        shutil.copytree(sweep.root / "sweep" / name, root / name)
    (root / "trial_000" / "env.json").unlink()
    found = pipeline.discover(str(root)).runs
    runs = {r.run.name: r for r in pipeline.rank_all(
        [pipeline.locate(pipeline.align(pipeline.read_run(f))) for f in found])}
    rows = {r["key"]: r for r in compare.key_diff(
        {"trial_002": runs["trial_002"], "trial_000": runs["trial_000"]}).rows}
    assert rows["env.torch"]["group"] == "environment"
    assert rows["env.torch"]["trial_002"] == torch.__version__
    assert rows["env.torch"]["trial_000"] is None
    assert "env.default_dtype" in rows and "learning_rate" in rows


def test_regression_an_unreadable_chosen_run_is_not_called_the_bold_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compare on a run of which nothing could be read: its siblings' curves are drawn, and
    the caption said 'The bold line is junk' of a line that is not there."""
    import os
    import shutil

    samples = ENTRY.parent.parent / "sample_runs"
    if not (samples / "healthy_control").is_dir():
        pytest.skip("no sample runs")
    root = tmp_path / "runs"
    shutil.copytree(samples / "healthy_control", root / "healthy_control")
    (root / "junk").mkdir()
    (root / "junk" / "events.out.tfevents.1.host").write_bytes(os.urandom(4096))
    monkeypatch.setenv("FORENSICS_RUNS", str(root))
    at = open_compare("junk")
    shown = texts(at)
    assert "unreadable" in shown
    assert at.get("plotly_chart"), "the sibling's curves"
    assert "The bold line is junk" not in shown
    assert "junk has no curve here" in shown
    assert at.toggle(key="compare_log_junk_loss").value in (True, False)  # a toggle per panel


def _line(run: str, values: list[float]) -> compare.Line:
    steps = np.arange(len(values), dtype=np.int64)
    curve = views.Curve("loss", "loss", f"{run}/train.log", steps, np.array(values))
    return compare.Line(run, curve, run == "diverged")


def test_regression_a_diverged_loss_beside_a_zero_is_drawn_on_a_log_axis() -> None:
    """lightning_nan's loss reaches 2e37; healthy_control's log rounds its loss to 0.0000:
    the zero kept the panel linear and every other run's loss lay flat on 0. The page has
    a log toggle per panel, defaulting to log for such a panel."""
    diverged = _line("diverged", [160.0, 1e10, 2e37, float("inf")])
    healthy = _line("healthy", [1.7, 0.3, 0.0, 0.0001])
    assert not views.log_scale([diverged.curve, healthy.curve])
    assert compare.log_default([diverged, healthy])
    assert not compare.log_default([_line("a", [1.0, 0.5, 0.0]), _line("b", [0.9, 0.4])])
    assert not compare.log_default([_line("a", [1e9, -1.0, 1e-3])])  # a negative value
    drawn = {"loss": [diverged, healthy]}
    spec = json.loads(compare.figure(drawn, ["diverged", "healthy"], compare.ALIGN_START,
                                     {"diverged": 3, "healthy": None}).to_json())
    assert spec["layout"]["yaxis"]["type"] == "log"
    spec = json.loads(compare.figure(drawn, ["diverged", "healthy"], compare.ALIGN_START,
                                     {"diverged": 3, "healthy": None},
                                     log={"loss": False}).to_json())
    assert spec["layout"]["yaxis"]["type"] == "linear"


def test_regression_the_key_table_fits_the_page_with_four_runs(samples: Path) -> None:
    """With three runs picked the key table ran past the page's right edge at 1440 px (an
    env.platform value widened its column): the runs' columns now share a fixed width."""
    at = open_compare("adam_eps_fp16")
    frame = next(f for f in at.dataframe if "group" in f.value.columns)
    config = json.loads(frame.proto.columns)
    runs = [c for c in frame.value.columns if c not in ("group", "key")]
    assert len(runs) == 4
    widths = [config[c]["width"] for c in ["group", "key", *runs]]
    assert all(isinstance(w, int) for w in widths) and sum(widths) <= 1000, widths
