"""A fleet's analysis as a stream: each run's slim result (:func:`analyzer.pipeline.
analyze_run`) from an executor, held only until every run of its folder is done; then the
folder's results are given, in discovery order, each ranked again beside its healthy
siblings (:func:`analyzer.pipeline.rank_siblings`). What is held at once is the slim
results of the folders still running, never a run's series.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from analyzer.fleet.executors import Executor, Status, Task
from analyzer.ingest.discover import RunFiles
from analyzer.model import RunResult
from analyzer.pipeline import (
    RunOptions,
    analyze_run,
    healthy_siblings,
    rank_siblings,
    same_folder,
    sibling_facts,
)

RunProgress = Callable[[int, int], None]
"""Called with (runs done, runs in all) as each run finishes."""

__all__ = ["RunProgress", "stream"]


def stream(runs: Sequence[RunFiles], options: RunOptions, executor: Executor, *,
           task: Task = analyze_run, progress: RunProgress | None = None,
           status: Status | None = None) -> Iterator[tuple[int, RunResult]]:
    """``(index in runs, result)`` for every run, a folder's results as soon as its last
    run is done."""
    folders = [same_folder(found.path) for found in runs]
    left = Counter(folders)
    held: dict[str, dict[int, RunResult]] = {}
    done = 0
    if progress is not None:
        progress(0, len(runs))
    for k, result in executor.map(runs, options, task, status):
        done += 1
        if progress is not None:
            progress(done, len(runs))
        folder = folders[k]
        held.setdefault(folder, {})[k] = result
        left[folder] -= 1
        if left[folder]:
            continue
        group = held.pop(folder)
        order = sorted(group)  # discovery's, not completion's: the siblings' evidence follows it
        facts = [sibling_facts(group[k]) for k in order]
        for index in order:
            r = group[index]
            if options.rules and (r.findings or r.skipped_rules):  # not a run left unanalysed
                r = rank_siblings(r, healthy_siblings(r.run.path, facts))
            yield index, r
