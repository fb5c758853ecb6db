"""The Dask executor: a LocalCluster of 2 worker processes on loopback gives the same report
as this process, through its scheduler's tcp:// address and through ``--scheduler
local:2``; a task that raises and a worker that dies are results that say so; replays on a
GPU need workers that declare one; without dask installed, a usage error names the extra."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analyzer import api
from analyzer.cli import main
from analyzer.errors import UsageError
from analyzer.ingest.discover import RunFiles
from analyzer.model import RunResult
from analyzer.pipeline import RunOptions, analyze_run, discover, runs_of
from analyzer.report.json import to_json
from tests.conftest import SAMPLE_RUNS, scenarios, write_summary_run
from tests.readonly import snapshot

distributed = pytest.importorskip("distributed")

NO_REPLAY = RunOptions(replay=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import dask

    from analyzer.fleet.cluster import local_cluster

    # One retry after a worker dies, so that the dying-worker test ends in seconds.
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        local = distributed.LocalCluster(**local_cluster(2))
    try:
        yield local
    finally:
        local.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    for k in range(4):
        loss = [1.0, 0.5, math.nan] if k % 2 else [1.0, 0.5, 0.25]
        folder = root / ("sweep_a" if k < 2 else "sweep_b") / f"run_{k}"
        write_summary_run(str(folder), {"train/loss": loss})
        (folder / "env.json").write_text(json.dumps({"torch": f"2.{k % 3}.0"}))
    return root


def test_a_tcp_scheduler_gives_the_same_report_as_this_process(cluster: Any,
                                                               fleet: Path) -> None:
    before = snapshot(fleet)
    here = api.analyze(str(fleet), jobs=1, keep_series=False)
    there = api.analyze(str(fleet), scheduler=cluster.scheduler_address, keep_series=False)
    assert [r.status for r in there.results] == ["finite", "failed", "finite", "failed"]
    assert to_json(there) == to_json(here)
    assert snapshot(fleet) == before


@pytest.mark.skipif(not scenarios(), reason="sample_runs/ holds no scenario runs")
def test_regression_relative_paths_reach_a_cluster_started_elsewhere(
        cluster: Any, fleet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cluster's workers started in another directory (as 'dask worker' on another
    # machine does): a run named relative to this one was looked for in theirs, and every
    # run came back unreadable.
    monkeypatch.chdir(fleet)
    there = api.analyze("sweep_a", scheduler=cluster.scheduler_address, keep_series=False)
    assert [r.status for r in there.results] == ["finite", "failed"]
    assert [r.run.name for r in there.results] == ["run_0", "run_1"]
    assert all(os.path.isabs(r.run.path) for r in there.results)


def test_the_sample_runs_replayed_on_the_cluster_give_the_same_report(
        cluster: Any, sample_report: Any) -> None:
    there = api.analyze(SAMPLE_RUNS, scheduler=cluster.scheduler_address)
    assert any(r.replay is not None for r in there.results)
    assert to_json(there) == to_json(sample_report)


@pytest.mark.skipif(not scenarios(), reason="sample_runs/ holds no scenario runs")
def test_cli_json_is_the_same_on_a_local_cluster(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(os.path.dirname(SAMPLE_RUNS))
    outputs = []
    before = snapshot(Path(SAMPLE_RUNS))
    for how in (["-j", "1"], ["--scheduler", "local:2"]):
        assert main(["analyze", "sample_runs", "--no-replay", "--json", "-", *how]) == 1
        outputs.append(capsys.readouterr().out)
    assert len(json.loads(outputs[0])["runs"]) == len(scenarios())
    assert outputs[1] == outputs[0]
    assert snapshot(Path(SAMPLE_RUNS)) == before  # nothing written into the runs


def _raises_on_run_1(found: RunFiles, options: RunOptions) -> RunResult:
    """Run on a worker (imported there by name from this module)."""
    if found.name.endswith("run_1"):
        raise ValueError("broken on the worker")
    return analyze_run(found, options)


def _dies_on_run_2(found: RunFiles, options: RunOptions) -> RunResult:
    if found.name.endswith("run_2"):
        os._exit(3)  # the worker process dies: the nanny restarts it
    return analyze_run(found, options)


def _results(cluster: Any, fleet: Path, task: Any, only: str | None = None
             ) -> dict[str, RunResult]:
    from analyzer.fleet.cluster import Dask

    runs = [r for r in runs_of(discover(str(fleet)), str(fleet))
            if only is None or r.name == only]
    with Dask(cluster.scheduler_address) as executor:
        got = dict(executor.map(runs, NO_REPLAY, task))
    assert sorted(got) == list(range(len(runs)))  # no run lost
    return {r.run.name: r for r in got.values()}


def test_a_task_that_raises_on_a_worker_is_a_result_with_an_issue(cluster: Any,
                                                                  fleet: Path) -> None:
    by_name = _results(cluster, fleet, _raises_on_run_1)
    broken = by_name["sweep_a/run_1"]
    (issue,) = broken.run.issues
    assert broken.status == "unreadable" and issue.kind == "unreadable"
    assert issue.message.startswith("not analysed: the analysis raised ValueError: broken on "
                                    "the worker (in test_dask.py:")
    assert by_name["sweep_b/run_3"].failed and by_name["sweep_a/run_0"].status == "finite"


def test_replays_on_a_gpu_need_workers_that_declare_one(cluster: Any, fleet: Path) -> None:
    from analyzer.fleet.cluster import Dask

    runs = runs_of(discover(str(fleet)), str(fleet))
    runs[0] = replace(runs[0], capture_dirs=(str(fleet / "capture" / "step_2"),))
    with Dask(cluster.scheduler_address) as executor, \
            pytest.raises(UsageError, match=r"--resources GPU=1"):
        next(executor.map(runs, RunOptions(device="cuda")))


def test_without_dask_a_scheduler_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                  fleet: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    assert main(["analyze", str(fleet), "--scheduler", "local:2", "-q"]) == 2
    assert "pip install 'nan-forensics[dask]'" in capsys.readouterr().err


def test_a_scheduler_that_is_neither_an_address_nor_local_is_refused(
        fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(fleet), "--scheduler", "localhost", "-q"]) == 2
    assert "tcp://HOST:PORT" in capsys.readouterr().err
    assert main(["analyze", str(fleet), "--scheduler", "local:0", "-q"]) == 2
    assert "local:N" in capsys.readouterr().err


def test_regression_a_local_cluster_is_closed_when_its_client_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The LocalCluster was left running when its client could not start (an interrupt, a
    # timeout) or when the client's close raised: its workers outlived the analysis.
    from analyzer.fleet.cluster import Dask

    closed: list[str] = []

    class Cluster:
        def __init__(self, **kwargs: object) -> None:
            pass

        def close(self) -> None:
            closed.append("cluster")

    class Failing:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise OSError("the client could not start")

    class Closing:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def close(self) -> None:
            closed.append("client")
            raise OSError("the client could not close")

    monkeypatch.setattr(distributed, "LocalCluster", Cluster)
    monkeypatch.setattr(distributed, "Client", Failing)
    with pytest.raises(OSError, match="could not start"):
        Dask("local:2")
    assert closed == ["cluster"]
    closed.clear()
    monkeypatch.setattr(distributed, "Client", Closing)
    with pytest.raises(OSError, match="could not close"), Dask("local:2"):
        pass
    assert closed == ["client", "cluster"]


def test_zz_a_worker_that_dies_leaves_its_run_not_analysed(cluster: Any, fleet: Path) -> None:
    # Last in the module: the dead workers' replacements take a moment to join. The run
    # goes alone: the scheduler suspects every task a dying worker held, not only its own.
    (dead,) = _results(cluster, fleet, _dies_on_run_2, only="sweep_b/run_2").values()
    (issue,) = dead.run.issues
    assert dead.status == "unreadable"
    assert issue.message.startswith("not analysed: every worker that ran it died "
                                    "(KilledWorker")
