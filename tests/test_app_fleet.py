"""The Fleet page and remote roots under Streamlit's AppTest.

The Fleet page is checked on a generated sweep (whose truth, the learning rate above which
runs diverge, the generator's manifest gives) and on a copy of the sample runs (whose
scenario.json says what each died of); remote roots on the same sample runs uploaded to a
real S3 API server on loopback (moto's), against the same folder on disk.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.test_app import (
    ENTRY,
    SAMPLES,
    TIMEOUT,
    frame_with,
    no_error,
    scenarios,
    served_samples,
    texts,
    tree,
)

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest

FLEET = "app_pages/fleet.py"


def open_fleet() -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    at.switch_page(FLEET).run()
    no_error(at)
    return at


def metrics(at: AppTest) -> dict[str, int]:
    return {m.label: int(m.value) for m in at.metric}


def runs_frame(at: AppTest) -> Any:
    """The Fleet page's runs table (its last table)."""
    return at.dataframe[-1].value


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from served_samples(tmp_path_factory, "fleet")


def test_fleet_counts_the_sample_runs_as_their_scenarios_say(samples: Path) -> None:
    expected = scenarios(samples)
    failed = sum(sc["expected"]["first_nonfinite_step"] is not None for sc in expected.values())
    at = open_fleet()
    shown = metrics(at)
    assert shown["failed"] == failed
    assert shown["finite"] == len(expected) - failed
    assert shown["unreadable"] == 0
    table = runs_frame(at).set_index("run")
    for name, sc in expected.items():
        step = sc["expected"]["first_nonfinite_step"]
        assert table.loc[name, "status"] == ("finite" if step is None else "failed"), name
        if step is not None:
            assert int(table.loc[name, "first_step"]) == step, name
    assert at.get("plotly_chart"), "the causes and the first steps are drawn"


def test_fleet_cause_filter_keeps_that_causes_runs(samples: Path) -> None:
    at = open_fleet()
    causes = at.dataframe[0].value
    top = causes.iloc[0]
    at.selectbox(key="fleet_cause").set_value(top["cause"]).run()
    no_error(at)
    shown = runs_frame(at)
    assert len(shown) == top["runs"]
    assert set(shown["cause"]) == {top["cause"]}
    assert set(shown["status"]) == {"failed"}
    at.selectbox(key="fleet_cause").set_value("every cause").run()
    assert len(runs_frame(at)) == len(scenarios(samples))


def test_fleet_run_row_links_to_its_run_page(samples: Path) -> None:
    at = open_fleet()
    table = runs_frame(at)
    name = str(table.iloc[2]["run"])
    at.session_state["fleet_runs"] = {"selection": {"rows": [2], "columns": []}}
    at.run()
    no_error(at)
    links = {link.proto.page: link.proto.query_string for link in at.get("page_link")}
    run_page = next((p for p in links if p.endswith("run")), None)
    assert run_page is not None, links
    assert f"run={name}" in links[run_page]
    at.switch_page("app_pages/run.py")
    at.query_params["run"] = name
    at.run()
    no_error(at)
    assert f"**{name}**" in texts(at)


def test_fleet_reads_no_file_the_runs_page_has_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh root, so that no cache of another test holds its runs.
    for name in ("healthy_control", "sgd_lr_too_high", "nan_in_batch"):
        if not (SAMPLES / name).is_dir():
            pytest.skip(f"sample_runs/{name} is missing")
        shutil.copytree(SAMPLES / name, tmp_path / "runs" / name)
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    from analyzer import pipeline

    reads: list[str] = []
    real = pipeline.read_run

    def counted(found: Any, **kwargs: Any) -> Any:
        reads.append(found.path)
        return real(found, **kwargs)

    monkeypatch.setattr(pipeline, "read_run", counted)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    no_error(at)
    assert sorted(Path(p).name for p in reads) == sorted(
        ["healthy_control", "sgd_lr_too_high", "nan_in_batch"])
    reads.clear()
    at.switch_page(FLEET).run()
    no_error(at)
    assert metrics(at)["failed"] == 2
    assert reads == []
    at.selectbox(key="fleet_cause").set_value(at.dataframe[0].value.iloc[0]["cause"]).run()
    no_error(at)
    assert reads == []


