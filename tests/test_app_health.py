"""Damaged runs are never shown as healthy: :func:`app.health.health` on folders damaged on
purpose (an event file of random bytes, a real event file cut before its NaN, one cut in a
healthy run), the Runs table's status, and the run pages' headline and read-issue box
under AppTest; the headline of a run whose only non-finite values were overflow skips.

The event files come from torch's SummaryWriter and are cut afterwards; the random bytes
are seeded so a failure can be reproduced.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_app import ENTRY, SAMPLES, TIMEOUT, no_error, texts, tree

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

NAN_AT = 30


def _event_file(folder: Path, nan_at: int | None, steps: int = 40) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step in range(steps):
        bad = nan_at is not None and step >= nan_at
        writer.add_scalar("train/loss", float("nan") if bad else 1.0 / (step + 1), step)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def _cut(path: Path, keep: int) -> int:
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    return len(data)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """unreadable/ (random bytes), cut_before_nan/ (NaN from step 30, file cut in half),
    whole/ (the same training, not cut) and healthy_cut/ (finite, cut in half)."""
    root = tmp_path_factory.mktemp("damaged") / "runs"
    (root / "unreadable").mkdir(parents=True)
    (root / "unreadable" / "events.out.tfevents.1.host").write_bytes(
        random.Random(19).randbytes(4096))
    path = _event_file(root / "cut_before_nan", NAN_AT)
    _cut(path, path.stat().st_size // 2)
    _event_file(root / "whole", NAN_AT)
    path = _event_file(root / "healthy_cut", None)
    _cut(path, path.stat().st_size // 2 + 7)
    path = _event_file(root / "flipped", None)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one record's bytes changed: reading goes on past it
    path.write_bytes(bytes(data))
    return root


@pytest.fixture(scope="module")
def results(damaged: Path) -> dict[str, object]:
    from analyzer import api

    report = api.analyze(str(damaged), replay=False)
    return {Path(r.run.path).name: r for r in report.results}


def test_regression_random_bytes_are_unreadable_not_finite(results: dict[str, object]) -> None:
    from app.health import health
    from app.rows import run_row

    well = health(results["unreadable"])  # type: ignore[arg-type]
    assert well.status == "unreadable"
    assert well.ends_early is not None
    assert "`events.out.tfevents.1.host` at byte 0" in well.ends_early
    assert [i.kind for i in well.issues] == ["not_event_file"]
    assert run_row("unreadable", results["unreadable"], None).status == "unreadable"  # type: ignore[arg-type]


def test_regression_a_run_cut_before_its_nan_is_damaged_and_says_where_it_ends(
        results: dict[str, object]) -> None:
    from app.health import health
    from app.rows import run_row

    result = results["cut_before_nan"]
    assert result.status == "finite"  # type: ignore[attr-defined]  # what the analysis says
    well = health(result)  # type: ignore[arg-type]
    assert well.status == "damaged"
    assert well.ends_early is not None
    found = re.search(r"is cut at byte (\d+): its record ends at step (\d+); nothing after "
                      r"it was read", well.ends_early)
    assert found, well.ends_early
    last = int(found.group(2))
    assert last < NAN_AT
    assert last == max(int(s.steps.max()) for s in result.run.series)  # type: ignore[attr-defined]
    row = run_row("cut_before_nan", result, None)  # type: ignore[arg-type]
    assert (row.status, row.ends_early) == ("damaged", well.ends_early)
    # The same training, whole, fails at its NaN; a cut healthy run is damaged too.
    assert health(results["whole"]).status == "failed"  # type: ignore[arg-type]
    assert health(results["healthy_cut"]).status == "damaged"  # type: ignore[arg-type]


def test_damage_that_reading_went_past_costs_data_but_ends_no_record(
        results: dict[str, object]) -> None:
    from app.health import health

    result = results["flipped"]
    well = health(result)  # type: ignore[arg-type]
    assert well.status == "damaged"
    assert well.costly and well.ends_early is None
    steps = [int(s) for s in result.run.series[0].steps]  # type: ignore[attr-defined]
    assert steps[-1] == 39 and len(steps) < 40  # read to its end, a record lost


def test_a_run_not_analysed_at_all_is_unreadable_with_the_reason() -> None:
    from app.health import health

    well = health(None, "no such folder")
    assert (well.status, well.ends_early) == ("unreadable", "no such folder")


def test_overflow_skips_are_put_in_ranges() -> None:
    from app.health import step_ranges

    assert step_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3, 8, 10-11"
    assert step_ranges(list(range(0, 40, 2))).endswith(", ...")


@pytest.fixture()
def served(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("FORENSICS_RUNS", str(damaged))
    before = tree(damaged)
    yield damaged
    assert tree(damaged) == before


def _run_page(run: str, page: str = "run") -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.query_params["run"] = run
    at.run()
    at.switch_page(f"app_pages/{page}.py").run()
    no_error(at)
    return at


def _headline(at: AppTest, run: str) -> str:
    (line,) = [m.value for m in at.markdown if m.value.startswith(f"**{run}**")]
    return str(line)


@pytest.mark.parametrize("page", ["run", "timeline", "layers", "findings", "logs"])
def test_regression_the_headline_of_an_unreadable_run_says_so_and_shows_its_issue(
        served: Path, page: str) -> None:
    at = _run_page("unreadable", page)
    line = _headline(at, "unreadable")
    assert "**unreadable**: nothing could be read" in line
    assert "finite" not in line
    assert "1 read issue" in line and "1 read issues" not in line
    (box,) = [w.value for w in at.warning if "read issue" in w.value]
    assert "Nothing of this run could be read" in box
    assert "`events.out.tfevents.1.host` at byte 0: not_event_file: " in box


@pytest.mark.parametrize("page", ["timeline", "layers"])
def test_regression_pages_that_draw_what_was_logged_say_nothing_of_an_unreadable_run_logged(
        served: Path, page: str) -> None:
    """Timeline said 'Not logged by this run: loss, grad norm, ...' and Layers 'This run
    logged no per-layer norms' of a run none of whose files could be read."""
    at = _run_page("unreadable", page)
    shown = [str(e.value) for kind in ("caption", "info", "markdown")
             for e in at.get(kind)]
    assert not any("Not logged by this run" in t or "logged no" in t for t in shown), shown
    assert any("nothing to draw here" in t for t in shown), shown


