"""Streaming a fleet run by run: slim results, the sibling pass, the folder-by-folder order,
the local executors (serial, process pool) and the command line's -j."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from analyzer import api
from analyzer.cli import main
from analyzer.errors import UsageError
from analyzer.fleet.choose import make_executor
from analyzer.fleet.executors import Pool, Serial, Status, Task, not_analysed
from analyzer.fleet.stream import stream
from analyzer.ingest.discover import RunFiles
from analyzer.model import RunResult
from analyzer.pipeline import (
    RunOptions,
    align,
    analyze_run,
    discover,
    healthy_siblings,
    locate,
    rank_all,
    rank_siblings,
    read_runs,
    report,
    runs_of,
    sibling_facts,
)
from analyzer.report.json import to_json
from tests.conftest import SAMPLE_RUNS, scenarios, write_summary_run
from tests.readonly import snapshot

NO_REPLAY = RunOptions(replay=False)


def _env(folder: Path, torch: str) -> None:
    (folder / "env.json").write_text(json.dumps(
        {"format": "nan-forensics-env", "version": 1, "torch": torch, "blas": "mkl"}))


@pytest.fixture
def drift_fleet(tmp_path: Path) -> Path:
    """Two sweeps: in ``sweep/`` a failed run whose torch differs from its healthy sibling
    and a failed one that does not; in ``other/`` a healthy run, not their sibling."""
    nan = math.nan
    runs = {"sweep/bad": ([1.0, 0.9, nan], "2.3.0"), "sweep/good": ([1.0, 0.9, 0.8], "2.1.0"),
            "sweep/same": ([1.0, 2.0, nan], "2.1.0"), "other/far": ([1.0, 0.5, 0.2], "1.0.0")}
    for name, (loss, torch) in runs.items():
        write_summary_run(str(tmp_path / name), {"train/loss": loss, "lr": [0.1] * len(loss)})
        _env(tmp_path / name, torch)
    return tmp_path


def _full(paths: str | Sequence[str]) -> list[RunResult]:
    """Today's batch analysis without replay: every run held whole, then rank_all."""
    found = runs_of(discover(paths), paths)
    return rank_all([locate(align(r)) for r in read_runs(found)])


def _streamed(paths: str, slim: list[RunResult] | None = None) -> list[RunResult]:
    """Each run analysed alone (slim), then the sibling pass over its folder."""
    slim = _slim_alone(paths) if slim is None else slim
    facts = [sibling_facts(r) for r in slim]
    return [rank_siblings(r, healthy_siblings(r.run.path, facts)) for r in slim]


def test_sibling_pass_equals_rank_all_where_the_environment_drifts(drift_fleet: Path) -> None:
    full, streamed = _full(str(drift_fleet)), _streamed(str(drift_fleet))
    by_name = {r.run.name: r for r in full}
    drift = [f for f in by_name["sweep/bad"].findings if f.code == "NF502"]
    assert drift and "torch '2.3.0' vs '2.1.0'" in drift[0].evidence[0].text
    assert not any(f.code == "NF502" for f in by_name["sweep/same"].findings)
    assert any(s.code == "NF502" for s in by_name["other/far"].skipped_rules)
    for want, got in zip(full, streamed, strict=True):
        assert got.findings == want.findings, want.run.name
        assert got.skipped_rules == want.skipped_rules, want.run.name
    assert to_json(report(streamed)) == to_json(report(full))


@pytest.mark.skipif(not scenarios(), reason="sample_runs/ holds no scenario runs")
def test_sibling_pass_equals_rank_all_on_the_sample_runs() -> None:
    # Every sample run has an env.json beside the healthy control's: the pass removes
    # NF502's skip from each, as rank_all does.
    alone = _slim_alone(SAMPLE_RUNS)
    full, streamed = _full(SAMPLE_RUNS), _streamed(SAMPLE_RUNS, alone)
    assert not any(s.code == "NF502" for r in full for s in r.skipped_rules)
    assert all(any(s.code == "NF502" for s in r.skipped_rules) for r in alone)
    assert to_json(report(streamed)) == to_json(report(full))


