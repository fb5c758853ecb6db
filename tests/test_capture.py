"""The flight recorder: what it writes, when, and that it never breaks the loop."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from analyzer import capture
from analyzer.capture import FlightRecorder, read_meta, restore_rng, rng_state

FACTORY = "analyzer.scenarios.models:mlp"
KWARGS = {"in_features": 3, "hidden": 5, "out_features": 1, "depth": 2}


def _setup(tmp_path: Path, **options: Any) -> tuple[torch.nn.Module, Any, FlightRecorder]:
    torch.manual_seed(0)
    model = capture.Factory(FACTORY, KWARGS).build()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    rec = FlightRecorder(
        tmp_path, model, opt, model_factory=FACTORY, model_kwargs=KWARGS,
        loss_factory="analyzer.scenarios.losses:mse", seed=0, **options,
    )  # fmt: skip
    return model, opt, rec


def _batch(step: int, bad_steps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)
    if step in bad_steps:
        x[1, 2] = float("nan")
    return x, y


def _train(model: Any, opt: Any, rec: FlightRecorder, steps: int, bad: tuple[int, ...]) -> list:
    starts = []
    for step in range(steps):
        starts.append({k: v.clone() for k, v in model.state_dict().items()})
        x, y = _batch(step, bad)
        with rec.step(step, x, y) as r:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            r.loss(loss)
            loss.backward()
            opt.step()
    return starts


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True, map_location="cpu")


def test_writes_env_at_start(tmp_path: Path) -> None:
    _setup(tmp_path)
    env = json.loads((tmp_path / "env.json").read_text())
    for key in ("python", "torch", "numpy", "blas", "lapack", "deterministic_algorithms", "seed"):
        assert key in env
    assert env["torch"] == torch.__version__


def test_nothing_written_while_finite(tmp_path: Path) -> None:
    model, opt, rec = _setup(tmp_path)
    _train(model, opt, rec, 5, bad=())
    assert not (tmp_path / "capture").exists()
    assert rec.capture_path is None and rec.errors == []


def test_captures_first_nonfinite_step_only(tmp_path: Path) -> None:
    model, opt, rec = _setup(tmp_path)
    starts = _train(model, opt, rec, 8, bad=(3, 5))
    assert sorted(os.listdir(tmp_path / "capture")) == ["step_3"]
    folder = tmp_path / "capture" / "step_3"
    assert rec.capture_path == str(folder) and not rec.active
    meta = read_meta(folder)
    assert meta["step"] == 3 and meta["state_step"] == 3 and meta["mode"] == "every_step"
    assert meta["trigger"] == {"what": "loss", "name": "train/loss", "kind": "nan"}
    assert meta["model"] == {"factory": FACTORY, "kwargs": KWARGS}
    assert meta["optimizer"]["class"] == "torch.optim.Adam"
    assert meta["optimizer"]["hyperparameters"]["betas"] == [0.9, 0.999]
    assert meta["dtype"] == "float32" and meta["device"] == "cpu"
    assert meta["amp"] == {"autocast_dtype": None, "device_type": "cpu", "grad_scaler": False,
                           "scope": "step"}
    assert meta["lr"] == 0.01 and meta["grad_clip"] is None and meta["seed"] == 0
    state = _load(folder / "state.pt")
    for name, tensor in starts[3].items():
        assert torch.equal(state["model"][name], tensor), name
    assert state["scaler"] is None and state["optimizer"]["state"]
    batch = _load(folder / "batch.pt")
    torch.testing.assert_close(batch["inputs"], _batch(3, (3,))[0], equal_nan=True)
    rng = _load(folder / "rng.pt")
    assert set(rng) == {"torch", "cuda", "numpy", "python"}


def test_param_check_catches_a_bad_update(tmp_path: Path) -> None:
    model, _opt, rec = _setup(tmp_path, check_params=True)
    x, y = _batch(0, ())
    with rec.step(0, x, y) as r:
        loss = torch.nn.functional.mse_loss(model(x), y)
        r.loss(loss)
        with torch.no_grad():
            model.fc2.bias.fill_(float("inf"))
    meta = read_meta(tmp_path / "capture" / "step_0")
    assert meta["trigger"] == {"what": "param", "name": "fc2.bias", "kind": "+inf"}


def test_grad_check_names_the_parameter(tmp_path: Path) -> None:
    model, _opt, rec = _setup(tmp_path, check_grads=True)
    x, y = _batch(0, ())
    with rec.step(0, x, y) as r:
        loss = torch.nn.functional.mse_loss(model(x), y)
        r.loss(loss)
        loss.backward()
        model.fc1.weight.grad[0, 0] = float("-inf")
    meta = read_meta(tmp_path / "capture" / "step_0")
    assert meta["trigger"] == {"what": "grad", "name": "fc1.weight", "kind": "-inf"}


def test_capture_even_when_the_loop_raises(tmp_path: Path) -> None:
    model, _opt, rec = _setup(tmp_path)
    x, y = _batch(2, (2,))
    with pytest.raises(FloatingPointError), rec.step(2, x, y) as r:
        loss = torch.nn.functional.mse_loss(model(x), y)
        r.loss(loss)
        raise FloatingPointError("loss is nan")
    assert (tmp_path / "capture" / "step_2" / "meta.json").exists()


def test_never_raises_when_saving_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, rec = _setup(tmp_path)

    def broken_save(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.warns(UserWarning, match="disk full"):
        _train(model, opt, rec, 6, bad=(2, 4))
    assert rec.capture_path is None and not rec.active
    assert any("disk full" in e for e in rec.errors)
    assert not (tmp_path / "capture" / "step_2").exists()
    assert not [p for p in (tmp_path / "capture").iterdir() if p.name.startswith(".")]


def test_never_raises_on_an_unwritable_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    torch.manual_seed(0)
    model = capture.Factory(FACTORY, KWARGS).build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning):
        rec = FlightRecorder(blocker / "run", model, opt, model_factory=FACTORY,
                             loss_factory="x:y", validate=False)
        _train(model, opt, rec, 3, bad=(1,))
    assert rec.errors and rec.capture_path is None


def test_every_n_mode_replays_to_the_failing_step(tmp_path: Path) -> None:
    model, opt, rec = _setup(tmp_path, mode="every_n", every_n=4)
    starts = _train(model, opt, rec, 8, bad=(6,))
    folder = tmp_path / "capture" / "step_6"
    meta = read_meta(folder)
    assert meta["state_step"] == 4 and meta["every_n"] == 4 and meta["history_steps"] == [4, 5]
    history = _load(folder / "history.pt")["steps"]
    state = _load(folder / "state.pt")
    # Oracle: restoring state_step and re-running the kept steps gives the failing step's start.
    replay = capture.Factory(FACTORY, KWARGS).build()
    replay.load_state_dict(state["model"])
    ropt = torch.optim.Adam(replay.parameters(), lr=0.01)
    ropt.load_state_dict(state["optimizer"])
    for entry in history:
        ropt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(replay(entry["inputs"]), entry["targets"]).backward()
        ropt.step()
    for name, tensor in replay.state_dict().items():
        torch.testing.assert_close(tensor, starts[6][name])


def test_regression_every_n_alone_is_not_ignored(tmp_path: Path) -> None:
    """``every_n=K`` without a mode used to be dropped: the state was copied every step."""
    model, opt, rec = _setup(tmp_path, every_n=4)
    assert rec.mode == "every_n" and rec.every_n == 4
    _train(model, opt, rec, 8, bad=(6,))
    meta = read_meta(tmp_path / "capture" / "step_6")
    assert meta["mode"] == "every_n" and meta["every_n"] == 4 and meta["state_step"] == 4
    assert meta["history_steps"] == [4, 5]


def test_every_n_with_every_step_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='every_n=3 needs mode="every_n"'):
        _setup(tmp_path, mode="every_step", every_n=3)
    assert not (tmp_path / "env.json").exists()  # refused before it wrote anything
    _, _, rec = _setup(tmp_path, mode="every_step", every_n=1)
    assert rec.mode == "every_step" and rec.every_n == 1
    _, _, rec = _setup(tmp_path)
    assert rec.mode == "every_step"


def test_rng_round_trip() -> None:
    state = rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.random(), np.random.rand(), torch.rand(1)
    restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_meta_is_strict_json(tmp_path: Path) -> None:
    model, opt, rec = _setup(tmp_path)
    _train(model, opt, rec, 2, bad=(1,))
    text = (tmp_path / "capture" / "step_1" / "meta.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_read_meta_refuses_a_foreign_file(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text('{"format": "other", "version": 1}')
    with pytest.raises(ValueError, match="not a nan-forensics-capture"):
        read_meta(tmp_path)


def test_amp_settings_and_scaler_state(tmp_path: Path) -> None:
    model, opt, _ = _setup(tmp_path)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    rec = FlightRecorder(
        tmp_path, model, opt, model_factory=FACTORY, loss_factory="x:y", validate=False,
        scaler=scaler, autocast_dtype=torch.bfloat16, grad_clip=1.0,
    )  # fmt: skip
    x, y = _batch(0, (0,))
    with rec.step(0, [x], y) as r:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        r.loss(loss)
    folder = tmp_path / "capture" / "step_0"
    meta = read_meta(folder)
    assert meta["amp"] == {"autocast_dtype": "bfloat16", "device_type": "cpu", "grad_scaler": True,
                           "scope": "step"}
    assert meta["grad_clip"] == 1.0
    assert _load(folder / "state.pt")["scaler"]["scale"] == 1024.0
    assert isinstance(_load(folder / "batch.pt")["inputs"], list)
