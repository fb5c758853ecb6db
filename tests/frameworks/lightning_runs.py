"""Lightning 2.6 runs: ``Trainer(default_root_dir=root)`` with its default TensorBoardLogger
(``lightning_logs/version_N/`` holding the event file and ``hparams.yaml``) and
``ModelCheckpoint`` files under ``version_N/checkpoints/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.frameworks._common import offline, regression, seed


def _module(lr: float, *, normalise: bool = False, growth: float = 1.0) -> Any:
    import lightning.pytorch as pl
    import torch
    from torch import nn

    class Regressor(pl.LightningModule):
        def __init__(self, lr: float, normalise: bool, growth: float) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.hparams["normalise"]:
                # The bug: a sample of zeros has norm 0, and 0/0 is NaN.
                x = x / x.norm(dim=1, keepdim=True)
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self(x), y), prog_bar=True)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
            growth = self.hparams["growth"]
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: growth ** epoch)
            return {"optimizer": opt, "lr_scheduler": sched}

    return Regressor(lr, normalise, growth)


def _loader(data: Any, batch: int = 8) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(data, batch_size=batch, shuffle=False)


def _trainer(root: Path, *, epochs: int, callbacks: list[Any], **kwargs: Any) -> Any:
    import lightning.pytorch as pl

    return pl.Trainer(default_root_dir=str(root), max_epochs=epochs, log_every_n_steps=1,
                      accelerator="cpu", devices=1, enable_progress_bar=True,
                      enable_model_summary=True, callbacks=callbacks, deterministic=True,
                      **kwargs)


def make_lightning_nan(root: Path) -> Path:
    """SGD with lr=1.0 on inputs of scale 3 diverges: the loss overflows to inf, then is NaN.
    Lightning's TQDM bar (chosen explicitly: the default is the rich bar when rich is
    installed) prints the loss in its postfix; a checkpoint is saved every epoch."""
    offline()
    seed(0)
    from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

    data = regression(64, value=0)
    data.tensors = (data.tensors[0] * 3.0, data.tensors[1] * 3.0)
    ckpt = ModelCheckpoint(save_top_k=-1, every_n_epochs=1)
    trainer = _trainer(root, epochs=5, callbacks=[ckpt, TQDMProgressBar()])
    trainer.fit(_module(1.0), _loader(data))
    return root


def make_lightning_anomaly(root: Path) -> Path:
    """``detect_anomaly=True``: a zero sample in the data makes x / |x| NaN, and
    autograd's anomaly mode raises in the backward pass; the run dies with the traceback."""
    offline()
    seed(0)
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

    data = regression(64, value=1)
    data.tensors[0][45] = torch.zeros(4)  # batch 5 of each epoch
    ckpt = ModelCheckpoint(save_top_k=-1, every_n_epochs=1)
    trainer = _trainer(root, epochs=3, callbacks=[ckpt, TQDMProgressBar()],
                       detect_anomaly=True)
    trainer.fit(_module(0.05, normalise=True), _loader(data))
    return root


def make_lightning_healthy(root: Path) -> Path:
    """ModelCheckpoint(monitor="val_loss", save_top_k=2), a second, periodic ModelCheckpoint
    (no monitor: its ``kth_value`` stays +inf in every checkpoint) and EarlyStopping; the
    default (rich) progress bar. Nothing fails."""
    offline()
    seed(0)
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    data = regression(64, value=2)
    val = regression(16, value=3)
    callbacks = [ModelCheckpoint(monitor="val_loss", save_top_k=2),
                 ModelCheckpoint(every_n_epochs=2, save_top_k=-1, filename="periodic-{epoch}"),
                 EarlyStopping(monitor="val_loss", patience=2)]
    trainer = _trainer(root, epochs=5, callbacks=callbacks)
    trainer.fit(_module(0.05), _loader(data), _loader(val))
    return root


def make_lightning_restart(root: Path) -> Path:
    """One training in two versions: 2 epochs into ``version_0``, then resumed from its last
    checkpoint into ``version_1``, where a LambdaLR growing the lr 6x per epoch diverges."""
    offline()
    seed(0)
    from lightning.pytorch.callbacks import ModelCheckpoint

    data = regression(64, value=4)
    first = _trainer(root, epochs=2, callbacks=[ModelCheckpoint(save_last=True)])
    first.fit(_module(0.02, growth=6.0), _loader(data))
    last = Path(first.checkpoint_callback.dirpath) / "last.ckpt"
    seed(0)
    second = _trainer(root, epochs=5, callbacks=[ModelCheckpoint(save_last=True)])
    second.fit(_module(0.02, growth=6.0), _loader(data), ckpt_path=str(last))
    return root
