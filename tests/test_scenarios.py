"""The sample runs: complete, honest about their failure, and reproducible."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from analyzer.capture import Factory, read_meta
from analyzer.ingest.tb import is_event_file
from analyzer.scenarios.catalog import SCENARIOS

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_runs"
NAMES = [sc.name for sc in SCENARIOS]
# Fast ones, each a different failure mechanism: bad data, a loss fault, a recurrent overflow,
# an optimizer fault in float16.
REGENERATE = ["nan_in_batch", "division_by_zero", "exploding_rnn", "adam_eps_fp16"]


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of every event file, unsampled, in file order."""
    series: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(run)):
        if not is_event_file(name):
            continue
        for event in EventFileLoader(str(run / name)).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif value.HasField("tensor") and value.tensor.float_val:
                    number = value.tensor.float_val[0]
                else:
                    continue
                series.setdefault(value.tag, []).append((event.step, number))
    return series


def _first_nonfinite(run: Path, skipped: set[int]) -> tuple[int, str] | None:
    """Oracle for scenario.json: the earliest step with a non-finite scalar; at that step the
    tag in the order the step computes them (loss, grad norms, weight norms)."""
    order = {"train/loss": 0, "train/grad_norm": 1}
    names: list[str] = []
    hits: list[tuple[int, int, int, str]] = []
    for tag, points in _scalars(run).items():
        names.append(tag)
        for step, value in points:
            if math.isfinite(value):
                continue
            if step in skipped and "grad_norm" in tag:
                continue  # a GradScaler skip, not a failure
            rank = order.get(tag, 2 if tag.startswith("grad_norm/") else 3)
            hits.append((step, rank, 0, tag))
            break
    if not hits:
        return None
    step, rank, _, _ = min(hits)
    # Within a rank, parameters in model order: the scenario's first parameter tag logged.
    tied = [h[3] for h in hits if h[0] == step and h[1] == rank]
    tag = tied[0] if len(tied) == 1 else _model_order(tied, names)
    return step, tag


def _model_order(tags: list[str], names: list[str]) -> str:
    return min(tags, key=names.index)


def _scenario(run: Path) -> dict[str, Any]:
    return json.loads((run / "scenario.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_committed_run_is_complete(name: str) -> None:
    run = SAMPLES / name
    info = _scenario(run)
    assert info["scenario"] == name
    for required in ("README.md", "env.json", "train.log"):
        assert (run / required).is_file(), required
    assert any(is_event_file(f) for f in os.listdir(run))
    checkpoints = sorted((run / "checkpoints").iterdir())
    assert checkpoints
    for path in checkpoints:
        state = torch.load(path, weights_only=True, map_location="cpu")
        assert {"model", "optimizer", "step"} <= set(state)
    expected = info["expected"]
    found = _first_nonfinite(run, set(info["skipped_steps"]))
    if info["healthy"]:
        assert found is None and expected["first_nonfinite_step"] is None
        assert info["capture"] is None
        losses = _scalars(run)["train/loss"]
        assert all(math.isfinite(v) for _, v in losses)
        assert bool(info["skipped_steps"]) == info["benign_skips"]
        return
    assert found == (expected["first_nonfinite_step"], expected["tag"])
    step = expected["first_nonfinite_step"]
    assert str(step) in (run / "README.md").read_text()
    assert expected["cause"] and expected["verdict"] and expected["phase"]
    # A checkpoint from before the failure exists, so the last good state can be inspected.
    assert any(int(p.stem.split("_")[1]) < step for p in checkpoints)
    meta = read_meta(run / info["capture"])
    assert meta["step"] == step
    for part in ("state.pt", "batch.pt", "rng.pt"):
        torch.load(run / info["capture"] / part, weights_only=True, map_location="cpu")
    # What replay does first: rebuild the model from its factory and load the saved state.
    model = Factory(meta["model"]["factory"], meta["model"]["kwargs"]).build()
    state = torch.load(run / info["capture"] / "state.pt", weights_only=True)
    model.to(getattr(torch, meta["dtype"])).load_state_dict(state["model"])
    assert callable(Factory(meta["loss"]["factory"], meta["loss"]["kwargs"]).build())


def test_failures_are_varied() -> None:
    infos = [_scenario(SAMPLES / n) for n in NAMES]
    causes = {i["expected"]["cause"] for i in infos if not i["healthy"]}
    assert len(causes) == len([i for i in infos if not i["healthy"]])
    styles = {i["log_style"] for i in infos}
    assert styles == {"plain", "huggingface", "lightning", "megatron", "deepspeed", "metric_logger"}


def test_regenerated_runs_fail_the_same_way(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run(
        [sys.executable, "-m", "analyzer.scenarios", str(tmp_path), "--only", *REGENERATE],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    for name in REGENERATE:
        committed = _scenario(SAMPLES / name)
        fresh = _scenario(tmp_path / name)
        assert fresh["expected"] == committed["expected"], name
        found = _first_nonfinite(tmp_path / name, set(fresh["skipped_steps"]))
        assert found == (committed["expected"]["first_nonfinite_step"],
                         committed["expected"]["tag"]), name  # fmt: skip
        assert read_meta(tmp_path / name / fresh["capture"])["step"] == found[0]


STYLE_FRAMEWORK = {
    "plain": "generic",
    "huggingface": "transformers",
    "lightning": "lightning",
    "megatron": "megatron",
    "deepspeed": "deepspeed",
    "metric_logger": "metric_logger",
}


@pytest.mark.parametrize("name", NAMES)
def test_each_sample_log_reads_as_its_style(name: str) -> None:
    # The log styles imitate real frameworks; the log reader must recognise each.
    from analyzer.ingest.logs import read_log

    info = _scenario(SAMPLES / name)
    read = read_log(str(SAMPLES / name / "train.log"))
    assert read.framework == STYLE_FRAMEWORK[info["log_style"]], read.framework
    assert read.series and not read.issues
