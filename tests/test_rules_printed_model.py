"""A run that printed its model: the printed module decides between causes the curves leave
open (a real training whose LayerNorm has eps=0 and meets a constant row)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import analyzer
from analyzer.model import top_tie


class _Encoder(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(6, eps=eps)  # over each record's raw features
        self.proj = nn.Linear(6, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(self.norm(x))))


def _run(folder: Path, eps: float, *, print_model: bool) -> None:
    """Steady training until a batch holds a record whose features are all equal (step 12):
    LayerNorm divides its zero deviations by sqrt(0 + eps)."""
    torch.manual_seed(0)
    model = _Encoder(eps)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter(str(folder))
    with open(folder / "train.log", "w", encoding="utf-8") as log:
        if print_model:
            log.write(f"{model}\n")
        for step in range(16):
            x = torch.randn(8, 6)
            if step == 12:
                x[3] = 1.0  # one record whose features are all equal
            y = (x[:, 0] > 0).long()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.add_scalar("train/loss", loss.item(), step)
            log.write(f"step {step} loss {loss.item():.4f}\n")
    writer.close()


def test_a_printed_layernorm_with_eps_zero_decides_a_sudden_nan(tmp_path: Path) -> None:
    _run(tmp_path, 0.0, print_model=True)
    result = analyzer.analyze(str(tmp_path), replay=False).results[0]
    assert result.failed and result.incident is not None and result.incident.step == 12
    tie = top_tie(result.findings)
    assert [f.name for f in tie] == ["zero-variance-normalisation"]
    assert "eps=0" in " ".join(e.text for e in tie[0].evidence)


def test_without_the_printed_model_the_same_run_is_undetermined(tmp_path: Path) -> None:
    _run(tmp_path, 0.0, print_model=False)
    result = analyzer.analyze(str(tmp_path), replay=False).results[0]
    assert result.failed
    assert len(top_tie(result.findings)) > 1  # the loss alone cannot tell the causes apart
