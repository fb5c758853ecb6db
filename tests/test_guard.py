"""StepGuard: real training that really fails, read back by the analyzer.

Each run trains a small named MLP (parameters ``net.0.weight`` ...) with a real optimizer
and writes through torch's SummaryWriter or tensorboardX into ``tmp_path``; the folder is
then analysed read-only, as ``forensics analyze`` would.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from analyzer.capture.guard import SCALE_TAG, SKIPS_TAG, TOTAL_GRAD_TAG, GuardFault, StepGuard
from analyzer.model import RunResult, Series
from analyzer.tags import TagRole, layer_from_tag, param_from_tag, role
from tests.readonly import analyse_read_only

STEPS = 30
NAN_STEPS = (7, 13)


class Net(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def _batch(step: int, *, nan_at: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 4, generator=g)
    y = x.sum(1, keepdim=True)
    if step in nan_at:
        x[3, 1] = float("nan")  # one bad sample: the loss and every gradient go NaN
    return x, y


def _train(folder: Path, *, skip: bool, every: int = 5, lr: float = 0.05,
           nan_at: tuple[int, ...] = NAN_STEPS, steps: int = STEPS,
           writer: Any = None, sgd: bool = False) -> tuple[Net, StepGuard, list[float]]:
    """A plain loop that logs its loss every step, as scripts do, with the guard."""
    from torch.utils.tensorboard import SummaryWriter

    model = Net()
    opt = (torch.optim.SGD if sgd else torch.optim.Adam)(model.parameters(), lr=lr)
    own = writer is None
    w = SummaryWriter(str(folder)) if own else writer
    guard = StepGuard(model, writer=w, every=every, skip_nonfinite=skip)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for step in range(steps):
            x, y = _batch(step, nan_at=nan_at)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            w.add_scalar("train/loss", loss.item(), step)
            losses.append(loss.item())
            if guard.after_backward(step):
                opt.step()
            guard.after_update(step)
    guard.close()
    if own:
        w.close()
    return model, guard, losses


def _series(result: RunResult, tag: str) -> Series:
    return next(s for s in result.run.series if s.tag == tag)


def _finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# -- what the analyzer reads ---------------------------------------------------------------


def test_norms_are_per_layer_tags_the_analyzer_reads(tmp_path: Path) -> None:
    model, _, _ = _train(tmp_path, skip=False, nan_at=(), steps=12)
    result = analyse_read_only(tmp_path)
    tags = {s.tag for s in result.run.series}
    names = [n for n, _ in model.named_parameters()]
    assert {f"grad_norm/{n}" for n in names} | {f"weight_norm/{n}" for n in names} <= tags
    assert param_from_tag("grad_norm/net.0.weight") == "net.0.weight"
    assert layer_from_tag("weight_norm/net.2.bias") == "net.2"
    assert role("grad_norm/net.0.weight") is TagRole.LAYER_GRAD
    assert role("weight_norm/net.0.weight") is TagRole.LAYER_WEIGHT
    assert role(TOTAL_GRAD_TAG) is TagRole.GRAD_NORM
    assert _series(result, "grad_norm/net.0.weight").steps.tolist() == [0, 5, 10]  # every=5
    assert result.status == "finite"


def test_written_norms_are_the_gradients_and_weights_norms() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = _Recorder()
    guard = StepGuard(model, writer=w, every=1)
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    guard.after_backward(0)
    grads = {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    guard.after_update(0)
    for n, v in grads.items():
        assert w.value(f"grad_norm/{n}", 0) == pytest.approx(v, rel=1e-6)
        assert w.value(f"weight_norm/{n}", 0) == pytest.approx(
            float(dict(model.named_parameters())[n].detach().norm()), rel=1e-6)
    total = math.sqrt(sum(v * v for v in grads.values()))
    assert w.value(TOTAL_GRAD_TAG, 0) == pytest.approx(total)


def test_regression_a_failing_run_leaves_layer_evidence_without_a_capture(tmp_path: Path) -> None:
    # No skip: the NaN batch at step 7 (not a step of every=5) goes into the weights. The
    # guard writes the norms of the step whose check failed, so the onset names a layer.
    model, guard, _ = _train(tmp_path, skip=False)
    assert not _finite(model)
    assert guard.first_fault == GuardFault(step=7, parameter="net.0.weight", tensor="gradient",
                                      kind="nan")
    assert guard.last_fault is not None and guard.last_fault.step == STEPS - 1
    result = analyse_read_only(tmp_path)
    assert result.status == "failed"
    assert result.incident is not None and result.incident.step == 7
    assert result.layer_incident is not None and result.layer_incident.step == 7
    assert result.layer_incident.layer in {"net.0", "net.2"}
    assert 7 in _series(result, "weight_norm/net.0.weight").steps.tolist()


def test_regression_a_guarded_run_that_recovers_is_not_failed(tmp_path: Path) -> None:
    # Two NaN batches, refused; the loss logged at those steps is NaN, and the run goes on.
    model, guard, losses = _train(tmp_path, skip=True)
    assert [s for s, v in enumerate(losses) if not math.isfinite(v)] == list(NAN_STEPS)
    assert guard.skipped == 2 and _finite(model)
    result = analyse_read_only(tmp_path)
    assert result.status == "finite" and result.incident is None
    assert result.findings == ()
    assert result.scale is not None and result.scale.guarded == frozenset(NAN_STEPS)
    counter = _series(result, SKIPS_TAG)
    assert counter.steps.tolist() == list(NAN_STEPS) and counter.values.tolist() == [1.0, 2.0]
    from analyzer.model import Report
    from analyzer.report.text import format_text

    text = format_text(Report(results=(result,)))
    assert "guard skips: 2 steps skipped by the guard at 7, 13" in text


def test_a_guarded_run_that_never_recovers_is_failed(tmp_path: Path) -> None:
    # An lr that diverges: from the first non-finite step on, every update is refused.
    _, guard, losses = _train(tmp_path, skip=True, lr=10.0, nan_at=(), every=1, steps=20,
                              sgd=True)
    bad = [s for s, v in enumerate(losses) if not math.isfinite(v)]
    assert bad and bad == list(range(bad[0], 20))
    result = analyse_read_only(tmp_path)
    refused = _series(result, SKIPS_TAG).steps.tolist()
    assert refused == list(range(refused[0], 20)) and refused[0] <= bad[0] + 1
    assert guard.skipped == len(refused)
    assert result.status == "failed"
    # The gradient norms outgrow float32 (the events' scalars) a few steps before the loss.
    assert result.incident is not None and result.incident.step <= bad[0]
    assert result.scale is not None and result.scale.guarded == frozenset()


def test_a_refusal_before_a_run_diverges_for_good_is_not_its_failure(tmp_path: Path) -> None:
    # A NaN batch refused at step 2, then an lr that diverges: the refusals it ends with
    # are the failure, the one it went on from is not.
    from analyzer.scaler import guard_skips

    _, guard, losses = _train(tmp_path, skip=True, lr=10.0, nan_at=(2,), every=1, steps=20,
                              sgd=True)
    assert math.isnan(losses[2]) and not math.isfinite(losses[-1])
    result = analyse_read_only(tmp_path)
    refused = _series(result, SKIPS_TAG).steps.tolist()
    assert refused[0] == 2 and refused[-1] == 19 and guard.skipped == len(refused) > 2
    assert guard_skips(result.run) == frozenset({2})
    assert result.status == "failed"
    assert result.incident is not None and 2 < result.incident.step <= refused[1]


# -- the check and the skip ---------------------------------------------------------------


def test_the_skip_leaves_the_weights_and_adam_state_as_they_were() -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    guard = StepGuard(model, every=0, skip_nonfinite=True)
    for step in range(3):  # Adam's state exists before the bad step
        x, y = _batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        assert guard.after_backward(step)
        opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(3, nan_at=(3,))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    with pytest.warns(UserWarning, match="net.0.weight is nan at step 3"):
        assert not guard.after_backward(3)
    assert all(p.grad is None for p in model.parameters())
    opt.step()  # called anyway: a no-op
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert guard.skipped == 1


def test_kinds_and_an_overflowing_norm_of_finite_values() -> None:
    model = Net()
    w = _Recorder()
    guard = StepGuard(model, writer=w, every=0)
    params = dict(model.named_parameters())
    for p in params.values():
        p.grad = torch.zeros_like(p)
    params["net.2.weight"].grad = torch.full_like(params["net.2.weight"], 1e30)  # norm: inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert guard.after_backward(0)  # every element finite: no fault
    assert guard.last_fault is None and w.points == {}
    params["net.2.bias"].grad = torch.tensor([-math.inf])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert guard.after_backward(1)
        params["net.0.bias"].grad[2] = math.inf
        assert guard.after_backward(2)
    assert guard.last_fault == GuardFault(2, "net.0.bias", "gradient", "+inf")
    assert [str(m.message) for m in seen] == [  # warned once
        "StepGuard: the gradient of net.2.bias is -inf at step 1; training goes on; "
        "StepGuard keeps the last fault in last_fault"]
    assert math.isinf(w.value("grad_norm/net.2.bias", 1))  # the failing step is written
    with torch.no_grad():
        params["net.2.weight"][0, 0] = math.nan
    guard.after_update(3)
    assert guard.last_fault == GuardFault(3, "net.2.weight", "weight", "nan")
    assert math.isnan(w.value("weight_norm/net.2.weight", 3))


def test_frozen_parameters_and_no_parameters() -> None:
    model = Net()
    model.net[0].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    w = _Recorder()
    guard = StepGuard(model, writer=w, every=1, skip_nonfinite=True)
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    assert guard.after_backward(0)
    opt.step()
    guard.after_update(0)
    assert {t for t, _ in w.points} == {
        "grad_norm/net.2.weight", "grad_norm/net.2.bias", TOTAL_GRAD_TAG,
        "weight_norm/net.2.weight", "weight_norm/net.2.bias"}
    empty = StepGuard(torch.nn.ReLU(), writer=w, every=1, skip_nonfinite=True)
    assert empty.after_backward(1)
    empty.after_update(1)
    assert empty.last_fault is None and not any(s == 1 for _, s in w.points)


def test_wrapped_models_keep_their_own_names_and_sparse_gradients_are_read() -> None:
    class Bag(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(10, 3, sparse=True)
            self.head = Net()

        def forward(self, i: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.head(torch.cat([self.emb(i), self.emb(i)[:, :1]], 1))
            return out

    model = Bag()
    w = _Recorder()
    guard = StepGuard(torch.nn.DataParallel(model), writer=w, every=1)
    ids = torch.tensor([1, 1, 4])  # index 1 twice: the sparse gradient has duplicates
    model(ids).sum().backward()  # type: ignore[no-untyped-call]
    assert model.emb.weight.grad is not None and model.emb.weight.grad.is_sparse
    dense = model.emb.weight.grad.to_dense().norm()
    assert guard.after_backward(0)
    assert w.value("grad_norm/emb.weight", 0) == pytest.approx(float(dense), rel=1e-6)
    assert "grad_norm/head.net.0.weight" in {t for t, _ in w.points}
    model.emb.weight.grad = torch.sparse_coo_tensor([[2]], [[math.nan, 0.0, 0.0]], (10, 3),
                                                    check_invariants=True)
    with pytest.warns(UserWarning, match="gradient of emb.weight is nan"):
        guard.after_backward(1)


def test_arguments_that_contradict_each_other() -> None:
    with pytest.raises(ValueError, match="needs check=True"):
        StepGuard(Net(), check=False, skip_nonfinite=True)
    with pytest.raises(ValueError, match="not both"):
        StepGuard(Net(), log_dir="x", writer=_Recorder())


def test_check_off_costs_nothing_between_the_every_steps() -> None:
    model = Net()
    w = _Recorder()
    guard = StepGuard(model, writer=w, every=10, check=False)
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    assert guard.after_backward(3)
    guard.after_update(3)
    assert w.points == {} and guard.last_fault is None
    assert guard.after_backward(10) and math.isnan(w.value("grad_norm/net.0.weight", 10))
    assert guard.last_fault is None


# -- mixed precision ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_grad_scaler_step_writes_unscaled_norms_and_is_not_a_guard_skip(
        tmp_path: Path, dtype: torch.dtype) -> None:
    from torch.utils.tensorboard import SummaryWriter

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1000)
    writer = SummaryWriter(str(tmp_path))
    guard = StepGuard(model, writer=writer, every=1, skip_nonfinite=True)
    overflow = 4
    for step in range(10):
        x, y = _batch(step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if step == overflow:
            loss = loss * 1e35  # finite, but its gradients times the scale overflow
        writer.add_scalar("train/loss", loss.item(), step)
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scale = scaler.get_scale()
        expected = {n: float(p.grad.float().norm()) / scale
                    for n, p in model.named_parameters() if p.grad is not None}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an overflow the scaler skips is no fault
            assert guard.after_backward(step, scaler=scaler)
        scaler.step(opt)
        scaler.update()
        guard.after_update(step)
        if step == 0:
            unscaled = expected
    guard.close()
    writer.close()
    assert guard.skipped == 0 and guard.last_fault is None and _finite(model)
    result = analyse_read_only(tmp_path)
    n2 = _series(result, "grad_norm/net.2.weight")
    assert n2.values[0] == pytest.approx(unscaled["net.2.weight"], rel=1e-5)
    assert not np.isfinite(n2.values[overflow])
    scales = _series(result, SCALE_TAG)
    assert scales.values[0] == 2.0**12 and scales.values[overflow + 1] == 2.0**11
    assert result.overflow_skips == (overflow,)
    assert result.status == "finite"


def test_gradients_already_unscaled_are_not_divided_again() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    w = _Recorder()
    guard = StepGuard(model, writer=w, every=1)
    x, y = _batch(0)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()  # type: ignore[no-untyped-call]
    scaler.unscale_(opt)  # as a loop that clips does
    norm = float(model.net[0].weight.grad.norm())  # type: ignore[union-attr]
    guard.after_backward(0, scaler=scaler)
    assert w.value("grad_norm/net.0.weight", 0) == pytest.approx(norm, rel=1e-6)
    assert w.value(SCALE_TAG, 0) == 2.0**8  # the scale is still written, for its skips


# -- writers ------------------------------------------------------------------------------


def test_a_tensorboardx_writer_passed_in(tmp_path: Path) -> None:
    import tensorboardX

    writer = tensorboardX.SummaryWriter(str(tmp_path))
    model, guard, _ = _train(tmp_path, skip=True, writer=writer)
    writer.close()
    assert guard.skipped == 2 and _finite(model)
    result = analyse_read_only(tmp_path)
    assert result.status == "finite"
    assert result.scale is not None and result.scale.guarded == frozenset(NAN_STEPS)
    assert "grad_norm/net.0.weight" in {s.tag for s in result.run.series}


def test_log_dir_makes_its_own_writer_on_the_first_write(tmp_path: Path) -> None:
    model = Net()
    guard = StepGuard(model, log_dir=tmp_path / "tb", every=1)
    assert not (tmp_path / "tb").exists()
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    guard.after_backward(0)
    guard.close()
    result = analyse_read_only(tmp_path / "tb")
    assert "grad_norm/net.0.weight" in {s.tag for s in result.run.series}


def test_a_writer_that_fails_is_warned_about_once_and_training_goes_on() -> None:
    class Full:
        calls = 0

        def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
            self.calls += 1
            raise OSError(28, "No space left on device")

    model = Net()
    writer = Full()
    guard = StepGuard(model, writer=writer, every=1, skip_nonfinite=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(3):
            x, y = _batch(step, nan_at=(2,))
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
            guard.after_backward(step)
            guard.after_update(step)
    assert [str(w.message)[:34] for w in seen] == ["StepGuard: writing failed (step 0:",
                                                   "StepGuard: the gradient of net.0.w"]
    assert writer.calls == 1 and guard.errors == ["step 0: OSError: [Errno 28] No space left "
                                                  "on device"]
    assert guard.skipped == 1 and guard.first_fault is not None  # the check went on


def test_importing_the_guard_does_not_import_torch() -> None:
    code = "import sys, analyzer.capture.guard; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _Recorder:
    """A writer passed in: keeps every point."""

    def __init__(self) -> None:
        self.points: dict[tuple[str, int], float] = {}

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        self.points[(tag, global_step)] = float(scalar_value)

    def value(self, tag: str, step: int) -> float:
        return self.points[(tag, step)]


# -- inside a framework's hooks -----------------------------------------------------------


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_a_lightning_callback_guards_a_real_trainer(tmp_path: Path, precision: str) -> None:
    # The guard's two calls from Lightning's own hooks, its logger's writer passed in: two
    # NaN batches are refused, and the run, which goes on, is read as healthy; under
    # 16-mixed the precision plugin's GradScaler skips them itself.
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import MixedPrecision
    from torch.utils.data import DataLoader, TensorDataset

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x).float(), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    class Guarded(pl.Callback):
        guard: StepGuard

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.guard = StepGuard(pl_module, writer=trainer.logger.experiment, every=4,
                                   skip_nonfinite=True)

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            self.guard.after_backward(trainer.global_step, scaler=scaler)

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            self.guard.after_update(trainer.global_step - 1)

    batches = [_batch(i, nan_at=(5, 11)) for i in range(16)]
    data = TensorDataset(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
    cb = Guarded()
    trainer = pl.Trainer(default_root_dir=str(tmp_path), max_epochs=1, log_every_n_steps=1,
                         accelerator="cpu", devices=1, callbacks=[cb], enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         **({"plugins": [MixedPrecision("16-mixed", "cpu",
                                                        scaler=torch.amp.GradScaler("cpu"))]}
                            if precision == "16-mixed" else {"precision": precision}))
    lit = Lit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(lit, DataLoader(data, batch_size=16))
    cb.guard.close()
    assert _finite(lit)
    result = analyse_read_only(tmp_path)
    assert "grad_norm/model.net.0.weight" in {s.tag for s in result.run.series}  # full paths
    if precision != "16-mixed":
        assert cb.guard.skipped == 2 and result.scale is not None
        assert result.scale.guarded == frozenset({5, 11})
        assert result.status == "finite"
    else:  # the scaler's skips, not the guard's; its scale is logged beside the norms
        assert cb.guard.skipped == 0 and cb.guard.last_fault is None
        scale = _series(result, SCALE_TAG)
        assert {4, 5, 6, 8, 11, 12} <= set(scale.steps.tolist())  # every=4, and each drop
        assert {5, 11} <= set(result.overflow_skips)  # (fp16 may overflow at step 0 too)


def test_a_trainer_callback_guards_a_real_hf_trainer(tmp_path: Path) -> None:
    # The Trainer logs the update it made at state.global_step N on step N + 1 (after it
    # counted it): the guard is given that number, so the NaN grad_norm the Trainer logs
    # for a refused update falls on the guard's own step.
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = Net()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.body(x), labels)}

    class Guarded(TrainerCallback):  # type: ignore[misc]
        guard: StepGuard

        def __init__(self, tb: Any) -> None:
            self.tb = tb

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.guard = StepGuard(kw["model"], writer=self.tb.tb_writer, every=4,
                                   skip_nonfinite=True)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.guard.after_backward(state.global_step + 1)

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.guard.after_update(state.global_step + 1)

    rows = [{"x": x[i], "labels": y[i]} for x, y in (_batch(s, nan_at=(5, 11)) for s in range(16))
            for i in range(2, 6)]  # four rows a batch, x[3] the NaN sample
    args = TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard"], logging_steps=1,
                             max_steps=16, per_device_train_batch_size=4, use_cpu=True, seed=0,
                             save_strategy="no", disable_tqdm=True, learning_rate=1e-2,
                             train_sampling_strategy="sequential")
    model = Model()
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    tb = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TensorBoardCallback))
    cb = Guarded(tb)
    trainer.add_callback(cb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    cb.guard.close()
    assert cb.guard.skipped == 2 and _finite(model)
    result = analyse_read_only(tmp_path)
    assert "grad_norm/body.net.0.weight" in {s.tag for s in result.run.series}
    assert math.isnan(_series(result, "train/grad_norm").values[5])  # the Trainer's own
    assert result.scale is not None and result.scale.guarded == frozenset({6, 12})
    assert result.status == "finite"


class _Values:
    """A writer that keeps what it is given (the guard takes anything with add_scalar)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.values[tag] = value

    def flush(self) -> None:
        pass


def test_regression_a_huge_but_finite_weight_has_a_finite_norm() -> None:
    """Elements of 2.7e19 square past float32's largest: the float32 norm is inf over
    finite values, which the analyzer would read as non-finite weights."""
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.fill_(2.7e19)
    writer = _Values()
    guard = StepGuard(model, writer=writer, every=1)
    model(torch.ones(1, 4)).sum().backward()
    guard.after_backward(0)
    guard.after_update(0)
    norm = writer.values["weight_norm/weight"]
    assert math.isfinite(norm) and norm == pytest.approx(2.7e19 * 4, rel=1e-6)
    assert guard.first_fault is None
