"""Reading whole runs: every source file of a run folder merged into one :class:`Run`.

Several event files in one folder are a restarted (or re-created) writer: they are merged
in the order their names give, and each file after the first is recorded as a restart, not
deduplicated away. The run's flight-recorder captures and its ``env.json`` are read here too
(by :mod:`analyzer.capture.folder`, their format's owner), and its framework metadata (by
:mod:`analyzer.ingest.metadata`), so that later stages read them off the :class:`Run` and
open no file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from multiprocessing.context import BaseContext

from analyzer.capture.folder import read_run_captures
from analyzer.ingest import storage
from analyzer.ingest.discover import RunFiles
from analyzer.ingest.tb import EventFile, read_event_file
from analyzer.model import Event, Location, LogSource, Run

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes in all) as files finish."""


def read_runs(runs: list[RunFiles], *, verify: bool = True, jobs: int = 1,
              progress: Progress | None = None, checkpoints: bool = True,
              trust_pickle: bool = False) -> list[Run]:
    """Read every file of every run; with ``jobs > 1`` event files are read in parallel
    processes. Checkpoints are scanned tensor by tensor unless ``checkpoints`` is False."""
    for run in runs:
        _prime(run)
    paths = [f for run in runs for f in run.event_files]
    sizes = {p: _size(p) for p in paths}
    total = sum(sizes.values())
    done = 0
    results: dict[str, EventFile] = {}
    for path, result in _read_all(paths, verify, jobs):
        results[path] = result
        done += sizes[path]
        if progress is not None:
            progress(done, total)
    merged = [_with_metadata(_with_captures(_with_logs(
        merge_run(run, [results[f] for f in run.event_files]), run), run), run)
              for run in runs]
    if not checkpoints:
        return merged
    return [_with_checkpoints(m, r, trust_pickle) for m, r in zip(merged, runs, strict=True)]


def _prime(run: RunFiles) -> None:
    """A remote run found by a walk, in a process that has not listed it (a pool's worker):
    its tree listed once, rather than each of its objects looked at for its size. A run of
    one file named alone is not listed (its folder may be a whole bucket)."""
    files = (*run.event_files, *run.log_files, *run.checkpoint_files, *run.metadata_files,
             *run.capture_dirs)
    if storage.is_url(run.path) and run.folders and len(files) > 1:
        storage.prime(run.path)


def _with_logs(run: Run, files: RunFiles) -> Run:
    if not files.log_files:
        return run
    from analyzer.ingest.logs import read_log

    reads = [(path, read_log(path)) for path in files.log_files]
    return replace(
        run,
        files=run.files + files.log_files,
        series=run.series + tuple(s for _, r in reads for s in r.series),
        events=run.events + tuple(e for _, r in reads for e in r.events),
        issues=run.issues + tuple(i for _, r in reads for i in r.issues),
        logs=tuple(LogSource(path, r.framework, r.confidence, r.notes, r.epoch_length)
                   for path, r in reads),
    )


def _with_metadata(run: Run, files: RunFiles) -> Run:
    if not files.metadata_files and not files.log_files:
        return run
    from analyzer.ingest.metadata.read import read_run_metadata

    found = read_run_metadata(files.metadata_files, files.log_files)
    if found is None:
        return run
    # trainer_state.json is a log too: its damage is the log reader's to report, once.
    reported = {i.location.file for i in run.issues}
    return replace(run, metadata=found, issues=run.issues + tuple(
        i for i in found.issues if i.location.file not in reported))


def _with_captures(run: Run, files: RunFiles) -> Run:
    found = read_run_captures(files.path, files.capture_dirs)
    return replace(run, captures=found.captures, capture_metas=found.metas, env=found.env,
                   issues=run.issues + found.issues)


def _with_checkpoints(run: Run, files: RunFiles, trust_pickle: bool) -> Run:
    if not files.checkpoint_files:
        return run
    from analyzer.ingest.checkpoints import scan_run_checkpoints
    from analyzer.ingest.metadata.read import with_checkpoints

    history = scan_run_checkpoints(list(files.checkpoint_files), trust_pickle=trust_pickle)
    return replace(run, checkpoints=history, issues=run.issues + history.issues,
                   files=run.files + files.checkpoint_files,
                   metadata=with_checkpoints(run.metadata, history))


def _read_all(paths: list[str], verify: bool, jobs: int) -> Iterable[tuple[str, EventFile]]:
    if jobs <= 1 or len(paths) <= 1:
        for p in paths:
            yield p, read_event_file(p, verify=verify)
        return
    # Largest first, so one big file does not start last and run alone.
    order = sorted(paths, key=_size, reverse=True)
    done: dict[str, EventFile] = {}
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_context()) as pool:
            futures = {p: pool.submit(read_event_file, p, verify=verify) for p in order}
            for p in order:
                done[p] = futures[p].result()
                yield p, done[p]
    except BrokenProcessPool:
        # Workers cannot start in some hosts (a script fed on stdin under spawn, tight
        # limits): read what is left here rather than fail.
        for p in order:
            if p not in done:
                yield p, read_event_file(p, verify=verify)


def _context() -> BaseContext:
    """fork when nothing that runs threads is loaded (fast start), else spawn: forking a
    process that runs torch's or a server's threads can deadlock the child."""
    import multiprocessing

    threaded = any(m in sys.modules for m in ("torch", "streamlit", "tornado"))
    if not threaded and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def merge_run(run: RunFiles, files: list[EventFile]) -> Run:
    series = tuple(s for f in files for s in f.series)
    histograms = tuple(h for f in files for h in f.histograms)
    events: list[Event] = []
    for k, f in enumerate(files):
        if k > 0 and f.records and f.path not in run.stream_starts:  # not beside the others
            first = _first_step(f)
            events.append(Event("restart", first, Location(f.path, offset=0),
                                "another event file: the writer was started again",
                                {"reason": "new_file"}))
        events.extend(f.events)
    issues = run.issues + tuple(i for f in files for i in f.issues)
    return Run(path=run.path, name=run.name, files=run.event_files, series=series,
               histograms=histograms, events=tuple(events), issues=issues,
               layout=run.layout())


def _first_step(f: EventFile) -> int | None:
    steps = [int(s.steps[0]) for s in f.series if len(s)]
    return min(steps) if steps else None


def _size(path: str) -> int:
    try:
        return storage.size(path)
    except OSError:
        return 0
