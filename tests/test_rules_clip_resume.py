"""NF305 clip-before-unscale and NF210 optimizer-state-mismatch, on real training and real
checkpoints written in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import analyzer
from analyzer.model import RunResult


def _analyse(folder: Path) -> RunResult:
    return analyzer.analyze(str(folder), replay=False).results[0]


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
