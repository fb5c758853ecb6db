"""Tiny models, losses and step functions the plain-loop and Accelerate tests train.

Each fails from its own numerics on a batch the tests choose: ``LogProbHead`` takes the log
of a softmax that underflows to 0 on large logits (log(0) = -inf), ``RowNorm`` divides a row
by its norm, which is 0/0 for a row of zeros. The tests import this file as a user's project
module, copied outside this tool's source tree (:func:`project_module`): a replay never
imports factories from the tool's own tree.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class LogProbHead(nn.Module):
    """log(softmax(x)) written out: a probability that underflows gives log(0) = -inf."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.softmax(x, dim=-1))


class RowNorm(nn.Module):
    """Each row over its L2 norm, without an epsilon: a row of zeros is 0/0 = NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)


class Net(nn.Module):
    """body (Linear, ReLU, Linear) then head (log-probabilities); ``norm`` first when asked."""

    def __init__(self, features: int = 4, hidden: int = 8, classes: int = 3,
                 normalise: bool = False) -> None:
        super().__init__()
        self.norm = RowNorm() if normalise else nn.Identity()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(),
                                  nn.Linear(hidden, classes))
        self.head = LogProbHead()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.body(self.norm(x)))
        return out


class EmbedNet(Net):
    """``Net`` that also returns its logits: the embedding a loss outside the model uses."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        logits = self.body(self.norm(x))
        return self.head(logits), logits


class PairNet(nn.Module):
    """Two inputs through one body: the model of a batch of pairs."""

    def __init__(self, features: int = 4, hidden: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.net = Net(features, hidden, classes)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(a), self.net(b)


class SelfLossNet(nn.Module):
    """A model that returns its own loss, as Hugging Face models do: ``model(**batch)``."""

    def __init__(self, features: int = 4, hidden: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.net = Net(features, hidden, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logp = self.net(x)
        return {"loss": F.nll_loss(logp, labels), "logits": logp}


def make_net(features: int = 4, hidden: int = 8, classes: int = 3,
             normalise: bool = False) -> Net:
    return Net(features, hidden, classes, normalise)


def make_embed_net(features: int = 4, hidden: int = 8, classes: int = 3) -> EmbedNet:
    return EmbedNet(features, hidden, classes)


def make_pair_net(features: int = 4, hidden: int = 8, classes: int = 3) -> PairNet:
    return PairNet(features, hidden, classes)


def make_self_loss_net(features: int = 4, hidden: int = 8, classes: int = 3) -> SelfLossNet:
    return SelfLossNet(features, hidden, classes)


def nll() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of the ``loss_fn`` kind: NLL over the head's log-probabilities."""
    return F.nll_loss


def dict_step() -> Callable[[nn.Module, Mapping[str, Any]], torch.Tensor]:
    """A step over a dict batch ``{"x", "y", "weight"}``: the weighted NLL."""

    def step(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = F.nll_loss(model(batch["x"]), batch["y"]) * batch["weight"]
        return loss

    return step


def embed_step(weight: float = 1e-3) -> Callable[[nn.Module, Mapping[str, Any]], torch.Tensor]:
    """NLL plus a similarity term computed outside the model: ``logits @ logits.T``, a
    matmul that autocast would run in low precision, if it covered the loss."""

    def step(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        logp, logits = model(batch["x"])
        loss: torch.Tensor = (F.nll_loss(logp, batch["y"])
                              + weight * (logits @ logits.T).mean())
        return loss

    return step


def pair_step(aux: float = 0.5) -> Callable[[nn.Module, Sequence[Any]], torch.Tensor]:
    """A step over a tuple batch ``((a, b), y)``: two NLL losses summed."""

    def step(model: nn.Module, batch: Sequence[Any]) -> torch.Tensor:
        (a, b), y = batch
        out_a, out_b = model(a, b)
        loss: torch.Tensor = F.nll_loss(out_a, y) + aux * F.nll_loss(out_b, y)
        return loss

    return step


def batches(count: int, *, bad: int | None = None, size: int = 4, features: int = 4,
            classes: int = 3, outlier: float = 1e4, seed: int = 0
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (x, y) batches; batch ``bad`` holds a row scaled by ``outlier`` (logits large
    enough for the softmax to underflow) when ``outlier`` is not 0, else a row of zeros."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        x = torch.randn(size, features, generator=gen)
        y = torch.randint(0, classes, (size,), generator=gen)
        if i == bad:
            x[0] = x[0] * outlier if outlier else 0.0
        out.append((x, y))
    return out


@contextlib.contextmanager
def project_module(folder: Path, name: str, source: str | Path = __file__
                   ) -> Iterator[ModuleType]:
    """``source`` (this file unless given) as ``folder/<name>.py``, imported by that name
    while the context lasts: a user's project module, outside this tool's tree."""
    shutil.copy(source, folder / f"{name}.py")
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)
