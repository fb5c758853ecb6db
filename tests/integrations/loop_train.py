"""A plain training loop whose model and step function are defined in this script.

``python tests/integrations/loop_train.py OUT`` trains a small scorer on dict batches for
two epochs, with two param groups (their own lrs) and a scheduler, under a FlightRecorder
that counts the global step itself. In the second epoch a batch holds a row of zeros, and
the model's normalisation divides it by its norm: 0/0 = NaN. The factories live in
``__main__``: the capture records this file, and replay rebuilds the model from it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from analyzer.capture import FlightRecorder


class UnitRows(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)  # no epsilon: a row of zeros is 0/0


class Scorer(nn.Module):
    def __init__(self, features: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.norm = UnitRows()
        self.encoder = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.encoder(self.norm(x))))
        return out


def make_model(features: int = 4, hidden: int = 8) -> Scorer:
    return Scorer(features, hidden)


def make_step() -> Callable[[nn.Module, Mapping[str, Any]], torch.Tensor]:
    def step(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = F.cross_entropy(model(batch["x"]), batch["y"])
        return loss

    return step


def epoch_batches(epoch: int) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(epoch)
    out = []
    for i in range(3):
        x = torch.randn(4, 4, generator=gen)
        if epoch == 1 and i == 1:
            x[2] = 0.0
        out.append({"x": x, "y": torch.randint(0, 2, (4,), generator=gen), "epoch": epoch})
    return out


def main(out: str) -> int:
    torch.manual_seed(0)
    model = make_model(hidden=8)
    optimizer = torch.optim.SGD([
        {"params": model.encoder.parameters(), "lr": 0.05},
        {"params": model.head.parameters(), "lr": 0.01},
    ], momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    recorder = FlightRecorder(out, model, optimizer, model_factory=make_model,
                              model_kwargs={"hidden": 8}, step_factory=make_step, seed=0)
    step_fn = make_step()
    for epoch in range(2):
        for batch in epoch_batches(epoch):
            with recorder.step(batch=batch) as rec:
                optimizer.zero_grad()
                loss = step_fn(model, batch)
                loss.backward()
                optimizer.step()
                rec.loss(loss)
            scheduler.step()
            if recorder.captured:
                print(recorder.capture_path)
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
