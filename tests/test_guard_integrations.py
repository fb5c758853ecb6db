"""The guarded step as an option of the Lightning and Hugging Face integrations.

Real trainings on the CPU, each read back as ``forensics analyze`` reads its folder:

- two bad batches (a zero sample that ``LitNet``'s normalisation turns into 0/0, a padded
  row that the Llama's ``rms_norm_eps=0`` turns into rsqrt(0)) under ``skip_nonfinite``:
  the guard refuses both updates, training finishes with finite weights, the recorder
  running beside the guard leaves no capture of a refused step, and the folder is a healthy
  run with the guard's per-layer norms and its two refusals;
- a training that really diverges under the same option: a failed run whose first layer
  is named from the guard's norms.

Accelerate's option (``recorder_for(..., guard=...)``, analyzer/capture/accelerate.py) is
read back the same way, in the loop docs/capture.md shows.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from analyzer.capture.guard import StepGuard
from analyzer.model import RunResult
from analyzer.tags import TagRole, layer_from_tag, role
from tests.readonly import analyse_read_only
from tests.test_capture_hf import tiny_llama

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true"}


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    with warnings.catch_warnings():
        # The frameworks' advice and the guard's own warning are no part of what is tested.
        warnings.simplefilter("ignore")
        yield


def _finite(model: torch.nn.Module) -> bool:
    return all(bool(p.isfinite().all()) for p in model.parameters())


def _layers(result: RunResult) -> dict[str, set[str]]:
    """The layers the analyzer reads from the guard's tags, by role."""
    out: dict[str, set[str]] = {}
    for s in result.run.series:
        if s.tag.startswith(("grad_norm/", "weight_norm/")) and s.tag != "grad_norm/total":
            layer = layer_from_tag(s.tag)
            assert layer is not None, s.tag
            out.setdefault(role(s.tag).name, set()).add(layer)
    return out


