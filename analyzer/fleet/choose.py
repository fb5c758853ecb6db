"""Which executor runs a fleet (:mod:`analyzer.fleet.executors`, :mod:`analyzer.fleet.cluster`):
the one place that turns ``--scheduler`` and ``-j`` into one."""

from __future__ import annotations

from analyzer.errors import UsageError
from analyzer.fleet.executors import Executor, Pool, Serial, machine_size

__all__ = ["make_executor"]


POOL_MIN_RUNS = 16
"""Without ``-j``, fewer runs than this are analysed in this process: starting a worker
(a process that imports numpy, and torch for checkpoints) costs seconds, more than a few
small runs take."""


def make_executor(scheduler: str | None, jobs: int | None, runs: int) -> Executor:
    """The executor for ``runs`` runs: a Dask cluster for ``scheduler`` (an address, or
    ``local``/``local:N``); else a local pool of ``jobs`` processes for more than one run
    (None: the machine's size, for fleets of :data:`POOL_MIN_RUNS` runs or more), and this
    process otherwise (a single run has its event files read in ``jobs`` processes, one
    when not given)."""
    if scheduler is not None:
        from analyzer.fleet.cluster import Dask

        return Dask(scheduler)
    size = machine_size() if jobs is None else jobs
    if size < 1:
        raise UsageError("--jobs must be at least 1")
    if runs <= 1:  # its event files in -j processes, as -j always did; in one by default
        return Serial(jobs=jobs or 1)
    if size == 1 or (jobs is None and runs < POOL_MIN_RUNS):
        return Serial()
    return Pool(min(size, runs))
