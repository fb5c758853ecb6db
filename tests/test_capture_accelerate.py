"""The flight recorder in a loop written with Hugging Face Accelerate, end to end.

tests/integrations/accelerate_train.py trains lm.Net with the real Accelerator on
the CPU (``accumulate``, ``backward``, ``clip_grad_norm_``, bf16 autocast); a batch with an
outlier row makes the softmax underflow and the head take log(0). ``forensics analyze`` on
the run folder, with no flag, must then replay the captured step and name the head's log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from analyzer.capture.recorder import CaptureSetupError
from tests.integrations import accelerate_train
from tests.integrations.loop_models import project_module
from tests.readonly import analyse_replayed as analyse
from tests.readonly import layer_and_op

pytest.importorskip("accelerate")
MODELS = "accelerate_project"


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """tests/integrations/lm.py as the user's project module ``accelerate_project``
    (a replay never imports factories from this tool's own tree)."""
    with project_module(tmp_path_factory.mktemp("project"), MODELS) as module:
        yield module


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """Accelerate keeps one process-wide state; each test builds its own Accelerator (as
    accelerate's own test cases reset it)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()




def meta_of(path: str | None) -> dict[str, Any]:
    assert path is not None
    data: dict[str, Any] = json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    return data




@pytest.mark.parametrize(("bad", "step", "micro_batches", "failing"),
                         [(3, 1, 2, 1), (4, 2, 1, None)])
def test_accumulate_two_micro_batches_with_clipping(tmp_path: Path, lm: ModuleType, bad: int,
                                                    step: int, micro_batches: int,
                                                    failing: int | None) -> None:
    # Five batches of a dataloader, two micro-batches a step: steps [0 1] [2 3] [4] an epoch,
    # the last cut short by the end of the dataloader, yet its loss still divided by 2.
    rec = accelerate_train.train(str(tmp_path), accumulation=2, clip=1.0, bad=bad, models=lm)
    assert rec.capture_path == str(tmp_path / "capture" / f"step_{step}"), rec.errors
    meta = meta_of(rec.capture_path)
    assert meta["accumulation"] == {"micro_batches": micro_batches, "divide": True,
                                    "divisor": 2, "failing": failing, "configured": 2}
    assert meta["grad_clip"] == 1.0  # seen in accelerator.clip_grad_norm_
    assert meta["amp"]["autocast_dtype"] is None and meta["amp"]["grad_scaler"] is False
    # Batch 4's outlier row has a class its softmax keeps as target: a finite loss; the NaN
    # gradient of log(0) reaches the parameters (check_params: the loop's zero_grad has
    # already cleared the gradients when the step ends).
    assert meta["trigger"]["what"] == ("loss" if bad == 3 else "param")
    assert layer_and_op(analyse(tmp_path)) == ("head", ("log",))


def test_bf16_on_the_cpu(tmp_path: Path, lm: ModuleType) -> None:
    rec = accelerate_train.train(str(tmp_path), mixed_precision="bf16", clip=0.5,
                                 models=lm)
    assert rec.capture_path == str(tmp_path / "capture" / "step_3"), rec.errors
    meta = meta_of(rec.capture_path)
    assert meta["amp"] == {"autocast_dtype": "bfloat16", "device_type": "cpu",
                           "grad_scaler": False, "scope": "forward"}
    assert meta["dtype"] == "float32" and meta["grad_clip"] == 0.5
    result = analyse(tmp_path)
    assert result.replay is not None and result.replay.autocast == "bfloat16"
    assert layer_and_op(result) == ("head", ("log",))


def test_the_recorder_reads_the_accelerator_and_puts_its_methods_back(
        tmp_path: Path, lm: ModuleType) -> None:
    from accelerate import Accelerator

    from analyzer.capture.accelerate import recorder_for

    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=3)
    net = lm.make_net()
    first = torch.optim.SGD(net.body[0].parameters(), 0.1)
    second = torch.optim.Adam(net.body[2].parameters(), 1e-3)
    model, opt1, opt2 = accelerator.prepare(net, first, second)
    assert type(opt1).__name__ == "AcceleratedOptimizer"
    with pytest.raises(TypeError, match="scaler"):
        recorder_for(accelerator, tmp_path, model, [opt1, opt2],
                     model_factory=f"{MODELS}:make_net", loss_factory=f"{MODELS}:nll",
                     scaler=None)
    with pytest.raises(ValueError, match="records nothing"):
        recorder_for(accelerator, tmp_path, model, opt1, record=False)
    rec = recorder_for(accelerator, tmp_path, model, [opt1, opt2], guard=True,
                       model_factory=f"{MODELS}:make_net", loss_factory=f"{MODELS}:nll")
    inner = rec.recorder
    assert inner is not None
    assert inner.model is accelerator.unwrap_model(model)
    assert inner.optimizers == [first, second]  # the user's own, unwrapped
    assert inner.autocast_dtype == torch.bfloat16 and inner.scaler is None
    assert inner.accumulation == 3 and inner.divide_loss is True
    assert "backward" in vars(accelerator) and "step" in vars(opt1) and "step" in vars(opt2)
    rec.close()
    assert "backward" not in vars(accelerator) and "clip_grad_norm_" not in vars(accelerator)
    assert "step" not in vars(opt1) and "step" not in vars(opt2)


def test_a_wrong_factory_fails_when_the_recorder_is_made(tmp_path: Path, lm: ModuleType) -> None:
    from accelerate import Accelerator

    from analyzer.capture.accelerate import recorder_for

    accelerator = Accelerator(cpu=True)
    model = lm.make_net()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    model, opt = accelerator.prepare(model, opt)
    with pytest.raises(CaptureSetupError, match="make_nett"):
        recorder_for(accelerator, tmp_path, model, opt, model_factory=f"{MODELS}:make_nett",
                     loss_factory=f"{MODELS}:nll")
    assert "backward" not in vars(accelerator)


class _Calls:
    """Stands in for the FlightRecorder under AcceleratorRecorder: the calls it gets."""

    active = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.grad_clip: float | None = None
        self.errors: list[str] = []

    def begin(self, step: Any, inputs: Any, targets: Any, *, batch: Any = None) -> None:
        self.calls.append("begin")

    def micro_batch(self, batch: Any = None, *, inputs: Any = None, targets: Any = None) -> None:
        self.calls.append("micro")

    def loss(self, value: Any) -> None:
        self.calls.append(f"loss {float(value.detach()):g}")

    def end(self, error: BaseException | None = None) -> None:
        self.calls.append("end" if error is None else f"end {type(error).__name__}")


def test_an_optimizer_step_ends_where_accelerate_syncs() -> None:
    """Two micro-batches a step over a dataloader of five: Accelerate syncs after batches 1,
    3 and 4 (the end of the dataloader), so the recorder's steps are [0 1] [2 3] [4]; each
    loss is handed over as the loop computed it, before backward divides it by 2."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from analyzer.capture.accelerate import AcceleratorRecorder

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(2, 1)
    loader = DataLoader(TensorDataset(torch.arange(5.0)), batch_size=1)
    model, loader = accelerator.prepare(model, loader)
    fake = _Calls()
    rec = AcceleratorRecorder(accelerator, fake)  # type: ignore[arg-type]
    for (x,) in loader:
        with accelerator.accumulate(model), rec.step(batch=x):
            accelerator.backward((model.weight.sum() * 0 + x).sum())
    assert fake.calls == ["begin", "loss 0", "micro", "loss 1", "end",
                          "begin", "loss 2", "micro", "loss 3", "end",
                          "begin", "loss 4", "end"]
    with pytest.raises(FloatingPointError), rec.step(batch=torch.zeros(1)):
        raise FloatingPointError("nan loss")
    assert fake.calls[-2:] == ["begin", "end FloatingPointError"]
    accelerator.clip_grad_norm_(model.parameters(), 2.0)
    assert fake.grad_clip == 2.0
    rec.close()


@pytest.mark.parametrize(("mixed_precision", "clip"), [("no", None), ("no", 0.1),
                                                      ("bf16", 0.1)])
def test_the_replay_runs_the_steps_as_accelerate_did(tmp_path: Path, lm: ModuleType,
                                                     mixed_precision: str,
                                                     clip: float | None) -> None:
    """every_n mode: replay first re-runs steps 0..4 from the state kept at step 0 (two
    micro-batches each, the epoch's last step one, every loss divided by 2, clipped or not,
    the scheduler's lrs), then step 5, whose loss is finite: the replayed loss is the run's
    only if every recorded step ran as Accelerate ran it. (Without clipping, a step of one
    micro-batch divided by 1 instead of 2 changes it; clipping to 0.1 hides that factor.)"""
    from analyzer.replayer import replay

    rec = accelerate_train.train(str(tmp_path), mixed_precision=mixed_precision,
                                 accumulation=2, clip=clip, bad=4, bad_epoch=1, every_n=10,
                                 models=lm)
    assert rec.capture_path == str(tmp_path / "capture" / "step_5"), rec.errors
    meta = meta_of(rec.capture_path)
    assert meta["history_steps"] == [0, 1, 2, 3, 4] and meta["trigger"]["what"] == "param"
    run_loss = meta["loss_value"]
    assert isinstance(run_loss, float)
    result = replay(str(tmp_path))
    as_run = result.passes[0]
    assert as_run.loss == pytest.approx(run_loss, rel=1e-6), (as_run, run_loss)
    assert (result.layer, result.op.names if result.op else None) == ("head", ("log",))


def test_a_model_that_returns_its_own_loss(tmp_path: Path, lm: ModuleType) -> None:
    """The Hugging Face shape of a step, ``model(**batch)["loss"]`` (step kind model_loss),
    with two micro-batches a step."""
    rec = accelerate_train.train(str(tmp_path), accumulation=2, kind="model_loss", models=lm)
    assert rec.capture_path == str(tmp_path / "capture" / "step_1"), rec.errors
    meta = meta_of(rec.capture_path)
    assert meta["step_call"]["kind"] == "model_loss" and "loss" not in meta
    assert meta["accumulation"]["failing"] == 1
    assert layer_and_op(analyse(tmp_path)) == ("net.head", ("log",))


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_regression_autocast_covers_only_the_models_forward(tmp_path: Path, lm: ModuleType,
                                                             mixed_precision: str) -> None:
    """The step adds a similarity term computed outside the model (logits @ logits.T). Under
    bf16 Accelerate ran that matmul in float32 on the float32 outputs of the autocast
    forward; a replay that autocast the whole step ran it in bfloat16 (25.6104 for the
    run's 25.5978). The capture records the autocast's scope, and the replay agrees."""
    from analyzer.replayer import replay

    rec = accelerate_train.train(str(tmp_path), mixed_precision=mixed_precision,
                                 accumulation=2, bad=4,
                                 bad_epoch=1, every_n=10, kind="step_fn", models=lm)
    assert rec.capture_path == str(tmp_path / "capture" / "step_5"), rec.errors
    meta = meta_of(rec.capture_path)
    assert meta["trigger"]["what"] == "param" and isinstance(meta["loss_value"], float)
    assert replay(str(tmp_path)).passes[0].loss == pytest.approx(meta["loss_value"], rel=1e-6)


@pytest.mark.parametrize(("mixed_precision", "enabled", "expected"),
                         [("no", True, None), ("bf16", True, torch.bfloat16),
                          ("bf16", False, None)])
def test_the_autocast_dtype_is_what_accelerate_autocasts_to(
        mixed_precision: str, enabled: bool, expected: torch.dtype | None,
        lm: ModuleType) -> None:
    """An AutocastKwargs(enabled=False) handler turns Accelerate's autocast off: checked by
    the dtype the prepared model's forward really computes in."""
    from accelerate import Accelerator
    from accelerate.utils import AutocastKwargs

    from analyzer.capture.accelerate import autocast_dtype

    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision,
                              kwargs_handlers=[AutocastKwargs(enabled=enabled)])
    model = accelerator.prepare(lm.make_embed_net())
    seen: list[torch.dtype] = []
    model.body[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    model(torch.ones(2, 4))
    assert seen == [expected or torch.float32]
    assert autocast_dtype(accelerator) == expected


def test_the_guard_refuses_the_updates_of_nan_gradients_and_the_run_reads_healthy(
        tmp_path: Path, lm: ModuleType) -> None:
    """guard={"skip_nonfinite": True}: batch 3 (step 1, micro-batch 1, in each of the two
    epochs) makes NaN gradients; the guard refuses both updates, the recorder captures
    neither, and the analyzer reads a healthy run with the two guarded steps."""
    from analyzer.capture.guard import StepGuard
    from analyzer.tags import TagRole, layer_from_tag, role
    from tests.readonly import analyse_read_only

    with pytest.warns(UserWarning, match="gradient of body.0.weight is nan at step 1"):
        rec = accelerate_train.train(str(tmp_path), accumulation=2, clip=1.0,
                                     guard={"every": 1, "skip_nonfinite": True}, models=lm)
    guard = rec.guard
    assert isinstance(guard, StepGuard) and guard.skipped == 2
    assert guard.first_fault is not None and guard.first_fault.step == 1
    assert not rec.captured and rec.recorder is not None
    assert all(bool(p.isfinite().all()) for p in rec.recorder.model.parameters())
    result = analyse_read_only(tmp_path)
    assert result.status == "finite" and not result.run.captures
    assert result.scale is not None and result.scale.guarded == frozenset({1, 4})
    layers = {layer_from_tag(s.tag) for s in result.run.series
              if role(s.tag) is TagRole.LAYER_GRAD}
    assert layers == {"body.0", "body.2"}  # full module paths
