"""Cost of the align stage on a large run, against a reference in the same run.

Builds a run in memory: an event file's loss and learning rate at every global step
(``--steps``), and a log of the Trainer's records every ``--every`` steps with the same loss
printed rounded to 4 places, numbered 1, 2, ... (no step). Times ``analyzer.align.align`` on
it, and as the reference a stable argsort of the event file's steps and the log's values
(what any pass over the run's points costs). Prints wall and CPU seconds, each the best of
``--repeat`` runs, and the ratio.

    .venv/bin/python bench/align.py                       # 1,000,000 steps, a record every 5
    .venv/bin/python bench/align.py --steps 100000 --every 1
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from analyzer.align import align
from analyzer.model import Run, Series, StepAxis


def _series(tag: str, source: str, steps: np.ndarray, values: np.ndarray,
            axis: StepAxis | None = None) -> Series:
    extra = {} if axis is None else {"axis": axis, "position_unit": "line"}
    return Series(tag=tag, steps=steps.astype(np.int64), values=values.astype(np.float64),
                  wall_times=np.full(steps.size, np.nan), source=source,
                  positions=np.arange(steps.size, dtype=np.int64), **extra)  # type: ignore[arg-type]


def build(steps: int, every: int) -> Run:
    rng = np.random.default_rng(0)
    glob = np.arange(steps)
    loss = 3.0 * np.exp(-glob / (steps / 4)) + rng.normal(0, 0.05, steps)
    events = "run/events.out.tfevents.1.host"
    logged = glob[every::every]
    records = np.arange(1, logged.size + 1)
    log = [_series("loss", "run/train.log", records, np.round(loss[logged], 4),
                   StepAxis("record", base=1, label="record"))]
    ref = [_series("train/loss", events, glob, loss),
           _series("train/lr", events, glob, np.full(steps, 5e-5))]
    return Run(path="run", name="run", files=(events, "run/train.log"), series=(*ref, *log))


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    run = build(args.steps, args.every)
    placed = align(run).alignments[0]
    print(f"placed: {placed.confidence}, step = {placed.stride} x record + {placed.offset}, "
          f"{placed.agreement:.0%} of {placed.points} agree")

    def reference() -> None:
        for s in run.series:
            np.argsort(s.steps, kind="stable")
            np.argsort(s.values, kind="stable")

    ref_wall, ref_cpu = _best(reference, args.repeat)
    wall, cpu = _best(lambda: align(run), args.repeat)
    points = sum(len(s) for s in run.series)
    print(f"{points:,} points: align {wall:.3f} s wall, {cpu:.3f} s CPU; reference "
          f"{ref_wall:.3f} s wall, {ref_cpu:.3f} s CPU; ratio {wall / ref_wall:.2f}x wall")


if __name__ == "__main__":
    main()
