"""Replay from capture folders written by the real flight recorder."""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from analyzer.capture import FlightRecorder
from analyzer.cli.replay import replay_command
from analyzer.errors import ForensicsError, UsageError
from analyzer.model.replays import REPLAY_SCHEMA_VERSION
from analyzer.replayer import (
    CaptureError,
    ModelRebuildError,
    load_capture,
    replay,
)
from analyzer.report.replay import brief_replay, format_replay
from analyzer.scenarios import losses, models
from analyzer.trust import UntrustedCode

MLP = "analyzer.scenarios.models:mlp"
MLP_KW = {"in_features": 4, "hidden": 8, "out_features": 3, "depth": 2, "seed": 1}


def _train(run_dir: Path, *, fail_at: int, steps: int = 6, loss: str = "log_of_softmax_nll",
           model_factory: str = MLP, model_kwargs: dict[str, Any] | None = None,
           build: Callable[[], torch.nn.Module] | None = None, dtype: torch.dtype = torch.float32,
           autocast: torch.dtype | None = None, scaler: Any = None, mode: str = "every_step",
           every_n: int = 1, optimizer: str = "adam", scale: float = 1e4,
           **extra: Any) -> FlightRecorder:
    """Train until the batch of step ``fail_at`` (multiplied by ``scale``) breaks the run."""
    torch.manual_seed(0)
    kwargs = MLP_KW if model_kwargs is None else model_kwargs
    model = (build() if build else models.mlp(**kwargs)).to(dtype)
    opt: torch.optim.Optimizer = (torch.optim.Adam(model.parameters(), lr=1e-3)
                                  if optimizer == "adam"
                                  else torch.optim.SGD(model.parameters(), lr=1e-3))
    loss_fn = getattr(losses, loss)()
    rec = FlightRecorder(run_dir, model, opt, model_factory=model_factory, model_kwargs=kwargs,
                         loss_factory=f"analyzer.scenarios.losses:{loss}", scaler=scaler,
                         autocast_dtype=autocast, seed=0, mode=mode,  # type: ignore[arg-type]
                         every_n=every_n, check_params=True, **extra)
    for step in range(steps):
        x = torch.randn(16, 4) * (scale if step == fail_at else 1.0)
        y = torch.randn(16, 1) if loss == "mse" else torch.randint(0, 3, (16,))
        with rec.step(step, x.to(dtype), y) as r:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16,
                                enabled=autocast is not None):
                loss_value = loss_fn(model(x.to(dtype)), y)
            r.loss(loss_value)
            if scaler is not None:
                scaler.scale(loss_value).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss_value.backward()
                opt.step()
        if rec.captured:
            break
    assert rec.captured, rec.errors
    return rec


@pytest.fixture(scope="module")
def log_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "log_run"
    _train(run, fail_at=3)
    return run


def test_replay_of_a_run_folder_names_the_log_in_the_loss(log_run: Path) -> None:
    result = replay(str(log_run))
    assert result.step == 3
    assert result.source == str(log_run / "capture" / "step_3")
    assert result.phase == "forward"
    assert result.op is not None and result.op.op == "log.default"
    assert result.op.module == "(loss)" and result.layer is None
    assert result.op.source is not None and result.op.source.endswith(
        os.path.join("scenarios", "losses.py") + f":{_line('torch.log(probs)')}")
    assert result.verdict.kind == "math-fault"
    assert any("at step 3" in n for n in result.notes)
    assert result.forward.batch[0].shape == (16, 4) and result.forward.batch[0].absmax > 1e3
    assert "aten.log.default" in format_replay(result)
    line = brief_replay(result)
    assert line.startswith("replay: forward, in the loss function, aten.log.default at ")
    assert line.endswith("verdict math-fault")


def _line(text: str) -> int:
    with open(losses.__file__, encoding="utf-8") as fh:
        return next(i for i, line in enumerate(fh, 1) if text in line)