def _slim_alone(paths: str) -> list[RunResult]:
    return [analyze_run(found, NO_REPLAY) for found in runs_of(discover(paths), paths)]


@pytest.mark.skipif(not scenarios(), reason="sample_runs/ holds no scenario runs")
def test_a_slim_result_holds_no_series_and_keeps_its_point_counts() -> None:
    path = os.path.join(SAMPLE_RUNS, "amp_scale_collapse")
    (full,) = api.read(path)
    (found,) = runs_of(discover(path), path)
    slim = analyze_run(found, NO_REPLAY).run
    assert full.series and slim.series == () and slim.histograms == ()
    assert slim.tag_points == full.tag_points and list(slim.tag_points) == list(full.tag_points)
    assert slim.tags() == full.tags()
    assert slim.scalar_points == sum(len(s) for s in full.series) > 0
    assert slim.readable and slim.slim() is slim
    assert json.loads(to_json(report([RunResult(run=slim, incident=None)])))["runs"][0][
        "tags"] == full.tag_points


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_result_a_streamed_analysis_holds_is_slim(drift_fleet: Path, jobs: int) -> None:
    streamed = list(api.iter_analyze(str(drift_fleet), replay=False, jobs=jobs))
    collected = api.analyze(str(drift_fleet), replay=False, jobs=jobs, keep_series=False)
    for results in (streamed, collected.results):
        assert len(results) == 4
        assert all(r.run.series == () and r.run.histograms == () for r in results)
        assert all(r.run.tag_points == {"train/loss": 3, "lr": 3} for r in results)
    whole = api.analyze(str(drift_fleet), replay=False, jobs=jobs)
    assert all(len(r.run.series) == 2 and r.run.dropped is None for r in whole.results)
    assert to_json(whole) == to_json(collected)


def test_iter_runs_gives_what_read_gives_one_run_at_a_time(drift_fleet: Path) -> None:
    runs = api.iter_runs(str(drift_fleet))
    first = next(runs)
    whole = api.read(str(drift_fleet))
    assert first.name == whole[0].name and first.tag_points == whole[0].tag_points
    assert len(first.series) == len(whole[0].series) == 2 and first.dropped is None
    assert [r.name for r in runs] == [r.name for r in whole[1:]]


def test_iter_analyze_gives_a_folder_before_reading_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import analyzer.pipeline as pipeline

    for name in ("a/r0", "a/r1", "b/r0", "b/r1", "c/r0"):
        write_summary_run(str(tmp_path / name), {"train/loss": [1.0, 0.5]})
    seen: list[str] = []
    reading = pipeline.read_runs

    def recording(runs: list[RunFiles], **kwargs: object) -> object:
        seen.extend(f"read {r.name}" for r in runs)
        return reading(runs, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "read_runs", recording)
    for result in api.iter_analyze(str(tmp_path), jobs=1, replay=False):
        seen.append(f"gave {result.run.name}")
    assert seen == ["read a/r0", "read a/r1", "gave a/r0", "gave a/r1",
                    "read b/r0", "read b/r1", "gave b/r0", "gave b/r1",
                    "read c/r0", "gave c/r0"]


def _raises_for_bad(found: RunFiles, options: RunOptions) -> RunResult:
    """A task that breaks on one run (run in a pool's worker: a module-level function)."""
    if found.name.endswith("bad"):
        raise RuntimeError("a reader broke\nwith a second line")
    return analyze_run(found, options)


