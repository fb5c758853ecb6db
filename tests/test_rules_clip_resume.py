"""NF305 clip-before-unscale and NF210 optimizer-state-mismatch, on real training and real
checkpoints written in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from tests.readonly import analyse_read_only

_analyse = analyse_read_only


def _amp_run(folder: Path, *, unscale_first: bool, steps: int = 40) -> None:
    """A float16-autocast MLP with a GradScaler that grows every 4 steps, logging the norm
    clip_grad_norm_ returns and the scale, with or without unscaling before the clip."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=4)
    writer = SummaryWriter(str(folder))
    for step in range(steps):
        x = torch.randn(32, 8)
        y = x.sum(1, keepdim=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = ((model(x) - y) ** 2).mean()
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", norm.item(), step)
        writer.add_scalar("amp/loss_scale", scaler.get_scale(), step)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    writer.close()


@pytest.mark.parametrize("unscale_first", [False, True])
def test_clipping_scaled_gradients_is_told_from_clipping_after_unscale(
        tmp_path: Path, unscale_first: bool) -> None:
    _amp_run(tmp_path, unscale_first=unscale_first)
    result = _analyse(tmp_path)
    found = [f for f in result.findings if f.code == "NF305"]
    if unscale_first:
        assert not found
        return
    assert found and found[0].role == "warning" and found[0].confidence == "medium"
    assert "loss scale's factor" in found[0].evidence[0].text
    assert not result.failed  # the run stalls rather than dies: a warning, not a failure


class _Tagger(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(x))).mean(1)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, lr_boost: float = 1.0
           ) -> list[float]:
    losses = []
    for g in opt.param_groups:
        g["lr"] *= lr_boost
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, 20, (16, 5), generator=gen)
        y = torch.randint(0, 3, (16,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y) * 1e3
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _resumed_run(folder: Path, *, stale_state: bool) -> None:
    """A run saved at step 20, resumed with a vocabulary grown from 20 to 24 tokens, that
    then diverges (its learning rate was raised 1e4 times, so it really dies); the save
    after the resume keeps the optimizer state loaded at the resume (``stale_state``), or
    the optimizer's own."""
    torch.manual_seed(0)
    old = _Tagger(20)
    opt = torch.optim.SGD(old.parameters(), lr=1e-3, momentum=0.9)
    losses = _train(old, opt, 20)
    (folder / "checkpoints").mkdir()
    torch.save({"model": old.state_dict(), "optimizer": opt.state_dict(), "step": 20},
               folder / "checkpoints" / "step_20.pt")
    loaded = opt.state_dict()
    new = _Tagger(24)
    with torch.no_grad():
        new.embed.weight[:20] = old.embed.weight
    new.norm.load_state_dict(old.norm.state_dict())
    new.head.load_state_dict(old.head.state_dict())
    opt2 = torch.optim.SGD(new.parameters(), lr=1e-3, momentum=0.9)
    after = _train(new, opt2, 12, lr_boost=1e4)
    assert not all(map(torch.isfinite, map(torch.tensor, after)))  # the run really died
    torch.save({"model": new.state_dict(), "optimizer": loaded if stale_state
                else opt2.state_dict(), "step": 32}, folder / "checkpoints" / "step_32.pt")
    for start, values in ((0, losses), (len(losses), after)):  # the resume's own writer
        writer = SummaryWriter(str(folder), filename_suffix=f".{start}")
        for step, value in enumerate(values, start):
            writer.add_scalar("train/loss", value, step)
        writer.close()


@pytest.mark.parametrize("stale_state", [True, False])
def test_optimizer_state_saved_for_other_parameters_is_named(tmp_path: Path,
                                                             stale_state: bool) -> None:
    _resumed_run(tmp_path, stale_state=stale_state)
    result = _analyse(tmp_path)
    assert result.failed
    found = [f for f in result.findings if f.code == "NF210"]
    if not stale_state:
        # Every state fits a parameter of its own file; what is left is the loss jumping
        # right after the resume (the raised learning rate), which a mismatch would show too.
        assert found and found[0].confidence == "low"
        assert "resumed at step 20" in found[0].evidence[0].text
        return
    assert found and found[0].confidence == "high"
    text = found[0].evidence[0].text
    assert "optimizer.state.0.momentum_buffer" in text and "20x8" in text
    assert "step_32.pt" in text and "step_20.pt" not in text


def test_regression_a_bad_record_halving_the_scale_each_epoch_is_no_scaled_clip(
        tmp_path: Path) -> None:
    """A correct loop (unscale, then clip) whose bad record makes the scaler halve once an
    epoch: the batches' gradient norms repeat a pattern each epoch, and a median over a few
    points either side of each halving read that pattern as the norm following the scale."""
    from tests.test_rules_periodic import _train

    _train(tmp_path)
    assert not [f for f in _analyse(tmp_path).findings if f.code == "NF305"]
