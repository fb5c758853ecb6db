"""Per-step cost of the flight recorder inside each framework integration.

Each framework trains the same MLP (256-512-512-10, Adam, one CPU thread) on batches kept in
memory, with and without its integration: Lightning with ``FlightRecorderCallback``, the
Hugging Face Trainer with its flight-recorder callback, a loop written with Accelerate with
``recorder_for``. A step's time is the CPU time from one step's start to the next one's
(so every hook of the integration is inside it), measured after a warm-up; configurations
alternate in the same process, and the ratio is the median step with the integration over
the median step without it, median over the rounds. Run: ``python bench/capture_frameworks.py``
(``--batch 512``, ``--only lightning``...).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

WARMUP = 5


def _data(batch: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def make_loss() -> Callable[..., torch.Tensor]:
    return nn.functional.cross_entropy


def _median_step(stamps: list[float]) -> float:
    deltas = [b - a for a, b in itertools.pairwise(stamps)][WARMUP:]
    return statistics.median(deltas)


# --- Lightning ---------------------------------------------------------------------------


def _lightning_module() -> type:
    import lightning.pytorch as pl

    class BenchNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    BenchNet.__module__ = __name__
    BenchNet.__qualname__ = "BenchNet"
    globals()["BenchNet"] = BenchNet
    return BenchNet


def lightning(batch: int, steps: int, recorded: bool) -> float:
    import lightning.pytorch as pl

    from analyzer.capture.lightning import FlightRecorderCallback

    stamps: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            stamps.append(time.process_time())

    callbacks: list[Any] = [Clock()]
    if recorded:
        callbacks.append(FlightRecorderCallback(tempfile.mkdtemp(prefix="bench-pl-"),
                                                trust_code_root=False, write_env_file=False))
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    batches: Any = _data(batch, steps)  # a list of ready batches is a map-style dataset
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    trainer.fit(_lightning_module()(), loader)
    return _median_step(stamps)


# --- the Hugging Face Trainer ------------------------------------------------------------


class MLPWithLoss(nn.Module):
    """The bench's MLP returning its loss, as a Trainer model does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


def hf(batch: int, steps: int, recorded: bool) -> float:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from analyzer.capture.hf import FlightRecorderTrainer

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.process_time())

    rows = [{"x": x[i], "labels": y[i]} for x, y in _data(batch, steps) for i in range(batch)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="bench-hf-"), max_steps=steps,
                             per_device_train_batch_size=batch, use_cpu=True, report_to=[],
                             save_strategy="no", disable_tqdm=True, learning_rate=1e-4,
                             optim="adamw_torch", max_grad_norm=0.0, logging_strategy="no",
                             train_sampling_strategy="sequential")
    torch.manual_seed(0)
    if recorded:
        trainer: Any = FlightRecorderTrainer(
            model=MLPWithLoss(), args=args, train_dataset=rows, callbacks=[Clock()],
            flight_recorder={"model_factory": MLPWithLoss, "trust_code_root": False,
                             "write_env_file": False})
    else:
        trainer = Trainer(model=MLPWithLoss(), args=args, train_dataset=rows,
                          callbacks=[Clock()])
    trainer.train()
    return _median_step(stamps)


# --- Accelerate --------------------------------------------------------------------------


def accelerate(batch: int, steps: int, recorded: bool) -> float:
    from accelerate import Accelerator

    from analyzer.capture.accelerate import recorder_for

    accelerator = Accelerator(cpu=True)
    model = make_net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model, opt = accelerator.prepare(model, opt)
    rec = None
    if recorded:
        rec = recorder_for(accelerator, tempfile.mkdtemp(prefix="bench-acc-"), model, opt,
                           model_factory=make_net, loss_factory=make_loss,
                           trust_code_root=False, write_env_file=False)
    stamps: list[float] = []
    for x, y in _data(batch, steps):
        stamps.append(time.process_time())
        with rec.step(inputs=x, targets=y) if rec is not None else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    return _median_step(stamps)


FRAMEWORKS: dict[str, Callable[[int, int, bool], float]] = {
    "lightning": lightning,
    "hf-trainer": hf,
    "accelerate": accelerate,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=sorted(FRAMEWORKS), action="append")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(f"MLP 256-512-512-10, Adam, batch {args.batch}, 1 thread; median step of "
          f"{args.steps - WARMUP - 1} steps, median ratio of {args.rounds} rounds")
    print(f"{'integration':<28}{'plain ms':>10}{'recorded ms':>13}{'ratio':>8}")
    for name in args.only or list(FRAMEWORKS):
        run = FRAMEWORKS[name]
        run(args.batch, WARMUP + 3, False)  # the first fit of a process pays for imports
        plain, recorded, ratios = [], [], []
        for i in range(args.rounds):
            if i % 2:  # alternate which goes first: the machine's load drifts
                r = run(args.batch, args.steps, True)
                p = run(args.batch, args.steps, False)
            else:
                p = run(args.batch, args.steps, False)
                r = run(args.batch, args.steps, True)
            plain.append(p)
            recorded.append(r)
            ratios.append(r / p)
        print(f"{name:<28}{statistics.median(plain) * 1e3:>10.2f}"
              f"{statistics.median(recorded) * 1e3:>13.2f}{statistics.median(ratios):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
