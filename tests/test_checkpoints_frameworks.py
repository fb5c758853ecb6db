"""Checkpoints as the frameworks write them, read by meaning (issue #15).

Lightning, Hugging Face Trainer and Accelerate checkpoints come from tiny CPU trainings
with the real libraries in tmp_path (the shared corpus of tests/frameworks where it has
the run); DeepSpeed's (not installed) from torch.save of dicts with the key names its
engine writes. The tests that read a folder check that nothing is written into it.
"""

from __future__ import annotations

import io
import json
import os
import sys
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from analyzer.cli import main
from analyzer.cli.inspect import inspect_command
from analyzer.ingest.checkpoints import (
    checkpoint_incident,
    is_checkpoint_file,
    scan_checkpoint,
    scan_run_checkpoints,
)
from analyzer.model import CheckpointScan
from analyzer.report.checkpoints import format_scan
from tests.frameworks import corpus
from tests.readonly import snapshot


def _ckpts(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and is_checkpoint_file(str(p)))


# Lightning --------------------------------------------------------------------------------


def _lightning(root: Path, *, epochs: int) -> Path:
    """A Lightning 2.6 fit with ModelCheckpoint(monitor="val_loss", save_top_k=3) and
    EarlyStopping: until three saves exist ModelCheckpoint's ``kth_value`` is +inf."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Regressor(pl.LightningModule):
        def __init__(self, lr: float = 0.01, hidden: int = 8, name: str = "tiny",
                     data_dir: Path | None = None) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            loss = nn.functional.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, _: int) -> None:
            self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    callbacks = [ModelCheckpoint(monitor="val_loss", save_top_k=3, filename="{epoch}-{step}"),
                 EarlyStopping(monitor="val_loss", patience=5, check_finite=False)]
    trainer = pl.Trainer(default_root_dir=str(root), max_epochs=epochs, accelerator="cpu",
                         devices=1, callbacks=callbacks, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1)
    # A Path among the hyperparameters makes weights_only refuse the file: it is read
    # statically, as many real checkpoints must be.
    trainer.fit(Regressor(data_dir=root / "data"), data, data)
    return root


@pytest.fixture(scope="module")
def lightning_healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _lightning(tmp_path_factory.mktemp("lightning_healthy"), epochs=3)


def test_regression_lightning_kth_value_inf_is_not_a_failure(lightning_healthy: Path) -> None:
    before = snapshot(lightning_healthy)
    paths = _ckpts(lightning_healthy)
    assert len(paths) == 3
    first = scan_checkpoint(paths[0])
    # The defect: ModelCheckpoint's kth_value = tensor(inf) counted as a non-finite tensor.
    kth = [t for t in first.tensors if t.name.endswith(".kth_value")]
    assert kth and kth[0].stats is not None and kth[0].stats.pos_inf == 1
    assert kth[0].role == "callback" and not kth[0].evidence
    assert first.nonfinite_tensors == () and not first.has_nonfinite
    assert [t.name for t in first.nonfinite_metadata] == [kth[0].name]
    history = scan_run_checkpoints(paths)
    assert history.first_nonfinite is None and checkpoint_incident(history) is None
    assert [s.nonfinite_tensors for s in history.saves] == [0, 0, 0]
    assert main(["analyze", str(lightning_healthy), "-q"]) == 0
    assert inspect_command(paths, stream=io.StringIO()) == 0
    assert snapshot(lightning_healthy) == before


def test_lightning_checkpoint_sections_and_metadata(lightning_healthy: Path) -> None:
    scan = scan_checkpoint(_ckpts(lightning_healthy)[0])
    # data_dir is a PosixPath: weights_only refuses it, the static reading gives the rest.
    assert scan.read_mode == "static" and scan.static is not None
    assert "pathlib.PosixPath" in scan.static.globals_wanted
    assert (scan.format, scan.step, scan.step_source) == ("lightning", 4, "'global_step' key")
    meta = scan.meta
    assert meta is not None
    assert (meta.framework, meta.global_step, meta.epoch) == ("lightning", 4, 0)
    import lightning

    assert meta.framework_version == lightning.__version__
    assert meta.hyperparameters == {"lr": 0.01, "hidden": 8, "name": "tiny"}
    assert meta.hyperparameters_other == ("data_dir",)
    assert meta.sections["state_dict"] == "weights"
    assert meta.sections["optimizer_states"] == "optimizer"
    assert meta.sections["callbacks"] == "callback"
    assert meta.sections["loops"] == "loop"
    assert meta.sections["lr_schedulers"] == "scheduler"
    assert meta.sections["hyper_parameters"] == "hyperparameters"
    by_name = {c.callback: c for c in meta.callbacks}
    checkpoint = by_name["ModelCheckpoint"]
    assert checkpoint.monitor == "val_loss" and checkpoint.values["kth_value"] == float("inf")
    assert by_name["EarlyStopping"].values["wait_count"] == 0
    assert by_name["EarlyStopping"].monitor == "val_loss"  # from its state key
    assert meta.counters["loops.fit_loop.epoch_loop.batch_progress.total.completed"] == 4
    assert meta.schedulers[0]["_last_lr.0"] == pytest.approx(0.001)
    roles = {t.role for t in scan.tensors}
    assert roles == {"weights", "optimizer", "callback"}
    assert scan.adam == ()  # SGD: momentum buffers, scanned as optimizer state
    assert all(t.role == "weights" for t in scan.tensors if t.group == "model")
    text = format_scan(scan)
    assert "kth_value (callback) nan=0 +inf=1" in text and "0 holding non-finite" in text
    encoded = scan.to_dict()
    json.dumps(encoded, allow_nan=False)
    assert encoded["meta"]["callbacks"][1]["values"]["kth_value"] == "inf"


def test_lightning_weights_gone_nan_are_still_found(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The corpus' diverging Lightning run: its saves also hold kth_value = inf (a
    ModelCheckpoint without a monitor), and the NaN weights are still the finding."""
    run = corpus.get("lightning_nan", tmp_path_factory)
    before = snapshot(run)
    history = scan_run_checkpoints(_ckpts(run))
    assert [s.step for s in history.saves] == [8, 16, 24, 32, 40]
    assert history.first_nonfinite == 3 and history.nonfinite_layers == ("net.0", "net.2")
    first = history.scans[3]
    assert first.nonfinite_tensors and all(t.role == "weights" for t in first.nonfinite_tensors
                                           if t.group == "model")
    assert {t.role for t in first.nonfinite_tensors} <= {"weights", "optimizer"}
    assert all(any(t.name.endswith(".kth_value") for t in s.nonfinite_metadata)
               for s in history.scans)
    incident = checkpoint_incident(history)
    assert incident is not None and incident.tag.startswith("checkpoint/net.")
    assert (incident.step, incident.last_finite_step) == (32, 24)
    assert main(["analyze", str(run), "-q"]) == 1
    assert snapshot(run) == before


