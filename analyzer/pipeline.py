"""The analysis as stages, each a function over records that can be called and cached on
its own:

    discover(paths)          -> Discovery      the run folders below the paths, and what the
                                               walk passed over (runs_of: the runs, or an
                                               error when there is none)
    read_run(found)          -> Run            every file of one run (read_runs: many, with
                                               event files in parallel processes)
    align(run)               -> Run            every source's steps on the global step
    locate(run)              -> RunResult      the first non-finite step, tag and layer
    replay_run(result)       -> RunResult      its capture replayed, or why not
                                               (attempt_replay + with_replay, for a caller
                                               that caches the replay apart)
    siblings(result, all)    -> {name: env}    the healthy runs beside it, for comparison
    rank(result, siblings)   -> RunResult      the rules' ranked findings (rank_all: every
                                               run, each beside its siblings)
    report(results, issues)  -> Report         the versioned result

:func:`analyze_run` is one run's read, align, locate, replay and rank (without siblings),
returning a slim result (:meth:`Run.slim`): what a fleet's executor runs per run (see
:mod:`analyzer.fleet`). :func:`rank_siblings` then adds the rules that compare the run
with its healthy siblings, once every run of its folder is done: together they give what
:func:`rank_all` gives on full runs. :func:`analyze` streams them as ``forensics analyze``
does; the dashboard calls the same stages one at a time, caching each. Only
:func:`discover` and :func:`read_run` open files; the rules read everything off the
:class:`Run` (its ``env`` and capture metas included), and a replay reads only its
capture, importing the factories it names only from trusted folders (:mod:`analyzer.trust`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from analyzer.align import align
from analyzer.errors import ForensicsError, UsageError
from analyzer.ingest import storage
from analyzer.ingest.discover import Discovery, RunFiles
from analyzer.ingest.discover import discover as _discover
from analyzer.ingest.runs import read_runs
from analyzer.model import CodeRefusal, IngestIssue, Report, Run, RunResult
from analyzer.model.replays import ReplayResult
from analyzer.onset import locate

__all__ = [
    "RunOptions",
    "align",
    "analyze",
    "analyze_run",
    "attempt_replay",
    "discover",
    "locate",
    "rank",
    "rank_all",
    "rank_siblings",
    "read_run",
    "read_runs",
    "replay_run",
    "report",
    "runs_of",
    "same_folder",
    "sibling_facts",
    "siblings",
    "tool_version",
    "with_replay",
]


def tool_version() -> str:
    try:
        return version("nan-forensics")
    except PackageNotFoundError:
        return "unknown"


def discover(paths: str | Sequence[str], logs: Sequence[str] = (),
             run_roots: Sequence[str] = ()) -> Discovery:
    """The runs below ``paths`` (``logs``: extra text logs whose names do not say they are
    logs; ``run_roots``: folders each of which is one run with everything below it) and
    what the walk passed over; see :func:`runs_of` for the runs or an error."""
    return _discover([paths] if isinstance(paths, str) else list(paths), logs, run_roots)


def runs_of(found: Discovery, paths: str | Sequence[str]) -> list[RunFiles]:
    """The runs ``found`` below ``paths``; raises UsageError when there is none."""
    if not found.runs:
        roots = [paths] if isinstance(paths, str) else list(paths)
        skipped = "".join(f"; {issue}" for issue in found.issues[:4])
        raise UsageError("no runs (folders with event files, logs or checkpoints) found "
                         f"under {', '.join(roots)}{skipped}")
    return list(found.runs)


def read_run(found: RunFiles, *, verify: bool = True, checkpoints: bool = True,
             trust_pickle: bool = False) -> Run:
    """Every file of one run: event files, logs, checkpoints, captures and env.json."""
    (run,) = read_runs([found], verify=verify, checkpoints=checkpoints,
                       trust_pickle=trust_pickle)
    return run


def replay_run(result: RunResult, *, device: str = "cpu", import_paths: Sequence[str] = (),
               trust_code: bool = False) -> RunResult:
    """The result with the replay of its run's earliest capture, or the reason it was not
    run (code not trusted) or failed."""
    if not result.run.captures:
        return result
    return with_replay(result, attempt_replay(result.run.captures[0], device=device,
                                              import_paths=import_paths,
                                              trust_code=trust_code))


ReplayAttempt = tuple[ReplayResult | None, str | None, CodeRefusal | None]
"""What :func:`attempt_replay` gives: the result, or why it failed, or why it was not run."""


def with_replay(result: RunResult, attempt: ReplayAttempt) -> RunResult:
    """The result holding a replay attempt of its capture (one a caller may have cached)."""
    done, error, refused = attempt
    return replace(result, replay=done, replay_error=error, replay_refused=refused)


def attempt_replay(capture: str, *, device: str = "cpu", dtype: str = "as-run",
                   import_paths: Sequence[str] = (), trust_code: bool = False,
                   ) -> ReplayAttempt:
    """Replay a capture: (the result, or why it failed, or why it was not run). A capture
    that breaks the replay in any way is reported, never raised: one hostile run must not
    stop the analysis of the others."""
    from analyzer.replayer import replay as run_replay
    from analyzer.trust import refusal_of

    try:
        done = run_replay(capture, device=device, dtype=dtype, import_paths=import_paths,
                          trust_code=trust_code)
    except ForensicsError as exc:
        refused = refusal_of(exc)
        return None, None if refused is not None else str(exc), refused
    except Exception as exc:  # damage the capture's checks did not foresee
        return None, f"the replay failed: {type(exc).__name__}: {exc}", None
    return done, None, None


@dataclass(frozen=True)
class RunOptions:
    """How :func:`analyze_run` treats each run; picklable, so that it travels to worker
    processes and cluster workers with the run's files."""

    verify: bool = True
    checkpoints: bool = True
    trust_pickle: bool = False
    replay: bool = True
    device: str = "cpu"
    dtype: str = "as-run"
    import_paths: tuple[str, ...] = ()
    trust_code: bool = False
    rules: bool = True
    keep_series: bool = False
    """Keep the run's series and histograms in the result (not slim): for a caller that
    reads them after the analysis, at the cost of holding every run whole."""