@pytest.mark.parametrize("executor", [Serial(guard=True), Pool(2)], ids=["guarded", "pool"])
def test_a_task_that_raises_is_a_result_with_an_issue(drift_fleet: Path,
                                                      executor: Serial | Pool) -> None:
    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    with executor:
        results = dict(executor.map(runs, NO_REPLAY, _raises_for_bad))
    assert sorted(results) == list(range(len(runs)))
    by_name = {r.run.name: r for r in results.values()}
    bad = by_name["sweep/bad"]
    assert bad.status == "unreadable" and not bad.findings
    (issue,) = bad.run.issues
    assert issue.kind == "unreadable" and issue.location.file == bad.run.path
    assert issue.message.startswith("not analysed: the analysis raised RuntimeError: "
                                    "a reader broke (in test_fleet_pipeline.py:")
    assert "Traceback" not in to_json(report(list(results.values())))
    assert by_name["sweep/same"].failed and by_name["sweep/good"].status == "finite"


def test_in_this_process_alone_a_task_that_raises_is_a_bug_of_ours(
        drift_fleet: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import analyzer.pipeline as pipeline

    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    with pytest.raises(RuntimeError, match="a reader broke"):
        dict(Serial().map(runs, NO_REPLAY, _raises_for_bad))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a reader broke")

    monkeypatch.setattr(pipeline, "read_runs", broken)
    assert main(["analyze", str(drift_fleet), "-j", "1"]) == 3
    assert "internal error: RuntimeError: a reader broke" in capsys.readouterr().err


def test_a_broken_pool_leaves_what_is_left_to_this_process(
        drift_fleet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures.process import BrokenProcessPool

    import analyzer.fleet.executors as executors

    class Broken:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def submit(self, *args: object, **kwargs: object) -> None:
            raise BrokenProcessPool("no workers")

        def shutdown(self, *args: object, **kwargs: object) -> None:
            pass

    monkeypatch.setattr(executors, "ProcessPoolExecutor", Broken)
    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    results = dict(Pool(2).map(runs, NO_REPLAY))
    assert [results[k].run.name for k in range(4)] == [r.name for r in runs]
    assert [results[k].status for k in range(4)] == ["finite", "failed", "finite", "failed"]


def _pid(found: RunFiles, options: RunOptions) -> RunResult:
    return not_analysed(found, str(os.getpid()))


def test_cuda_replays_run_in_this_process_one_at_a_time(drift_fleet: Path) -> None:
    from dataclasses import replace

    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    runs[1] = replace(runs[1], capture_dirs=(str(drift_fleet / "capture" / "step_2"),))
    pids = {k: r.run.issues[-1].message.removeprefix("not analysed: ")
            for k, r in Pool(2).map(runs, RunOptions(device="cuda:0"), _pid)}
    assert pids[1] == str(os.getpid())
    assert all(pids[k] != str(os.getpid()) for k in (0, 2, 3))
    on_cpu = dict(Pool(2).map(runs, RunOptions(device="cpu"), _pid))
    assert on_cpu[1].run.issues[-1].message != f"not analysed: {os.getpid()}"


def test_the_default_executor_is_the_machine_and_one_run_stays_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import analyzer.fleet.choose as choose

    monkeypatch.setattr(choose, "machine_size", lambda: 4)
    single = make_executor(None, None, 1)
    assert isinstance(single, Serial) and single.jobs == 1
    files = make_executor(None, 3, 1)
    assert isinstance(files, Serial) and files.jobs == 3  # its event files in 3 processes
    pool = make_executor(None, None, 100)
    assert isinstance(pool, Pool) and pool.workers == 4
    few = make_executor(None, None, choose.POOL_MIN_RUNS - 1)  # workers would cost more
    assert isinstance(few, Serial) and few.jobs == 1
    asked = make_executor(None, 2, 3)
    assert isinstance(asked, Pool) and asked.workers == 2
    assert isinstance(make_executor(None, 8, 3), Pool) and make_executor(
        None, 8, 3).workers == 3  # type: ignore[attr-defined]
    assert isinstance(make_executor(None, 1, 100), Serial)
    with pytest.raises(UsageError, match="at least 1"):
        make_executor(None, 0, 3)


def test_progress_counts_runs_as_they_finish(drift_fleet: Path) -> None:
    calls: list[tuple[int, int]] = []
    api.analyze(str(drift_fleet), replay=False, jobs=2,
                progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]


@pytest.mark.skipif(not scenarios(), reason="sample_runs/ holds no scenario runs")
def test_cli_json_is_the_same_with_one_and_two_jobs(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(os.path.dirname(SAMPLE_RUNS))
    outputs = []
    before = snapshot(Path(SAMPLE_RUNS))
    for jobs in ("1", "2"):
        assert main(["analyze", "sample_runs", "--no-replay", "--json", "-", "-j", jobs]) == 1
        outputs.append(capsys.readouterr().out)
    assert len(json.loads(outputs[0])["runs"]) == len(scenarios())
    assert outputs[0] == outputs[1]
    assert snapshot(Path(SAMPLE_RUNS)) == before  # nothing written into the runs


def test_cli_rejects_jobs_below_one(drift_fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(drift_fleet), "-j", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err



def test_cli_summary_follows_the_report_or_replaces_it_and_is_in_the_json(
        drift_fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analyzer.fleet.summary import summarize, summary_json
    from analyzer.report.summary import format_summary

    results = api.analyze(str(drift_fleet), jobs=1).results
    sweep = format_summary(summarize(results)).rstrip("\n") + "\n"
    assert main(["analyze", str(drift_fleet), "-j", "1"]) == 1
    plain = capsys.readouterr().out
    assert main(["analyze", str(drift_fleet), "-j", "1", "--summary"]) == 1
    assert capsys.readouterr().out == f"{plain}\n{sweep}"
    assert main(["analyze", str(drift_fleet), "-j", "1", "--summary", "-q"]) == 1
    assert capsys.readouterr().out == sweep
    assert main(["analyze", str(drift_fleet), "-j", "1", "--summary", "--json", "-"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["summary"] == json.loads(json.dumps(summary_json(summarize(results))))
    assert main(["analyze", str(drift_fleet), "-j", "1", "--json", "-"]) == 1
    assert json.loads(capsys.readouterr().out)["summary"] is None


def test_cli_jobs_and_a_scheduler_are_not_given_together(
        drift_fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(drift_fleet), "-j", "2", "--scheduler", "local:2"]) == 2
    assert "local:N" in capsys.readouterr().err


def test_the_progress_bar_counts_runs() -> None:
    import io

    from analyzer.cli.progress import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(stream, delay=0)
    bar(3, 12)
    assert stream.getvalue() == "\ranalysing [#######.......................] 3/12 runs"
    bar.close()
    assert stream.getvalue().endswith("\r" + " " * 72 + "\r")


def test_api_summary_gives_the_sweep_frames_of_a_report_or_of_paths(drift_fleet: Path) -> None:
    done = api.analyze(str(drift_fleet), replay=False)
    frames = api.summary(done)
    assert {"runs", "causes", "steps", "separators"} <= set(frames)
    assert sorted(frames["runs"]["run"]) == sorted(r.run.name for r in done.results)
    assert list(api.summary(str(drift_fleet))["runs"]["run"]) == list(frames["runs"]["run"])


class _Reversed(Serial):
    """An executor whose runs finish last first, as a pool's or a cluster's may."""

    def map(self, runs: Sequence[RunFiles], options: RunOptions, task: Task = analyze_run,
            status: Status | None = None) -> Iterator[tuple[int, RunResult]]:
        yield from reversed(list(super().map(runs, options, task, status)))


def test_regression_sibling_evidence_follows_discovery_not_completion_order(
        tmp_path: Path) -> None:
    # A failed run beside two healthy runs of other environments: NF502's evidence lists
    # them in discovery order whichever finishes first (a pool gave them as they finished).
    nan = math.nan
    for name, loss, torch in (("s/a_good", [1.0, 0.8], "2.1.0"), ("s/b_good", [1.0, 0.7], "2.2.0"),
                              ("s/c_bad", [1.0, nan], "2.3.0")):
        write_summary_run(str(tmp_path / name), {"train/loss": loss})
        _env(tmp_path / name, torch)
    runs = runs_of(discover(str(tmp_path)), str(tmp_path))
    want = {r.run.name: r for r in _full(str(tmp_path))}
    got = {r.run.name: r for _, r in stream(runs, NO_REPLAY, _Reversed())}
    drift = [f for f in got["s/c_bad"].findings if f.code == "NF502"]
    assert [e.subject for e in drift[0].evidence] == ["s/a_good", "s/b_good"]
    assert got["s/c_bad"].findings == want["s/c_bad"].findings


def _dies_in_a_worker_on_bad(found: RunFiles, options: RunOptions) -> RunResult:
    """A run that kills the worker process reading it (a reader's crash, the OOM killer);
    in the test's own process it is analysed, so that a run retried here shows."""
    import multiprocessing
    import signal

    if found.name == "sweep/bad" and multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return analyze_run(found, options)


def test_regression_a_run_that_kills_its_worker_is_not_analysed_in_this_process(
        drift_fleet: Path) -> None:
    # A broken pool used to leave every run not yet done to this process, the one that
    # killed its worker included: a crash there would end the whole analysis.
    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    with Pool(2) as pool:
        results = dict(pool.map(runs, NO_REPLAY, _dies_in_a_worker_on_bad))
    assert sorted(results) == list(range(len(runs)))
    by_name = {r.run.name: r for r in results.values()}
    bad = by_name["sweep/bad"]
    assert bad.status == "unreadable"
    assert bad.run.issues[-1].message.startswith("not analysed: the worker process")
    assert [by_name[n].status for n in ("other/far", "sweep/good", "sweep/same")] == [
        "finite", "finite", "failed"]


def _two_die_together(folder: str, found: RunFiles, options: RunOptions) -> RunResult:
    """Two runs that kill their workers: at once the first time, and when retried only once
    the other's retry has started too (start files named by run and pid, in ``folder``; not
    named by the environment, which a forkserver started by an earlier test would not
    pass on). Retried one after the other, the first would wait for the second in
    vain and say so in a file ``unmet``."""
    import multiprocessing
    import signal
    import time

    pair = ("sweep/bad", "sweep/same")
    if found.name in pair and multiprocessing.parent_process() is not None:
        meet = Path(folder)
        me = found.name.replace("/", "-")
        retried = any(meet.glob(f"{me}.*"))
        (meet / f"{me}.{os.getpid()}").write_text("")
        if not retried:
            os.kill(os.getpid(), signal.SIGKILL)
        other = next(n for n in pair if n != found.name).replace("/", "-")
        for _ in range(600):  # 30 s
            if len(list(meet.glob(f"{other}.*"))) >= 2:
                break
            time.sleep(0.05)
        else:
            (meet / "unmet").write_text(found.name)
        os.kill(os.getpid(), signal.SIGKILL)
    return analyze_run(found, options)


def test_runs_that_kill_their_workers_are_retried_alone_side_by_side(
        drift_fleet: Path, tmp_path: Path) -> None:
    # Each suspect is retried in a pool of one worker, as many at once as the pool had
    # workers: one after the other, a pool of eight would retry eight runs in turn.
    meet = tmp_path / "meet"
    meet.mkdir()
    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    with Pool(2) as pool:
        results = dict(pool.map(runs, NO_REPLAY, functools.partial(_two_die_together,
                                                                    str(meet))))
    by_name = {r.run.name: r for r in results.values()}
    for name in ("sweep/bad", "sweep/same"):
        assert by_name[name].status == "unreadable"
        assert by_name[name].run.issues[-1].message.startswith("not analysed: the worker")
    assert [by_name[n].status for n in ("other/far", "sweep/good")] == ["finite", "finite"]
    assert not (meet / "unmet").exists()
    assert len(list(meet.glob("sweep-bad.*"))) == len(list(meet.glob("sweep-same.*"))) == 2


def _hangs_on_bad(found: RunFiles, options: RunOptions) -> RunResult:
    """A run whose reader never returns (a stalled mount or store): it says so in a file
    named by the environment, then sleeps."""
    import time

    if found.name == "sweep/bad":
        Path(os.environ["NF_TEST_HANGING"]).write_text("hanging")
        time.sleep(600)
    return analyze_run(found, options)


_HANGING_POOL = """
import sys
from analyzer.fleet.executors import Pool
from analyzer.pipeline import RunOptions, discover, runs_of
from tests.test_fleet_pipeline import _hangs_on_bad

runs = runs_of(discover(sys.argv[1]), sys.argv[1])
with Pool(2) as pool:
    for k, r in pool.map(runs, RunOptions(replay=False), _hangs_on_bad):
        print(r.run.name, flush=True)
"""


def test_regression_an_interrupt_stops_a_pool_whose_worker_hangs(drift_fleet: Path,
                                                                 tmp_path: Path) -> None:
    # SIGINT to the analysing process alone (a notebook's interrupt, kill -INT): the pool
    # used to wait for the hung worker to finish its run, forever.
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "hanging"
    child = subprocess.Popen(
        [sys.executable, "-c", _HANGING_POOL, str(drift_fleet)], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "NF_TEST_HANGING": str(marker)},
        # As from a shell: SIGINT not ignored, whatever this process inherited.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout is not None
        given = [child.stdout.readline().strip() for _ in range(3)]
        assert sorted(given) == ["other/far", "sweep/good", "sweep/same"]
        while not marker.exists():
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) != 0  # interrupted, not waiting on the hung worker
        left = subprocess.run(["ps", "-o", "pid=", "-g", str(child.pid)],
                              capture_output=True, text=True).stdout.split()
        assert left == []  # no worker outlives it
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_regression_an_unreadable_run_is_not_a_healthy_sibling(drift_fleet: Path) -> None:
    # A run of which nothing could be read (its event file is not one) but whose env.json
    # is there: NF502 said the failed run "differs from healthy run sweep/unread".
    unread = drift_fleet / "sweep" / "unread"
    unread.mkdir()
    (unread / "events.out.tfevents.1.host").write_bytes(b"not an event file at all")
    _env(unread, "1.0.0")
    streamed = {r.run.name: r for r in api.iter_analyze(str(drift_fleet), replay=False,
                                                        jobs=1)}
    assert streamed["sweep/unread"].status == "unreadable"
    for results in (streamed, {r.run.name: r for r in _full(str(drift_fleet))}):
        (drift,) = [f for f in results["sweep/bad"].findings if f.code == "NF502"]
        assert [e.subject for e in drift.evidence] == ["sweep/good"]


def test_regression_runs_kept_here_survive_a_pool_that_breaks_while_submitting(
        drift_fleet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A CUDA replay is run in this process while the pool works; when a worker died before
    # every run was submitted, that run was never analysed (its folder never given).
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool
    from dataclasses import replace

    import analyzer.fleet.executors as executors

    real = executors.ProcessPoolExecutor

    class BreaksWhileSubmitting:
        made = 0

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            cls.made += 1
            return real(*args, **kwargs) if cls.made > 1 else super().__new__(cls)

        def __init__(self, *args: Any, initargs: tuple[Any, ...] = (), **kwargs: Any) -> None:
            self.started, self.calls = initargs[0], 0

        def submit(self, fn: Any, k: int, *args: Any) -> Future[RunResult]:
            self.calls += 1
            if self.calls > 1:
                raise BrokenProcessPool("a worker died")
            self.started[k] = 1  # the first run had started in the worker that died
            return Future()

        def shutdown(self, *args: object, **kwargs: object) -> None:
            pass

    monkeypatch.setattr(executors, "ProcessPoolExecutor", BreaksWhileSubmitting)
    runs = runs_of(discover(str(drift_fleet)), str(drift_fleet))
    runs[1] = replace(runs[1], capture_dirs=(str(drift_fleet / "capture" / "step_2"),))
    results = dict(Pool(2).map(runs, RunOptions(device="cuda:0"), _pid))
    assert sorted(results) == [0, 1, 2, 3]
    assert results[1].run.issues[-1].message == f"not analysed: {os.getpid()}"
