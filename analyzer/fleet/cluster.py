"""The Dask executor: one task per run on a ``dask.distributed`` cluster.

``--scheduler tcp://HOST:PORT`` connects to a running scheduler (any cluster: one started by
hand with ``dask scheduler`` and ``dask worker``, by dask-jobqueue on Slurm, by
dask-kubernetes); ``local`` or ``local:N`` starts a ``LocalCluster`` of N worker processes
(default: the machine's size) on 127.0.0.1 without a dashboard, closed when the analysis
ends. Workers need this package installed (they import :mod:`analyzer.pipeline`) and must
reach the runs' paths (the same shared file system, or URLs of an object store).

A run's task is retried by the scheduler on another worker when its worker dies; once the
scheduler gives up (``KilledWorker``), or the result cannot come back, the run is reported
as not analysed with the reason. Replays on a CUDA device: tasks of runs that hold a capture
ask for the worker resource ``GPU`` (1 each) on a remote cluster, and a cluster with no
worker that declares one is refused before anything is submitted; on a LocalCluster those
runs are analysed in this process, one at a time.
"""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from analyzer.errors import UsageError
from analyzer.fleet.executors import (
    DASK_EXTRA,
    Executor,
    Serial,
    Status,
    Task,
    guarded,
    machine_size,
    needs_gpu,
    not_analysed,
)
from analyzer.ingest.discover import RunFiles
from analyzer.model import RunResult
from analyzer.pipeline import RunOptions, analyze_run

__all__ = ["Dask", "local_cluster", "local_workers"]

CONNECT_TIMEOUT = "20s"


def local_workers(scheduler: str) -> int | None:
    """N of ``local:N`` (``local``: the machine's size); None for an address."""
    if scheduler == "local":
        return machine_size()
    if not scheduler.startswith("local:"):
        return None
    count = scheduler.partition(":")[2]
    if not count.isdigit() or int(count) < 1:
        raise UsageError(f"--scheduler {scheduler}: local:N needs N a whole number of "
                         "workers, at least 1")
    return int(count)


def local_cluster(workers: int) -> dict[str, Any]:
    """A LocalCluster's keywords: ``workers`` processes of one thread on 127.0.0.1, no
    dashboard, and the scheduler's HTTP routes (which it serves even without a dashboard) on
    a free loopback port rather than 8787; errors only in its logs (a worker killed when
    the cluster closes is routine, not a warning to show)."""
    return {"n_workers": workers, "threads_per_worker": 1, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None,
            "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
            "silence_logs": logging.ERROR}


class Dask(Executor):
    """A client of a Dask cluster: the one at ``scheduler``'s address, or a LocalCluster."""

    def __init__(self, scheduler: str) -> None:
        try:
            # Untyped: taken as Any rather than a call of an untyped function per use.
            distributed: Any = importlib.import_module("distributed")
        except ImportError:
            raise UsageError(f"--scheduler needs dask.distributed: {DASK_EXTRA}") from None
        self.distributed = distributed
        workers = local_workers(scheduler)
        self.cluster: Any = None
        self.local = workers is not None
        if workers is not None:
            self.cluster = distributed.LocalCluster(**local_cluster(workers))
            try:
                self.client: Any = distributed.Client(self.cluster)
            except BaseException:  # an interrupt too: the cluster's workers must not outlive us
                self.cluster.close()
                raise
            return
        if "://" not in scheduler:
            raise UsageError(f"--scheduler {scheduler}: give a scheduler's address "
                             "(tcp://HOST:PORT) or local[:N]")
        try:
            self.client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            raise UsageError(f"--scheduler {scheduler}: cannot reach the scheduler "
                             f"({type(exc).__name__}: {exc})") from None

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def gpu_workers(self) -> int:
        """The workers that declare a ``GPU`` resource."""
        workers = self.client.scheduler_info().get("workers", {})
        return sum(1 for w in workers.values() if w.get("resources", {}).get("GPU", 0) >= 1)

    def map(self, runs: Sequence[RunFiles], options: RunOptions, task: Task = analyze_run,
            status: Status | None = None) -> Iterator[tuple[int, RunResult]]:
        gpu = {k for k, found in enumerate(runs) if needs_gpu(found, options)}
        here = gpu if self.local else set()
        if gpu and not self.local and not self.gpu_workers():
            raise UsageError(
                f"replaying on {options.device} needs workers that declare a GPU resource, "
                f"and no worker of the cluster does: start them with 'dask worker "
                f"{self.client.scheduler.address} --resources GPU=1' (one per GPU), or pass "
                "--no-replay")
        batch = uuid.uuid4().hex
        futures = {}
        for k, found in enumerate(runs):
            if k in here:
                continue
            future = self.client.submit(guarded, task, found, options, pure=False,
                                        key=f"forensics-run-{k}-{batch}",
                                        resources={"GPU": 1} if k in gpu else None)
            futures[future] = k
        serial = Serial(guard=True)
        for k in sorted(here):
            yield k, serial.one(runs[k], options, task, status)
        for future in self.distributed.as_completed(futures):
            k = futures.pop(future)
            yield k, self._outcome(future, runs[k])

    @staticmethod
    def _outcome(future: Any, found: RunFiles) -> RunResult:
        try:
            result: RunResult = future.result()
        except Exception as exc:  # KilledWorker, a result that could not come back, ...
            detail = str(exc).strip().splitlines()
            why = ("every worker that ran it died" if type(exc).__name__ == "KilledWorker"
                   else "the cluster could not run it")
            return not_analysed(found, f"{why} ({type(exc).__name__}"
                                       f"{': ' + detail[0] if detail else ''})")
        finally:
            future.release()
        return result