def analyze_run(found: RunFiles, options: RunOptions, *, jobs: int = 1,
                status: Callable[[str], None] | None = None) -> RunResult:
    """One run read, aligned, located, its capture replayed (``options.replay``) and ranked
    without siblings; slim (its series and histograms dropped, their points per tag kept)
    unless ``options.keep_series``.
    ``jobs`` processes read its event files; ``status`` is told before a replay starts."""
    (run,) = read_runs([found], verify=options.verify, jobs=jobs,
                       checkpoints=options.checkpoints, trust_pickle=options.trust_pickle)
    result = locate(align(run))
    if options.replay and result.run.captures:
        if status is not None:
            status(f"replaying {result.run.name}")
        result = with_replay(result, attempt_replay(
            result.run.captures[0], device=options.device, dtype=options.dtype,
            import_paths=options.import_paths, trust_code=options.trust_code))
    if options.rules:
        result = rank(result, {})
    return result if options.keep_series else replace(result, run=result.run.slim())


def rank_siblings(result: RunResult, siblings: Mapping[str, Mapping[str, Any]]) -> RunResult:
    """A result ranked without siblings (:func:`analyze_run`), with the rules that compare
    it with ``siblings`` added: equal to :func:`rank` of the full run beside them."""
    from analyzer.rules import evaluate_siblings

    findings, skipped = evaluate_siblings(result, siblings)
    return replace(result, findings=findings, skipped_rules=skipped)


def same_folder(path: str) -> str:
    """The folder a run lies in, as siblings are grouped: runs with the same one are
    compared with each other (a URL's too: ``s3://b/sweep/run_1`` lies in ``s3://b/sweep``)."""
    return storage.parent(storage.absolute(path))


def siblings(result: RunResult, others: Sequence[RunResult]) -> dict[str, Mapping[str, Any]]:
    """The environments of the healthy runs beside ``result``'s run (same parent folder),
    by run name: the rules compare a failed run's environment with them. Healthy is finite:
    a run of which nothing could be read is no baseline, whatever its env.json says."""
    return healthy_siblings(result.run.path, [sibling_facts(r) for r in others])


SiblingFacts = tuple[str, str, bool, Mapping[str, Any] | None]
"""(path, name, not healthy, env) of a run: what :func:`healthy_siblings` needs of it."""


def sibling_facts(result: RunResult) -> SiblingFacts:
    """What :func:`healthy_siblings` needs of a result; not healthy: failed or unreadable."""
    return result.run.path, result.run.name, result.status != "finite", result.run.env


def healthy_siblings(path: str, runs: Sequence[SiblingFacts]) -> dict[str, Mapping[str, Any]]:
    """:func:`siblings` from :func:`sibling_facts` of each run, for callers that keep those
    facts and not whole results (the dashboard's caches)."""
    parent, here = same_folder(path), storage.absolute(path)
    return {name: env for other, name, unhealthy, env in runs
            if env is not None and not unhealthy and storage.absolute(other) != here
            and same_folder(other) == parent}


def rank(result: RunResult, siblings: Mapping[str, Mapping[str, Any]]) -> RunResult:
    """The result with the rule catalogue's ranked findings and the rules it skipped."""
    from analyzer.rules import evaluate

    findings, skipped = evaluate(result, siblings)
    return replace(result, findings=findings, skipped_rules=skipped)


def rank_all(results: Sequence[RunResult]) -> list[RunResult]:
    """:func:`rank` over every result, each compared with its healthy siblings among them."""
    return [rank(r, siblings(r, results)) for r in results]


def report(results: Sequence[RunResult], issues: Sequence[IngestIssue] = ()) -> Report:
    return Report(results=tuple(results), tool_version=tool_version(), issues=tuple(issues))


def analyze(paths: str | Sequence[str], *, verify: bool = True, jobs: int = 1,
            progress: Callable[[int, int], None] | None = None, checkpoints: bool = True,
            trust_pickle: bool = False, logs: Sequence[str] = (), replay: bool = True,
            device: str = "cpu", dtype: str = "as-run", import_paths: Sequence[str] = (),
            trust_code: bool = False, rules: bool = True,
            status: Callable[[str], None] | None = None, run_roots: Sequence[str] = (),
            keep_series: bool = True) -> Report:
    """Every stage over every run below ``paths``, in this process, one run after the
    other: :func:`analyze_run` per run (``jobs`` processes read its event files), then
    :func:`rank_siblings` beside the others. :func:`analyzer.api.analyze` gives the same
    report on a process pool or a Dask cluster. ``progress`` is called with (runs done,
    runs in all); ``keep_series`` False keeps slim results only.
    """
    found = discover(paths, logs, run_roots)
    runs = runs_of(found, paths)
    options = RunOptions(verify=verify, checkpoints=checkpoints, trust_pickle=trust_pickle,
                         replay=replay, device=device, dtype=dtype,
                         import_paths=tuple(import_paths), trust_code=trust_code,
                         rules=rules, keep_series=keep_series)
    results: list[RunResult] = []
    for found_run in runs:
        results.append(analyze_run(found_run, options, jobs=jobs, status=status))
        if progress is not None:
            progress(len(results), len(runs))
    if rules:
        results = [rank_siblings(r, siblings(r, results)) for r in results]
    return report(results, found.issues)
