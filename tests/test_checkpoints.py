"""Checkpoint scans: formats, per-tensor statistics against a plain numpy oracle,
optimizer state, and a run's history."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from analyzer.cli.inspect import inspect_command
from analyzer.ingest import checkpoints
from analyzer.ingest.checkpoints import (
    is_checkpoint_file,
    scan_checkpoint,
    scan_run_checkpoints,
)
from analyzer.ingest.ckpt import stats as stats_module
from analyzer.model import TensorRecord
from analyzer.report.checkpoints import format_history, format_scan


def _oracle(tensor: torch.Tensor) -> dict[str, float]:
    values = tensor.detach().to(torch.float64).numpy().reshape(-1)
    finite = values[np.isfinite(values)]
    return {
        "nan": int(np.isnan(values).sum()),
        "pos_inf": int(np.isposinf(values).sum()),
        "neg_inf": int(np.isneginf(values).sum()),
        "abs_max": float(np.abs(finite).max()) if finite.size else 0.0,
        "sum_squares": float((finite**2).sum()),
        "beyond_fp16": int((np.abs(finite) > 65504).sum()),
    }


def _tricky(dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(37, 29, generator=generator) * 10
    base[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    if dtype in (torch.float32, torch.float64, torch.bfloat16):
        base[5, 5] = 1e6  # beyond the float16 range
    return base.to(dtype)


def _assert_matches(record: TensorRecord, tensor: torch.Tensor) -> None:
    assert record.stats is not None, record
    expected = _oracle(tensor)
    for key in ("nan", "pos_inf", "neg_inf", "beyond_fp16"):
        assert getattr(record.stats, key) == expected[key], key
    assert record.stats.abs_max == pytest.approx(expected["abs_max"])
    assert record.stats.sum_squares == pytest.approx(expected["sum_squares"], rel=1e-6)
    assert record.stats.numel == tensor.numel()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Several chunks per tensor, so that chunk boundaries are exercised.
    monkeypatch.setattr(stats_module, "CHUNK", 100)


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("dtype", DTYPES)
def test_stats_match_oracle_weights_only(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = {
        "a.weight": _tricky(dtype, 1),
        "a.t": _tricky(dtype, 2).t(),
        "b.bias": _tricky(dtype, 3)[3],
    }
    path = tmp_path / "sd.pt"
    torch.save(tensors, path)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "weights_only" and scan.format == "state_dict"
    by_name = {t.name: t for t in scan.tensors}
    for name, tensor in tensors.items():
        _assert_matches(by_name[name], tensor)
        assert by_name[name].shape == tuple(tensor.shape)
        assert by_name[name].dtype == str(dtype).removeprefix("torch.")


@dataclass
class _Config:
    lr: float = 0.1


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("dtype", DTYPES)
def test_static_read_gives_the_same_stats(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = {"a.weight": _tricky(dtype, 4), "a.view": _tricky(dtype, 5)[4:9]}
    path = tmp_path / "with_config.pt"
    torch.save({"model": tensors, "config": _Config()}, path)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "static"
    assert scan.static is not None and any("_Config" in g for g in scan.static.globals_wanted)
    by_name = {t.name: t for t in scan.tensors}
    for name, tensor in tensors.items():
        _assert_matches(by_name[name], tensor)


def test_safetensors_stats_and_layers(tmp_path: Path) -> None:
    tensors = {
        "enc.0.weight": _tricky(torch.float32, 6),
        "enc.0.bias": torch.zeros(29),
        "head.weight": _tricky(torch.bfloat16, 7),
        "ids": torch.arange(5),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    scan = scan_checkpoint(str(path))
    assert (scan.format, scan.read_mode, scan.issues) == ("safetensors", "header", ())
    by_name = {t.name: t for t in scan.tensors}
    for name in ("enc.0.weight", "head.weight"):
        _assert_matches(by_name[name], tensors[name])
    assert by_name["ids"].stats is None and by_name["ids"].dtype == "int64"
    layers = {layer.layer: layer for layer in scan.layers}
    assert set(layers) == {"enc.0", "head"}
    enc = layers["enc.0"].stats
    assert enc.numel == 37 * 29 + 29 and enc.nan == 1
    assert enc.l2_norm == pytest.approx(math.sqrt(_oracle(tensors["enc.0.weight"])["sum_squares"]))


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    optimizer = torch.optim.Adam(model.parameters(), eps=1e-8)
    for _ in range(3):
        loss = model(torch.randn(16, 4)).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


SCALER = {
    "scale": 1024.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
    "_growth_tracker": 7,
}


def test_training_checkpoint_optimizer_and_scaler(tmp_path: Path) -> None:
    model, optimizer = _trained()
    state = optimizer.state_dict()
    state["state"][4]["exp_avg_sq"].zero_()  # the last Linear's weight: update divides by eps
    path = tmp_path / "ckpt.pt"
    torch.save(
        {"model": model.state_dict(), "optimizer": state, "scaler": SCALER, "step": 1200}, path
    )
    scan = scan_checkpoint(str(path))
    assert (scan.format, scan.step, scan.step_source) == ("training", 1200, "'step' key")
    assert scan.scaler is not None
    assert (scan.scaler.scale, scan.scaler.growth_tracker) == (1024.0, 7)
    names = [a.param_name for a in scan.adam]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]
    zeroed = scan.adam[4]
    assert zeroed.v_zero == zeroed.numel == 16 and zeroed.flagged
    m = state["state"][4]["exp_avg"].abs().max().item()
    assert zeroed.ratio_max == pytest.approx(m / 1e-8)
    healthy = scan.adam[5]
    v = state["state"][5]["exp_avg_sq"]
    m5 = state["state"][5]["exp_avg"]
    assert healthy.ratio_max == pytest.approx((m5.abs() / (v.sqrt() + 1e-8)).max().item())
    assert healthy.v_zero == 0
    groups = {t.group for t in scan.tensors}
    assert groups == {"model", "optimizer"}
    assert {layer.layer for layer in scan.layers} == {"0", "1", "3"}
    text = format_scan(scan)
    assert "3.weight" in text and "scale=1.02e+03" in text


def test_lightning_checkpoint(tmp_path: Path) -> None:
    model, optimizer = _trained()
    path = tmp_path / "epoch=3-step=420.ckpt"
    torch.save(
        {
            "epoch": 3,
            "global_step": 420,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [],
            "MixedPrecision": SCALER,
        },
        path,
    )
    scan = scan_checkpoint(str(path))
    assert (scan.format, scan.step, scan.step_source) == ("lightning", 420, "'global_step' key")
    assert len(scan.adam) == 6 and scan.adam[0].param_name == "model.0.weight"
    assert scan.scaler is not None and scan.scaler.key == "MixedPrecision"


def test_hf_bin_takes_its_step_from_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-500"
    folder.mkdir()
    torch.save({"bert.pooler.dense.weight": torch.ones(2, 2)}, folder / "pytorch_model.bin")
    scan = scan_checkpoint(str(folder / "pytorch_model.bin"))
    assert (scan.format, scan.step, scan.step_source) == ("hf_bin", 500, "folder name")


def test_full_model_pickle_is_listed_statically(tmp_path: Path) -> None:
    model, _ = _trained()
    path = tmp_path / "model.pt"
    torch.save(model, path)
    scan = scan_checkpoint(str(path))
    assert (scan.format, scan.read_mode) == ("full_model", "static")
    assert [t.name for t in scan.tensors] == list(model.state_dict())
    weight = next(t for t in scan.tensors if t.name == "3.weight")
    _assert_matches(weight, model.state_dict()["3.weight"])
    trusted = scan_checkpoint(str(path), trust_pickle=True)
    assert (trusted.format, trusted.read_mode) == ("full_model", "trusted")
    assert [t.stats for t in trusted.tensors] == [t.stats for t in scan.tensors]


def test_sharded_safetensors(tmp_path: Path) -> None:
    save_file({"layers.0.w": torch.ones(3)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(
        {"layers.1.w": torch.tensor([1.0, float("nan")])},
        str(tmp_path / "model-00002-of-00002.safetensors"),
    )
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {
        "layers.0.w": "model-00001-of-00002.safetensors",
        "layers.1.w": "model-00002-of-00002.safetensors",
        "layers.2.w": "model-00003-of-00002.safetensors",
    }
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    scan = scan_checkpoint(str(index))
    assert scan.format == "sharded" and len(scan.files) == 3
    assert [layer.layer for layer in scan.nonfinite_layers] == ["layers.1"]
    assert any("missing" in issue.message for issue in scan.issues)


def test_is_checkpoint_file() -> None:
    for name in (
        "a.pt",
        "b.PTH",
        "c.ckpt",
        "pytorch_model.bin",
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    ):
        assert is_checkpoint_file(f"run/{name}"), name
    for name in (
        "events.out.tfevents.1",
        "config.json",
        "train.log",
        "model.onnx",
        "training_args.bin",
        "rng_state_3.pth",
        "scheduler.pt",
    ):
        assert not is_checkpoint_file(f"run/{name}"), name


def test_history_finds_first_nonfinite_save_and_runaway_layer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    stable, runaway = torch.randn(8, 8), torch.randn(8, 8)
    paths = []
    for i, (scale, growth) in enumerate([(65536.0, 1), (8192.0, 10), (1024.0, 100), (1.0, 0)]):
        late = runaway * growth if growth else torch.full((8, 8), float("nan"))
        path = tmp_path / f"ckpt_step{(i + 1) * 100}.pt"
        torch.save(
            {
                "model": {"enc.weight": stable * (1 + i / 100), "dec.weight": late},
                "scaler": {**SCALER, "scale": scale},
            },
            path,
        )
        paths.append(str(path))
    history = scan_run_checkpoints(list(reversed(paths)))
    assert [s.step for s in history.saves] == [100, 200, 300, 400]
    assert history.first_nonfinite == 3 and history.last_finite == 2
    assert history.nonfinite_layers == ("dec",)
    assert [s.scale for s in history.saves] == [65536.0, 8192.0, 1024.0, 1.0]
    top = history.layers[0]
    assert top.layer == "dec" and top.growth == pytest.approx(100.0)
    assert top.last_growth == pytest.approx(10.0)
    text = format_history(history)
    assert "first save with a non-finite tensor: step 400" in text and "dec: x100" in text
    as_json = json.dumps(history.to_dict(), allow_nan=False)
    assert '"nan"' not in as_json or "dec" in as_json


def test_to_dict_is_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"w": torch.tensor([float("inf"), 1.0])}, path)
    data = scan_checkpoint(str(path)).to_dict()
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text)["tensors"][0]["stats"]["pos_inf"] == 1


def test_import_does_not_import_torch() -> None:
    code = "import sys, analyzer.ingest.checkpoints; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_api_is_pinned() -> None:
    # The scans' records are analyzer.model's, the one record contract, not re-exported.
    assert sorted(checkpoints.__all__) == [
        "CHECKPOINT_SUFFIXES", "checkpoint_incident", "is_checkpoint_file",
        "scan_checkpoint", "scan_run_checkpoints"]


def test_checkpoint_incident_names_step_layer_and_kind(tmp_path: Path) -> None:
    for step, value in [(10, 1.0), (20, float("inf")), (30, float("nan"))]:
        torch.save(
            {"model": {"head.weight": torch.full((2,), value)}, "step": step},
            tmp_path / f"s{step}.pt",
        )
    history = scan_run_checkpoints([str(p) for p in sorted(tmp_path.iterdir())])
    incident = checkpoints.checkpoint_incident(history)
    assert incident is not None
    assert (incident.step, incident.kind, incident.layer) == (20, "+inf", "head")
    assert incident.last_finite_step == 10 and incident.tag == "checkpoint/head.weight"


def test_history_reads_shards_through_their_index_once(tmp_path: Path) -> None:
    shard = tmp_path / "model-00001-of-00001.safetensors"
    save_file({"a.w": torch.ones(2)}, str(shard))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.w": shard.name}}))
    history = scan_run_checkpoints([str(shard), str(index)])
    assert [s.path for s in history.saves] == [str(index)]


def test_legacy_format_loads_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    tensor = _tricky(torch.float32, 8)
    torch.save({"w": tensor, "epoch": 4}, path, _use_new_zipfile_serialization=False)
    scan = scan_checkpoint(str(path))
    # An epoch is not a step: it is kept as the save's epoch.
    assert (scan.read_mode, scan.step, scan.step_source) == ("weights_only", None, None)
    assert scan.meta is not None and scan.meta.epoch == 4
    _assert_matches(scan.tensors[0], tensor)


def test_adam_state_with_nan_is_flagged(tmp_path: Path) -> None:
    model, optimizer = _trained()
    state = optimizer.state_dict()
    state["state"][0]["exp_avg_sq"][0, 0] = float("nan")
    path = tmp_path / "o.pt"
    torch.save({"model": model.state_dict(), "optimizer": state}, path)
    scan = scan_checkpoint(str(path))
    assert scan.adam[0].nonfinite == 1 and scan.adam[0].flagged
    bad = [t.name for t in scan.nonfinite_tensors]
    assert bad == ["optimizer.state.0.exp_avg_sq"]


def test_trusted_file_with_parameters_and_views(tmp_path: Path) -> None:
    model, _ = _trained()
    path = tmp_path / "params.pt"
    torch.save({"model": dict(model.named_parameters()), "extra": model}, path)
    scan = scan_checkpoint(str(path), trust_pickle=True)
    assert scan.issues == ()
    weight = next(t for t in scan.tensors if t.name == "3.weight")
    _assert_matches(weight, dict(model.named_parameters())["3.weight"])


def test_inspect_command_text_json_and_exit_status(tmp_path: Path) -> None:
    import io

    from analyzer.errors import UsageError

    good, bad = tmp_path / "step_1.pt", tmp_path / "step_2.pt"
    torch.save({"w.weight": torch.ones(2)}, good)
    torch.save({"w.weight": torch.tensor([1.0, float("nan")])}, bad)
    out = io.StringIO()
    assert inspect_command([str(good)], stream=out) == 0
    assert "1 tensors, 1 scanned" in out.getvalue()
    out = io.StringIO()
    assert inspect_command([str(tmp_path)], as_json=True, stream=out) == 1
    data = json.loads(out.getvalue())
    assert data["checkpoints"]["first_nonfinite"] == 1
    with pytest.raises(UsageError):
        inspect_command([str(tmp_path / "missing.pt")])


def test_hf_side_files_optimizer_and_scaler(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-40"
    folder.mkdir()
    _, optimizer = _trained()
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(SCALER, folder / "scaler.pt")
    opt = scan_checkpoint(str(folder / "optimizer.pt"))
    assert (opt.format, opt.step, len(opt.adam)) == ("optimizer", 40, 6)
    assert all(t.group == "optimizer" for t in opt.tensors)
    scaler = scan_checkpoint(str(folder / "scaler.pt"))
    assert scaler.format == "scaler" and scaler.scaler is not None
    assert scaler.scaler.scale == 1024.0


def test_adam_moments_saved_as_requiring_grad_are_read_like_any(tmp_path: Path) -> None:
    # A saved tensor keeps its requires_grad flag; the scan's in-place reductions (out=)
    # refuse such tensors unless they are detached first.
    model, optimizer = _trained()
    state = optimizer.state_dict()
    for slots in state["state"].values():
        slots["exp_avg"].requires_grad_()
        slots["exp_avg_sq"].requires_grad_()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": state, "step": 3}, path)
    scan = scan_checkpoint(str(path))
    assert len(scan.adam) == 6 and not scan.issues
    v, m = state["state"][5]["exp_avg_sq"].detach(), state["state"][5]["exp_avg"].detach()
    assert scan.adam[5].ratio_max == pytest.approx((m.abs() / (v.sqrt() + 1e-8)).max().item())
