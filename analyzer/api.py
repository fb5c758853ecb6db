"""The analysis as library calls: paths in, a :class:`Report` (or DataFrames) out."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from analyzer.errors import UsageError
from analyzer.ingest.discover import find_runs
from analyzer.ingest.runs import Progress, read_runs
from analyzer.locate import locate
from analyzer.model import Report, Run

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
            trust_pickle: bool = False, logs: Sequence[str] = ()) -> Report:
    """Read every run below ``paths`` and locate its first non-finite values."""
    runs = read(paths, verify=verify, jobs=jobs, progress=progress, checkpoints=checkpoints,
                trust_pickle=trust_pickle, logs=logs)
    return Report(results=tuple(locate(r) for r in runs), tool_version=tool_version())


def scalars(paths: str | list[str], *, verify: bool = True, jobs: int = 1) -> pd.DataFrame:
    """All scalars as a long DataFrame: run, tag, step, value, wall_time, source, position."""
    from analyzer.frames import scalars_frame

    return scalars_frame(read(paths, verify=verify, jobs=jobs))


def incidents(report: Report) -> pd.DataFrame:
    """One row per non-finite tag of every run, earliest first within a run."""
    from analyzer.frames import incidents_frame

    return incidents_frame(report)
