"""The analysis as library calls: paths in, a :class:`Report` (or DataFrames) out.

:func:`analyze` runs every stage of :mod:`analyzer.pipeline`; :func:`read` the first three
(discover, read, align). The DataFrame views are built from the same records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from analyzer.align import align
from analyzer.ingest.runs import Progress, read_runs
from analyzer.model import Report, Run
from analyzer.pipeline import analyze, discover, runs_of, tool_version

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["analyze", "incidents", "read", "scalars", "tool_version"]


def read(paths: str | Sequence[str], *, verify: bool = True, jobs: int = 1,
         progress: Progress | None = None, checkpoints: bool = True,
         trust_pickle: bool = False, logs: Sequence[str] = (),
         run_roots: Sequence[str] = ()) -> list[Run]:
    """Every run found below ``paths``, fully read, every source's steps on the run's
    global step (:func:`analyzer.align.align`). Raises UsageError when there is none.

    ``logs`` are extra text logs whose file names do not say they are logs; each of
    ``run_roots`` is one run with everything below it (``--run-root``).
    """
    runs = read_runs(runs_of(discover(paths, logs, run_roots), paths), verify=verify, jobs=jobs,
                     progress=progress, checkpoints=checkpoints, trust_pickle=trust_pickle)
    return [align(run) for run in runs]


def scalars(paths: str | Sequence[str], *, verify: bool = True, jobs: int = 1) -> pd.DataFrame:
    """All scalars as a long DataFrame: run, tag, step, value, wall_time, source, position."""
    from analyzer.frames import scalars_frame

    return scalars_frame(read(paths, verify=verify, jobs=jobs))


def incidents(report: Report) -> pd.DataFrame:
    """One row per non-finite tag of every run, earliest first within a run."""
    from analyzer.frames import incidents_frame

    return incidents_frame(report)