@pytest.mark.parametrize("page", ["run", "timeline", "findings"])
def test_regression_a_truncated_run_reads_damaged_on_every_page_with_its_cut(
        served: Path, page: str) -> None:
    at = _run_page("cut_before_nan", page)
    line = _headline(at, "cut_before_nan")
    assert "**damaged**: the values read are finite, but the record ends early" in line
    assert "every logged value is finite" not in line
    assert re.search(r"is cut at byte \d+: its record ends at step \d+", line)
    (box,) = [w.value for w in at.warning if "read issue" in w.value]
    assert "record is damaged" in box
    if page == "findings":
        (note,) = [i.value for i in at.info if i.value.startswith("No findings")]
        assert "every logged value is finite" not in note and "record is damaged" in note
    assert re.search(r"`events\.out\.tfevents\.[^`]+` at byte \d+: truncated: ", box)


def test_regression_benign_overflow_skips_are_not_called_all_finite(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The headline said "every logged value is finite" above red non-finite marks.
    if not (SAMPLES / "amp_benign_skips" / "scenario.json").is_file():
        pytest.skip("sample_runs/ has no amp_benign_skips (make samples)")
    import json

    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / "amp_benign_skips", root / "amp_benign_skips")
    scenario = json.loads((root / "amp_benign_skips" / "scenario.json").read_text())
    skipped = scenario["skipped_steps"]
    monkeypatch.setenv("FORENSICS_RUNS", str(root))
    at = _run_page("amp_benign_skips", "timeline")
    line = _headline(at, "amp_benign_skips")
    assert "every logged value is finite" not in line
    assert (f"the non-finite values were the loss scaler's overflow skips, benign: "
            f"{len(skipped)} skipped steps (steps {skipped[0]}-{skipped[-1]}), training went "
            f"on to step {scenario['steps_run'] - 1}") in line
    assert "damaged" not in texts(at)
