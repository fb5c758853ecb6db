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

:func:`analyze` chains them as ``forensics analyze`` does; the dashboard calls the same
stages one at a time, caching each. Only :func:`discover` and :func:`read_run` open files;
the rules read everything off the :class:`Run` (its ``env`` and capture metas included),
and a replay reads only its capture, importing the factories it names only from trusted
folders (:mod:`analyzer.trust`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from analyzer.align import align
from analyzer.errors import ForensicsError, UsageError
from analyzer.ingest.discover import Discovery, RunFiles
from analyzer.ingest.discover import discover as _discover
from analyzer.ingest.runs import Progress, read_runs
from analyzer.model import CodeRefusal, IngestIssue, Report, Run, RunResult
from analyzer.model.replays import ReplayResult
from analyzer.onset import locate

__all__ = [
    "align",
    "analyze",
    "attempt_replay",
    "discover",
    "locate",
    "rank",
    "rank_all",
    "read_run",
    "read_runs",
    "replay_run",
    "report",
    "runs_of",
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


def siblings(result: RunResult, others: Sequence[RunResult]) -> dict[str, Mapping[str, Any]]:
    """The environments of the healthy runs beside ``result``'s run (same parent folder),
    by run name: the rules compare a failed run's environment with them."""
    return healthy_siblings(result.run.path,
                            [(r.run.path, r.run.name, r.failed, r.run.env) for r in others])


def healthy_siblings(path: str, runs: Sequence[tuple[str, str, bool, Mapping[str, Any] | None]]
                     ) -> dict[str, Mapping[str, Any]]:
    """:func:`siblings` from (path, name, failed, env) of each run, for callers that keep
    those facts and not whole results (the dashboard's caches)."""
    parent = os.path.dirname(os.path.abspath(path))
    return {name: env for other, name, failed, env in runs
            if env is not None and not failed and os.path.abspath(other) != os.path.abspath(path)
            and os.path.dirname(os.path.abspath(other)) == parent}


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
            progress: Progress | None = None, checkpoints: bool = True,
            trust_pickle: bool = False, logs: Sequence[str] = (), replay: bool = True,
            device: str = "cpu", import_paths: Sequence[str] = (), trust_code: bool = False,
            rules: bool = True, status: Callable[[str], None] | None = None,
            run_roots: Sequence[str] = ()) -> Report:
    """Read every run below ``paths``, locate its first non-finite values, replay its
    captured failing step (when it has one) and rank the root causes: every stage over
    every run, as ``forensics analyze`` runs them.

    A replay imports the factories its capture names only from trusted folders (see
    :mod:`analyzer.trust`): ``import_paths``, the folders recorded with ``forensics trust``,
    the tool's own, or wherever they are with ``trust_code``; otherwise the result says
    which code it would have imported (``replay_refused``) and the rest is analysed.
    ``status`` is told, in a few words, what slow step comes next (a replay).
    ``run_roots`` override how runs are grouped: each is one run with all below it.
    """
    found = discover(paths, logs, run_roots)
    runs = read_runs(runs_of(found, paths), verify=verify, jobs=jobs, progress=progress,
                     checkpoints=checkpoints, trust_pickle=trust_pickle)
    results = [locate(align(r)) for r in runs]
    if replay:
        for k, r in enumerate(results):
            if status is not None and r.run.captures:
                status(f"replaying {r.run.name} ({k + 1}/{len(results)})")
            results[k] = replay_run(r, device=device, import_paths=import_paths,
                                    trust_code=trust_code)
    if rules:
        results = rank_all(results)
    return report(results, found.issues)
