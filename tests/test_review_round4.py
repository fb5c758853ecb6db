"""Defects found reviewing round 4, each shown by a test that fails today (strict xfail):
the fix turns it green and the marker must then go."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import analyzer
from analyzer.model import Run, Series
from analyzer.onset import locate
from analyzer.rules import evaluate
from tests.test_rules_printed_model import _Encoder, _run


def _series(tag: str, values: list[float]) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(n, dtype=np.int64),
                  values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                  source="events", positions=np.arange(n, dtype=np.int64) * 40)


def test_a_gradient_nan_at_the_first_step_fails_no_rule() -> None:
    run = Run(path="r", name="r", files=("events",), series=(
        _series("train/loss", [0.9, 0.8, 0.7]),
        _series("train/grad_norm", [float("nan"), 1.0, 1.0])))
    _, skipped = evaluate(locate(run))
    failed = [s.name for s in skipped if "the rule failed" in s.reason]
    assert failed == []


def test_a_depth_one_lightning_summary_does_not_rule_out_a_norm_it_does_not_show(
        tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.model_summary import ModelSummary

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = _Encoder(0.0)

    _run(tmp_path, 0.0, print_model=False)
    log = tmp_path / "train.log"
    summary = str(ModelSummary(Lit(), max_depth=1))  # what ModelSummary prints at fit
    log.write_text(summary + "\n" + log.read_text(encoding="utf-8"), encoding="utf-8")
    result = analyzer.analyze(str(tmp_path), replay=False).results[0]
    assert result.failed
    causes = [f.name for f in result.findings if f.role == "cause"]
    assert "zero-variance-normalisation" in causes


def _layer(tag: str, value: float, position: int, n: int = 12) -> Series:
    return Series(tag=tag, steps=np.arange(n, dtype=np.int64), values=np.full(n, value),
                  wall_times=np.zeros(n), source="events",
                  positions=np.arange(n, dtype=np.int64) * 100 + position)


def test_slash_separated_layer_tags_read_the_first_layer() -> None:
    from analyzer.rules.evidence import RunEvidence
    from analyzer.rules.evidence_scale import input_scale

    n = 12
    loss = _series("train/loss", [1.0] * (n - 1) + [float("nan")])
    # fc1: fan_in 64 (|W|/|b| = 8 at init) and |gW|/|gb| = 800: inputs of RMS 100
    layers = [("fc1/weight", 800.0, 8.0), ("fc1/bias", 1.0, 1.0),
              ("fc2/weight", 4.0, 4.0), ("fc2/bias", 1.0, 1.0)]
    series = [loss]
    for k, (name, grad, weight) in enumerate(layers):
        series.append(_layer(f"grad_norm/{name}", grad, 2 * k + 1))
        series.append(_layer(f"weight_norm/{name}", weight, 2 * k + 2))
    run = Run(path="r", name="r", files=("events",), series=tuple(series))
    scale = input_scale(RunEvidence(locate(run)))
    assert scale is not None and scale.rms == pytest.approx(100.0)


def test_optimizer_state_mismatch_names_what_it_carries(tmp_path: Path) -> None:
    from tests.test_evidence import mismatches
    from tests.test_rules_clip_resume import _analyse, _resumed_run

    _resumed_run(tmp_path, stale_state=True)
    found = [f for f in _analyse(tmp_path).findings if f.code == "NF210"]
    assert found
    texts = [e.text for e in found[0].evidence]
    assert not any(str(tmp_path) in t or "{'" in t for t in texts), texts
    assert not [m for e in found[0].evidence for m in mismatches(e, None)]


def test_a_scalar_parameter_is_no_optimizer_state_mismatch(tmp_path: Path) -> None:
    import torch
    from torch import nn
    from torch.utils.tensorboard import SummaryWriter

    class Clip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.logit_scale = nn.Parameter(torch.tensor(2.0))

    torch.manual_seed(0)
    model = Clip()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    writer = SummaryWriter(str(tmp_path))
    for step in range(12):
        loss = (model.proj(torch.randn(8, 4)) * model.logit_scale.exp()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        writer.add_scalar("train/loss", loss.item() if step < 11 else float("nan"), step)
    writer.close()
    (tmp_path / "checkpoints").mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 10},
               tmp_path / "checkpoints" / "step_10.pt")
    result = analyzer.analyze(str(tmp_path), replay=False).results[0]
    assert result.failed
    assert "optimizer-state-mismatch" not in [f.name for f in result.findings]