# -- Lightning -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The Lightning training script of tests/integrations as a project module of the
    user's (a replay never imports factories from this tool's own tree)."""
    pytest.importorskip("lightning")
    from tests.integrations.loop_models import project_module

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with project_module(tmp_path_factory.mktemp("guardlit"), "guard_lit_project",
                            ROOT / "tests" / "integrations" / "lightning_train.py") as module:
            yield module


def _fit(lit: ModuleType, out: Path, callback: Any, *, zeros: tuple[int, ...] = (),
         lr: float = 0.05, layer: str = "normalize", steps: int = 12,
         logger: bool = True, accumulate: int = 1, **trainer_options: Any) -> Any:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    pl.seed_everything(0, verbose=False)
    data = lit.data(samples=4 * steps * accumulate, zero=None)
    for i in zeros:
        data.tensors[0][i] = 0.0  # sample i is in batch i // 4
    module = lit.LitNet(lr=lr, layer=layer)
    trainer = pl.Trainer(default_root_dir=str(out), max_steps=steps, accelerator="cpu",
                         devices=1, callbacks=[callback], log_every_n_steps=1,
                         logger=logger, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accumulate_grad_batches=accumulate,
                         **trainer_options)
    trainer.fit(module, DataLoader(data, batch_size=4, shuffle=False))
    return module


def test_lightning_guard_option_refuses_two_nan_batches_and_the_run_reads_healthy(
        tmp_path: Path, lit: ModuleType) -> None:
    from analyzer.capture.lightning import FlightRecorderCallback

    callback = FlightRecorderCallback(guard={"every": 4, "skip_nonfinite": True})
    module = _fit(lit, tmp_path, callback, zeros=(13, 29))  # batches 3 and 7
    guard = callback.guard
    assert isinstance(guard, StepGuard) and guard.skipped == 2 and _finite(module)
    assert guard.first_fault is not None and guard.first_fault.step == 3
    assert callback.recorder is not None and callback.capture_path is None
    version = tmp_path / "lightning_logs" / "version_0"
    # The logger's own writer: one event file, the norms beside the module's train_loss.
    assert len(list(version.glob("events.out.tfevents.*"))) == 1
    result = analyse_read_only(tmp_path)
    assert result.status == "finite" and not result.run.captures
    assert result.scale is not None and result.scale.guarded == frozenset({3, 7})
    layers = _layers(result)
    assert layers[TagRole.LAYER_GRAD.name] == {"net.0", "net.3"}  # full module paths
    assert layers[TagRole.LAYER_WEIGHT.name] == {"net.0", "net.3"}


def test_lightning_guard_option_with_accumulated_batches_guards_each_optimizer_step(
        tmp_path: Path, lit: ModuleType) -> None:
    # Two batches an optimizer step: the zero sample in batch 7 is optimizer step 3's.
    from analyzer.capture.lightning import FlightRecorderCallback

    callback = FlightRecorderCallback(guard={"every": 2, "skip_nonfinite": True})
    module = _fit(lit, tmp_path, callback, zeros=(29,), steps=6, accumulate=2)
    assert callback.guard is not None and callback.guard.skipped == 1 and _finite(module)
    assert callback.capture_path is None
    result = analyse_read_only(tmp_path)
    assert result.status == "finite"
    assert result.scale is not None and result.scale.guarded == frozenset({3})
    steps = {int(v) for s in result.run.series if s.tag.startswith("weight_norm/")
             for v in s.steps.tolist()}
    assert steps == {0, 2, 4}  # once an optimizer step, at its own number


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_lightning_guard_option_under_mixed_precision(tmp_path: Path, lit: ModuleType,
                                                      precision: str) -> None:
    # bf16-mixed has no scaler: the guard refuses. Under 16-mixed the plugin's GradScaler
    # skips the non-finite steps itself; the guard logs its scale and refuses nothing.
    from lightning.pytorch.plugins.precision import MixedPrecision

    from analyzer.capture.guard import SCALE_TAG
    from analyzer.capture.lightning import FlightRecorderCallback

    options: dict[str, Any] = {"plugins": [MixedPrecision(
        "16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]} \
        if precision == "16-mixed" else {"precision": precision}
    callback = FlightRecorderCallback(record=False, guard={"every": 4, "skip_nonfinite": True})
    module = _fit(lit, tmp_path, callback, zeros=(13, 29), **options)
    guard = callback.guard
    assert guard is not None and _finite(module)
    result = analyse_read_only(tmp_path)
    assert TagRole.LAYER_GRAD.name in _layers(result)
    if precision == "bf16-mixed":
        assert guard.skipped == 2 and result.status == "finite"
        assert result.scale is not None and result.scale.guarded == frozenset({3, 7})
    else:
        assert guard.skipped == 0 and guard.last_fault is None
        assert any(s.tag == SCALE_TAG for s in result.run.series)
        assert result.scale is not None and {3, 7} <= set(result.overflow_skips)


def test_lightning_a_backward_that_raised_is_still_captured_beside_the_guard(
        tmp_path: Path, lit: ModuleType) -> None:
    # detect_anomaly raises in step 3's backward: the guard never sees that step, the
    # recorder captures it, as without the guard.
    from analyzer.capture.lightning import FlightRecorderCallback

    callback = FlightRecorderCallback(guard={"every": 1, "skip_nonfinite": True})
    with pytest.raises(RuntimeError, match="nan"):
        lit.train(str(tmp_path), anomaly=True, layer="norm_feature", recorder=callback)
    assert callback.guard is not None and callback.guard.skipped == 0
    assert callback.capture_path is not None and callback.capture_path.endswith("step_3")
    result = analyse_read_only(tmp_path)
    assert result.status != "finite" and result.run.captures
    assert TagRole.LAYER_GRAD.name in _layers(result)  # steps 0..2, written before it raised


def test_lightning_guard_alone_without_a_logger_writes_into_the_run_folder(
        tmp_path: Path, lit: ModuleType) -> None:
    from analyzer.capture.lightning import FlightRecorderCallback

    callback = FlightRecorderCallback(record=False, guard={"every": 4, "skip_nonfinite": True})
    module = _fit(lit, tmp_path, callback, zeros=(13, 29), logger=False)
    assert callback.recorder is None and callback.guard is not None
    assert callback.guard.skipped == 2 and _finite(module)
    assert list(tmp_path.glob("events.out.tfevents.*"))  # its own SummaryWriter, closed
    result = analyse_read_only(tmp_path)
    assert result.status == "finite"
    assert result.scale is not None and result.scale.guarded == frozenset({3, 7})
    assert "net.2" not in _layers(result)[TagRole.LAYER_GRAD.name]  # no parameters there


def test_lightning_run_that_diverges_under_the_guard_is_failed_at_a_layer(
        tmp_path: Path, lit: ModuleType) -> None:
    # SGD at lr 5 on the unnormalised feature: the first layer's weights run away (their
    # norm overflows), the loss follows, and from the first NaN gradient on every update
    # is refused to the end of training.
    from analyzer.capture.lightning import FlightRecorderCallback

    callback = FlightRecorderCallback(guard={"every": 4, "skip_nonfinite": True})
    _fit(lit, tmp_path, callback, lr=5.0, layer="norm_feature", steps=24)
    assert callback.guard is not None and callback.guard.skipped > 5
    result = analyse_read_only(tmp_path)
    assert result.status != "finite"
    lay = result.layer_incident
    assert lay is not None and lay.layer == "net.0"
    assert lay.tag.startswith(("grad_norm/net.", "weight_norm/net."))  # the guard's


def test_lightning_guard_options_are_checked_when_the_callback_is_built() -> None:
    pytest.importorskip("lightning")
    from analyzer.capture.lightning import FlightRecorderCallback

    with pytest.raises(TypeError, match="evry is not an option of StepGuard"):
        FlightRecorderCallback(guard={"evry": 4})
    with pytest.raises(TypeError, match="guard= takes True"):
        FlightRecorderCallback(guard="yes")
    with pytest.raises(ValueError, match="record=False"):
        FlightRecorderCallback(record=False)
    assert FlightRecorderCallback(guard=True).guard_options == {}
    assert FlightRecorderCallback().guard_options is None


# -- Hugging Face Trainer ---------------------------------------------------------------

ROWS, LENGTH, VOCAB = 32, 8, 32




def _rows(padded: tuple[int, ...]) -> list[dict[str, torch.Tensor]]:
    """Token rows, the last three tokens of each row in ``padded`` being padding: the
    RMSNorm of a padded position (its embedding row is zero) is rsqrt(0)."""
    ids = torch.randint(3, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(0))
    for row in padded:
        ids[row, LENGTH - 3:] = 0
    return [{"input_ids": r, "attention_mask": (r != 0).long(),
             "labels": torch.where(r == 0, -100, r)} for r in ids]


def _hf_train(out: Path, *, padded: tuple[int, ...] = (), flight_recorder: Any = None,
              guard: Any = None, **overrides: Any) -> Any:
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from analyzer.capture.hf import FlightRecorderTrainer

    options: dict[str, Any] = {
        "output_dir": str(out), "max_steps": 8, "per_device_train_batch_size": 4,
        "use_cpu": True, "seed": 0, "report_to": ["tensorboard"], "logging_steps": 1,
        "save_strategy": "no", "train_sampling_strategy": "sequential",
        "disable_tqdm": True, "dataloader_num_workers": 0}
    trainer = FlightRecorderTrainer(model=tiny_llama(),
                                    args=TrainingArguments(**(options | overrides)),
                                    train_dataset=_rows(padded),
                                    flight_recorder=flight_recorder, guard=guard)
    trainer.train()
    return trainer


@pytest.mark.parametrize("bf16", [False, True])
def test_hf_guard_option_refuses_two_padded_batches_and_the_run_reads_healthy(
        tmp_path: Path, bf16: bool) -> None:
    # Rows 13 and 29: the Trainer's steps 4 and 8 (it counts from 1); steps 9 and 10 (the
    # next epoch's first rows) show that training went on after the second refusal.
    trainer = _hf_train(tmp_path, padded=(13, 29), guard={"every": 2, "skip_nonfinite": True},
                        max_steps=10, bf16=bf16)
    guard = trainer.step_guard
    assert isinstance(guard, StepGuard) and guard.skipped == 2 and _finite(trainer.model)
    assert guard.first_fault is not None and guard.first_fault.step == 4
    assert trainer.flight_recorder is not None and trainer.flight_recorder.capture_path is None
    assert not (tmp_path / "capture").exists()
    # The TensorBoardCallback's writer: the norms are in the Trainer's runs/<date>/ events,
    # the only event file.
    assert len(list(tmp_path.rglob("events.out.tfevents.*"))) == 1
    assert len(list(tmp_path.glob("runs/*/events.out.tfevents.*"))) == 1
    nan_norms = [h["step"] for h in trainer.state.log_history
                 if "grad_norm" in h and h["grad_norm"] != h["grad_norm"]]
    assert nan_norms == [4, 8]  # the Trainer's own NaN grad_norm, at the guard's steps
    result = analyse_read_only(tmp_path)
    assert result.status == "finite" and not result.run.captures
    assert result.scale is not None and result.scale.guarded == frozenset({4, 8})
    layers = _layers(result)
    assert "model.layers.0.input_layernorm" in layers[TagRole.LAYER_GRAD.name]
    assert "model.layers.0.self_attn.q_proj" in layers[TagRole.LAYER_WEIGHT.name]


def test_hf_run_that_diverges_under_the_guard_is_failed_at_a_layer(tmp_path: Path) -> None:
    # Plain SGD at lr 30 with no clipping: the loss runs away (1e8 by step 5), and from
    # the step whose gradients are NaN every update is refused to the end.
    trainer = _hf_train(tmp_path, guard={"every": 2, "skip_nonfinite": True}, optim="sgd",
                        learning_rate=30.0, max_grad_norm=0.0, max_steps=16,
                        lr_scheduler_type="constant")
    guard = trainer.step_guard
    assert guard is not None and guard.skipped > 0
    result = analyse_read_only(tmp_path)
    assert result.status != "finite"
    lay = result.layer_incident
    assert lay is not None and lay.tag.startswith(("grad_norm/", "weight_norm/"))  # the guard's
    assert lay.layer in dict(trainer.model.named_modules())  # a layer of the model, by path


def test_hf_guard_alone_and_its_options(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from analyzer.capture.hf import FlightRecorderTrainer

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(TypeError, match="evry is not an option of StepGuard"):
        FlightRecorderTrainer(model=tiny_llama(), args=args, guard={"evry": 2})
    with pytest.raises(ValueError, match="flight_recorder=False"):
        FlightRecorderTrainer(model=tiny_llama(), args=args, flight_recorder=False)
    # No TensorBoardCallback: the guard's own SummaryWriter in output_dir, its norms the
    # run's only events (every=2: the steps after the refusal say training went on).
    trainer = _hf_train(tmp_path / "alone", padded=(13,), flight_recorder=False,
                        guard={"every": 2, "skip_nonfinite": True}, report_to=[])
    assert trainer.flight_recorder is None and trainer.step_guard.skipped == 1
    assert list((tmp_path / "alone").glob("events.out.tfevents.*"))
    result = analyse_read_only(tmp_path / "alone")
    assert result.status == "finite"
    assert result.scale is not None and result.scale.guarded == frozenset({4})


# -- Accelerate ---------------------------------------------------------------------------


@pytest.fixture
def accelerate_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """tests/integrations/loop_models.py as a project module of the user's, and a fresh
    process-wide Accelerate state for the test's own Accelerator."""
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    from tests.integrations.loop_models import project_module

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        with project_module(tmp_path_factory.mktemp("guardacc"), "guard_acc_project") as m:
            yield m
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def _accelerate_loop(out: Path, models: ModuleType, *, zero: tuple[int, ...] = (),
                     steps: int = 10, accumulation: int = 1, lr: float = 0.1,
                     tracker: bool = True, **options: Any) -> Any:
    """The loop of docs/capture.md with recorder_for(..., **options); batches in ``zero``
    hold a row of zeros, which the model's RowNorm makes 0/0."""
    from accelerate import Accelerator

    from analyzer.capture.accelerate import recorder_for

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation,
                              log_with="tensorboard" if tracker else None,
                              project_dir=str(out))
    if tracker:
        accelerator.init_trackers("tb")
    model = models.make_net(normalise=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    recorder = recorder_for(accelerator, out, model, optimizer,
                            model_factory=models.make_net, model_kwargs={"normalise": True},
                            loss_factory=models.nll, seed=0, **options)
    loss_fn = models.nll()
    data = models.batches(steps * accumulation, outlier=0.0)
    for i in zero:
        data[i][0][0] = 0.0
    for i, (x, y) in enumerate(data):
        with accelerator.accumulate(model), recorder.step(inputs=x, targets=y):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if tracker:
            accelerator.log({"train/loss": loss.item()}, step=i // accumulation)
    recorder.close()
    accelerator.end_training()
    return recorder, model


def test_accelerate_guard_option_refuses_two_nan_batches_and_the_run_reads_healthy(
        tmp_path: Path, accelerate_models: ModuleType) -> None:
    recorder, model = _accelerate_loop(tmp_path, accelerate_models, zero=(3, 7),
                                       guard={"every": 2, "skip_nonfinite": True})
    guard = recorder.guard
    assert isinstance(guard, StepGuard) and guard.skipped == 2 and _finite(model)
    assert recorder.recorder is not None and recorder.capture_path is None
    # The tracker's own writer: the norms beside the loop's train/loss.
    assert len(list(tmp_path.rglob("events.out.tfevents.*"))) == 1
    result = analyse_read_only(tmp_path)
    assert result.status == "finite" and not result.run.captures
    assert result.scale is not None and result.scale.guarded == frozenset({3, 7})
    assert _layers(result)[TagRole.LAYER_GRAD.name] == {"body.0", "body.2"}


def test_accelerate_guard_with_accumulation_checks_the_step_that_synchronises(
        tmp_path: Path, accelerate_models: ModuleType) -> None:
    # Two micro-batches a step: batch 5 is step 2's second; the guard alone, its own writer.
    recorder, model = _accelerate_loop(tmp_path, accelerate_models, zero=(5,), steps=5,
                                       accumulation=2, tracker=False, record=False,
                                       guard={"every": 1, "skip_nonfinite": True})
    assert recorder.recorder is None and recorder.guard is not None
    assert recorder.guard.skipped == 1 and _finite(model)
    result = analyse_read_only(tmp_path)
    assert result.status == "finite"
    assert result.scale is not None and result.scale.guarded == frozenset({2})
    steps = {int(v) for s in result.run.series if s.tag.startswith("weight_norm/")
             for v in s.steps.tolist()}
    assert steps == {0, 1, 2, 3, 4}  # once an optimizer step


def test_accelerate_run_that_diverges_under_the_guard_is_failed_at_a_layer(
        tmp_path: Path, accelerate_models: ModuleType) -> None:
    # Adam at lr 10: the first update sends the logits so far that the softmax underflows,
    # log(0) from step 1 on, and every update from there to the end is refused.
    recorder, _ = _accelerate_loop(tmp_path, accelerate_models, lr=10.0, steps=16,
                                   guard={"every": 2, "skip_nonfinite": True})
    assert recorder.guard is not None and recorder.guard.skipped == 15
    result = analyse_read_only(tmp_path)
    assert result.status != "finite"
    lay = result.layer_incident
    assert lay is not None and lay.step == 1 and lay.layer in {"body.0", "body.2"}
    assert lay.tag.startswith("grad_norm/body.")  # the guard's


def test_accelerate_guard_options() -> None:
    pytest.importorskip("accelerate")
    from analyzer.capture.accelerate import recorder_for

    with pytest.raises(TypeError, match="evry is not an option of StepGuard"):
        recorder_for(object(), "run", torch.nn.Linear(1, 1), None, guard={"evry": 2})
    with pytest.raises(ValueError, match="record=False"):
        recorder_for(object(), "run", torch.nn.Linear(1, 1), None, record=False)


# -- the recorder beside the guard ---------------------------------------------------------


def test_regression_a_refused_step_is_left_out_of_the_steps_a_replay_reruns(
        tmp_path: Path) -> None:
    # every_n mode: the recorder keeps the state of step 0 and the batches since. Step 2's
    # update is refused (finite loss, NaN gradients: the outlier row's target is the class
    # its softmax keeps, and log(0) elsewhere); step 5 raises and is captured. Had step 2
    # stayed in the history, the replay would run its NaN update unguarded and stop there;
    # dropped, the replay reaches step 5 with the run's own state and loss.
    from analyzer.capture.guarding import drop_step
    from analyzer.capture.recorder import FlightRecorder
    from analyzer.replayer import replay
    from tests.integrations.loop_models import project_module

    (tmp_path / "project").mkdir()
    with project_module(tmp_path / "project", "guard_loop_project") as models:
        torch.manual_seed(0)
        model = models.make_net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        run = tmp_path / "run"
        rec = FlightRecorder(run, model, opt, model_factory=models.make_net,
                             loss_factory=models.nll, every_n=10, seed=0)
        guard = StepGuard(model, log_dir=run, every=1, skip_nonfinite=True)
        loss_fn = models.nll()
        data = models.batches(6, bad=2, outlier=1e3)
        with pytest.raises(FloatingPointError):
            for step, (x, y) in enumerate(data):
                if step == 2:
                    with torch.no_grad():
                        y[0] = model(x)[0].argmax()
                with rec.step(inputs=x, targets=y):
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn(model(x), y)
                    rec.loss(loss)
                    loss.backward()  # type: ignore[no-untyped-call]
                    if step == 5:
                        raise FloatingPointError("the loop's own stop at step 5")
                    if guard.after_backward(step):
                        opt.step()
                    else:
                        drop_step(rec)
                    guard.after_update(step)
        guard.close()
        assert guard.skipped == 1 and guard.first_fault is not None
        assert guard.first_fault.step == 2 and guard.first_fault.tensor == "gradient"
        assert rec.capture_path is not None and rec.capture_path.endswith("step_5")
        meta = json.loads((Path(rec.capture_path) / "meta.json").read_text(encoding="utf-8"))
        assert meta["history_steps"] == [0, 1, 3, 4]
        result = replay(rec.capture_path)
        assert result.passes[0].loss == pytest.approx(meta["loss_value"], rel=1e-6)
