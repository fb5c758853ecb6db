"""A real hyperparameter sweep whose truth is known: ``python -m analyzer.scenarios.sweep OUT
--runs N --seed S``.

Each trial trains a tiny two-tower recommender (user and item embeddings, each through a
one-layer tower, scored by their dot product) on one fixed synthetic ratings matrix, with
plain SGD for STEPS full-batch steps, and logs through Lightning's ``TensorBoardLogger``
used without a Trainer: ``log_hyperparams`` then ``finalize`` write ``hparams.yaml``,
``log_metrics`` the event file, in ``OUT/trial_NNN/version_0/`` as a Trainer's run would
lay them out. Some trials save a Lightning-style checkpoint (``checkpoints/epoch=0-step=
K.ckpt``: the state_dict and ``hyper_parameters``). A trial whose loss goes non-finite logs
it and stops, as ``EarlyStopping(check_finite=True)`` would stop a Trainer.

The keys drawn per trial:

    lr               log-uniform over [LR_LOW, LR_HIGH]: the product of two factors makes
                     SGD unstable above a rate (found by running it: near 0.7 with this
                     data), and an unclipped trial past it overflows to Inf, then NaN
    clip_gradients   true for a share CLIPPED of the trials: the gradient norm clipped to 1
                     bounds every update, so a clipped trial stays finite (it matters)
    activation       relu|gelu: the towers' activation, a small correction each: it does
                     not move the threshold (it does not matter)
    seed             the trial's initialisation: nor does it

Nothing decides the outcome but the training: the manifest (``--manifest``, by default
``OUT/manifest.json``, beside the trial folders and never inside one) records, per trial,
its keys, whether a logged value really went non-finite and at which step. The sample
runs (:mod:`analyzer.scenarios.catalog`) are MLP, CNN, attention and recurrent models
trained by one plain loop; here the model is a factorisation, whose instability is
multiplicative, logged by Lightning's logger. The failure itself, a rate too high, is the
family of the sample ``sgd_lr_too_high``: a sweep over the rate is what it is about.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass
from typing import Any

LR_LOW, LR_HIGH = 0.03, 30.0
STEPS = 60
USERS, ITEMS, DIM, RANK = 24, 24, 8, 2
CHECKPOINT_EVERY = 3
"""Every third trial saves a checkpoint, at CHECKPOINT_STEP."""
CHECKPOINT_STEP = 10
ACTIVATIONS = ("relu", "gelu")
INIT_STD = 0.1
TOWER = 0.1
CLIPPED = 0.3
"""The share of trials that clip their gradient norm."""
DATA_SEED = 1234
"""One ratings matrix for the whole sweep, as a real sweep trains on one dataset."""


@dataclass(frozen=True)
class Trial:
    name: str
    lr: float
    clip_gradients: bool
    activation: str
    seed: int


@dataclass(frozen=True)
class Outcome:
    """What a trial did: ``first_nonfinite_step`` is the first step at which a logged value
    (loss, gradient norm) was non-finite."""

    name: str
    diverged: bool
    first_nonfinite_step: int | None
    steps_run: int
    checkpoint: str | None


def draw(runs: int, seed: int) -> list[Trial]:
    """The sweep's trials: lr log-uniform, the categories uniform, seeds distinct."""
    rng = random.Random(seed)
    out = []
    for i in range(runs):
        lr = math.exp(rng.uniform(math.log(LR_LOW), math.log(LR_HIGH)))
        out.append(Trial(f"trial_{i:03d}", lr, rng.random() < CLIPPED, rng.choice(ACTIVATIONS),
                         rng.randrange(2**31)))
    return out


def _ratings() -> Any:
    import torch

    g = torch.Generator().manual_seed(DATA_SEED)
    users = torch.randn(USERS, RANK, generator=g)
    items = torch.randn(ITEMS, RANK, generator=g)
    return users @ items.T + 0.1 * torch.randn(USERS, ITEMS, generator=g)