def test_lightning_fp16_scaler_state_is_read_as_evidence(tmp_path: Path) -> None:
    """A real "16-mixed" Lightning checkpoint on CPU (the plugin given a CPU GradScaler):
    the precision plugin files the scaler's state under its class name."""
    import lightning.pytorch as pl
    from lightning.pytorch.plugins import MixedPrecision
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    x = torch.randn(16, 4)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    trainer = pl.Trainer(default_root_dir=str(tmp_path), max_epochs=1, accelerator="cpu",
                         devices=1, plugins=[plugin], enable_progress_bar=False,
                         enable_model_summary=False, logger=False)
    trainer.fit(Tiny(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    (path,) = _ckpts(tmp_path)
    scan = scan_checkpoint(path)
    assert scan.scaler is not None and scan.scaler.key == "MixedPrecision"
    assert scan.scaler.scale is not None and scan.scaler.scale > 0
    assert scan.meta is not None and scan.meta.sections["MixedPrecision"] == "scaler"
    assert scan.meta.precision == "16-mixed"
    assert not scan.has_nonfinite


# Hugging Face Trainer and Accelerate ------------------------------------------------------


def test_hf_trainer_checkpoint_n_steps_from_their_folders(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run = corpus.get("hf_healthy", tmp_path_factory)
    before = snapshot(run)
    paths = _ckpts(run)
    # scheduler.pt, rng_state.pth and training_args.bin are run metadata, not checkpoints.
    assert [os.path.relpath(p, run) for p in paths] == [
        "checkpoint-10/model.safetensors", "checkpoint-10/optimizer.pt",
        "checkpoint-20/model.safetensors", "checkpoint-20/optimizer.pt"]
    history = scan_run_checkpoints(paths)
    assert [(s.step, s.step_source) for s in history.scans] == [(10, "folder name")] * 2 + \
        [(20, "folder name")] * 2
    assert [s.format for s in history.scans] == ["safetensors", "optimizer"] * 2
    assert {t.role for t in history.scans[0].tensors} == {"weights"}
    assert {t.role for t in history.scans[1].tensors} == {"optimizer"}
    assert history.first_nonfinite is None
    assert snapshot(run) == before


def test_hf_trainer_first_nan_save_by_its_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = corpus.get("hf_nan", tmp_path_factory)
    history = scan_run_checkpoints(_ckpts(run))
    assert [s.step for s in history.saves] == [8, 8, 16, 16, 24, 24]
    assert history.first_nonfinite is not None
    first = history.scans[history.first_nonfinite]
    assert (first.step, first.step_source) == (16, "folder name")
    assert all(t.role in ("weights", "optimizer") for t in first.nonfinite_tensors)
    assert not any(s.has_nonfinite for s in history.scans[: history.first_nonfinite])


# Lightning runs of the shared corpus ------------------------------------------------------


def test_corpus_lightning_healthy_inf_only_in_bookkeeping(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Every save of the corpus' healthy run holds kth_value = inf (a second ModelCheckpoint
    without a monitor keeps it so): none is a finding."""
    run = corpus.get("lightning_healthy", tmp_path_factory)
    paths = _ckpts(run)
    assert len(paths) == 4
    for scan in (scan_checkpoint(p) for p in paths):
        assert not scan.has_nonfinite, scan.path
        assert any(t.name.endswith(".kth_value") for t in scan.nonfinite_metadata), scan.path
        assert scan.meta is not None and scan.meta.framework == "lightning"
    assert inspect_command(paths, stream=io.StringIO()) == 0


def test_corpus_lightning_restart_steps_from_global_step(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run = corpus.get("lightning_restart", tmp_path_factory)
    scans = {os.path.relpath(p, run): scan_checkpoint(p) for p in _ckpts(run)}
    last0 = scans["lightning_logs/version_0/checkpoints/last.ckpt"]
    last1 = scans["lightning_logs/version_1/checkpoints/last.ckpt"]
    assert (last0.step, last0.step_source) == (16, "'global_step' key")
    assert (last1.step, last1.step_source) == (40, "'global_step' key")
    assert last1.meta is not None and last1.meta.epoch == 4


def test_accelerate_save_state_counts_saves_not_steps(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=project)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model, opt = accelerator.prepare(model, opt)
    for _ in range(3):
        accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
        opt.step()
        opt.zero_grad()
    accelerator.save_state()
    accelerator.save_state()
    before = snapshot(tmp_path)
    paths = _ckpts(tmp_path)
    assert [os.path.relpath(p, tmp_path) for p in paths] == [
        f"checkpoints/checkpoint_{i}/{name}" for i in (0, 1)
        for name in ("model.safetensors", "optimizer.bin")]
    scans = [scan_checkpoint(p) for p in paths]
    # checkpoint_1 is the second save, not step 1.
    assert [(s.step, s.step_source) for s in scans] == [(None, None)] * 4
    assert [s.format for s in scans] == ["safetensors", "optimizer"] * 2
    assert not any(s.has_nonfinite for s in scans)
    assert snapshot(tmp_path) == before


# DeepSpeed --------------------------------------------------------------------------------


@pytest.fixture
def fake_deepspeed(monkeypatch: pytest.MonkeyPatch) -> type:
    """DeepSpeed's DynamicLossScaler under its real module name (deepspeed is not
    installed), so torch.save pickles it as DeepSpeed's ZeRO partitions hold it."""
    names = ["deepspeed", "deepspeed.runtime", "deepspeed.runtime.fp16",
             "deepspeed.runtime.fp16.loss_scaler"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    class DynamicLossScaler:
        def __init__(self) -> None:
            self.cur_scale = 65536.0
            self.cur_iter = 500

    DynamicLossScaler.__module__ = names[-1]
    DynamicLossScaler.__qualname__ = "DynamicLossScaler"
    sys.modules[names[-1]].DynamicLossScaler = DynamicLossScaler  # type: ignore[attr-defined]
    return DynamicLossScaler


DS_CONFIG = {"train_batch_size": 8, "gradient_clipping": 1.0,
             "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
             "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW",
                                                              "params": {"lr": 3e-4}}}


def _deepspeed_save(folder: Path, scaler: type, *, step: int, poison: bool) -> Path:
    """What ``DeepSpeedEngine.save_checkpoint(folder)`` writes with ZeRO stage 2 on two
    data-parallel ranks: ``global_stepN/`` with the model states and one optimizer
    partition per rank, and the ``latest`` file naming the tag."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).half()
    weights = model.state_dict()
    if poison:
        weights["1.weight"][0, 0] = float("nan")
    tag = folder / f"global_step{step}"
    tag.mkdir(parents=True)
    torch.save({
        "module": weights, "buffer_names": [], "optimizer": None,
        "param_shapes": [OrderedDict((k, v.shape) for k, v in weights.items())],
        "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
        "lr_scheduler": {"last_batch_iteration": step - 1, "_last_lr": [3e-4]},
        "data_sampler": None, "random_ltd": None, "sparse_tensor_module_names": set(),
        "skipped_steps": 3, "global_steps": step, "global_samples": step * 8,
        "dp_world_size": 2, "mp_world_size": 1, "ds_config": DS_CONFIG, "ds_version": "0.16.4",
    }, tag / "mp_rank_00_model_states.pt")
    numel = sum(v.numel() for v in weights.values())
    for rank in (0, 1):
        flat = torch.randn(numel // 2)
        moments = {"step": torch.tensor(float(step)), "exp_avg": flat.clone(),
                   # NaN in a partition is not read: the file is listed, never loaded.
                   "exp_avg_sq": torch.full_like(flat, float("nan") if poison else 1e-4)}
        torch.save({
            "optimizer_state_dict": {
                "loss_scaler": scaler(), "dynamic_loss_scale": True, "overflow": False,
                "clip_grad": 1.0,
                "base_optimizer_state": {"state": {0: moments}, "param_groups": [
                    {"lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0]}]},
                "single_partition_of_fp32_groups": [flat], "zero_stage": 2,
                "group_paddings": [0], "partition_count": [2], "ds_version": "0.16.4",
                "param_slice_mappings": [OrderedDict()],
            },
            "ds_config": DS_CONFIG, "ds_version": "0.16.4",
        }, tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (folder / "latest").write_text(f"global_step{step}")
    return tag


def test_deepspeed_zero_folder_is_listed_by_role(tmp_path: Path, fake_deepspeed: type) -> None:
    tag = _deepspeed_save(tmp_path / "ckpt", fake_deepspeed, step=500, poison=False)
    before = snapshot(tmp_path)
    model = scan_checkpoint(str(tag / "mp_rank_00_model_states.pt"))
    assert (model.format, model.read_mode) == ("deepspeed", "weights_only")
    assert (model.step, model.step_source) == (500, "'global_steps' key")
    assert {t.role for t in model.tensors} == {"weights"}
    assert all(t.stats is not None for t in model.tensors)
    meta = model.meta
    assert meta is not None
    assert (meta.framework, meta.framework_version, meta.global_step) == (
        "deepspeed", "0.16.4", 500)
    assert meta.precision == "fp16" and meta.hyperparameters["zero_optimization.stage"] == 2
    assert meta.counters == {"skipped_steps": 3, "global_samples": 4000, "dp_world_size": 2,
                             "mp_world_size": 1}
    assert meta.sections["lr_scheduler"] == "scheduler"
    assert meta.sections["param_shapes"] == "metadata"
    shard = scan_checkpoint(str(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    assert shard.format == "zero_optimizer"
    assert (shard.step, shard.step_source) == (500, "folder name")
    # The loss scaler is a DeepSpeed object: weights_only refuses, the listing is static.
    assert shard.read_mode == "static" and shard.static is not None
    assert shard.static.globals_wanted == ("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",)
    assert shard.tensors and all(t.role == "optimizer" and t.stats is None for t in shard.tensors)
    assert all("values not read" in (t.note or "") for t in shard.tensors)
    assert snapshot(tmp_path) == before


def test_deepspeed_nan_weights_found_and_partitions_left_unread(
    tmp_path: Path, fake_deepspeed: type
) -> None:
    tag = _deepspeed_save(tmp_path, fake_deepspeed, step=40, poison=True)
    history = scan_run_checkpoints(_ckpts(tmp_path))
    assert [os.path.basename(s.path) for s in history.scans] == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert history.first_nonfinite == 0 and history.nonfinite_tensor_names == ("1.weight",)
    incident = checkpoint_incident(history)
    assert incident is not None and (incident.step, incident.layer) == (40, "1")
    assert [s.nonfinite_tensors for s in history.saves] == [1, 0, 0]
    assert str(tag) in history.scans[0].path


# Roles, unit by unit ----------------------------------------------------------------------


def _scan_dict(tmp_path: Path, name: str, value: dict[str, Any]) -> CheckpointScan:
    path = tmp_path / name
    torch.save(value, path)
    return scan_checkpoint(str(path))


def test_early_stopping_best_score_inf_is_metadata(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import EarlyStopping

    stopping = EarlyStopping(monitor="val_loss")  # best_score starts at +inf
    scan = _scan_dict(tmp_path, "last.ckpt", {
        "epoch": 0, "global_step": 0, "pytorch-lightning_version": "2.6.6",
        "state_dict": {"w": torch.ones(2)},
        "callbacks": {stopping.state_key: stopping.state_dict()},
    })
    assert scan.format == "lightning" and not scan.has_nonfinite
    assert [t.role for t in scan.nonfinite_metadata] == ["callback"]
    assert scan.meta is not None and scan.meta.callbacks[0].values["best_score"] == float("inf")


def test_unknown_section_stays_evidence(tmp_path: Path) -> None:
    scan = _scan_dict(tmp_path, "step_9.pt", {
        "model": {"w": torch.ones(2)}, "ema": {"w": torch.tensor([float("nan"), 1.0])},
        "scheduler": {"last": torch.tensor(float("inf"))}, "step": 9,
    })
    assert [(t.name, t.role) for t in scan.nonfinite_tensors] == [("ema.w", "other")]
    assert [(t.name, t.role) for t in scan.nonfinite_metadata] == [("scheduler.last",
                                                                   "scheduler")]


def test_scaler_state_under_a_plugin_name_is_evidence(tmp_path: Path) -> None:
    scaler = {"scale": torch.tensor(float("inf")), "growth_factor": 2.0, "backoff_factor": 0.5,
              "growth_interval": 2000, "_growth_tracker": torch.tensor(0)}
    scan = _scan_dict(tmp_path, "epoch=0-step=3.ckpt", {
        "epoch": 0, "global_step": 3, "pytorch-lightning_version": "2.6.6",
        "state_dict": {"w": torch.ones(2)}, "MixedPrecision": scaler,
    })
    assert [(t.name, t.role) for t in scan.nonfinite_tensors] == [("MixedPrecision.scale",
                                                                   "scaler")]
    assert scan.meta is not None
    assert scan.meta.precision == "16-mixed"


@pytest.mark.parametrize(("name", "step", "source", "epoch"), [
    ("epoch=3-step=120.ckpt", 120, "file name", 3),
    ("model_epoch0.pt", None, None, 0),
    ("global_step500/mp_rank_00_model_states.pt", 500, "folder name", None),
    ("checkpoint-500/model.pt", 500, "folder name", None),
    ("checkpoints/checkpoint_3/model.pt", None, None, None),
])
def test_step_from_names(tmp_path: Path, name: str, step: int | None, source: str | None,
                         epoch: int | None) -> None:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.ones(2)}, path)
    scan = scan_checkpoint(str(path))
    assert (scan.step, scan.step_source) == (step, source)
    assert (scan.meta.epoch if scan.meta else None) == epoch


def test_epoch_named_saves_keep_their_order(tmp_path: Path) -> None:
    for epoch in (10, 2, 1):
        torch.save({"w": torch.ones(2) * epoch}, tmp_path / f"model_epoch{epoch}.pt")
    history = scan_run_checkpoints([str(p) for p in tmp_path.iterdir()])
    assert [os.path.basename(s.path) for s in history.scans] == [
        "model_epoch1.pt", "model_epoch2.pt", "model_epoch10.pt"]


def test_regression_epoch_in_a_file_name_is_not_step_0(tmp_path: Path) -> None:
    # model_epoch0.pt was "the failure at step 0": its epoch was read as a step.
    path = tmp_path / "model_epoch0.pt"
    torch.save({"model": {"w": torch.tensor([float("nan")])}, "epoch": 0}, path)
    history = scan_run_checkpoints([str(path)])
    incident = checkpoint_incident(history)
    assert incident is not None and incident.step is None
    assert "epoch 0 but no step" in incident.decided_by
    assert history.scans[0].meta is not None and history.scans[0].meta.epoch == 0


def test_regression_accelerate_checkpoint_folder_number_is_not_a_step(tmp_path: Path) -> None:
    # Accelerate's checkpoints/checkpoint_1/ is its second save, which was read as step 1.
    folder = tmp_path / "checkpoints" / "checkpoint_1"
    folder.mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, folder / "pytorch_model.bin")
    scan = scan_checkpoint(str(folder / "pytorch_model.bin"))
    assert (scan.step, scan.step_source) == (None, None)


def test_lightning_deepspeed_strategy_folder(tmp_path: Path, fake_deepspeed: type) -> None:
    """Lightning's DeepSpeed strategy saves through the engine with tag "checkpoint" into a
    folder named like a checkpoint file, Lightning's own keys (less state_dict and
    optimizer_states) merged into the model states."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    callback = ModelCheckpoint(save_top_k=-1)
    tag = tmp_path / "epoch=1-step=8.ckpt" / "checkpoint"
    tag.mkdir(parents=True)
    torch.save({
        "module": {"layer.weight": torch.ones(2, 2)}, "optimizer": None, "lr_scheduler": None,
        "global_steps": 8, "ds_config": {"bf16": {"enabled": True}}, "ds_version": "0.16.4",
        "epoch": 1, "global_step": 8, "pytorch-lightning_version": "2.6.6", "loops": {},
        "callbacks": {callback.state_key: callback.state_dict()}, "lr_schedulers": [],
    }, tag / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"loss_scaler": fake_deepspeed(), "zero_stage": 2},
                "ds_config": {}, "ds_version": "0.16.4"},
               tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    shard, model = (scan_checkpoint(p) for p in _ckpts(tmp_path))
    assert (model.format, model.step, model.step_source) == ("deepspeed", 8, "'global_step' key")
    assert model.meta is not None and (model.meta.framework, model.meta.precision) == (
        "lightning", "bf16")
    assert not model.has_nonfinite and model.nonfinite_metadata  # kth_value = inf
    assert (shard.format, shard.step, shard.step_source) == ("zero_optimizer", 8, "folder name")


def test_a_scaler_file_is_scaler_evidence(tmp_path: Path) -> None:
    # scaler.pt beside a Trainer or Accelerate save: GradScaler.state_dict() as it is.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    state = scaler.state_dict()
    state["scale"] = torch.tensor(float("inf"))  # a scale that overflowed
    scan = _scan_dict(tmp_path, "scaler.pt", state)
    assert scan.format == "scaler" and scan.scaler is not None
    assert [(t.name, t.role) for t in scan.nonfinite_tensors] == [("scale", "scaler")]
