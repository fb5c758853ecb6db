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
