"""The analysis as library calls: paths in, a :class:`Report` (or DataFrames) out.

:func:`analyze` runs every stage of :mod:`analyzer.pipeline` over every run and returns
the report; :func:`iter_analyze` gives the same results one at a time, as each folder's runs
finish, holding only slim results (a run's series are dropped once its rules have read
them): the call for fleets, on a local process pool or a Dask cluster (``scheduler``).
:func:`read` gives every run fully read (discover, read, align) and holds them all;
:func:`iter_runs` gives them one at a time. The DataFrame views are built from the same
records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from analyzer.align import align
from analyzer.ingest.discover import Discovery, RunFiles
from analyzer.ingest.runs import Progress, read_runs
from analyzer.model import Report, Run, RunResult
from analyzer.pipeline import RunOptions, discover, read_run, report, runs_of, tool_version

if TYPE_CHECKING:
    import pandas as pd

    from analyzer.fleet.executors import Executor
    from analyzer.fleet.stream import RunProgress

__all__ = ["analyze", "incidents", "iter_analyze", "iter_runs", "read", "scalars",
           "summary", "tool_version"]

def read(paths: str | Sequence[str], *, verify: bool = True, jobs: int = 1,
         progress: Progress | None = None, checkpoints: bool = True,
         trust_pickle: bool = False, logs: Sequence[str] = (),
         run_roots: Sequence[str] = ()) -> list[Run]:
    """Every run found below ``paths``, fully read, every source's steps on the run's
    global step (:func:`analyzer.align.align`). Raises UsageError when there is none.

    Every run is held in memory with all its series at once: for many runs, take them one
    at a time from :func:`iter_runs`, or analyse them with :func:`iter_analyze`.
    ``logs`` are extra text logs whose file names do not say they are logs; each of
    ``run_roots`` is one run with everything below it (``--run-root``); ``progress`` is
    called with (bytes done, bytes in all) of the event files.
    """
    runs = read_runs(runs_of(discover(paths, logs, run_roots), paths), verify=verify, jobs=jobs,
                     progress=progress, checkpoints=checkpoints, trust_pickle=trust_pickle)
    return [align(run) for run in runs]


def iter_runs(paths: str | Sequence[str], *, verify: bool = True, checkpoints: bool = True,
              trust_pickle: bool = False, logs: Sequence[str] = (),
              run_roots: Sequence[str] = ()) -> Iterator[Run]:
    """The runs of :func:`read`, fully read and aligned, one at a time in discovery order:
    each is read only when the next is asked for, and nothing keeps the ones before it."""
    for found in runs_of(discover(paths, logs, run_roots), paths):
        yield align(read_run(found, verify=verify, checkpoints=checkpoints,
                             trust_pickle=trust_pickle))


def _options(verify: bool, checkpoints: bool, trust_pickle: bool, replay: bool, device: str,
             dtype: str, import_paths: Sequence[str], trust_code: bool, rules: bool,
             keep_series: bool) -> RunOptions:
    return RunOptions(verify=verify, checkpoints=checkpoints, trust_pickle=trust_pickle,
                      replay=replay, device=device, dtype=dtype,
                      import_paths=tuple(import_paths), trust_code=trust_code, rules=rules,
                      keep_series=keep_series)


def _stream(found: list[RunFiles], options: RunOptions, executor: Executor,
            progress: RunProgress | None, status: Callable[[str], None] | None,
            ) -> Iterator[tuple[int, RunResult]]:
    from analyzer.fleet.stream import stream

    with executor:
        yield from stream(found, options, executor, progress=progress, status=status)


def _start(paths: str | Sequence[str], logs: Sequence[str], run_roots: Sequence[str],
           scheduler: str | None, jobs: int | None) -> tuple[Discovery, list[RunFiles],
                                                             Executor]:
    from analyzer.fleet.choose import make_executor

    if scheduler is not None and "://" in scheduler:
        # A cluster's workers run elsewhere (another machine, another directory): a path
        # relative to this directory means nothing there.
        from analyzer.ingest import storage

        paths = [storage.absolute(p) for p in ([paths] if isinstance(paths, str) else paths)]
        logs = [storage.absolute(p) for p in logs]
        run_roots = [storage.absolute(p) for p in run_roots]
    found = discover(paths, logs, run_roots)
    runs = runs_of(found, paths)
    return found, runs, make_executor(scheduler, jobs, len(runs))


def iter_analyze(paths: str | Sequence[str], *, scheduler: str | None = None,
                 jobs: int | None = None, verify: bool = True, checkpoints: bool = True,
                 trust_pickle: bool = False, logs: Sequence[str] = (), replay: bool = True,
                 device: str = "cpu", dtype: str = "as-run", import_paths: Sequence[str] = (),
                 trust_code: bool = False, rules: bool = True,
                 progress: RunProgress | None = None,
                 status: Callable[[str], None] | None = None,
                 run_roots: Sequence[str] = ()) -> Iterator[RunResult]:
    """The results of :func:`analyze`, each as soon as every run of its folder is done
    (the rule that compares a run with its healthy siblings needs them), in discovery order
    within a folder. Each result is slim: its run's series and histograms are dropped, their
    points per tag kept (``Run.tag_points``), so what is held is bounded by the largest run.

    ``scheduler``: a Dask scheduler's address (``tcp://HOST:PORT``) or ``local[:N]`` for a
    LocalCluster of N workers (see :mod:`analyzer.fleet.cluster`); without one, ``jobs``
    local processes (None: the machine's size; 1: this process), used only for more than one
    run. ``progress`` is called with (runs done, runs in all).
    """
    _, runs, executor = _start(paths, logs, run_roots, scheduler, jobs)
    options = _options(verify, checkpoints, trust_pickle, replay, device, dtype, import_paths,
                       trust_code, rules, False)
    for _, result in _stream(runs, options, executor, progress, status):
        yield result


def analyze(paths: str | Sequence[str], *, verify: bool = True, jobs: int | None = 1,
            scheduler: str | None = None, progress: RunProgress | None = None,
            checkpoints: bool = True, trust_pickle: bool = False, logs: Sequence[str] = (),
            replay: bool = True, device: str = "cpu", dtype: str = "as-run",
            import_paths: Sequence[str] = (), trust_code: bool = False, rules: bool = True,
            status: Callable[[str], None] | None = None,
            run_roots: Sequence[str] = (), keep_series: bool = True) -> Report:
    """Read every run below ``paths``, locate its first non-finite values, replay its
    captured failing step (when it has one) and rank the root causes: every stage over
    every run, as ``forensics analyze`` runs them, streamed as :func:`iter_analyze` does
    and collected in discovery order.

    ``keep_series`` (the default) keeps every run whole in the report, series and
    histograms included, for callers that read them afterwards: memory then grows with the
    fleet. ``keep_series=False`` (what ``forensics analyze`` passes) holds slim results
    only (``Run.tag_points`` still counts their points): memory is bounded by the largest
    run. The report's JSON and text are the same either way.

    ``jobs`` local processes analyse runs (1, the default: this process, one run after the
    other; None: the machine's size), or a Dask cluster does (``scheduler``). A replay
    imports the factories its capture names only from trusted folders (see
    :mod:`analyzer.trust`): ``import_paths``, the folders recorded with ``forensics trust``,
    the tool's own, or wherever they are with ``trust_code``; otherwise the result says
    which code it would have imported (``replay_refused``) and the rest is analysed.
    ``status`` is told, in a few words, what slow step comes next (a replay in this
    process); ``progress`` (runs done, runs in all). ``run_roots`` override how runs are
    grouped: each is one run with all below it.
    """
    found, runs, executor = _start(paths, logs, run_roots, scheduler, jobs)
    options = _options(verify, checkpoints, trust_pickle, replay, device, dtype, import_paths,
                       trust_code, rules, keep_series)
    results: dict[int, RunResult] = dict(_stream(runs, options, executor, progress, status))
    return report([results[k] for k in range(len(runs))], found.issues)


def summary(report_or_paths: Report | str | Sequence[str]) -> dict[str, pd.DataFrame]:
    """The sweep summary's DataFrames (:func:`analyzer.frames.summary_frames`) of a report,
    or of the analysis of ``paths``."""
    from analyzer.fleet.summary import summarize
    from analyzer.frames import summary_frames

    done = report_or_paths if isinstance(report_or_paths, Report) else analyze(report_or_paths)
    return summary_frames(summarize(done.results))


def scalars(paths: str | Sequence[str], *, verify: bool = True, jobs: int = 1) -> pd.DataFrame:
    """All scalars as a long DataFrame: run, tag, step, value, wall_time, source, position."""
    from analyzer.frames import scalars_frame

    return scalars_frame(read(paths, verify=verify, jobs=jobs))


def incidents(report: Report) -> pd.DataFrame:
    """One row per non-finite tag of every run, earliest first within a run."""
    from analyzer.frames import incidents_frame

    return incidents_frame(report)