# --- a generated sweep ------------------------------------------------------------------

SWEEP_RUNS = 20


@pytest.fixture(scope="module")
def sweep(sweep_of: Callable[[int, str], tuple[Path, dict[str, Any]]]
          ) -> Iterator[tuple[Path, dict[str, Any]]]:
    # The session's sweep (tests/conftest.py), its first trials: the truth beside the runs,
    # never in the folder analysed.
    root, manifest = sweep_of(SWEEP_RUNS, "fleet_sweep")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORENSICS_RUNS", str(root))
        yield root, manifest


def test_fleet_names_the_separating_learning_rate(sweep: tuple[Path, dict[str, Any]]) -> None:
    root, manifest = sweep
    before = tree(root)
    at = open_fleet()
    shown = metrics(at)
    trials = manifest["trials"]
    diverged = [t for t in trials if t["diverged"]]
    assert 0 < len(diverged) < SWEEP_RUNS
    assert shown == {"failed": len(diverged), "finite": SWEEP_RUNS - len(diverged),
                     "unreadable": 0}
    separators = frame_with(at, "effect")
    lr = separators[separators["key"] == "lr"]
    assert not lr.empty and lr.iloc[0]["separates"] == "yes", separators
    effect = str(lr.iloc[0]["effect"])
    assert effect.startswith("lr >= "), effect
    # Both sides' counts are the manifest's: the trials above the cut, and those below.
    high, low = (float(side.split(":")[0].split()[-1]) for side in effect.split("; "))
    above = [t for t in trials if t["lr"] >= high]
    below = [t for t in trials if t["lr"] <= low * 1.0001]  # printed to 4 digits
    assert effect == (f"lr >= {high:.4g}: {sum(t['diverged'] for t in above)} of {len(above)} "
                      f"failed; lr <= {low:.4g}: {sum(t['diverged'] for t in below)} of "
                      f"{len(below)} failed")
    assert max(t["lr"] for t in trials if not t["diverged"] and not t["clip_gradients"]) < high
    sentence = next(m.value for m in at.markdown if m.value.startswith("**lr** separates"))
    assert effect in sentence
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    strip = next(f for f in figures
                 if f["layout"].get("xaxis", {}).get("title", {}).get("text") == "lr")
    assert strip["layout"]["xaxis"]["type"] == "log"  # lr spans decades
    drawn = {t["name"]: len(t["x"]) for t in strip["data"]}
    assert drawn == {"failed": len(diverged), "healthy": SWEEP_RUNS - len(diverged)}
    table = runs_frame(at)
    assert "lr" in table.columns
    assert tree(root) == before


def test_fleet_cause_filter_on_a_sweep(sweep: tuple[Path, dict[str, Any]]) -> None:
    at = open_fleet()
    causes = at.dataframe[0].value
    for label, runs in zip(causes["cause"], causes["runs"], strict=True):
        at.selectbox(key="fleet_cause").set_value(label).run()
        no_error(at)
        shown = runs_frame(at)
        assert len(shown) == runs, label
        assert set(shown["status"]) == {"failed"} and set(shown["cause"]) == {label}


def test_a_run_whose_analysis_fails_is_counted_unreadable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("healthy_control", "sgd_lr_too_high"):
        if not (SAMPLES / name).is_dir():
            pytest.skip(f"sample_runs/{name} is missing")
        shutil.copytree(SAMPLES / name, tmp_path / "runs" / name)
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    from analyzer import pipeline

    real = pipeline.read_run

    def broken(found: Any, **kwargs: Any) -> Any:
        if found.name == "healthy_control":
            raise RuntimeError("a reader broke")
        return real(found, **kwargs)

    monkeypatch.setattr(pipeline, "read_run", broken)
    at = open_fleet()
    assert metrics(at) == {"failed": 1, "finite": 0, "unreadable": 1}
    assert "a reader broke" in texts(at)
    assert "1 run could not be analysed" in [e.label for e in at.expander]


