"""Issue #16's new causes read from what a dead run leaves: exp overflow, a float16 reduction
overflow, a collapsing temperature. Series are made here; a real float16 loss and a real
checkpoint come from torch."""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from analyzer.model import Run, Series
from analyzer.onset import locate
from analyzer.rules import BY_NAME, evaluate
from analyzer.scenarios.corpus.failing import PROPOSED


def _series(tag: str, values: list[float], start: int = 0) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(start, start + n, dtype=np.int64),
                  values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                  source="events", positions=np.arange(n, dtype=np.int64) * 40)


def _findings(*series: Series) -> list[tuple[str, str]]:
    run = Run(path="r", name="r", files=("events",), series=series)
    findings, _ = evaluate(locate(run))
    return [(f.name, f.confidence) for f in findings if f.is_failure]


def _top(*series: Series) -> str | None:
    found = _findings(*series)
    return found[0][0] if found else None


def _float32_losses(n: int, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (1.0 + torch.rand(n, generator=g)).tolist()  # float32 values, not float16 ones


def _float16_losses(n: int, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (200.0 + 30 * torch.rand(n, generator=g)).half().float().tolist()


def test_new_causes_are_rules_and_left_the_proposals() -> None:
    for name in ("exp-overflow", "fp16-reduction-overflow", "temperature-collapse",
                 "zero-variance-normalisation"):
        assert name in BY_NAME and name not in PROPOSED
    assert {BY_NAME[n].code for n in ("exp-overflow", "fp16-reduction-overflow",
                                      "temperature-collapse")} == {"NF104", "NF304", "NF209"}


def test_exp_overflow_a_jump_to_inf_from_a_negative_poisson_loss() -> None:
    loss = [1.0, -5.0, -40.0, -300.0, 3e4, math.inf]
    grads = [3.0, 20.0, 150.0, 900.0, 6000.0, math.nan]
    found = _findings(_series("train/loss", loss), _series("train/grad_norm", grads))
    assert found[0] == ("exp-overflow", "medium")


def test_exp_overflow_needs_a_precursor() -> None:
    # A bare jump to +inf is as much a division by zero: not claimed.
    assert "exp-overflow" not in dict(
        _findings(_series("train/loss", [*_float32_losses(20), math.inf])))
    found = _findings(_series("train/loss", [*_float32_losses(20), math.inf]),
                      _series("train/grad_norm", [2.0] * 19 + [40.0, math.nan]))
    assert ("exp-overflow", "medium") in found


def test_exp_overflow_is_not_a_runaway_climb_nor_a_nan() -> None:
    climb = [10.0 ** (2 * i) for i in range(1, 15)] + [math.inf]  # last finite 1e28
    assert "exp-overflow" not in dict(_findings(_series("train/loss", climb)))
    runaway = [10 ** (0.5 * i) for i in range(30)] + [math.inf]  # gradients explode first
    assert "exp-overflow" not in dict(_findings(
        _series("train/loss", [*_float32_losses(30), math.inf]),
        _series("train/grad_norm", runaway)))
    nan = [*_float32_losses(20), math.nan]
    assert "exp-overflow" not in dict(_findings(_series("train/loss", nan)))


def test_exp_overflow_needs_the_loss_to_go_first() -> None:
    loss = [*_float32_losses(10), math.inf]
    grads = [50.0] * 8 + [math.nan, math.nan, math.nan]  # the gradients were NaN before
    assert "exp-overflow" not in dict(_findings(_series("train/loss", loss),
                                                _series("train/grad_norm", grads)))


def test_fp16_reduction_overflow_from_a_float16_loss() -> None:
    loss = [*_float16_losses(20), math.inf]
    found = _findings(_series("train/loss", loss), _series("train/grad_norm", [15.0] * 21))
    assert found[0] == ("fp16-reduction-overflow", "medium")
    assert "exp-overflow" not in dict(found)  # the same jump in float16 is the reduction


def test_fp16_reduction_overflow_is_not_a_float32_loss_nor_a_nan() -> None:
    assert "fp16-reduction-overflow" not in dict(
        _findings(_series("train/loss", [*_float32_losses(20, seed=3), math.inf])))
    assert "fp16-reduction-overflow" not in dict(
        _findings(_series("train/loss", [*_float16_losses(20), math.nan])))


def test_temperature_collapse_from_a_log_temperature_norm() -> None:
    steps = 60
    log_t = [abs(math.log(0.5) + i * math.log(0.7)) for i in range(steps)]
    loss = [3.0] * (steps - 1) + [math.nan]
    found = _findings(_series("train/loss", loss),
                      _series("weight_norm/log_temperature", log_t),
                      _series("weight_norm/fc1.weight", [4.0] * (steps - 1) + [math.nan]))
    assert found[0] == ("temperature-collapse", "medium")


def test_temperature_collapse_needs_a_collapse_and_a_failure() -> None:
    steady = [abs(math.log(0.07))] * 40
    assert _top(_series("train/loss", [1.0] * 39 + [math.nan]),
                _series("weight_norm/log_temperature", steady)) != "temperature-collapse"
    falling = [abs(math.log(0.5) + i * math.log(0.7)) for i in range(40)]
    assert _findings(_series("train/loss", [1.0] * 40),
                     _series("weight_norm/log_temperature", falling)) == []
    temporal = [1.0 / 2 ** i for i in range(40)]  # a temporal conv's weights, not a temperature
    assert "temperature-collapse" not in dict(
        _findings(_series("train/loss", [1.0] * 39 + [math.nan]),
                  _series("weight_norm/temporal_conv.weight", temporal)))


def _checkpointed_run(folder, log_ts: list[float], fails: bool) -> None:  # type: ignore[no-untyped-def]
    from torch.utils.tensorboard import SummaryWriter

    (folder / "checkpoints").mkdir(parents=True)
    writer = SummaryWriter(str(folder))
    for i in range(30):
        writer.add_scalar("train/loss", math.nan if fails and i == 29 else 1.0 + 0.01 * i, i)
    writer.close()
    model = torch.nn.Module()
    model.fc = torch.nn.Linear(4, 4)
    model.log_temperature = torch.nn.Parameter(torch.tensor(0.0))
    for step, log_t in zip((0, 10, 20), log_ts, strict=True):
        with torch.no_grad():
            model.log_temperature.fill_(log_t)
        torch.save({"model": model.state_dict(), "global_step": step},
                   folder / "checkpoints" / f"step_{step}.pt")


def test_temperature_collapse_from_checkpoints(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import analyzer

    collapsed, steady, healthy = tmp_path / "collapsed", tmp_path / "steady", tmp_path / "ok"
    _checkpointed_run(collapsed, [math.log(0.5), -30.0, -60.0], fails=True)
    _checkpointed_run(steady, [math.log(0.07)] * 3, fails=True)
    _checkpointed_run(healthy, [math.log(0.5), -30.0, -60.0], fails=False)
    before = _snapshot(tmp_path)
    results = {r.run.name: r for r in analyzer.analyze(str(tmp_path), replay=False).results}
    assert _snapshot(tmp_path) == before
    found = [f for f in results["collapsed"].findings if f.name == "temperature-collapse"]
    assert found and found[0].confidence == "medium"
    assert found[0].evidence[0].tensor == "log_temperature"
    assert "e^-60" in found[0].evidence[0].text
    assert found[0].evidence[-1].text.startswith("not seen: the op")  # says what it lacks
    assert not [f for f in results["steady"].findings if f.name == "temperature-collapse"]
    assert not [f for f in results["ok"].findings if f.is_failure]


def _snapshot(folder) -> dict[str, tuple[int, bytes]]:  # type: ignore[no-untyped-def]
    import hashlib

    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[p] = (os.path.getsize(p), hashlib.sha256(fh.read()).digest())
    return out


def test_exp_overflow_left_to_the_replay_that_names_a_division(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sample division by zero jumps from 0.85 to +inf: with its capture the replay
    names the division, and without it the bare jump is not claimed as an exp."""
    import shutil

    import analyzer

    sample = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "sample_runs", "division_by_zero")
    copy = tmp_path / "division_by_zero"
    shutil.copytree(sample, copy, ignore=shutil.ignore_patterns("capture"))
    for folder, replay in ((copy, False), (sample, True)):
        result = analyzer.analyze(str(folder), replay=replay).results[0]
        assert result.failed
        assert "exp-overflow" not in {f.name for f in result.findings}


def _anomaly_log(path, norm: torch.nn.Module) -> None:  # type: ignore[no-untyped-def]
    """A training step's console under detect_anomaly: torch's own warning and error text."""
    import traceback
    import warnings

    lines = ["step 0 loss 0.6931", "step 1 loss 0.6812"]
    x = torch.zeros(4, 8)
    x[0] = torch.randn(8)  # three blank rows: a zero variance each
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly():
                norm(x).sum().backward()
        except RuntimeError:
            lines.append(traceback.format_exc())
    lines[2:2] = [warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                  for w in caught if "Error detected" in str(w.message)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_zero_variance_normalisation_from_a_real_anomaly_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import analyzer

    run = tmp_path / "ln_eps0"
    run.mkdir()
    _anomaly_log(run / "train.log", torch.nn.LayerNorm(8, eps=0.0))
    assert "NativeLayerNormBackward0" in (run / "train.log").read_text()
    before = _snapshot(run)
    result = analyzer.analyze(str(run), replay=False).results[0]
    assert _snapshot(run) == before
    assert result.failed
    top = next(f for f in result.findings if f.is_failure)
    assert (top.name, top.confidence) == ("zero-variance-normalisation", "medium")
    assert "test_rules_new.py" in top.evidence[0].text  # the user frame that called the norm


def test_zero_variance_normalisation_not_from_a_division_anomaly() -> None:
    from analyzer.model import Event, Location

    event = Event("nonfinite", 5, Location("train.log", line=9), "RuntimeError: ...",
                  {"tag": "loss", "kind": "nan", "function": "DivBackward0",
                   "user_frames": ["train.py:12"]})
    run = Run(path="r", name="r", files=("events",),
              series=(_series("train/loss", [1.0] * 5),), events=(event,))
    findings, _ = evaluate(locate(run))
    assert "zero-variance-normalisation" not in {f.name for f in findings}


def _with_replay(op_names: tuple[str, ...], *series: Series):  # type: ignore[no-untyped-def]
    """A located run whose replay found ``op_names`` failing first (the replay's record is
    stood in by its fields the overflow rules read)."""
    from dataclasses import replace
    from types import SimpleNamespace

    result = locate(Run(path="r", name="r", files=("events",), series=series))
    op = SimpleNamespace(phase="forward", forward_op=None, names=op_names, module="loss",
                         inputs=(), outputs=(), parameter=None, inputs_finite=True,
                         float64_finite=True, source=None, source_line=None, op=op_names[0])
    verdict = SimpleNamespace(kind="range-overflow", summary="finite in float64")
    return replace(result, replay=SimpleNamespace(op=op, step=20, verdict=verdict))


def test_fp16_reduction_overflow_follows_the_replay() -> None:
    loss = _series("train/loss", [*_float16_losses(20), math.inf])
    summed, _ = evaluate(_with_replay(("aten::sum",), loss))
    assert ("fp16-reduction-overflow", "high") in {(f.name, f.confidence) for f in summed}
    matmul, _ = evaluate(_with_replay(("aten::mm",), loss))
    assert "fp16-reduction-overflow" not in {f.name for f in matmul}


def test_exp_overflow_follows_the_replay() -> None:
    loss = _series("train/loss", [*_float32_losses(20), math.inf])  # no precursor at all
    exp, _ = evaluate(_with_replay(("aten::exp",), loss))
    assert ("exp-overflow", "high") in {(f.name, f.confidence) for f in exp}
    div, _ = evaluate(_with_replay(("aten::div",), loss))
    assert "exp-overflow" not in {f.name for f in div}
