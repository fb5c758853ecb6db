"""Where each run's analysis runs: one task per run, results as they complete.

Every executor has one call, :meth:`Executor.map`: the runs and their options in, ``(index,
result)`` pairs out in the order the runs finish. Three kinds:

- :class:`Serial`: in this process, one run after the other, each only when the caller
  asks for the next result (a folder's results can be used before the next folder is read).
- :class:`Pool`: a local :class:`~concurrent.futures.ProcessPoolExecutor` (fork when nothing
  that runs threads is loaded, else a forkserver); a worker that dies has the runs it had
  started analysed again alone, in a worker of their own, so that a run that kills its
  worker is reported as not analysed rather than run in this process; a pool whose workers
  cannot start leaves every run to this process, one at a time. Its workers start with the
  analysis imported (:data:`PRELOAD`), its results are taken as each completes, and the
  strings they repeat (tags, keys, rule names) are loaded as one copy each.
- :class:`Dask`: a ``dask.distributed`` cluster, reached at a scheduler's address or started
  here as a ``LocalCluster`` on 127.0.0.1 (no dashboard) and closed at the end. dask is
  imported only then. A worker that dies while running a task has it retried elsewhere by
  the scheduler (``distributed.scheduler.allowed-failures``); once those retries are spent
  the run is reported as not analysed, with the reason.

A task that raises in a worker (or in this process for a pool or a cluster) gives its run
a result holding one issue that says so (kind ``unreadable``, the exception's type and
message and where it was raised): never a traceback, never a lost run. In this process
alone (``-j 1``, one run) it goes up as a bug of ours, as it always did.

Replays on a CUDA device: a cluster's tasks for runs that hold a capture ask for a worker
resource ``GPU``; locally (pool or LocalCluster) they run in this process, one at a time,
since the machine's GPU is one.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from queue import SimpleQueue
from types import TracebackType
from typing import Any

from analyzer.ingest.discover import RunFiles
from analyzer.model import IngestIssue, Location, Run, RunResult
from analyzer.model.runs import PointCounts
from analyzer.pipeline import RunOptions, analyze_run

Task = Callable[[RunFiles, RunOptions], RunResult]
"""What runs per run: :func:`analyze_run` unless a caller gives another."""
Status = Callable[[str], None]

DASK_EXTRA = "pip install 'nan-forensics[dask]'"
THREADED = ("torch", "streamlit", "tornado")
"""Modules that run threads once loaded: a process holding one is not forked."""
PRELOAD = ("analyzer.rules", "analyzer.ingest.logs", "analyzer.ingest.tb_proto",
           "analyzer.ingest.metadata.read", "analyzer.ingest.checkpoints",
           "analyzer.ingest.ckpt.scan")
"""What :func:`analyze_run` imports on its first run (the rules, the log and metadata
readers, protobuf and the checkpoint scan; about 0.2 s): imported before a pool's workers
start from this process, so that each is born with them rather than importing them again.
None of them loads a module of :data:`THREADED`."""

__all__ = ["DASK_EXTRA", "PRELOAD", "Executor", "Pool", "Serial", "Task", "guarded",
           "machine_size", "needs_gpu", "not_analysed", "preload"]


def machine_size() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def not_analysed(found: RunFiles, reason: str) -> RunResult:
    """The result of a run whose analysis did not complete: nothing read, one issue that
    says why (its status is then ``unreadable``)."""
    issue = IngestIssue(Location(found.path), "unreadable", f"not analysed: {reason}")
    run = Run(path=found.path, name=found.name,
              files=found.event_files + found.log_files + found.checkpoint_files,
              issues=(*found.issues, issue), layout=found.layout(), dropped=PointCounts())
    return RunResult(run=run, incident=None)


def guarded(task: Task, found: RunFiles, options: RunOptions) -> RunResult:
    """``task(found, options)``, or the run's :func:`not_analysed` result if it raises."""
    try:
        return task(found, options)
    except Exception as exc:  # one run's failure must not stop, or hide, the others
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (in {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" \
            if frames else ""
        detail = str(exc).strip().splitlines()
        return not_analysed(found, f"the analysis raised {type(exc).__name__}"
                                   f"{': ' + detail[0] if detail else ''}{where}")


def needs_gpu(found: RunFiles, options: RunOptions) -> bool:
    return options.replay and bool(found.capture_dirs) and options.device.startswith("cuda")


class Executor:
    """Runs one task per run; a context manager that frees what it started."""

    def map(self, runs: Sequence[RunFiles], options: RunOptions, task: Task = analyze_run,
            status: Status | None = None) -> Iterator[tuple[int, RunResult]]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what the executor started (workers, a cluster)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Serial(Executor):
    """In this process, lazily; ``jobs`` processes read one run's event files (what ``-j``
    does for a single run). ``guard``: a task that raises gives its run's
    :func:`not_analysed` result, as in a worker; without it (``-j 1``, a single run) the
    exception goes up, where the command line reports a bug of ours as one (status 3, the
    traceback with ``--debug``)."""

    def __init__(self, jobs: int = 1, *, guard: bool = False) -> None:
        self.jobs = jobs
        self.guard = guard

    def map(self, runs: Sequence[RunFiles], options: RunOptions, task: Task = analyze_run,
            status: Status | None = None) -> Iterator[tuple[int, RunResult]]:
        for k, found in enumerate(runs):
            yield k, self.one(found, options, task, status)

    def one(self, found: RunFiles, options: RunOptions, task: Task,
            status: Status | None) -> RunResult:
        def run(f: RunFiles, o: RunOptions) -> RunResult:
            if task is analyze_run:
                return analyze_run(f, o, jobs=self.jobs, status=status)
            return task(f, o)

        return guarded(run, found, options) if self.guard else run(found, options)


def _in_parent(runs: Sequence[RunFiles], options: RunOptions) -> set[int]:
    return {k for k, found in enumerate(runs) if needs_gpu(found, options)}


class Pool(Executor):
    """A local process pool of ``workers`` processes.

    A worker that dies (killed, out of memory, a crash in native code) breaks the whole
    pool. The runs it had started are suspects; the runs it had not started go on in a
    fresh pool (at most :attr:`RESTARTS` times, then in this process). Once the others are
    done, each suspect is analysed again alone, in a pool of one worker (as many such pools
    at once as the pool had workers), and reported as not analysed if that worker dies too.
    A pool whose workers never started one run (they cannot start in this host) leaves
    every run to this process, one at a time."""

    RESTARTS = 4

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def map(self, runs: Sequence[RunFiles], options: RunOptions, task: Task = analyze_run,
            status: Status | None = None) -> Iterator[tuple[int, RunResult]]:
        here = _in_parent(runs, options)
        serial = Serial(guard=True)
        # A replay in this process loads torch, which runs threads: workers started after
        # that must not be forked from it.
        context = pool_context(forking=not here)
        started = context.Array("b", max(1, len(runs)), lock=False)
        rounds: list[tuple[int, list[int]]] = [
            (self.workers, [k for k in range(len(runs)) if k not in here])]
        suspected: list[int] = []
        first, restarts = True, 0
        seen: dict[str, str] = {}  # one copy of each string of the results (_Sharing)
        given: set[int] = set()
        while rounds:
            workers, ks = rounds.pop(0)
            done: set[int] = set()
            try:
                for k, result in self._round(context, started, workers, ks, runs, options,
                                             task, sorted(here) if first else [], status,
                                             seen):
                    done.add(k)
                    yield k, result
            except BrokenProcessPool:
                rest = [k for k in ks if k not in done]
                suspects = [k for k in rest if started[k]]
                others = [k for k in rest if not started[k]]
                if first and not any(started[k] for k in ks) and restarts == 0:
                    # Workers cannot start in some hosts (a script fed on stdin under spawn,
                    # tight limits): what is left is analysed here.
                    left = [k for k in range(len(runs)) if k not in done]
                    for k in left:
                        yield k, serial.one(runs[k], options, task, status)
                    return
                restarts += 1
                if others and restarts > self.RESTARTS:
                    for k in others:
                        yield k, serial.one(runs[k], options, task, status)
                    others = []
                suspected += suspects
                if others:
                    rounds.insert(0, (workers, others))
            finally:
                first = False
                given |= done
        for k, result in self._alone(context, self.workers, suspected, runs, options, task,
                                     seen):
            given.add(k)
            yield k, result
        # A pool that broke while its runs were being submitted had not yet run these.
        for k in sorted(here - given):
            yield k, serial.one(runs[k], options, task, status)

    @staticmethod
    def _alone(context: BaseContext, workers: int, ks: list[int], runs: Sequence[RunFiles],
               options: RunOptions, task: Task, seen: dict[str, str],
               ) -> Iterator[tuple[int, RunResult]]:
        """Each run of ``ks`` in a pool of one worker of its own, up to ``workers`` such pools
        at once; a run whose worker dies again is reported as not analysed (alone, its
        worker needs no flag to say which run it had started)."""
        waiting = list(ks)
        live: dict[Future[bytes], tuple[int, ProcessPoolExecutor]] = {}
        completed: SimpleQueue[Future[bytes]] = SimpleQueue()
        try:
            while waiting or live:
                while waiting and len(live) < workers:
                    k = waiting.pop(0)
                    pool = ProcessPoolExecutor(max_workers=1, mp_context=context)
                    try:
                        future = pool.submit(_tracked, k, task, runs[k], options)
                    except BrokenProcessPool:
                        _stop(pool)
                        yield k, not_analysed(runs[k], WORKER_DIED)
                        continue
                    live[future] = (k, pool)
                    future.add_done_callback(completed.put)
                if not live:
                    continue
                done = completed.get()
                k, pool = live.pop(done)
                try:
                    result = _outcome(done, runs[k], seen)
                except BrokenProcessPool:
                    _stop(pool)
                    result = not_analysed(runs[k], WORKER_DIED)
                else:
                    pool.shutdown(wait=True)
                del done
                yield k, result
        finally:
            for _, pool in live.values():  # interrupted or stopped early
                _stop(pool)

    @staticmethod
    def _round(context: BaseContext, started: Any, workers: int, ks: list[int],
               runs: Sequence[RunFiles], options: RunOptions, task: Task, here: list[int],
               status: Status | None, seen: dict[str, str],
               ) -> Iterator[tuple[int, RunResult]]:
        """The runs ``ks`` on a fresh pool, then ``here`` in this process while it works."""
        for k in ks:
            started[k] = 0
        pool = ProcessPoolExecutor(max_workers=min(workers, max(1, len(ks))),
                                   mp_context=context, initializer=_remember,
                                   initargs=(started,))
        finished_all = False
        # Each future puts itself here as it completes: one wait per result, where
        # wait(FIRST_COMPLETED) over every pending future cost a pass over all of them per
        # result (quadratic in the runs: 2 s of this process's CPU for 1,000 runs).
        completed: SimpleQueue[Future[bytes]] = SimpleQueue()
        try:
            futures: dict[Future[bytes], int] = {}
            for k in ks:
                future = pool.submit(_tracked, k, task, runs[k], options)
                futures[future] = k
                future.add_done_callback(completed.put)
            serial = Serial(guard=True)
            for k in here:
                yield k, serial.one(runs[k], options, task, status)
            while futures:
                # Each future is let go once its result is given: a caller that keeps no
                # result holds none.
                future = completed.get()
                k = futures.pop(future)
                result = _outcome(future, runs[k], seen)
                del future
                yield k, result
            finished_all = True
        finally:
            if finished_all:
                pool.shutdown(wait=True)
            else:  # interrupted, stopped early or broken: not waiting on a worker that hangs
                _stop(pool)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop a pool's workers now: a run still in one (a read stalled on a mount or a store)
    must not keep an interrupted analysis waiting, nor outlive it."""
    # The workers are only reachable through the pool's own table before Python 3.14's
    # terminate_workers().
    table: dict[int, Any] = getattr(pool, "_processes", None) or {}
    workers = list(table.values())
    for process in workers:
        if process.is_alive():
            process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


WORKER_DIED = ("the worker process analysing it died, twice, the second time analysing it "
               "alone (killed by a signal, out of memory, or a crash in native code)")

_STARTED: Any = None
"""In a pool's worker: the parent's flags of the runs that started (shared memory)."""


def _remember(started: Any) -> None:
    global _STARTED
    _STARTED = started


def _tracked(k: int, task: Task, found: RunFiles, options: RunOptions) -> bytes:
    """:func:`guarded` in a worker, the run marked as started first (if the worker dies,
    the parent knows which runs it was analysing), its result pickled by :class:`_Marking`."""
    if _STARTED is not None:
        _STARTED[k] = 1
    out = io.BytesIO()
    _Marking(out, pickle.HIGHEST_PROTOCOL).dump(guarded(task, found, options))
    return out.getvalue()


class _Marking(pickle.Pickler):
    """Pickles each string as a mark (a persistent id), which :class:`_Sharing` turns into
    one shared copy in the process that gathers the results: every result of a fleet
    repeats the same tag, key, tensor and rule names, and unpickled as they are each
    result holds copies of its own (about 4 KB of a 21 KB result)."""

    def persistent_id(self, obj: Any) -> Any:
        return obj if type(obj) is str else None


class _Sharing(pickle.Unpickler):
    """Loads what :class:`_Marking` pickled (our workers' results, nothing else), each
    short string the copy ``seen`` holds (the pool's own table, not sys.intern's, which
    keeps what it holds for good in some Pythons; bounded: ``SHARED_STRINGS``)."""

    def __init__(self, data: bytes, seen: dict[str, str]) -> None:
        super().__init__(io.BytesIO(data))
        self.seen = seen

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not str:
            raise pickle.UnpicklingError("not a result of this pool")
        if len(pid) > SHARED_CHARS:
            return pid  # a path, a message: shared by few results, if any
        found = self.seen.get(pid)
        if found is not None:
            return found
        if len(self.seen) < SHARED_STRINGS:
            self.seen[pid] = pid
        return pid


SHARED_CHARS = 64
"""Strings up to this long are shared between results: names (tags, keys, rules, tensors)."""
SHARED_STRINGS = 1 << 16
"""Strings the table holds at most: past it new ones are not kept, so that what the table
holds stops growing with the fleet (a run's own names, its folder's, are in it too)."""


def _outcome(future: Future[bytes], found: RunFiles, seen: dict[str, str]) -> RunResult:
    """A pool task's result; one that could not come back (it would not pickle) is the
    run's :func:`not_analysed`. A broken pool is the caller's to handle."""
    try:
        result: RunResult = _Sharing(future.result(), seen).load()
        return result
    except BrokenProcessPool:
        raise
    except Exception as exc:
        return not_analysed(found, f"its result could not be returned from the worker "
                                   f"({type(exc).__name__}: {exc})")


def preload() -> None:
    """Import :data:`PRELOAD` here (a process that forks workers shares them)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def pool_context(*, forking: bool = True) -> BaseContext:
    """How a pool's workers start: forked from this process when nothing here runs threads
    (torch, a server) and ``forking`` allows it (the fastest start); else forked from a
    fresh server process that imported the analysis once (forkserver), where the platform
    has one, so that a second pool in the same process starts faster than the first; else
    spawned."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    threaded = any(m in sys.modules for m in THREADED)
    if forking and not threaded and "fork" in methods:
        preload()  # once here, not once in each worker
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["analyzer.fleet.executors", *PRELOAD])
        return context
    return multiprocessing.get_context("spawn")
