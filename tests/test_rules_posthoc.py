"""Causes read from what a dead run leaves without a capture: the kind of the failing value,
the phase that went first, the loss's course before it, and float16 values in the logs.

Each sample run that gets its intended cause only this way is analysed from a copy without
its capture/ folder; constructed runs pin each signature and its near misses."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import analyzer
from analyzer.model import Finding, Run, Series
from analyzer.onset import locate
from analyzer.rules import evaluate
from analyzer.rules.evidence import RunEvidence

SAMPLE_RUNS = Path(__file__).resolve().parent.parent / "sample_runs"


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_size,
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _series(tag: str, values: list[float], dtype: type = np.float64) -> Series:
    n = len(values)
    v = np.asarray(values, dtype=dtype).astype(np.float64)
    return Series(tag=tag, steps=np.arange(n, dtype=np.int64), values=v,
                  wall_times=np.zeros(n), source="events",
                  positions=np.arange(n, dtype=np.int64) * 40)


def _findings(*series: Series) -> list[Finding]:
    run = Run(path="r", name="r", files=("events",), series=series)
    result = locate(run)
    return list(result.findings or evaluate(result)[0])


def _causes(*series: Series) -> list[str]:
    return [f.name for f in _findings(*series) if f.role == "cause"]


def _flat(n: int, seed: int = 0, level: float = 0.9) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(level + 0.05 * rng.standard_normal(n))


@pytest.mark.parametrize(("name", "cause", "high"), [
    ("log_softmax_underflow", "log-of-zero", False),
    ("division_by_zero", "division-by-zero", False),
    ("sqrt_at_zero", "sqrt-at-zero-backward", False),
    ("fp16_no_amp", "fp16-overflow", False),
    # its checkpoints hold Adam's moments in float16 with eps=1e-8, which rounds to 0 there
    ("adam_eps_fp16", "adam-eps-too-small", True),
])
def test_regression_sample_without_capture_gets_its_cause(tmp_path: Path, name: str,
                                                          cause: str, high: bool) -> None:
    run = tmp_path / name
    shutil.copytree(SAMPLE_RUNS / name, run, ignore=shutil.ignore_patterns("capture"))
    before = _snapshot(run)
    result = analyzer.analyze(str(run), replay=False).results[0]
    failures = [f for f in result.findings if f.role in ("cause", "symptom")]
    assert failures and failures[0].name == cause, [f.name for f in failures]
    top = failures[0]
    # from curves alone never the top confidence; a checkpoint that shows the cause is
    assert (top.confidence == "high") is high
    assert any(e.text.startswith("not seen") for e in top.evidence)  # says what it lacks
    assert _snapshot(run) == before


def test_regression_inf_from_a_flat_loss_is_a_division() -> None:
    loss = [*_flat(20), float("inf"), float("nan")]
    grad = [*_flat(20, 1, 0.5), float("nan"), float("nan")]
    found = _findings(_series("train/loss", loss), _series("train/grad_norm", grad))
    top = next(f for f in found if f.role == "cause")
    assert top.name == "division-by-zero"
    assert top.evidence[0].step == 20 and "+inf" in top.evidence[0].text


def test_inf_after_growth_is_not_a_division() -> None:
    loss = [float(10 ** (k / 2)) for k in range(20)] + [float("inf")]
    assert "division-by-zero" not in _causes(_series("train/loss", loss))


def test_nan_from_a_flat_loss_leaves_division_tied_with_a_nan_batch() -> None:
    # 0/0, a NaN in the batch, a log of a negative number: the curves cannot tell them apart
    loss = [*_flat(20), float("nan")]
    found = [f for f in _findings(_series("train/loss", loss)) if f.role == "cause"]
    top, second = found[:2]
    tied = {f.name for f in found if (f.confidence, f.score) == (top.confidence, top.score)}
    assert tied == {"division-by-zero", "nan-in-batch", "log-of-zero"}
    assert top.confidence == "low" and (second.rank_note or "").startswith("undetermined")


def test_regression_saturated_loss_then_nan_is_a_log_of_zero() -> None:
    loss = [1.0, 0.3, 0.05, 0.01] + [10.0 ** -k for k in range(3, 10)] + [float("nan")]
    assert _causes(_series("train/loss", loss))[:1] == ["log-of-zero"]


def test_loss_alternating_zero_and_hundreds_is_not_saturated() -> None:
    loss = [0.0, 0.0, 137.6, 0.0, 0.0, 0.0, 465.8, float("nan")]
    assert "log-of-zero" not in _causes(_series("train/loss", loss))


def test_regression_gradient_nan_under_a_finite_loss_is_a_backward_fault() -> None:
    loss = _flat(23)
    grad = [*_flat(22, 2, 0.2), float("nan")]
    found = _findings(_series("train/loss", loss), _series("train/grad_norm", grad))
    top = next(f for f in found if f.role == "cause")
    assert top.name == "sqrt-at-zero-backward" and top.confidence == "low"


def test_backward_fault_needs_a_moving_loss() -> None:
    # a loss stuck at one value (saturated outputs) is another story: no backward claim
    loss = [3.4657] * 23
    grad = [*_flat(22, 2, 0.2), float("nan")]
    causes = _causes(_series("train/loss", loss), _series("train/grad_norm", grad))
    assert "sqrt-at-zero-backward" not in causes


def _fp16_values(start: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(np.float16(start * (1 + 0.1 * rng.standard_normal()))) for _ in range(n)]


def test_regression_float16_values_rising_into_the_failure_are_an_fp16_overflow() -> None:
    loss = [*_fp16_values(20.0, 20, 3), float("nan")]
    grad = [*_fp16_values(200.0, 19, 4), 5640.0, float("nan")]
    found = _findings(_series("train/loss", loss), _series("train/grad_norm", grad))
    top = next(f for f in found if f.role == "cause")
    assert top.name == "fp16-overflow" and top.confidence == "medium"
    assert "float16" in top.evidence[0].text


def test_same_course_in_float32_is_no_fp16_overflow() -> None:
    rng = np.random.default_rng(5)
    loss = [*(20.0 + rng.random(20)), float("nan")]
    grad = [*(200.0 + rng.random(19)), 5640.123, float("nan")]
    causes = _causes(_series("train/loss", loss), _series("train/grad_norm", grad))
    assert "fp16-overflow" not in causes


def test_regression_weights_first_in_float16_is_adam_eps() -> None:
    loss = _fp16_values(120.0, 21, 6)
    grad = _fp16_values(12.0, 21, 7)
    weight = [*_fp16_values(30.0, 20, 8), float("inf")]
    found = _findings(_series("train/loss", loss), _series("train/grad_norm", grad),
                      _series("weight_norm/fc1.weight", weight))
    top = next(f for f in found if f.role == "cause")
    assert top.name == "adam-eps-too-small"
    assert "update" in top.evidence[0].text


def test_onset_phases() -> None:
    nan = float("nan")
    run = Run(path="r", name="r", files=("events",), series=(
        _series("train/loss", [1.0, 0.9, 0.8, nan]),
        _series("train/grad_norm", [1.0, 1.0, nan, nan])))
    o = RunEvidence(locate(run)).onset
    assert o is not None and (o.step, o.phase, o.loss_kind) == (2, "backward", None)
    run = replace(run, series=(_series("train/loss", [1.0, 0.9, -float("inf")]),))
    o = RunEvidence(locate(run)).onset
    assert o is not None and (o.step, o.phase, o.loss_kind) == (2, "forward", "-inf")


def test_healthy_run_has_no_onset() -> None:
    run = Run(path="r", name="r", files=("events",),
              series=(_series("train/loss", _fp16_values(1.0, 30, 9)),))
    ev = RunEvidence(locate(run))
    assert ev.onset is None and not ev.result.findings


def test_inf_after_gradient_growth_is_not_a_division() -> None:
    # the loss barely moved, but the gradient norm grew 14 orders of magnitude into it
    grads = [10 ** (0.5 * i) for i in range(30)] + [float("inf")]
    loss = [1.0 + 0.1 * i for i in range(30)] + [float("inf")]
    causes = _causes(_series("train/grad_norm", grads), _series("train/loss", loss))
    assert "division-by-zero" not in causes


def test_regression_sane_first_gradient_blown_up_by_a_rate_above_any_ceiling() -> None:
    # lr 3.0 for a CNN: the first norm is 135, the second 3e7 - the rate, not the init
    grad = [135.3, 3.3e7, float("inf"), float("nan"), float("nan")]
    loss = [24.4, 1.3e8, 2.3e28, float("nan"), float("nan")]
    series = (_series("train/grad_norm", grad), _series("train/loss", loss),
              _series("train/lr", [3.0] * 5))
    assert _causes(*series)[:1] == ["learning-rate-too-high"]
    # the same curves at a rate of 0.01 stay the initialisation's
    series = (*series[:2], _series("train/lr", [0.01] * 5))
    assert _causes(*series)[:1] == ["bad-initialisation"]


def test_regression_a_tie_between_two_causes_is_reported_as_undetermined() -> None:
    from analyzer.rules import BY_NAME, rank

    a = BY_NAME["division-by-zero"].finding("medium", [], 0.5)
    b = BY_NAME["nan-in-batch"].finding("medium", [], 0.5)
    top, second = rank([b, a])
    assert top.name == "division-by-zero"
    note = second.rank_note or ""
    assert note.startswith("undetermined between division-by-zero and nan-in-batch")
    assert "would decide" in note


def test_regression_configured_float16_and_eps_name_adam_eps() -> None:
    from analyzer.model import RunMetadata, Setting

    settings = {"precision": Setting("16-true", "hparams.yaml", "precision"),
                "adam_epsilon": Setting(1e-8, "hparams.yaml", "adam_epsilon")}
    rng = np.random.default_rng(10)
    loss = list(1.0 + 0.1 * rng.random(21))  # float32 values: only the config says float16
    weight = [*(30.0 + rng.random(20)), float("inf")]
    run = Run(path="r", name="r", files=("events",),
              series=(_series("train/loss", loss), _series("weight_norm/fc1.weight", weight)),
              metadata=RunMetadata(settings=settings))
    result = locate(run)
    findings = result.findings or evaluate(result)[0]
    top = next(f for f in findings if f.role == "cause")
    assert top.name == "adam-eps-too-small"
    texts = " | ".join(e.text for e in top.evidence)
    assert "precision=16-true" in texts and "eps=1e-08 rounds to 0 in float16" in texts


def test_regression_a_loss_that_each_update_multiplies_under_a_high_rate_is_the_rate(
        tmp_path: Path) -> None:
    """A Lightning run at lr 3 (SGD): the loss went 6, 103, 3.6e7, 1.8e23, inf in four
    updates, too few points for a growth fit, and no gradient norm was logged. The
    configured rate and the loss each update multiplied say the rate (it was no cause)."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    writer = SummaryWriter(str(run))
    for step, value in enumerate([5.98, 103.1, 3.58e7, 1.77e23, float("inf"), float("nan")]):
        writer.add_scalar("train/loss", value, step)
    writer.close()
    (run / "hparams.yaml").write_text("lr: 3.0\nhidden: 16\n", encoding="utf-8")
    result = analyzer.analyze(str(run), replay=False).results[0]
    assert result.findings and result.findings[0].code == "NF202"
    assert result.findings[0].confidence == "medium"
    # The same curve with a sane rate is no rate's doing.
    (run / "hparams.yaml").write_text("lr: 0.01\nhidden: 16\n", encoding="utf-8")
    again = analyzer.analyze(str(run), replay=False).results[0]
    assert "NF202" not in [f.code for f in again.findings]