def test_the_earliest_capture_of_a_run_is_replayed(log_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(log_run, run)
    shutil.copytree(run / "capture" / "step_3", run / "capture" / "step_10")
    assert load_capture(str(run)).step == 3
    assert load_capture(str(run / "capture")).step == 3
    assert load_capture(str(run / "capture" / "step_10")).path.endswith("step_10")


def test_capture_restores_model_optimizer_and_batch(log_run: Path) -> None:
    cap = load_capture(str(log_run))
    assert cap.meta["optimizer"]["class"] == "torch.optim.Adam"
    assert isinstance(cap.optimizer, torch.optim.Adam)
    assert len(cap.optimizer.state) == len(list(cap.model.parameters()))  # Adam moments
    assert cap.inputs.shape == (16, 4) and cap.targets.shape == (16,)
    assert float(cap.inputs.abs().max()) > 1e3
    saved = torch.load(log_run / "capture" / "step_3" / "state.pt", weights_only=True)
    for name, value in cap.model.state_dict().items():
        assert torch.equal(value, saved["model"][name])


def _train_in_project(tmp_path: Path, name: str, **extra: Any) -> tuple[Path, Path]:
    """Train with a model factory from a project folder of the user's (``name:make``), as
    a script run from that folder would: (the run, the project folder)."""
    import sys

    pkg = tmp_path / "code"
    pkg.mkdir()
    (pkg / f"{name}.py").write_text(textwrap.dedent("""
        from analyzer.scenarios.models import mlp

        def make(**kwargs):
            return mlp(**kwargs)
    """), encoding="utf-8")
    run = tmp_path / "run"
    sys.path.insert(0, str(pkg))
    try:
        module = importlib.import_module(name)
        _train(run, fail_at=2, model_factory=f"{name}:make",
               build=lambda: module.make(**MLP_KW), **extra)
    finally:
        sys.path.remove(str(pkg))
        sys.modules.pop(name, None)
    return run, pkg


def test_a_factory_outside_the_path_needs_an_import_path(tmp_path: Path) -> None:
    import sys

    run, pkg = _train_in_project(tmp_path, "mynets", trust_code_root=False)
    # The capture says where the code was: the folder is found, and named, not trusted.
    with pytest.raises(UntrustedCode) as untrusted:
        replay(str(run))
    assert untrusted.value.folder == os.path.realpath(pkg)
    assert isinstance(untrusted.value, ForensicsError)
    result = replay(str(run), import_paths=[str(pkg)])
    assert result.phase == "forward" and result.verdict.kind == "math-fault"
    assert str(pkg) not in sys.path
    sys.modules.pop("mynets", None)
    # Moved away, the code cannot be found at all: the message says what to pass.
    pkg.rename(tmp_path / "moved")
    with pytest.raises(ModelRebuildError) as err:
        replay(str(run))
    assert err.value.module == "mynets"
    assert "'mynets' cannot be imported" in str(err.value) and "--import-path" in str(err.value)
    sys.modules.pop("mynets", None)


def test_the_recorder_trusts_its_own_code_root_so_replay_needs_no_flag(tmp_path: Path) -> None:
    import sys

    run, _ = _train_in_project(tmp_path, "ownnets")
    result = replay(str(run))
    assert result.phase == "forward" and result.verdict.kind == "math-fault"
    sys.modules.pop("ownnets", None)


def _broken_copy(log_run: Path, tmp_path: Path) -> Path:
    step = tmp_path / "run" / "capture" / "step_3"
    shutil.copytree(log_run / "capture" / "step_3", step)
    return step


class _Payload:
    """Unpickling this writes a file: proof that unsafe loading happened."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_a_state_file_with_objects_is_refused_not_loaded(log_run: Path, tmp_path: Path) -> None:
    step = _broken_copy(log_run, tmp_path)
    marker = tmp_path / "unpickled"
    torch.save({"model": {}, "payload": _Payload(str(marker))}, step / "state.pt")
    with pytest.raises(CaptureError) as err:
        load_capture(str(step))
    assert err.value.path == str(step / "state.pt")
    assert "weights_only=True" in str(err.value)
    assert not marker.exists()


def test_damaged_meta_json_names_the_line(log_run: Path, tmp_path: Path) -> None:
    step = _broken_copy(log_run, tmp_path)
    text = (step / "meta.json").read_text(encoding="utf-8")
    (step / "meta.json").write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(CaptureError, match=r"meta\.json: line \d+ column \d+"):
        load_capture(str(step))


def test_a_missing_batch_or_a_foreign_meta_is_named(log_run: Path, tmp_path: Path) -> None:
    step = _broken_copy(log_run, tmp_path)
    (step / "batch.pt").unlink()
    with pytest.raises(CaptureError, match=r"batch\.pt: missing"):
        load_capture(str(step))
    meta = json.loads((step / "meta.json").read_text(encoding="utf-8"))
    meta["version"] = 99
    (step / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CaptureError, match="capture version 99"):
        load_capture(str(step))


def test_state_that_does_not_fit_the_model(log_run: Path, tmp_path: Path) -> None:
    step = _broken_copy(log_run, tmp_path)
    meta = json.loads((step / "meta.json").read_text(encoding="utf-8"))
    meta["model"]["kwargs"]["hidden"] = 5
    (step / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ModelRebuildError, match=r"state\.pt does not fit"):
        load_capture(str(step))


def test_a_folder_without_capture_and_bad_options(tmp_path: Path, log_run: Path) -> None:
    with pytest.raises(CaptureError, match="holds no capture"):
        load_capture(str(tmp_path))
    with pytest.raises(CaptureError, match="no such file"):
        load_capture(str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="--dtype"):
        replay(str(log_run), dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            replay(str(log_run), device="cuda")


def test_every_n_capture_replays_the_history_first(tmp_path: Path) -> None:
    rec = _train(tmp_path / "run", fail_at=4, mode="every_n", every_n=3)
    cap = load_capture(str(tmp_path / "run"))
    assert cap.meta["state_step"] == 3 and [h["step"] for h in cap.history] == [3]
    result = replay(str(tmp_path / "run"))
    assert any("replayed steps 3..3 first" in n for n in result.notes)
    assert result.phase == "forward" and result.op is not None and result.op.op == "log.default"
    assert rec.capture_path is not None


def test_autocast_and_grad_scaler_are_restored(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    _train(tmp_path / "run", fail_at=2, loss="mse", optimizer="sgd",
           model_kwargs={**MLP_KW, "out_features": 1}, autocast=torch.float16, scaler=scaler,
           scale=1e6)
    cap = load_capture(str(tmp_path / "run"))
    assert cap.autocast_dtype == "float16" and cap.scaler is not None
    assert cap.scaler.get_scale() == 2.0**10
    result = replay(str(tmp_path / "run"))
    assert result.autocast == "float16"
    assert result.phase == "forward"
    assert result.layer in ("fc1", "fc2")
    assert result.op is not None and result.op.outputs[0].dtype == "float16"
    assert result.verdict.kind == "range-overflow"
    wide = replay(str(tmp_path / "run"), dtype="float64")
    assert wide.autocast is None and wide.phase is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here")
def test_a_capture_replays_on_cuda(log_run: Path) -> None:
    result = replay(str(log_run), device="cuda")
    assert result.device == "cuda"
    assert result.phase == "forward" and result.op is not None and result.op.op == "log.default"
    assert result.verdict.kind == "math-fault"
    assert [p.device for p in result.passes] == ["cuda", "cuda", "cpu"]


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_the_command_prints_writes_json_and_leaves_the_run_alone(log_run: Path,
                                                                 tmp_path: Path) -> None:
    before = _listing(log_run)
    out = io.StringIO()
    target = tmp_path / "replay.json"
    assert replay_command(str(log_run), json_file=str(target), out=out) == 1
    assert "verdict: math-fault" in out.getvalue()
    data = json.loads(target.read_text(encoding="utf-8"))
    assert data["schema"] == "nan-forensics-replay"
    assert data["schema_version"] == REPLAY_SCHEMA_VERSION == 2
    assert data["phase"] == "forward" and data["op"]["op"] == "log.default"
    out = io.StringIO()
    replay_command(str(log_run), json_file="-", out=out)
    assert json.loads(out.getvalue())["verdict"]["kind"] == "math-fault"
    assert _listing(log_run) == before


def test_analyze_replays_only_runs_with_a_capture(log_run: Path, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from analyzer.api import analyze

    writer = SummaryWriter(str(tmp_path / "plain"))
    writer.add_scalar("train/loss", 1.0, 0)
    writer.close()
    (without,) = analyze(str(tmp_path / "plain")).results
    assert (without.replay, without.replay_error, without.replay_refused) == (None, None, None)
    (result,) = analyze(str(log_run)).results
    assert result.replay is not None and result.replay.verdict.kind == "math-fault"
