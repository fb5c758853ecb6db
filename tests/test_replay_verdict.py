"""The differential verdict as a pure function of the passes, and the package's light import."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.model.replays import OpFault, PassOutcome, Phase, ReplayResult, TensorStat
from analyzer.replayer.verdict import decide, wider

F16 = TensorStat((2,), "float16", 2)


def _pass(phase: Phase | None, label: str = "as-run", fingerprint: str = "a",
          error: str | None = None) -> PassOutcome:
    return PassOutcome(label, "cpu", "float32", None, 1.0, phase, fingerprint, error)


def _op(f64: bool | None, inputs_finite: bool = True, name: str = "log.default") -> OpFault:
    return OpFault("forward", name, 3, (F16,), (F16,), inputs_finite, float64_finite=f64)


def test_the_op_in_float64_decides_math_against_range() -> None:
    own = [_pass("forward"), _pass("forward")]
    math = decide(own, "forward", "forward", _pass(None), _op(False), "float32", [], True)
    assert math.kind == "math-fault"
    assert "limited range of float16 made" in math.summary  # the op's dtype; step finite
    assert "log of 0" in math.hypothesis
    rng = decide(own, "forward", "forward", _pass(None), _op(True, name="addmm.default"),
                 "float16", [], True)
    assert rng.kind == "range-overflow" and "float16" in rng.summary


def test_without_a_producing_op_the_whole_float64_pass_decides() -> None:
    own = [_pass("backward"), _pass("backward")]
    same = decide(own, "backward", "backward", _pass("backward"), _op(None, False), "float32",
                  [], True)
    assert same.kind == "math-fault"
    later = decide(own, "backward", "backward", _pass("update"), None, "float32", [], True)
    assert later.kind == "range-overflow" and "only in update" in later.summary
    failed = decide(own, "backward", "backward", _pass(None, error="RuntimeError: x"), None,
                    "float32", [], True)
    assert failed.kind == "undecided"


def test_disagreeing_or_silent_passes_are_not_reproducible() -> None:
    flaky = decide([_pass("forward"), _pass(None)], "forward", "forward", _pass(None),
                   _op(True), "float32", [], True)
    assert flaky.kind == "not-reproducible" and "deterministic" in flaky.next_check
    silent = decide([_pass(None), _pass(None)], None, None, _pass(None), None, "float32", [],
                    True)
    assert silent.kind == "not-reproducible"
    healthy = decide([_pass(None), _pass(None)], None, None, _pass(None), None, "float32", [],
                     False)
    assert healthy.kind == "finite"


def test_bit_differences_are_reported_and_bad_input_comes_first() -> None:
    own = [_pass("forward", fingerprint="a"), _pass("forward", fingerprint="b")]
    verdict = decide(own, "forward", "forward", _pass(None), _op(True), "float32", [], True)
    assert verdict.kind == "range-overflow" and "bit for bit" in verdict.summary
    bad = decide(own, "forward", "forward", _pass("forward"), _op(None, False), "float32",
                 ["the batch inputs"], True)
    assert bad.kind == "bad-input" and "the batch inputs" in bad.summary


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, analyzer.replayer; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_public_api_is_pinned() -> None:
    import analyzer.replayer as api

    # The records it returns are analyzer.model's, the one record contract.
    assert sorted(api.__all__) == sorted([
        "DTYPE_CHOICES", "CaptureError", "ModelRebuildError", "ReplayError",
        "capture_folder", "load_capture", "replay", "replay_step"])
    assert all(hasattr(api, name) for name in api.__all__)


# Real replays of the sample runs' captures: the verdict as a replay really makes it.
SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


@functools.cache
def _replayed(run: str, dtype: str = "as-run", passes: str = "auto") -> ReplayResult:
    from analyzer.replayer import replay

    folder = SAMPLES / run
    if not (folder / "capture").is_dir():
        pytest.skip(f"sample_runs/{run} has no capture")
    return replay(str(folder), dtype=dtype, passes=passes)


def test_regression_an_underflow_fed_math_fault_says_one_consistent_thing() -> None:
    # log_softmax_underflow: float32's softmax underflows to 0 and log(0) is -inf; the log
    # is non-finite on those values in float64 too, yet the step run in float64 from the
    # start is finite. Both were said as "non-finite even in float64" and "the whole step
    # stays finite in float64", which read as a contradiction.
    result = _replayed("log_softmax_underflow")
    v = result.verdict
    assert v.kind == "math-fault", v
    assert "even in float64" not in v.summary
    assert "on those very values it is non-finite in float64 as well" in v.summary
    assert "run in float64 from the start, the whole step stays finite" in v.summary
    assert "the limited range of float32 made those values" in v.summary
    assert "float32's range" in v.next_check
    f64 = result.passes[-1]
    assert (f64.label, f64.dtype, f64.phase) == ("float64 (cpu)", "float64", None)


def test_regression_a_float64_replay_of_a_float32_underflow_is_a_range_verdict() -> None:
    # The same capture replayed with --dtype float64 stays finite: that is the run's dtype
    # failing, not "not-reproducible ... check the GPU" (a verdict about the same
    # configuration repeated), and its passes are not the run's ("as-run").
    result = _replayed("log_softmax_underflow", "float64")
    v = result.verdict
    assert v.kind == "range-overflow", v
    assert "GPU" not in v.next_check and "GPU" not in v.hypothesis
    assert "finite in float64 where the run went non-finite in float32" in v.summary
    assert "replay as-run" in v.next_check
    # the verdict rests on the cast pass alone: by default no repeat and no float64 pass run
    assert [p.label for p in result.passes] == ["float64 #1"]
    every = _replayed("log_softmax_underflow", "float64", passes="all")
    assert every.verdict == v
    assert [p.label for p in every.passes] == ["float64 #1", "float64 #2", "float64 (cpu)"]
    assert all(p.dtype == "float64" and p.autocast is None and p.phase is None
               for p in every.passes)
    assert any("not the run's own configuration" in n for n in result.notes)
    from analyzer.report.replay import format_replay

    text = format_replay(result)
    assert "float64 #1     cpu float64 autocast off" in text and "as-run" not in text.split(
        "passes:")[1]


def test_a_float32_replay_of_an_autocast_float16_run_is_judged_against_float16() -> None:
    # amp_scale_collapse computes under autocast float16 with float32 parameters: the dtype
    # it computed in is the autocast one, so a float32 cast is the wider one.
    as_run = _replayed("amp_scale_collapse")
    assert [(p.label, p.dtype, p.autocast) for p in as_run.passes] == [
        ("as-run #1", "float32", "float16"), ("float64 (cpu)", "float64", None)]
    result = _replayed("amp_scale_collapse", "float32")
    assert [p.label for p in result.passes] == ["float32 #1"]
    assert all(p.autocast is None for p in result.passes)
    assert result.phase is None, result.verdict  # without float16's range it stays finite
    assert result.verdict.kind == "range-overflow", result.verdict
    assert "finite in float32 where the run went non-finite in float16" in result.verdict.summary


def test_a_cast_no_wider_than_the_run_that_stays_finite_is_undecided() -> None:
    # The passes of the log_softmax_underflow float64 replay, presented as a float16 cast
    # of a float64 run: a narrower cast that stays finite says nothing about the failure.
    own = [p for p in _replayed("log_softmax_underflow", "float64", passes="all").passes]
    verdict = decide(own[:2], None, None, own[2], None, "float16", [], True,
                     cast="float16", run_dtype="float64")
    assert verdict.kind == "undecided" and "no wider" in verdict.summary
    assert wider("float64", "float32") and wider("float32", "bfloat16+float32")
    assert not wider("bfloat16", "float16") and not wider("float64", None)
    assert wider("float32", "float16") and not wider("float16", "float16")


def test_regression_an_analysis_replayed_in_float64_does_not_blame_the_hardware() -> None:
    # analyze(..., dtype="float64") on a float32 underflow: the float64 replay stays finite,
    # which was "not-reproducible", and NF501 then named non-determinism or a hardware
    # fault as the run's cause.
    from analyzer.api import analyze

    folder = SAMPLES / "log_softmax_underflow"
    if not (folder / "capture").is_dir():
        pytest.skip("sample_runs/log_softmax_underflow has no capture")
    (result,) = analyze(str(folder), dtype="float64").results
    assert result.replay is not None and result.replay.verdict.kind == "range-overflow"
    assert "nondeterminism-or-hardware" not in [f.name for f in result.findings]
