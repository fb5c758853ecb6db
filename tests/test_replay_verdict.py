"""The differential verdict as a pure function of the passes, and the package's light import."""

from __future__ import annotations

import subprocess
import sys

from analyzer.model.replays import OpFault, PassOutcome, Phase, TensorStat
from analyzer.replayer.verdict import decide

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
    assert "limited range of float16" in math.summary  # the op's dtype; float64 step finite
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
