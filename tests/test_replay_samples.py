"""Every sample run with a capture: replay on the CPU must find what its scenario states.

``scenario.json`` states the layer, op, phase and verdict of each failing run. A
layer of null with a named op means the op ran outside the model's layers (in
the loss); a null op means the scenario does not pin one down, and then a null
layer is not checked either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analyzer.replayer import capture_folder, replay
from analyzer.report.replay import format_replay

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


def _cases() -> list[Any]:
    cases = []
    for path in sorted(SAMPLES.glob("*/scenario.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("capture") and capture_folder(str(path.parent)) is not None:
            cases.append(pytest.param(path.parent, data["expected"], id=path.parent.name))
    if not cases:
        cases.append(pytest.param(None, None, id="no-sample-runs", marks=pytest.mark.skip(
            reason="sample_runs/ holds no run with scenario.json and a capture; "
                   "make them with `python -m analyzer.scenarios sample_runs`")))
    return cases


@pytest.mark.parametrize(("run", "expected"), _cases())
def test_replay_finds_what_the_scenario_states(run: Path, expected: dict[str, Any]) -> None:
    result = replay(str(run))
    report = format_replay(result)
    assert result.phase == expected["phase"], report
    assert result.verdict.kind == expected["verdict"], report
    if expected["op"] is not None:
        assert result.op is not None, report
        assert expected["op"].removeprefix("aten::") in result.op.names, report
    if expected["layer"] is not None or expected["op"] is not None:
        assert result.layer == expected["layer"], report


@pytest.mark.parametrize(("run", "expected"), _cases())
def test_the_default_passes_say_what_every_pass_says(run: Path, expected: dict[str, Any]
                                                     ) -> None:
    # The default replay skips the second repeat, and the float64 pass where the verdict
    # does not rest on it; all else is what every pass gives, and so is each pass it ran.
    auto, every = replay(str(run)).to_dict(), replay(str(run), passes="all").to_dict()
    ran, all_passes = auto.pop("passes"), every.pop("passes")
    assert auto == every
    # Fingerprints are for passes compared with each other: the default replay has none.
    assert all(p.pop("fingerprint") is None for p in ran)
    for p in all_passes:
        del p["fingerprint"]
    assert ran == [p for p in all_passes if p["label"] != "as-run #2"] or (
        ran == all_passes[:1] and auto["verdict"]["kind"] in ("bad-input", "not-reproducible"))