def test_strip_cut_lies_between_the_sides_on_the_axis_drawn() -> None:
    from analyzer.model.fleet import RunRow, Separator, Side, SweepSummary
    from app.fleetviews import spans_decades, strip, top_numeric

    rows = tuple(RunRow(f"/r/{i}", f"r{i}", "failed" if lr >= 0.1 else "finite",
                        hyperparameters={"lr": lr, "wd": 0.01 * i})
                 for i, lr in enumerate([0.001, 0.003, 0.01, 0.1, 0.3, 1.0]))
    sep = Separator("lr", "number", "mann-whitney", 6, 3, 0.001, 0.002, True,
                    Side(">=", 0.1, 3, 3), Side("<=", 0.01, 3, 0))
    weak = Separator("wd", "number", "mann-whitney", 6, 3, 0.5, 0.5, False,
                     Side(">=", 0.03, 3, 3), Side("<=", 0.02, 3, 0))
    summary = SweepSummary(6, 3, 3, 0, separators=(sep, weak), rows=rows)
    assert top_numeric(summary) is sep
    drawn = strip(summary, sep)
    assert drawn.log and spans_decades([0.001, 1.0]) and not spans_decades([1.0, 50.0])
    assert drawn.values == {"failed": [0.1, 0.3, 1.0], "healthy": [0.001, 0.003, 0.01]}
    assert drawn.cut is not None and abs(drawn.cut - (0.1 * 0.01) ** 0.5) < 1e-12
    linear = strip(summary, weak)
    assert not linear.log and linear.cut is not None and abs(linear.cut - 0.025) < 1e-12


def test_regression_a_run_tied_between_two_causes_is_listed_under_each() -> None:
    # The causes table counts a run under every cause its top findings tie on; the runs
    # table kept it under the first alone, so choosing the second listed one run fewer.
    from analyzer.model.fleet import CauseCount, SweepSummary
    from app.fleetviews import fleet_runs

    summary = SweepSummary(3, 2, 1, 0, causes=(
        CauseCount("NF101", "log-of-zero", 2, 1), CauseCount("NF102", "division-by-zero", 1, 1)))
    runs = pd.DataFrame({"run": ["a", "b", "c"], "path": ["/r/a", "/r/b", "/r/c"],
                         "status": ["failed", "failed", "finite"],
                         "cause": ["NF101", "NF101", None], "first_step": [3, 4, None]})
    ties = {"/r/a": ("NF101", "NF102")}
    for cause in summary.causes:
        shown = fleet_runs(runs, summary, [], cause.code, ties)
        assert len(shown) == cause.runs, cause
    assert list(fleet_runs(runs, summary, [], "NF102", ties)["cause"]) == [
        "NF101 log-of-zero, NF102 division-by-zero"]
    assert list(fleet_runs(runs, summary, [], "every cause", ties)["run"]) == ["a", "b", "c"]


def test_regression_the_dashboard_takes_no_unreadable_run_for_a_healthy_sibling(
        tmp_path: Path) -> None:
    # The dashboard's NF502 compared a failed run with an unreadable one that had an
    # env.json, as the command line did before pipeline.sibling_facts.
    from app import data
    from tests.test_fleet_pipeline import _env, write_summary_run

    nan = float("nan")
    for name, loss, torch in (("bad", [1.0, 0.9, nan], "2.3.0"),
                              ("good", [1.0, 0.9, 0.8], "2.1.0")):
        write_summary_run(str(tmp_path / "sweep" / name), {"train/loss": loss})
        _env(tmp_path / "sweep" / name, torch)
    unread = tmp_path / "sweep" / "unread"
    unread.mkdir()
    (unread / "events.out.tfevents.1.host").write_bytes(b"not an event file at all")
    _env(unread, "1.0.0")
    refs = data.list_runs(str(tmp_path))
    assert not isinstance(refs, str)
    (bad,) = [r for r in refs if r.name.endswith("bad")]
    assert sorted(data.siblings_of(bad, refs).envs) == ["sweep/good"]
