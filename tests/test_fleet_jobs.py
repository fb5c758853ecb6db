"""``-j N`` over a fleet: each run's whole analysis in a worker, the same results as in
this process field for field, and nothing of a run but its slim result left in the process
that gathers them. The fleet is bench/fleetgen.py's (real tiny trainings, torch's
SummaryWriter and tensorboardX, text logs, checkpoints), copied into runs."""

from __future__ import annotations

import dataclasses
import gc
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from analyzer import api
from analyzer.fleet.executors import PRELOAD, THREADED, Pool, Serial
from analyzer.model import RunResult
from analyzer.model.runs import Histogram, Run, Series
from analyzer.pipeline import RunOptions, discover, runs_of
from analyzer.report.json import to_json
from tests.benchmods import bench_module
from tests.readonly import snapshot

ROOT = Path(__file__).resolve().parent.parent
NO_REPLAY = RunOptions(replay=False)


def _fleetgen() -> ModuleType:
    return bench_module("fleetgen")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 runs of six trainings (three diverge), about a third with checkpoints."""
    out = tmp_path_factory.mktemp("jobs") / "fleet"
    _fleetgen().make_fleet(str(out), 24, seed=5)
    return out


def _same(a: Any, b: Any, where: str) -> Iterator[str]:
    """Where ``a`` and ``b`` differ, record by record and field by field (NaN equal to NaN,
    arrays by value and dtype)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            yield f"{where}: {type(a).__name__} against {type(b).__name__}"
            return
        for field in dataclasses.fields(a):
            yield from _same(getattr(a, field.name), getattr(b, field.name),
                             f"{where}.{field.name}")
    elif isinstance(a, np.ndarray):
        if not (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")):
            yield f"{where}: arrays differ"
    elif isinstance(a, (tuple, list)):
        if type(a) is not type(b) or len(a) != len(b):
            yield f"{where}: {a!r} against {b!r}"
            return
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _same(x, y, f"{where}[{k}]")
    elif isinstance(a, dict):
        if type(a) is not type(b) or list(a) != list(b):
            yield f"{where}: keys {list(a)} against {list(b)}"
            return
        for key in a:
            yield from _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    elif type(a) is not type(b) or a != b:
        yield f"{where}: {a!r} against {b!r}"


@pytest.mark.slow
def test_a_pool_gives_each_run_the_result_this_process_gives_field_for_field(
        fleet: Path) -> None:
    runs = runs_of(discover(str(fleet)), str(fleet))
    before = snapshot(fleet)
    here = dict(Serial().map(runs, NO_REPLAY))
    with Pool(2) as pool:
        pooled = dict(pool.map(runs, NO_REPLAY))
    assert sorted(pooled) == sorted(here) == list(range(len(runs)))
    assert {here[k].status for k in here} == {"failed", "finite"}
    assert any(here[k].run.checkpoints for k in here)
    for k in here:
        assert list(_same(here[k], pooled[k], runs[k].name)) == []
    assert snapshot(fleet) == before  # nothing written into the runs


@pytest.mark.slow
def test_the_report_of_a_fleet_is_the_same_with_one_and_two_jobs(fleet: Path) -> None:
    one = api.analyze(str(fleet), replay=False, jobs=1, keep_series=False)
    two = api.analyze(str(fleet), replay=False, jobs=2, keep_series=False)
    assert [r.run.name for r in one.results] == [r.run.name for r in two.results]
    assert list(_same(one, two, "report")) == []
    assert to_json(one) == to_json(two)


def _alive(kind: type) -> list[Any]:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is kind]


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_after_a_fleets_analysis_this_process_holds_its_slim_results_only(
        fleet: Path, jobs: int) -> None:
    # What the command line keeps of each run once its result is made: the slim Run of
    # its result, no series, histogram or whole Run (those would make memory grow with the
    # fleet's points, not its runs).
    before = {id(o) for kind in (Run, Series, Histogram) for o in _alive(kind)}
    done = api.analyze(str(fleet), replay=False, jobs=jobs, keep_series=False)
    assert len(done.results) == 24
    new_runs = [r for r in _alive(Run) if id(r) not in before]
    kept = {id(r.run) for r in done.results}
    assert {id(r) for r in new_runs} == kept
    assert all(r.dropped is not None and r.series == () for r in new_runs)
    assert [o for kind in (Series, Histogram) for o in _alive(kind) if id(o) not in before] \
        == []
    results = [r for r in _alive(RunResult) if id(r.run) in kept]
    assert len(results) == 24  # no earlier version of a result (before its sibling pass)


def test_preloading_the_analysis_before_forking_loads_nothing_that_runs_threads() -> None:
    # Workers are forked only from a process without threads; preloading must not make
    # this one such a process (the next pool would then start from a forkserver).
    code = ("import sys\nfrom analyzer.fleet.executors import THREADED, PRELOAD, preload\n"
            "preload()\nassert all(m in sys.modules for m in PRELOAD)\n"
            "print(','.join(m for m in THREADED if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == ""
    assert PRELOAD and not set(PRELOAD) & set(THREADED)


@pytest.mark.slow
def test_regression_a_pools_results_share_one_copy_of_each_repeated_string(
        fleet: Path) -> None:
    # Each result came back unpickled on its own, with its own copy of every tag, key,
    # tensor and rule name it shares with the others: about 4 KB of a 21 KB result.
    runs = runs_of(discover(str(fleet)), str(fleet))
    with Pool(2) as pool:
        results = [r for _, r in pool.map(runs, NO_REPLAY)]
    first: dict[str, str] = {}
    repeated = 0
    for result in results:
        assert result.run.dropped is not None
        for tag, _ in result.run.dropped.scalars:
            repeated += tag in first
            assert first.setdefault(tag, tag) is tag
    assert repeated >= len(results) - 1 > 0


def test_the_pools_string_table_stops_growing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Results come back with their strings shared through one table: names repeat across
    # a fleet, but a run's own names and its long texts do not, so the table keeps short
    # strings only, up to a bound, past which what it holds is flat in the runs.
    import io
    import pickle

    from analyzer.fleet import executors

    monkeypatch.setattr(executors, "SHARED_STRINGS", 3)
    seen: dict[str, str] = {}

    def round_trip(value: object) -> Any:
        out = io.BytesIO()
        executors._Marking(out, pickle.HIGHEST_PROTOCOL).dump(value)
        return executors._Sharing(out.getvalue(), seen).load()

    first = round_trip(["loss", "grad_norm", "x" * 200])
    again = round_trip(["loss".upper().lower(), "run-000017", "run-000018", "x" * 200])
    assert again[0] is first[0]  # a name shared
    assert "x" * 200 not in seen  # a long text is not kept
    assert len(seen) == 3 and again[1:3] == ["run-000017", "run-000018"]
    assert round_trip({"k": "v"}) == {"k": "v"}  # still read right past the bound
