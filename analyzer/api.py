"""The analysis as library calls: paths in, a :class:`Report` (or DataFrames) out."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from analyzer.errors import ForensicsError, UsageError
from analyzer.ingest.discover import find_runs
from analyzer.ingest.runs import Progress, read_runs
from analyzer.locate import locate
from analyzer.model import Report, Run, RunResult

if TYPE_CHECKING:
    import pandas as pd


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
    roots = [paths] if isinstance(paths, str) else list(paths)
    found = find_runs(roots, logs)
    if not found:
        raise UsageError("no runs (folders with event files, logs or checkpoints) found "
                         f"under {', '.join(roots)}")
    return read_runs(found, verify=verify, jobs=jobs, progress=progress,
                     checkpoints=checkpoints, trust_pickle=trust_pickle)


def analyze(paths: str | list[str], *, verify: bool = True, jobs: int = 1,
            progress: Progress | None = None, checkpoints: bool = True,
            trust_pickle: bool = False, logs: Sequence[str] = (), replay: bool = True,
            device: str = "cpu", import_paths: Sequence[str] = (),
            rules: bool = True, status: Callable[[str], None] | None = None) -> Report:
    """Read every run below ``paths``, locate its first non-finite values, replay its
    captured failing step (when it has one) and rank the root causes.

    ``status`` is told, in a few words, what slow step comes next (a replay).
    """
    runs = read(paths, verify=verify, jobs=jobs, progress=progress, checkpoints=checkpoints,
                trust_pickle=trust_pickle, logs=logs)
    results = [locate(r) for r in runs]
    if replay:
        replayed = []
        for k, r in enumerate(results):
            if status is not None and r.run.captures:
                status(f"replaying {r.run.name} ({k + 1}/{len(results)})")
            replayed.append(with_replay(r, device=device, import_paths=import_paths))
        results = replayed
    if rules:
        results = with_findings(results)
    return Report(results=tuple(results), tool_version=tool_version())


def with_replay(result: RunResult, *, device: str = "cpu",
                import_paths: Sequence[str] = ()) -> RunResult:
    """The result with the replay of its run's earliest capture, or the reason it failed."""
    if not result.run.captures:
        return result
    from analyzer.replay import replay as run_replay

    try:
        done = run_replay(result.run.captures[0], device=device, import_paths=import_paths)
    except ForensicsError as exc:
        return replace(result, replay_error=str(exc))
    return replace(result, replay=done)


def with_findings(results: list[RunResult]) -> list[RunResult]:
    """Run the rule catalogue over every result; healthy runs beside a failed one (same
    parent folder) serve as its reference environment."""
    from analyzer.rules import evaluate
    from analyzer.rules.evidence import RunEvidence

    envs = {id(r): RunEvidence(r).env for r in results}
    out = []
    for r in results:
        parent = os.path.dirname(os.path.abspath(r.run.path))
        siblings = {o.run.name: env for o in results
                    if o is not r and not o.failed and (env := envs[id(o)]) is not None
                    and os.path.dirname(os.path.abspath(o.run.path)) == parent}
        findings, skipped = evaluate(r, siblings)
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
