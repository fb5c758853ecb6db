"""Which executor runs a fleet (:mod:`analyzer.fleet.executors`, :mod:`analyzer.fleet.cluster`):
the one place that turns ``--scheduler`` and ``-j`` into one."""

from __future__ import annotations

from analyzer.errors import UsageError
from analyzer.fleet.executors import Executor, Pool, Serial, machine_size

__all__ = ["make_executor"]


def make_executor(scheduler: str | None, jobs: int | None, runs: int) -> Executor:
    """The executor for ``runs`` runs: a Dask cluster for ``scheduler`` (an address, or
    ``local``/``local:N``); else a local pool of ``jobs`` processes (None: the machine's
    size) when there is more than one run, and this process otherwise."""
    if scheduler is not None:
        from analyzer.fleet.cluster import Dask

        return Dask(scheduler)
    size = machine_size() if jobs is None else jobs
    if size < 1:
        raise UsageError("--jobs must be at least 1")
    if size == 1 or runs <= 1:
        return Serial(jobs=size)
    return Pool(min(size, runs))

