"""Per-step cost of the flight recorder, as a ratio to a plain training step.

Every configuration trains the same MLP with Adam on the same batches in the same process;
rounds alternate between configurations so that drift in machine load hits them alike, and
each configuration's figure is the median over rounds. The recorder never captures here (the
loss stays finite), so this is the steady cost a healthy run pays.

The guard's configurations (``StepGuard``, writing its norms into a real SummaryWriter in a
temporary folder) run the same plain step with ``after_backward`` and ``after_update``;
``--guard-only`` runs them beside the plain step alone.

    .venv/bin/python bench/capture.py [--steps 10] [--rounds 40] [--hidden 512] [--batch 64]
        [--guard-only]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from analyzer.capture import FlightRecorder
from analyzer.capture.guard import StepGuard

FACTORY = "analyzer.scenarios.models:mlp"


def _kwargs(hidden: int) -> dict[str, Any]:
    return {"in_features": 256, "hidden": hidden, "out_features": 10, "depth": 3, "seed": 0}


def _model(hidden: int) -> torch.nn.Module:
    from analyzer.scenarios.models import mlp

    return mlp(**_kwargs(hidden))


def _batches(batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The eight batches every configuration cycles through, the same for each."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(8)]


def _runner(
    hidden: int, batch: int, recorder_options: dict[str, Any] | None
) -> Callable[[int], float]:
    model = _model(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = _batches(batch)
    rec = None
    if recorder_options is not None:
        rec = FlightRecorder(
            tempfile.mkdtemp(prefix="bench-capture-"), model, opt,
            model_factory=FACTORY, model_kwargs=_kwargs(hidden),
            loss_factory="analyzer.scenarios.losses:cross_entropy",
            write_env_file=False, trust_code_root=False, **recorder_options,
        )  # fmt: skip
    counter = [0]

    def one_step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if rec is not None:
            rec.loss(loss)

    def run(steps: int) -> float:
        start = time.process_time()
        for _ in range(steps):
            step = counter[0]
            counter[0] += 1
            x, y = batches[step % len(batches)]
            if rec is None:
                one_step(x, y)
            else:
                with rec.step(step, x, y):
                    one_step(x, y)
        return (time.process_time() - start) / steps

    return run


GUARD_CONFIGS: dict[str, dict[str, Any]] = {
    "guard every=1, check": {"every": 1},
    "guard every=1, no check": {"every": 1, "check": False},
    "guard every=10, check": {"every": 10},
    "guard every=10, no check": {"every": 10, "check": False},
    "guard every=10, check + skip_nonfinite": {"every": 10, "skip_nonfinite": True},
}


def _guard_runner(hidden: int, batch: int, options: dict[str, Any]) -> Callable[[int], float]:
    from torch.utils.tensorboard import SummaryWriter

    model = _model(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = _batches(batch)
    writer = SummaryWriter(tempfile.mkdtemp(prefix="bench-guard-"))
    guard = StepGuard(model, writer=writer, **options)
    counter = [0]

    def run(steps: int) -> float:
        start = time.process_time()
        for _ in range(steps):
            step = counter[0]
            counter[0] += 1
            x, y = batches[step % len(batches)]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            if guard.after_backward(step):
                opt.step()
            guard.after_update(step)
        writer.flush()  # the writer's thread works inside the measured time
        return (time.process_time() - start) / steps

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--guard-only", action="store_true",
                        help="the plain step and the guard's configurations only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    configs: dict[str, dict[str, Any] | None] = {
        "plain step": None,
        "every_step": {},
        "every_n (N=10)": {"mode": "every_n", "every_n": 10},
        "every_step + check_params": {"check_params": True},
        "every_step + check_grads + check_params": {"check_grads": True, "check_params": True},
    }
    if args.guard_only:
        configs = {"plain step": None}
    runners = {name: _runner(args.hidden, args.batch, opts) for name, opts in configs.items()}
    runners |= {name: _guard_runner(args.hidden, args.batch, opts)
                for name, opts in GUARD_CONFIGS.items()}
    for run in runners.values():
        run(5)  # warm-up: first-touch allocation, optimizer state creation
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            times[name].append(run(args.steps))
    params = sum(p.numel() for p in _model(args.hidden).parameters())
    print(
        f"MLP 256-{args.hidden}-{args.hidden}-10 ({params / 1e6:.2f} M parameters), Adam, "
        f"batch {args.batch}, 1 thread; median of {args.rounds} rounds x {args.steps} steps"
    )
    base = statistics.median(times["plain step"])
    print(f"{'configuration':42s} {'ms/step':>8s} {'ratio':>6s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:42s} {median * 1e3:8.3f} {median / base:6.2f}")


if __name__ == "__main__":
    main()