def _model(trial: Trial) -> Any:
    import torch
    from torch import nn

    class TwoTower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.users = nn.Embedding(USERS, DIM)
            self.items = nn.Embedding(ITEMS, DIM)
            self.user_tower = nn.Linear(DIM, DIM)
            self.item_tower = nn.Linear(DIM, DIM)
            self.act = nn.ReLU() if trial.activation == "relu" else nn.GELU()
            for table in (self.users, self.items):
                nn.init.normal_(table.weight, std=INIT_STD)

        def forward(self) -> torch.Tensor:
            # Each tower adds a small learned correction to its embedding.
            u = self.users.weight + TOWER * self.act(self.user_tower(self.users.weight))
            v = self.items.weight + TOWER * self.act(self.item_tower(self.items.weight))
            scores: torch.Tensor = u @ v.T
            return scores

    torch.manual_seed(trial.seed)
    return TwoTower()


def _loss(scores: Any, ratings: Any) -> Any:
    """Squared error summed over a user's items, averaged over users."""
    return ((scores - ratings) ** 2).sum(dim=1).mean()


def train(trial: Trial, out_dir: str, ratings: Any) -> Outcome:
    """One trial, logged as a Lightning run; returns what really happened."""
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    model = _model(trial)
    optimizer = torch.optim.SGD(model.parameters(), lr=trial.lr)
    logger = TensorBoardLogger(out_dir, name=trial.name, version=0, default_hp_metric=False)
    hparams = {"lr": trial.lr, "optimizer": "sgd", "clip_gradients": trial.clip_gradients,
               "activation": trial.activation, "seed": trial.seed, "max_steps": STEPS,
               "model": {"dim": DIM, "users": USERS, "items": ITEMS}}
    logger.log_hyperparams(hparams)
    first: int | None = None
    checkpoint = None
    step = 0
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = _loss(model(), ratings)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(
            model.parameters(), 1.0 if trial.clip_gradients else math.inf)
        logged = {"train_loss": loss.item(), "grad_norm": norm.item(), "lr": trial.lr}
        logger.log_metrics(logged, step)
        if first is None and not all(math.isfinite(v) for v in logged.values()):
            first = step  # the gradient may overflow a step before the loss does
        if not math.isfinite(logged["train_loss"]):
            break
        optimizer.step()
        if step == CHECKPOINT_STEP and int(trial.name[-3:]) % CHECKPOINT_EVERY == 0:
            checkpoint = _save_checkpoint(logger.log_dir, model, hparams, step)
    logger.finalize("success")
    return Outcome(trial.name, first is not None, first, step + 1, checkpoint)


def _save_checkpoint(log_dir: str, model: Any, hparams: dict[str, Any], step: int) -> str:
    """A checkpoint as Lightning's ModelCheckpoint names and keys it."""
    import lightning
    import torch

    folder = os.path.join(log_dir, "checkpoints")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"epoch=0-step={step + 1}.ckpt")
    torch.save({"epoch": 0, "global_step": step + 1,
                "pytorch-lightning_version": lightning.__version__,
                "state_dict": model.state_dict(), "hyper_parameters": hparams}, path)
    return os.path.relpath(path, os.path.dirname(os.path.dirname(log_dir)))


def generate(out_dir: str, runs: int, seed: int, manifest: str | None = None
             ) -> dict[str, Any]:
    """Train ``runs`` trials into ``out_dir``; write and return the manifest."""
    import torch

    torch.set_num_threads(1)
    os.makedirs(out_dir, exist_ok=True)
    ratings = _ratings()
    trials = draw(runs, seed)
    outcomes = [train(t, out_dir, ratings) for t in trials]
    document = {"format": "nan-forensics-sweep", "runs": runs, "seed": seed,
                "steps": STEPS, "lr_range": [LR_LOW, LR_HIGH],
                "trials": [{**asdict(t), **asdict(o)} for t, o in zip(trials, outcomes,
                                                                   strict=True)]}
    path = manifest or os.path.join(out_dir, "manifest.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analyzer.scenarios.sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder that receives one folder per trial")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--manifest", help="where the truth is written (default: "
                        "OUT/manifest.json)")
    args = parser.parse_args(argv)
    document = generate(args.out_dir, args.runs, args.seed, args.manifest)
    diverged = sum(t["diverged"] for t in document["trials"])
    print(f"{args.runs} trials, {diverged} diverged", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
