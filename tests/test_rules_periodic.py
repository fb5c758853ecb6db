"""Non-finite steps that come back at one position of every epoch (rules.evidence_periodic).

Real CPU training: float16 autocast with ``torch.amp.GradScaler("cpu")`` over a data set of
32 records in batches of 4 (8 steps per epoch, no shuffling), one record holding an Inf,
logged as the sample runs' loop logs (the loss, the unscaled gradient norm, the scale before
``scaler.update()``, a line per skipped step). The healthy controls are the same loop over
clean data, whose scaler warms up and then overflows now and then in step with the epoch."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

from analyzer.model import Finding, RunResult
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_periodic import periodic
from tests.readonly import analyse_read_only

BAD_RECORD = 13
"""Record 13 sits in batch 3 of each epoch (records 12 to 15)."""


def _train(run_dir: Path, *, bad: int | None = BAD_RECORD, epochs: int = 6,
           init_scale: float = 2.0**8, growth: int = 1000, scaler_on: bool = True,
           guard: bool = False, epoch_scalar: bool = False, x_scale: float = 1.0,
           lr_raised_at: int | None = None, save_each_epoch: bool = False) -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 8) * x_scale
    y = x.sum(1, keepdim=True) * 0.1
    if bad is not None:
        x[bad, 2] = math.inf
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth,
                                  enabled=scaler_on)
    os.makedirs(run_dir, exist_ok=True)
    writer = SummaryWriter(str(run_dir))
    step = 0
    with open(run_dir / "train.log", "w", encoding="utf-8") as log:
        for epoch in range(epochs):
            for position, (xb, yb) in enumerate(loader):
                for group in opt.param_groups:  # a cyclic schedule, where asked
                    group["lr"] = 0.1 if position == lr_raised_at else 0.01
                before = scaler.get_scale()
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
                if guard and not torch.isfinite(loss):
                    # the loop's own guard: the batch is dropped and nothing else logged
                    log.write(f"step {step}: non-finite loss, skipping batch\n")
                    step += 1
                    continue
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
                scaler.unscale_(opt)
                norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()
                                                      if p.grad is not None])
                scaler.step(opt)
                scaler.update()
                writer.add_scalar("train/loss", float(loss.detach()), step)
                writer.add_scalar("train/grad_norm", float(norm), step)
                writer.add_scalar("train/lr", opt.param_groups[0]["lr"], step)
                if scaler_on:
                    writer.add_scalar("amp/loss_scale", before, step)
                if epoch_scalar:
                    writer.add_scalar("epoch", epoch, step)
                if scaler.get_scale() < before:
                    log.write(f"step {step}: gradient overflow, skipping step, loss scale "
                              f"{before} -> {scaler.get_scale()}\n")
                step += 1
            if save_each_epoch:  # as Lightning's ModelCheckpoint lays out an epoch's end
                (run_dir / "checkpoints").mkdir(exist_ok=True)
                torch.save({"epoch": epoch, "global_step": step,
                            "pytorch-lightning_version": "2.6.6",
                            "state_dict": model.state_dict()},
                           run_dir / "checkpoints" / f"epoch={epoch}-step={step}.ckpt")
    writer.close()


_analyse = analyse_read_only


def _causes(result: RunResult) -> list[Finding]:
    return [f for f in result.findings if f.role == "cause"]


def _names(result: RunResult) -> set[str]:
    return {f.name for f in result.findings}


def test_regression_a_bad_record_skipped_every_epoch_is_no_warm_up(tmp_path: Path) -> None:
    # Before: no cause, and the skips at 3, 11, 19, ... were noted as a warm-up that recovered.
    run = tmp_path / "run"
    _train(run)
    result = _analyse(run)
    causes = _causes(result)
    assert causes and causes[0].name == "nan-in-batch"
    assert causes[0].confidence == "medium"
    text = " ".join(e.text for e in causes[0].evidence)
    assert "3, 11, 19, 27, 35, 43" in text and "every 8 steps" in text
    assert "batch 3 of each epoch" in text
    assert "read from the 6 recurrences" in text  # no epoch count logged
    assert "position 3 of the epoch" in text and "dataset[i]" in text
    assert "loss-scale-warm-up" not in _names(result)


def test_the_epoch_scalar_gives_the_period(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, epoch_scalar=True)
    p = periodic(RunEvidence(_analyse(run)))
    assert p is not None and (p.period, p.position) == (8, 3)
    assert "8, from its epoch scalar" in p.source


def test_two_epochs_are_enough_with_the_period_known_not_without(tmp_path: Path) -> None:
    known, unknown = tmp_path / "known", tmp_path / "unknown"
    _train(known, epochs=2, epoch_scalar=True)
    _train(unknown, epochs=2)
    p = periodic(RunEvidence(_analyse(known)))
    assert p is not None and p.steps == (3, 11)
    # two bad steps 8 apart, and nothing saying an epoch is 8 steps: no period
    result = _analyse(unknown)
    assert periodic(RunEvidence(result)) is None
    assert "nan-in-batch" not in {f.name for f in _causes(result)
                                  if f.confidence != "low"}


def test_the_trainers_steps_per_epoch_give_the_period(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    _train(run, epochs=2)
    state = transformers.TrainerState(max_steps=16, num_train_epochs=2, global_step=16,
                                      train_batch_size=4)
    state.save_to_json(str(run / "trainer_state.json"))
    result = _analyse(run)
    p = periodic(RunEvidence(result))
    assert p is not None and p.period == 8 and "max_steps 16" in p.source
    # the batch size the Trainer saved names the records to check: 12 to 15
    decide = _causes(result)[0].evidence[-1].text
    assert "`dataset[i]` for i in range(12, 16)" in decide


def test_the_saves_epochs_and_steps_give_the_period(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, epochs=2, save_each_epoch=True)
    p = periodic(RunEvidence(_analyse(run)))
    assert p is not None and p.steps == (3, 11)
    assert "8, from the epochs and steps its 2 saves name" in p.source


def test_a_loop_that_drops_a_non_finite_loss_shows_it_by_its_skip_lines(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, scaler_on=False, guard=True)
    result = _analyse(run)
    causes = _causes(result)
    assert causes and causes[0].name == "nan-in-batch"
    assert "a skipped step at 6" in causes[0].evidence[0].text


def test_healthy_warm_up_skips_in_step_with_the_epoch_stay_healthy(tmp_path: Path) -> None:
    # A scale that starts far too high halves through steps 0-9, then regrows every five
    # good steps and overflows at the batch with the largest gradients: steps 17, 25, 33, ...
    # one epoch apart, with a finite loss. The scaler's doing, not a bad record.
    for epoch_scalar in (False, True):
        run = tmp_path / f"healthy_{epoch_scalar}"
        _train(run, bad=None, epochs=8, init_scale=2.0**24, growth=5,
               epoch_scalar=epoch_scalar)
        result = _analyse(run)
        assert result.incident is None
        assert not _causes(result)
        assert periodic(RunEvidence(result)) is None
        assert "loss-scale-warm-up" in _names(result)


def test_a_collapse_is_dense_not_periodic(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, bad=None, epochs=8, init_scale=2.0**24, growth=5, x_scale=30.0)
    result = _analyse(run)
    assert periodic(RunEvidence(result)) is None
    assert _causes(result)[0].name == "loss-scale-collapse"


def test_one_bad_step_is_no_recurrence(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, epochs=1)
    assert periodic(RunEvidence(_analyse(run))) is None


def test_a_learning_rate_raised_at_that_position_leaves_it_open(tmp_path: Path) -> None:
    # The same bad record, but the schedule also raises the rate tenfold at batch 3 of each
    # epoch: the recurrence no longer singles out the data.
    run = tmp_path / "run"
    _train(run, lr_raised_at=3)
    assert periodic(RunEvidence(_analyse(run))) is None
