"""Loss-scaler skips read from the data: real torch.amp.GradScaler runs on CPU, the scale
logged before and after ``scaler.update()``, and the trainers' own overflow messages."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.api import analyze, read
from analyzer.cli import main
from analyzer.model import Run, Series
from analyzer.onset import locate, overflow_skip_steps
from analyzer.scaler import read_scale
from tests.fuzz.budget import fuzz_settings

FIXTURES = Path(__file__).parent / "fixtures" / "amp"


@dataclass
class AmpRun:
    folder: str
    skipped: list[int] = field(default_factory=list)
    """The steps the GradScaler really skipped (its scale fell across them)."""
    scales: list[float] = field(default_factory=list)


def train(folder: str, *, after: bool, steps: int, loss_gain: float = 20.0,
          growth_interval: int = 2000, blowup_at: int | None = None,
          grad_norm: bool = True) -> AmpRun:
    """A small MLP under float16 autocast with a real GradScaler on CPU.

    ``loss_gain`` multiplies the loss so that 65536 times its gradients overflow float16 (a
    few early skips); from ``blowup_at`` on the inputs are 1e5 times larger, so the forward
    overflows whatever the scale (a collapse). The scale is logged before or after
    ``scaler.update()``.
    """
    import torch
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0, growth_interval=growth_interval)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    out = AmpRun(folder)
    writer = SummaryWriter(folder)
    for step in range(steps):
        xb = x * 1e5 if blowup_at is not None and step >= blowup_at else x
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(xb), y) * loss_gain
        before = scaler.get_scale()
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scaler.unscale_(opt)
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()
                                                    if p.grad is not None]))
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < before:
            out.skipped.append(step)
        logged = scaler.get_scale() if after else before
        out.scales.append(logged)
        writer.add_scalar("train/loss", float(loss.detach()), step)
        if grad_norm:
            writer.add_scalar("train/grad_norm", norm, step)
        writer.add_scalar("amp/loss_scale", logged, step)
    writer.close()
    return out


def _run(folder: str) -> Run:
    (run,) = read(folder)
    return run


def _report(folder: str, tmp_path: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = tmp_path / "report.json"
    code = main(["analyze", folder, "--json", str(out), "-q", "--no-replay"])
    return code, json.loads(out.read_text())["runs"][0]


def _failures(run_json: dict) -> list[str]:  # type: ignore[type-arg]
    return [f["name"] for f in run_json["findings"] if f["role"] in ("cause", "symptom")]


def _snapshot(folder: str) -> dict[str, tuple[int, str]]:
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            out[p] = (os.path.getsize(p), hashlib.sha256(Path(p).read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AmpRun]:
    base = tmp_path_factory.mktemp("amp")
    made = {
        "early_after": train(str(base / "early_after"), after=True, steps=30, loss_gain=100.0),
        "early_before": train(str(base / "early_before"), after=False, steps=30,
                              loss_gain=100.0),
        "throughout_after": train(str(base / "throughout_after"), after=True, steps=40,
                                  growth_interval=4),
        "throughout_before": train(str(base / "throughout_before"), after=False, steps=40,
                                   growth_interval=4),
        "collapse_after": train(str(base / "collapse_after"), after=True, steps=40,
                                blowup_at=20),
        "collapse_before": train(str(base / "collapse_before"), after=False, steps=40,
                                 blowup_at=20),
        "short_collapse": train(str(base / "short_collapse"), after=True, steps=27,
                                blowup_at=20),
        "single_after": train(str(base / "single_after"), after=True, steps=12, loss_gain=8.0),
        "early_after_no_norm": train(str(base / "early_after_no_norm"), after=True, steps=30,
                                     loss_gain=100.0, grad_norm=False),
    }
    # What the scaler did, so the tests below check the runs they mean to.
    assert made["early_after"].skipped == [0, 1, 2, 3, 4]
    assert made["single_after"].skipped == [0]
    assert len(made["throughout_after"].skipped) >= 5
    assert max(made["throughout_after"].skipped) > 30
    assert made["collapse_after"].scales[-1] < 1.0
    assert made["short_collapse"].scales[-1] > 1.0
    return made


def test_regression_scale_logged_after_update_is_not_read_one_step_off(
        runs: dict[str, AmpRun]) -> None:
    # Before: a drop from step N to N+1 always marked N, so the after-update run's skips
    # were read as 0..3 and step 4's Inf gradient norm became the run's failure.
    amp = runs["early_after"]
    run = _run(amp.folder)
    reading = read_scale(run)
    assert reading.convention == "after_update" and reading.inferred
    assert overflow_skip_steps(run) == frozenset(amp.skipped)
    result = locate(run)
    assert result.incident is None
    assert result.overflow_skips == tuple(amp.skipped)
    assert reading.statement is not None
    assert reading.statement.startswith("loss scale logged after scaler.update(): a drop at "
                                        "step N marks step N as skipped")


def test_scale_logged_before_update_keeps_marking_the_step_before(
        runs: dict[str, AmpRun]) -> None:
    amp = runs["early_before"]
    run = _run(amp.folder)
    reading = read_scale(run)
    assert reading.convention == "before_update" and reading.inferred
    assert locate(run).overflow_skips == tuple(amp.skipped)


@pytest.mark.parametrize("name", ["throughout_after", "throughout_before"])
def test_skips_throughout_that_recover_are_exactly_the_skipped_steps(
        runs: dict[str, AmpRun], name: str) -> None:
    amp = runs[name]
    result = locate(_run(amp.folder))
    assert result.incident is None
    assert result.overflow_skips == tuple(amp.skipped)


def test_without_a_gradient_norm_the_convention_is_assumed_and_said(
        runs: dict[str, AmpRun]) -> None:
    reading = read_scale(_run(runs["early_after_no_norm"].folder))
    assert reading.convention == "before_update" and not reading.inferred
    assert reading.statement is not None and "assumed" in reading.statement


@pytest.mark.parametrize("name", ["early_after", "early_before", "throughout_after",
                                  "throughout_before", "single_after"])
def test_healthy_amp_run_with_early_skips_exits_0(runs: dict[str, AmpRun], name: str,
                                                  tmp_path: Path) -> None:
    folder = str(tmp_path / name)
    shutil.copytree(runs[name].folder, folder)
    before = _snapshot(folder)
    code, run_json = _report(folder, tmp_path)
    assert code == 0
    assert run_json["status"] == "finite" and run_json["incident"] is None
    assert run_json["overflow_skips"] == runs[name].skipped
    assert _failures(run_json) == []
    warm = [f for f in run_json["findings"] if f["code"] == "NF303"]
    assert warm and warm[0]["role"] == "warning"
    assert any("scaler.update()" in e["text"] for e in warm[0]["evidence"])
    assert _snapshot(folder) == before


@pytest.mark.parametrize("name", ["collapse_after", "collapse_before"])
def test_true_collapse_to_the_floor_fails_with_nf302(runs: dict[str, AmpRun], name: str,
                                                     tmp_path: Path) -> None:
    code, run_json = _report(runs[name].folder, tmp_path)
    assert code == 1
    assert run_json["incident"]["tag"] == "train/loss" and run_json["incident"]["step"] == 20
    top = run_json["findings"][0]
    assert top["code"] == "NF302" and top["confidence"] == "high"
    said = "after" if name.endswith("after") else "before"
    assert any(e["text"].startswith(f"loss scale logged {said} scaler.update()")
               for e in top["evidence"])
    assert not [f for f in run_json["findings"] if f["code"] == "NF303"]


def test_collapse_caught_before_the_floor_is_a_falling_tail(runs: dict[str, AmpRun],
                                                           tmp_path: Path) -> None:
    # 7 halvings from 16384: still far above 1 when the run ends with a NaN loss.
    code, run_json = _report(runs["short_collapse"].folder, tmp_path)
    assert code == 1
    nf302 = [f for f in run_json["findings"] if f["code"] == "NF302"]
    assert nf302 and nf302[0]["confidence"] == "medium"
    assert any("of the last" in e["text"] for e in nf302[0]["evidence"])


def test_regression_a_scale_that_settles_is_not_a_collapse(tmp_path: Path) -> None:
    # Five early skips, then the scale holds; a NaN loss at step 8 is the failure. Before:
    # five skips in the first half of the run read as a persistent collapse (NF302).
    amp = train(str(tmp_path / "run"), after=False, steps=8, loss_gain=100.0)
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(amp.folder)
    writer.add_scalar("train/loss", float("nan"), 8)
    writer.close()
    (result,) = analyze(amp.folder, replay=False).results
    assert result.incident is not None and result.incident.step == 8
    assert result.overflow_skips == tuple(amp.skipped) == (0, 1, 2, 3, 4)
    codes = [f.code for f in result.findings]
    assert "NF302" not in codes and "NF303" in codes


@pytest.mark.parametrize("name", ["amp_benign_skips", "amp_scale_collapse"])
def test_regression_sample_runs_skips_are_the_scalers_own(name: str) -> None:
    # The scenario records the steps its GradScaler skipped. Before: the collapse's last
    # skip (step 39, whose halving would show at a step never logged) was missed, so its
    # NaN gradients stood as incidents beside the failure.
    from tests.conftest import SAMPLE_RUNS

    folder = os.path.join(SAMPLE_RUNS, name)
    truth = json.loads(Path(folder, "scenario.json").read_text())["skipped_steps"]
    (run,) = read(folder)
    assert list(locate(run).overflow_skips) == truth


# --- the trainers' own messages, in the texts their sources print ---------------------

LOGS = {
    # deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale
    "deepspeed_min_scale.log": ("NF302", 1),
    # apex/amp/handle.py scale_loss: "Gradient overflow.  Skipping step, loss scaler ..."
    "apex_warm_up.log": ("NF303", 0),
    # fairseq/trainer.py train_step, fairseq/optim/dynamic_loss_scaler.py check_overflow
    "fairseq_min_scale.log": ("NF302", 1),
}


@pytest.mark.parametrize("name", sorted(LOGS))
def test_trainer_overflow_messages_are_read(name: str, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(FIXTURES / name, folder / "train.log")
    code, run_json = _report(str(folder), tmp_path)
    want, exit_code = LOGS[name]
    assert code == exit_code
    assert want in [f["code"] for f in run_json["findings"]]
    kinds = [e["kind"] for e in run_json["events"]]
    assert kinds.count("overflow_skip") >= 3
    found = next(f for f in run_json["findings"] if f["code"] == want)
    assert not any(re.search(r"\(steps?\s*\)", e["text"]) for e in found["evidence"])


def test_regression_deepspeed_stuck_at_its_minimum_without_raising_is_the_failure(
        tmp_path: Path) -> None:
    # raise_error_at_min_scale off: DeepSpeed goes on "reducing to 128" from 128, skipping
    # every step, and never prints the exception. Before: read as a finite run (exit 0).
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(FIXTURES / "deepspeed_at_min_scale_no_raise.log", folder / "train.log")
    code, run_json = _report(str(folder), tmp_path)
    assert code == 1
    floors = [e for e in run_json["events"] if e["kind"] == "min_loss_scale"]
    assert len(floors) == 1 and floors[0]["detail"]["min_scale"] == 128.0
    assert floors[0]["location"]["line"] == 10  # the second skip at 128
    assert run_json["incident"]["tag"] == "gradients"
    assert run_json["findings"][0]["code"] == "NF302"


def _series(tag: str, steps: list[int], values: list[float]) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.asarray(steps, np.int64), values=np.asarray(values),
                  wall_times=np.zeros(n), source="f", positions=np.arange(n, dtype=np.int64))


@fuzz_settings(ci_examples=150)
@given(overflow=st.lists(st.booleans(), min_size=2, max_size=40),
       growth_interval=st.integers(1, 6), start=st.integers(0, 1000), after=st.booleans())
def test_skips_are_exactly_the_scalers_whichever_side_of_update_the_scale_is_logged(
        overflow: list[bool], growth_interval: int, start: int, after: bool) -> None:
    # The scale evolves by GradScaler's own update kernel, fed the overflow of each step.
    import torch

    scale, tracker = torch.tensor([65536.0]), torch.zeros(1, dtype=torch.int32)
    logged: list[float] = []
    for inf in overflow:
        before = float(scale)
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(inf)]), 2.0, 0.5,
                                 growth_interval)
        logged.append(float(scale) if after else before)
    steps = list(range(start, start + len(overflow)))
    norms = [math.inf if inf else 1.0 for inf in overflow]
    run = Run(path="r", name="r", files=("f",), series=(
        _series("amp/loss_scale", steps, logged), _series("train/grad_norm", steps, norms)))
    reading = read_scale(run)
    assert reading.skips == {s for s, inf in zip(steps, overflow, strict=True) if inf}
    if reading.inferred:
        assert reading.convention == ("after_update" if after else "before_update")
    assert locate(run).incident is None


def test_deepspeed_hysteresis_skip_keeps_the_scale_and_is_still_a_skip(tmp_path: Path) -> None:
    # DeepSpeed with delayed_shift 2 skips the first overflow without lowering the scale.
    from analyzer.ingest.logs import read_log

    log = tmp_path / "train.log"
    prefix = "[2024-06-20 17:40:12,372] [INFO] [loss_scaler.py:190:update_scale] [deepspeed] "
    log.write_text(
        prefix + "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, but hysteresis "
        "is 2. Reducing hysteresis to 1\n"
        + prefix + "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to "
        "32768\n")
    events = read_log(str(log)).events
    assert [e.kind for e in events] == ["overflow_skip", "overflow_skip"]
    assert "new_scale" not in events[0].detail and events[1].detail["new_scale"] == 32768.0
