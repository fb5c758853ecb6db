"""What a replay costs, against one plain training step of the same model.

For each sample model this times, in the same process and on the CPU:

    plain     one training step (zero_grad, forward, loss, backward, optimizer step)
    anomaly   the same step under torch.autograd.detect_anomaly(check_nan=True)
    instr.    the instrumented pass alone (module hooks, op trace, anomaly mode,
              gradient hooks, update check)
    replay    a whole replay_step: the instrumented pass, two plain passes in the
              run's configuration and one in float64, plus copying the state for each

and prints each as a multiple of the plain step (the median of several repeats).
Run: ``.venv/bin/python bench/replay.py`` (add ``--threads N``; default 1).
"""

from __future__ import annotations

import argparse
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
from analyzer.scenarios import models


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]


def _loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


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


def _median(func: Callable[[], object], repeats: int) -> float:
    func()  # warm-up: first calls pay for lazy imports and allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(case: Case, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = case.build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = case.batch()
    plain = _median(lambda: _step(model, opt, x, y), repeats * 4)

    def anomaly() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                _step(model, opt, x, y)

    def instrumented() -> None:
        state = clone_state(TrainState(model, opt), StepConfig())
        instrumented_pass(state, x, y, _loss, StepConfig())

    def replay() -> None:
        replay_step(model, x, y, _loss, opt, expected=False)

    return {
        "plain_s": plain,
        "anomaly": _median(anomaly, repeats * 2) / plain,
        "instrumented": _median(instrumented, repeats) / plain,
        "replay": _median(replay, repeats) / plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of "
          f"{args.repeats}+ repeats; times relative to one plain step")
    print(f"{'model':24s} {'plain step':>11s} {'anomaly':>8s} {'instr.':>8s} {'replay':>8s}")
    for case in CASES:
        r = measure(case, args.repeats)
        print(f"{case.name:24s} {r['plain_s'] * 1e3:9.2f}ms {r['anomaly']:7.1f}x "
              f"{r['instrumented']:7.1f}x {r['replay']:7.1f}x", flush=True)


if __name__ == "__main__":
    main()
