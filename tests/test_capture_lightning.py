"""FlightRecorderCallback with the real Lightning, end to end.

Each test trains ``LitNet`` (tests/integrations/lightning_train.py) on CPU until its own
numerics fail at the zero sample of batch 3, then runs ``forensics analyze`` on the training
folder with no flag: the replay must name the producing layer by its full path (``net.2``)
and the op. The module class is either defined in the training script (the script run as a
subprocess: ``__main__:LitNet``) or imported from a project module: the script copied as
``lit_project.py`` into a folder of the test's own, since a replay never imports factories
from this tool's source tree. The recorder registers the code as trusted in the test's
private configuration folder (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("lightning")

from analyzer.capture.recorder import CaptureSetupError
from analyzer.cli import main
from tests.integrations.loop_models import project_module
from tests.readonly import analyse_replayed as analyse
from tests.readonly import layer_and_op as names

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "integrations" / "lightning_train.py"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The training script as a user's project module, imported from its own folder."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with project_module(tmp_path_factory.mktemp("litproj"), "lit_project",
                            SCRIPT) as module:
            yield module


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        # Lightning's advice (num_workers, the logger tip) is no part of what is tested.
        warnings.simplefilter("ignore")
        yield


def version_dir(out: Path) -> Path:
    return out / "lightning_logs" / "version_0"


def meta_of(out: Path, step: int) -> dict[str, Any]:
    folder = version_dir(out) / "capture" / f"step_{step}"
    assert folder.is_dir(), sorted(p.name for p in (version_dir(out) / "capture").iterdir())
    return meta_of_folder(folder)


def meta_of_folder(folder: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))
    return data






def test_a_module_defined_in_the_training_script_replays(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         ) -> None:
    out = tmp_path / "out"
    # The subprocess gets this process' FORENSICS_CONFIG_DIR: its trust is seen here.
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    capture = version_dir(out) / "capture" / "step_3"
    assert f"capture: {capture}" in done.stdout
    meta = meta_of(out, 3)
    assert meta["model"]["factory"] == "__main__:LitNet"
    assert (meta["step_call"]["kind"], meta["step_call"]["batch_idx"]) == ("training_step", 3)
    assert meta["trigger"]["what"] == "loss" and meta["trigger"]["kind"] == "nan"
    assert (capture / "source" / "__main__.py").read_bytes() == SCRIPT.read_bytes()
    layer, ops = names(analyse(out))
    assert layer == "net.2" and "div" in ops
    assert main(["analyze", str(out)]) == 1
    text = capsys.readouterr().out
    assert "net.2" in text and "div" in text


def test_a_backward_that_raised_under_detect_anomaly_is_captured(tmp_path: Path,
                                                                 project: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="returned nan values"):
        project.train(str(tmp_path), layer="norm_feature", anomaly=True)
    meta = meta_of(tmp_path, 3)
    assert meta["trigger"]["what"] == "error"
    assert "MulBackward0" in meta["trigger"]["error"]
    # The loss of the step that raised was finite: only the backward pass went wrong.
    assert isinstance(meta["loss_value"], float)
    assert meta["step_call"]["batch_idx"] == 3
    layer, ops = names(analyse(tmp_path))
    assert layer == "net.2" and "sqrt" in ops


def test_a_training_step_that_raises_floating_point_error_is_captured(
        tmp_path: Path, project: ModuleType) -> None:
    with pytest.raises(FloatingPointError):
        project.train(str(tmp_path), raise_on_nan=True)
    meta = meta_of(tmp_path, 3)
    assert meta["trigger"]["what"] == "error"
    assert meta["trigger"]["name"] == "FloatingPointError"
    assert meta["step_call"]["batch_idx"] == 3


def test_bf16_mixed_with_clipping(tmp_path: Path, project: ModuleType) -> None:
    cb = project.train(str(tmp_path), precision="bf16-mixed", clip=1.0)
    assert cb.capture_path == str(version_dir(tmp_path) / "capture" / "step_3")
    meta = meta_of(tmp_path, 3)
    assert meta["amp"] == {"autocast_dtype": "bfloat16", "device_type": "cpu",
                           "grad_scaler": False, "scope": "step"}
    assert meta["grad_clip"] == 1.0
    result = analyse(tmp_path)
    assert result.replay is not None and result.replay.autocast == "bfloat16"
    layer, ops = names(result)
    assert layer == "net.2" and "div" in ops


def test_clipping_by_value_is_said_to_be_left_out(tmp_path: Path, project: ModuleType) -> None:
    with pytest.warns(UserWarning, match="gradient_clip_algorithm='value' is not recorded"):
        project.train(str(tmp_path), clip=0.5, clip_algorithm="value")
    assert meta_of(tmp_path, 3)["grad_clip"] is None


def test_16_mixed_with_the_plugins_grad_scaler(tmp_path: Path, project: ModuleType) -> None:
    from lightning.pytorch.plugins.precision import MixedPrecision

    # Trainer(precision="16-mixed") on CPU becomes bf16-mixed in this Lightning; the plugin
    # given outright keeps float16 autocast and its CPU GradScaler.
    cb = project.train(str(tmp_path), plugins=[MixedPrecision("16-mixed", "cpu")], clip=0.5)
    assert cb.recorder.scaler is not None
    meta = meta_of(tmp_path, 3)
    assert meta["grad_clip"] == 0.5
    assert meta["amp"] == {"autocast_dtype": "float16", "device_type": "cpu",
                           "grad_scaler": True, "scope": "step"}
    layer, ops = names(analyse(tmp_path))
    assert layer == "net.2" and "div" in ops


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-true", "bfloat16"),
                                                  ("64-true", "float64")])
def test_the_true_precisions_replay_in_their_dtype(tmp_path: Path, project: ModuleType,
                                                   precision: str, dtype: str) -> None:
    # The "-true" plugins cast the module (and the batch): no autocast, no scaler.
    project.train(str(tmp_path), precision=precision)
    meta = meta_of(tmp_path, 3)
    assert meta["dtype"] == dtype and meta["amp"]["autocast_dtype"] is None
    result = analyse(tmp_path)
    assert result.replay is not None and result.replay.dtype == dtype
    layer, ops = names(result)
    assert layer == "net.2" and "div" in ops


def test_accumulated_batches_are_micro_batches_of_one_optimizer_step(
        tmp_path: Path, project: ModuleType) -> None:
    # Batches 2 and 3 make optimizer step 1; the zero sample is in batch 3, the second.
    project.train(str(tmp_path), accumulate=2)
    meta = meta_of(tmp_path, 1)
    assert meta["step_call"]["batch_idx"] == 2
    assert meta["accumulation"]["micro_batches"] == 2
    assert meta["accumulation"]["failing"] == 1
    assert meta["accumulation"]["divide"] is True
    layer, ops = names(analyse(tmp_path))
    assert layer == "net.2" and "div" in ops


def test_check_grads_captures_the_step_whose_gradient_went_nan(tmp_path: Path,
                                                               project: ModuleType) -> None:
    # Without anomaly mode nothing raises: the NaN gradient of step 3 reaches the weights,
    # and the loss only goes NaN at step 4. check_grads catches step 3 itself.
    plain = project.train(str(tmp_path / "plain"), layer="norm_feature")
    assert plain.capture_path.endswith("step_4")
    cb = project.train(str(tmp_path / "grads"), layer="norm_feature",
                       recorder=project.FlightRecorderCallback(check_grads=True))
    assert cb.capture_path.endswith("step_3")
    assert meta_of(tmp_path / "grads", 3)["trigger"]["what"] == "grad"


def test_every_n_replays_the_steps_since_the_kept_state(tmp_path: Path,
                                                        project: ModuleType) -> None:
    cb = project.train(str(tmp_path), recorder=project.FlightRecorderCallback(every_n=5))
    assert cb.capture_path.endswith("step_3")
    meta = meta_of(tmp_path, 3)
    assert meta["state_step"] == 0 and meta["history_steps"] == [0, 1, 2]
    layer, ops = names(analyse(tmp_path))
    assert layer == "net.2" and "div" in ops


def test_a_healthy_fit_leaves_no_capture(tmp_path: Path, project: ModuleType) -> None:
    # One optimizer step of batches 0 and 1: it ends before the zero sample (batch 3).
    cb = project.train(str(tmp_path), accumulate=2, max_steps=1)
    assert cb.capture_path is None and cb.recorder.errors == []
    assert not (version_dir(tmp_path) / "capture").exists()
    assert (version_dir(tmp_path) / "env.json").is_file()


def test_a_resumed_fit_counts_on_from_the_checkpoints_global_step(
        tmp_path: Path, project: ModuleType) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    def fit(data: Any, epochs: int, ckpt: str | None = None) -> Any:
        cb = project.FlightRecorderCallback()
        trainer = pl.Trainer(default_root_dir=str(tmp_path), max_epochs=epochs,
                             accelerator="cpu",
                             devices=1, callbacks=[cb], enable_progress_bar=False,
                             enable_model_summary=False, log_every_n_steps=1)
        trainer.fit(project.LitNet(), DataLoader(data, batch_size=project.BATCH_SIZE),
                    ckpt_path=ckpt)
        return cb, trainer

    # A healthy first epoch (8 batches) saved; resumed on data whose batch 3 fails.
    healthy, first = fit(project.data(zero=None), 1)
    assert healthy.capture_path is None
    saved = first.checkpoint_callback.best_model_path  # version_0/checkpoints/epoch=0-step=8
    assert saved.endswith("step=8.ckpt")
    cb, _ = fit(project.data(), 2, ckpt=saved)
    assert cb.capture_path == str(tmp_path / "lightning_logs" / "version_1" / "capture"
                                  / "step_11")
    assert meta_of_folder(cb.capture_path)["step_call"]["batch_idx"] == 3
    layer, ops = names(analyse(tmp_path))
    assert layer == "net.2" and "div" in ops


def test_without_a_logger_the_capture_goes_to_default_root_dir(
        tmp_path: Path, project: ModuleType) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    cb = project.FlightRecorderCallback()
    trainer = pl.Trainer(default_root_dir=str(tmp_path), max_steps=4, logger=False,
                         accelerator="cpu", devices=1, callbacks=[cb],
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer.fit(project.LitNet(), DataLoader(project.data(), batch_size=project.BATCH_SIZE))
    assert cb.capture_path == str(tmp_path / "capture" / "step_3")


def test_manual_optimization_records_every_optimizer(tmp_path: Path,
                                                     project: ModuleType) -> None:
    cb = project.train(str(tmp_path), manual=True, max_steps=10)
    # Each optimizer's step counts in Lightning's global step: two a batch.
    assert cb.capture_path == str(version_dir(tmp_path) / "capture" / "step_6")
    meta = meta_of(tmp_path, 6)
    assert [o["class"] for o in meta["optimizers"]] == ["torch.optim.SGD", "torch.optim.Adam"]
    assert meta["step_call"]["batch_idx"] == 3
    assert meta["trigger"]["what"] == "loss"


def test_manual_optimization_replays_through_a_step_factory(tmp_path: Path,
                                                             project: ModuleType) -> None:
    # Its training_step calls self.optimizers(), which a replay has no trainer for: the
    # step factory gives the loss, and the replay steps both recorded optimizers.
    cb = project.FlightRecorderCallback(step_factory=project.mse_step)
    project.train(str(tmp_path), manual=True, max_steps=10, recorder=cb)
    meta = meta_of(tmp_path, 6)
    assert meta["step_call"]["kind"] == "step_fn"
    assert "lit_project:mse_step" in json.dumps(meta["step_call"])
    layer, ops = names(analyse(tmp_path))
    assert layer == "net.2" and "div" in ops


def test_hyperparameters_that_are_not_json_fail_at_fit_start(tmp_path: Path,
                                                             project: ModuleType) -> None:
    import torch

    class Steps(project.LitNet):
        def __init__(self, scale: Any = None) -> None:
            super().__init__()
            self.save_hyperparameters()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise AssertionError("no batch may run")

    with pytest.raises(CaptureSetupError, match=r"'scale' .* is not JSON"):
        project.train(str(tmp_path), module=Steps(scale=torch.ones(2)))
    assert not (version_dir(tmp_path) / "capture").exists()


def test_an_argument_the_hyperparameters_lack_fails_at_fit_start(tmp_path: Path,
                                                                 project: ModuleType) -> None:
    from torch import nn

    class Wrapped(project.LitNet):
        def __init__(self, body: nn.Module) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=["body"])
            self.body = body

    with pytest.raises(CaptureSetupError, match="needs body"):
        project.train(str(tmp_path), module=Wrapped(nn.Identity()))


def test_a_saved_config_object_comes_back_under_its_argument(project: ModuleType) -> None:
    import lightning.pytorch as pl
    from torch import nn

    from analyzer.capture.lightning import module_factory

    class Configured(pl.LightningModule):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config)
            self.layer = nn.Linear(2, config["hidden"])

    module = Configured({"hidden": 6})
    cls, kwargs = module_factory(module)
    assert cls is Configured and kwargs == {"config": {"hidden": 6}}
    assert module_factory(project.LitNet(hidden=5))[1]["hidden"] == 5


def test_importing_the_callback_module_leaves_lightning_unimported() -> None:
    code = ("import sys, analyzer.capture, analyzer.capture.lightning; "
            "assert 'lightning' not in sys.modules and 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_callback_is_a_lightning_callback() -> None:
    from lightning.pytorch import Callback

    from analyzer.capture.lightning import FlightRecorderCallback

    assert issubclass(FlightRecorderCallback, Callback)
    assert FlightRecorderCallback.__module__ == "analyzer.capture.lightning"
    with pytest.raises(TypeError, match="grad_clip"):
        FlightRecorderCallback(grad_clip=1.0)


def test_regression_every_rank_asks_for_log_dir_which_lightning_broadcasts(
        project: ModuleType) -> None:
    """Trainer.log_dir is a collective (strategy.broadcast from rank zero): asked on rank
    zero alone, a 2-process DDP fit hung in on_fit_start. Checked here on a stand-in for a
    rank-1 trainer (a real DDP fit takes 40 s on 2 cores)."""

    class RankOne:
        is_global_zero = False
        default_root_dir = "unused"
        asked = 0

        @property
        def log_dir(self) -> str:
            RankOne.asked += 1
            return "unused"

    cb = project.FlightRecorderCallback()
    trainer, module = RankOne(), project.LitNet()
    cb.setup(trainer, module, "fit")
    cb.on_fit_start(trainer, module)
    assert RankOne.asked == 1 and cb.recorder is None
