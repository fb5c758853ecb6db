"""A fleet of training runs for ``bench/fleet.py``: a few real tiny trainings, then copies.

Six small trainings are run for real (a two-layer MLP on a synthetic regression task, plain
SGD with momentum and a linear warm-up, on the CPU): three learning rates that train, three
that diverge on their own once the warm-up reaches them (to inf, then NaN). Each leaves
what a real run leaves: an event file (three with torch's ``SummaryWriter``, three with
tensorboardX), a text log (plain prints or Hugging Face Trainer dict lines, from
:mod:`analyzer.scenarios.logstyles`) and checkpoints every 100 steps and at the end
(``torch.save`` of the model's and optimizer's state dicts; one training saves its
weights with safetensors instead).

A fleet of N runs is then N copies of those folders under new names (``trial-0000`` ...),
each with an ``hparams.yaml`` of its own: the learning rate of the training it copies, which
is what decides the outcome, and keys drawn at random that have no bearing on it (batch
size, weight decay, seed, precision). About a third of the copies keep their checkpoints.
The copies are honest for a throughput benchmark (every byte is read and analysed as a
separate run) but they are not independent trainings, and the random keys are fiction:
only the learning rate separates the failed runs from the healthy.

Everything is drawn from ``--seed``: the trainings' data and initial weights, which
training each trial copies and its hyperparameters; every logged value and checkpoint is
the same from one generation to the next (event records carry fixed wall times, the files
fixed names), but for what the writers clock themselves (the wall time of an event file's
first record, the runtime in a Trainer-style log's last line). A fleet of N runs is the
first N trials of any larger fleet made with the same seed.

Usage: ``python bench/fleetgen.py OUT [--runs 1000] [--seed 0]`` (prints the truth as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from dataclasses import asdict, dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@dataclass(frozen=True)
class Training:
    name: str
    lr: float
    writer: str  # "torch" or "tensorboardX"
    log_style: str
    safetensors: bool = False


TRAININGS = (
    Training("sgd-lr0.003", 0.003, "torch", "plain"),
    Training("sgd-lr0.01", 0.01, "tensorboardX", "huggingface"),
    Training("sgd-lr0.03", 0.03, "torch", "huggingface", safetensors=True),
    Training("sgd-lr0.1", 0.1, "tensorboardX", "plain"),
    Training("sgd-lr0.3", 0.3, "torch", "plain"),
    Training("sgd-lr1", 1.0, "tensorboardX", "huggingface"),
)
STEPS = 400
WARMUP = 200  # linear warm-up: a rate too high for the task diverges once the ramp reaches it
STEPS_AFTER_NAN = 5  # a loop that logs a few more steps before it stops (or crashes)
WALL_TIME0 = 1_790_000_000.0


@dataclass(frozen=True)
class Trial:
    name: str
    training: str
    lr: float
    failed: bool
    checkpoints: bool


def train(folder: str, spec: Training, seed: int) -> bool:
    """Run one training into ``folder``; True when its loss went non-finite."""
    import contextlib
    import io
    import math

    import torch

    from analyzer.scenarios.logstyles import STYLES, StepLog

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    os.makedirs(os.path.join(folder, "checkpoints"))
    inputs = torch.randn(512, 16)
    targets = inputs @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)
    writer: Any
    if spec.writer == "torch":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(folder)
    else:
        import tensorboardX

        writer = tensorboardX.SummaryWriter(folder)
    log_file = open(os.path.join(folder, "train.log"), "w")  # noqa: SIM115
    log = STYLES[spec.log_style](log_file, STEPS, 16)
    log.begin(f"training {spec.name}")
    nan_at: int | None = None
    for step in range(STEPS):
        lr = spec.lr * min(1.0, (step + 1) / WARMUP)
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, 512, (32,))
        loss = torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows])
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        opt.step()
        wall = WALL_TIME0 + step
        value = float(loss.detach())
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):  # NaN notes
            writer.add_scalar("train/loss", value, step, walltime=wall)
            writer.add_scalar("train/grad_norm", grad_norm, step, walltime=wall)
            writer.add_scalar("train/lr", lr, step, walltime=wall)
            for name, param in model.named_parameters():
                writer.add_scalar(f"weights/{name}", float(param.detach().norm()), step,
                                  walltime=wall)
        if step % 10 == 0:
            log.step(StepLog(step=step, loss=value, lr=lr, grad_norm=grad_norm,
                             epoch=step / 16, batch_size=32))
        if nan_at is None and not math.isfinite(value):
            nan_at = step
        last = nan_at is not None and step >= nan_at + STEPS_AFTER_NAN
        if (step + 1) % 100 == 0 or last or step == STEPS - 1:
            _save(folder, model, opt, step, spec.safetensors)
        if last:
            log.error(step, "the loss is NaN")
            break
    else:
        log.end(STEPS, value)
    writer.close()
    log_file.close()
    _fix_event_names(folder)
    return nan_at is not None


def _save(folder: str, model: object, opt: object, step: int, safetensors: bool) -> None:
    import torch

    assert isinstance(model, torch.nn.Module) and isinstance(opt, torch.optim.Optimizer)
    base = os.path.join(folder, "checkpoints", f"step-{step + 1}")
    if safetensors:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  base + ".safetensors")
    else:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "step": step + 1}, base + ".pt")


def _fix_event_names(folder: str) -> None:
    # The writers put the time, host and pid in the name; a fixed name keeps the fleet the
    # same from one generation to the next.
    events = sorted(n for n in os.listdir(folder) if n.startswith("events.out.tfevents."))
    for k, name in enumerate(events):
        os.rename(os.path.join(folder, name),
                  os.path.join(folder, f"events.out.tfevents.{int(WALL_TIME0)}.fleet.{k}"))


def make_trainings(folder: str, seed: int = 0) -> dict[str, bool]:
    """Run every training into ``folder/<name>``; which of them failed, by name."""
    done: dict[str, bool] = {}
    for k, spec in enumerate(TRAININGS):
        done[spec.name] = train(os.path.join(folder, spec.name), spec, seed + k)
    return done


def plan(runs: int, seed: int, failed: dict[str, bool]) -> list[Trial]:
    """Which training each trial copies: about 30% of trials copy a failing one."""
    rng = random.Random(seed)
    bad = [t for t in TRAININGS if failed[t.name]]
    good = [t for t in TRAININGS if not failed[t.name]]
    trials = []
    for k in range(runs):
        spec = rng.choice(bad if bad and rng.random() < 0.3 else good or bad)
        trials.append(Trial(f"trial-{k:04d}", spec.name, spec.lr, failed[spec.name],
                            checkpoints=rng.random() < 1 / 3))
    return trials


def _hparams(trial: Trial, rng: random.Random) -> str:
    return "\n".join([
        f"lr: {trial.lr}",
        "optimizer: sgd",
        "momentum: 0.9",
        f"batch_size: {rng.choice([16, 32, 64, 128])}",
        f"weight_decay: {rng.choice([0.0, 1e-5, 1e-4, 1e-2])}",
        f"warmup_steps: {WARMUP}",
        f"precision: {rng.choice(['32-true', 'bf16-mixed'])}",
        f"seed: {rng.randrange(10_000)}",
        "",
    ])


def make_fleet(out: str, runs: int, seed: int = 0, trainings: str | None = None) -> list[Trial]:
    """Write ``runs`` trials into ``out`` (which must not exist); the trainings are run into
    ``trainings`` when it is empty or missing, else reused from there."""
    own = trainings is None
    source = trainings if trainings is not None else out + ".trainings"
    if not os.path.isdir(source) or not os.listdir(source):
        os.makedirs(source, exist_ok=True)
        failed = make_trainings(source, seed)
        with open(os.path.join(source, "outcome.json"), "w") as handle:
            json.dump(failed, handle)
    with open(os.path.join(source, "outcome.json")) as handle:
        failed = json.load(handle)
    trials = plan(runs, seed, failed)
    rng = random.Random(seed + 1)
    os.makedirs(out)
    for trial in trials:
        target = os.path.join(out, trial.name)
        ignore = None if trial.checkpoints else shutil.ignore_patterns("checkpoints")
        shutil.copytree(os.path.join(source, trial.training), target, ignore=ignore)
        with open(os.path.join(target, "hparams.yaml"), "w") as handle:
            handle.write(_hparams(trial, rng))
    if own:
        shutil.rmtree(source)
    return trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trainings", help="a folder to keep (and reuse) the trainings in")
    args = parser.parse_args()
    trials = make_fleet(args.out, args.runs, args.seed, args.trainings)
    print(json.dumps({"runs": len(trials), "failed": sum(t.failed for t in trials),
                      "checkpoints": sum(t.checkpoints for t in trials),
                      "trials": [asdict(t) for t in trials]}))


if __name__ == "__main__":
    main()
