"""What a replay costs, against one plain training step of the same model.

For each sample model this times, in the same process and on the CPU:

    plain     one training step (zero_grad, forward, loss, backward, optimizer step)
    anomaly   the same step under torch.autograd.detect_anomaly(check_nan=True)
    instr.    the instrumented pass alone (module hooks, op trace, anomaly mode,
              gradient hooks, update check)
    default   replay_step as `forensics replay` and `analyze` run it (passes="auto") on
              the healthy step: one plain pass watching the module outputs, which is all a
              step that stays finite needs
    all       replay_step(passes="all"): the instrumented pass, two plain passes in the
              run's configuration and one in float64, each on a fresh copy of the state
    failing   the default replay of the same step with a loss that goes non-finite
              (log of 0 in the loss): the plain pass, the instrumented pass and the
              float64 pass the verdict needs

and prints each as a multiple of the plain step, with the load average beside them. The
measurements take turns, one of each per round, and the figure is the fastest round of each
(``--stat median`` for the median): on a loaded machine the fastest is the one least
disturbed by the rest. Times are the process's CPU time by default (``--clock wall`` for
elapsed time): with one thread, that is the work a pass does, which a busy machine does not
inflate by descheduling it.
Run: ``.venv/bin/python bench/replay.py`` (add ``--threads N``; default 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from analyzer.replayer import replay_step
from analyzer.replayer.passes import instrumented_pass
from analyzer.replayer.state import StepConfig, TrainState, clone_state
from analyzer.replayer.steps import StepBatch, StepCall
from analyzer.scenarios import models


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]


def _loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def _failing_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets) + torch.log(outputs - outputs).mean()


CASES = (
    Case("mlp 3x512, batch 64",
         lambda: models.mlp(in_features=256, hidden=512, out_features=10, depth=3, seed=0),
         lambda: (torch.randn(64, 256), torch.randint(0, 10, (64,)))),
    Case("cnn 2 conv, batch 32",
         lambda: models.small_cnn(channels=1, classes=10, width=16, size=32, seed=0),
         lambda: (torch.randn(32, 1, 32, 32), torch.randint(0, 10, (32,)))),
    Case("rnn 32x64, batch 16",
         lambda: models.rnn_classifier(in_features=8, hidden=64, classes=2, seed=0),
         lambda: (torch.randn(16, 32, 8), torch.randint(0, 2, (16,)))),
)


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: Any, y: Any) -> None:
    opt.zero_grad(set_to_none=True)
    _loss(model(x), y).backward()
    opt.step()


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def _timed(funcs: dict[str, Callable[[], object]], rounds: int,
           clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """Each function once per round, in turn, so that a change of the machine's load
    falls on all of them alike; one warm-up round first (lazy imports, allocations)."""
    for func in funcs.values():
        func()
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, func in funcs.items():
            start = clock()
            func()
            times[name].append(clock() - start)
    return times


def measure(case: Case, rounds: int, stat: Callable[[list[float]], float],
            clock: Callable[[], float] = time.process_time) -> dict[str, float]:
    torch.manual_seed(0)
    model = case.build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = case.batch()

    def plain() -> None:
        _step(model, opt, x, y)

    def anomaly() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                _step(model, opt, x, y)

    def instrumented() -> None:
        state = clone_state(TrainState(model, opt), StepConfig())
        instrumented_pass(state, StepBatch.pair(x, y), StepCall("loss_fn", _loss),
                          StepConfig())

    def replay(passes: str, loss: Callable[..., torch.Tensor], expected: bool
               ) -> Callable[[], object]:
        return lambda: replay_step(model, x, y, loss, opt, expected=expected, passes=passes)

    times = _timed({"plain": plain, "anomaly": anomaly, "instrumented": instrumented,
                    "default": replay("auto", _loss, False),
                    "all": replay("all", _loss, False),
                    "failing": replay("auto", _failing_loss, True)}, rounds, clock)
    base = stat(times["plain"])
    return {"plain_s": base, **{k: stat(v) / base for k, v in times.items() if k != "plain"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9, help="rounds of every measurement")
    parser.add_argument("--stat", choices=("min", "median"), default="min",
                        help="min (default): the round least disturbed by other load")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu",
                        help="cpu (default): the process's CPU time, which other load on "
                             "the machine does not inflate; wall: elapsed time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    stat = min if args.stat == "min" else statistics.median
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.stat} {args.clock} "
          f"time of {args.repeats} interleaved rounds; times relative to one plain step")
    columns = ("anomaly", "instrumented", "default", "all", "failing")
    print(f"{'model':24s} {'plain step':>11s} " + " ".join(f"{c[:8]:>8s}" for c in columns)
          + "  load")
    for case in CASES:
        r = measure(case, args.repeats, stat, CLOCKS[args.clock])
        print(f"{case.name:24s} {r['plain_s'] * 1e3:9.2f}ms "
              + " ".join(f"{r[c]:7.2f}x" for c in columns)
              + f"  {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
