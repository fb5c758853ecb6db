"""A tiny Lightning training that really fails, under a FlightRecorderCallback.

``python tests/integrations/lightning_train.py OUT [--precision P] [--accumulate K]
[--anomaly] [--layer normalize|norm_feature] [--raise-on-nan]`` trains ``LitNet`` (defined
here, so in ``__main__`` when run as a script) on 32 samples of which one is all zeros, four
samples a batch, with ``Trainer(default_root_dir=OUT)`` and its default TensorBoard logger.
The zero sample (index 13) sits in batch 3. Its failure depends on the layer at ``net.2``:

- ``normalize``: ``x / x.norm()``, 0/0 = NaN in the forward pass: the loss is NaN;
- ``norm_feature``: appends the row's norm, ``sqrt(sum(x * x))``, to it: 0 in the forward
  pass, but the gradient of sqrt at 0 is inf, and NaN once multiplied by the zero row: the
  loss stays finite and, with ``--anomaly`` (``detect_anomaly=True``), the backward pass
  raises.

Imported (``tests.integrations.lightning_train``), ``train`` runs the same training in the
calling process.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from analyzer.capture.lightning import FlightRecorderCallback

ZERO_SAMPLE = 13
BATCH_SIZE = 4


class Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=1, keepdim=True)  # no epsilon: a zero row is 0/0


class NormFeature(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A hand-written norm: sqrt(0) is 0, but its gradient 1 / (2 sqrt(0)) is inf, and
        # inf times the zero row is NaN.
        return torch.cat([x, torch.sqrt((x * x).sum(dim=1, keepdim=True))], dim=1)


class LitNet(pl.LightningModule):
    def __init__(self, features: int = 4, hidden: int = 8, layer: str = "normalize",
                 lr: float = 0.05, raise_on_nan: bool = False, manual: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        # manual: two optimizers (first and last layer), stepped by training_step itself.
        self.automatic_optimization = not manual
        bug = Normalize() if layer == "normalize" else NormFeature()
        width = hidden if layer == "normalize" else hidden + 1
        # No bias before the bug, so the zero sample reaches it as a zero row.
        self.net = nn.Sequential(nn.Linear(features, hidden, bias=False), nn.Tanh(), bug,
                                 nn.Linear(width, 1))

    def training_step(self, batch: Sequence[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(1).float(), y)
        if self.hparams["raise_on_nan"] and not bool(torch.isfinite(loss)):
            raise FloatingPointError(f"loss is {loss.item()} at batch {batch_idx}")
        self.log("train_loss", loss)
        if self.hparams["manual"]:
            optimizers = self.optimizers()
            for opt in optimizers:
                opt.zero_grad()
            self.manual_backward(loss)
            for opt in optimizers:
                opt.step()
        return loss

    def configure_optimizers(self) -> Any:
        if self.hparams["manual"]:
            return (torch.optim.SGD(self.net[0].parameters(), lr=self.hparams["lr"]),
                    torch.optim.Adam(self.net[3].parameters(), lr=0.01))
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


def mse_step() -> Callable[[LitNet, Sequence[torch.Tensor]], torch.Tensor]:
    """The loss of a batch, for a replay of the manual module (its training_step steps the
    trainer's optimizers itself)."""

    def step(module: LitNet, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(module.net(x).squeeze(1).float(), y)

    return step


def data(features: int = 4, samples: int = 32, zero: int | None = ZERO_SAMPLE) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=gen)
    if zero is not None:
        x[zero] = 0.0
    return TensorDataset(x, torch.randn(samples, generator=gen))


def train(out: str, *, precision: Any = "32-true", accumulate: int = 1,
          anomaly: bool = False, layer: str = "normalize", raise_on_nan: bool = False,
          manual: bool = False,
          clip: float | None = None, clip_algorithm: str | None = None,
          max_steps: int = 6, plugins: Sequence[Any] = (),
          module: pl.LightningModule | None = None, recorder: Any = None) -> Any:
    """Train into ``out`` under ``recorder`` (a new FlightRecorderCallback by default),
    which comes back."""
    pl.seed_everything(0, verbose=False)
    model = module if module is not None else LitNet(layer=layer, raise_on_nan=raise_on_nan,
                                                          manual=manual)
    recorder = recorder if recorder is not None else FlightRecorderCallback()
    trainer = pl.Trainer(
        default_root_dir=out, max_steps=max_steps, accelerator="cpu", devices=1,
        precision=None if plugins else precision, plugins=list(plugins) or None,
        accumulate_grad_batches=accumulate, detect_anomaly=anomaly,
        gradient_clip_val=clip, gradient_clip_algorithm=clip_algorithm,
        callbacks=[recorder], log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(data(), batch_size=BATCH_SIZE, shuffle=False))
    return recorder


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--anomaly", action="store_true")
    parser.add_argument("--layer", default="normalize", choices=["normalize", "norm_feature"])
    parser.add_argument("--raise-on-nan", action="store_true")
    args = parser.parse_args(argv)
    recorder = train(args.out, precision=args.precision, accumulate=args.accumulate,
                     anomaly=args.anomaly, layer=args.layer, raise_on_nan=args.raise_on_nan)
    print(f"capture: {recorder.capture_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
