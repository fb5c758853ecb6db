"""The analysis as library calls: paths in, a :class:`Report` (or DataFrames) out."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from analyzer.errors import ForensicsError, UsageError
from analyzer.ingest.discover import discover
from analyzer.ingest.runs import Progress, read_runs
from analyzer.model import CodeRefusal, IngestIssue, Report, Run, RunResult
from analyzer.onset import locate

if TYPE_CHECKING:
    import pandas as pd

    from analyzer.model.replays import ReplayResult


def tool_version() -> str:
    try:
        return version("nan-forensics")
    except PackageNotFoundError:
        return "unknown"


def read(paths: str | list[str], *, verify: bool = True, jobs: int = 1,
         progress: Progress | None = None, checkpoints: bool = True,
         trust_pickle: bool = False, logs: Sequence[str] = ()) -> list[Run]:
    """Every run found below ``paths``, fully read. Raises UsageError when there is none.

    ``logs`` are extra text logs whose file names do not say they are logs.
    """
    return _read(paths, verify=verify, jobs=jobs, progress=progress, checkpoints=checkpoints,
                 trust_pickle=trust_pickle, logs=logs)[0]


def _read(paths: str | list[str], *, verify: bool, jobs: int, progress: Progress | None,
          checkpoints: bool, trust_pickle: bool, logs: Sequence[str],
          ) -> tuple[list[Run], tuple[IngestIssue, ...]]:
    roots = [paths] if isinstance(paths, str) else list(paths)
    found = discover(roots, logs)
    if not found.runs:
        skipped = "".join(f"; {issue}" for issue in found.issues[:4])
        raise UsageError("no runs (folders with event files, logs or checkpoints) found "
                         f"under {', '.join(roots)}{skipped}")
    runs = read_runs(list(found.runs), verify=verify, jobs=jobs, progress=progress,
                     checkpoints=checkpoints, trust_pickle=trust_pickle)
    return runs, found.issues


def analyze(paths: str | list[str], *, verify: bool = True, jobs: int = 1,
            progress: Progress | None = None, checkpoints: bool = True,
            trust_pickle: bool = False, logs: Sequence[str] = (), replay: bool = True,
            device: str = "cpu", import_paths: Sequence[str] = (), trust_code: bool = False,
            rules: bool = True, status: Callable[[str], None] | None = None) -> Report:
    """Read every run below ``paths``, locate its first non-finite values, replay its
    captured failing step (when it has one) and rank the root causes.

    A replay imports the factories its capture names only from trusted folders (see
    :mod:`analyzer.trust`): ``import_paths``, the folders recorded with ``forensics trust``,
    the tool's own, or wherever they are with ``trust_code``; otherwise the result says
    which code it would have imported (``replay_refused``) and the rest is analysed.
    ``status`` is told, in a few words, what slow step comes next (a replay).
    """
    runs, issues = _read(paths, verify=verify, jobs=jobs, progress=progress,
                         checkpoints=checkpoints, trust_pickle=trust_pickle, logs=logs)
    results = [locate(r) for r in runs]
    if replay:
        replayed = []
        for k, r in enumerate(results):
            if status is not None and r.run.captures:
                status(f"replaying {r.run.name} ({k + 1}/{len(results)})")
            replayed.append(with_replay(r, device=device, import_paths=import_paths,
                                        trust_code=trust_code))
        results = replayed
    if rules:
        results = with_findings(results)
    return Report(results=tuple(results), tool_version=tool_version(), issues=issues)


def with_replay(result: RunResult, *, device: str = "cpu", import_paths: Sequence[str] = (),
                trust_code: bool = False) -> RunResult:
    """The result with the replay of its run's earliest capture, or the reason it was not
    run (code not trusted) or failed."""
    if not result.run.captures:
        return result
    done, error, refused = attempt_replay(result.run.captures[0], device=device,
                                          import_paths=import_paths, trust_code=trust_code)
    return replace(result, replay=done, replay_error=error, replay_refused=refused)


def attempt_replay(capture: str, *, device: str = "cpu", dtype: str = "as-run",
                   import_paths: Sequence[str] = (), trust_code: bool = False,
                   ) -> tuple[ReplayResult | None, str | None, CodeRefusal | None]:
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


def healthy_siblings(path: str, runs: Iterable[tuple[str, str, bool, Mapping[str, Any] | None]]
                     ) -> dict[str, Mapping[str, Any]]:
    """The environments of the healthy runs beside the run at ``path`` (same parent folder),
    by run name; ``runs`` gives (path, name, failed, env.json contents or None) per run."""
    parent = os.path.dirname(os.path.abspath(path))
    return {name: env for other, name, failed, env in runs
            if env is not None and not failed and os.path.abspath(other) != os.path.abspath(path)
            and os.path.dirname(os.path.abspath(other)) == parent}


def with_findings(results: list[RunResult]) -> list[RunResult]:
    """Run the rule catalogue over every result; healthy runs beside a failed one (same
    parent folder) serve as its reference environment."""
    from analyzer.rules import evaluate

    facts = [(r.run.path, r.run.name, r.failed, r.run.env) for r in results]
    out = []
    for r in results:
        findings, skipped = evaluate(r, healthy_siblings(r.run.path, facts))
        out.append(replace(r, findings=findings, skipped_rules=skipped))
    return out


def scalars(paths: str | list[str], *, verify: bool = True, jobs: int = 1) -> pd.DataFrame:
    """All scalars as a long DataFrame: run, tag, step, value, wall_time, source, position."""
    from analyzer.frames import scalars_frame

    return scalars_frame(read(paths, verify=verify, jobs=jobs))


def incidents(report: Report) -> pd.DataFrame:
    """One row per non-finite tag of every run, earliest first within a run."""
    from analyzer.frames import incidents_frame

    return incidents_frame(report)
