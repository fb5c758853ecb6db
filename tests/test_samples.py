"""`forensics analyze sample_runs/` against what each scenario was built to show."""

from __future__ import annotations

import pytest

from tests.conftest import scenarios

SCENARIOS = scenarios()


def _result(report, name):  # type: ignore[no-untyped-def]
    return next(r for r in report.results if r.run.name == name)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_first_nonfinite_step_and_tag(sample_report, name) -> None:  # type: ignore[no-untyped-def]
    expected = SCENARIOS[name]["expected"]
    result = _result(sample_report, name)
    if expected["first_nonfinite_step"] is None:
        assert result.incident is None
        return
    assert result.incident is not None
    assert result.incident.step == expected["first_nonfinite_step"]
    assert result.incident.tag == expected["tag"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_top_cause(sample_report, name) -> None:  # type: ignore[no-untyped-def]
    cause = SCENARIOS[name]["expected"]["cause"]
    result = _result(sample_report, name)
    failures = [f for f in result.findings if f.is_failure]
    if cause is None:
        assert failures == [], [f.name for f in failures]
        return
    assert failures, [s.reason for s in result.skipped_rules]
    top = failures[0]
    assert top.name == cause, [(f.name, f.confidence, f.score) for f in failures]
    assert top.evidence and top.fix and "```" in top.fix
    for runner_up in result.findings[1:]:
        assert runner_up.rank_note


def test_benign_skips_are_skips_not_failures(sample_report) -> None:  # type: ignore[no-untyped-def]
    benign = [n for n, s in SCENARIOS.items() if s.get("benign_skips")]
    assert benign
    for name in benign:
        result = _result(sample_report, name)
        assert result.incident is None
        assert result.overflow_skips


def test_replay_layer_matches_scenario(sample_report) -> None:  # type: ignore[no-untyped-def]
    for name, scenario in SCENARIOS.items():
        result = _result(sample_report, name)
        expected = scenario["expected"]
        if result.replay is None or expected["phase"] is None:
            continue
        assert result.replay.phase == expected["phase"], name
        assert result.replay_error is None


def test_checkpoints_alone_name_the_first_bad_save_and_layer() -> None:
    import os

    from analyzer.api import analyze
    from tests.conftest import SAMPLE_RUNS

    checked = 0
    for name, scenario in SCENARIOS.items():
        folder = os.path.join(SAMPLE_RUNS, name, "checkpoints")
        failed_at = scenario["expected"]["first_nonfinite_step"]
        after = [s for s in scenario.get("checkpoints", []) if failed_at is not None
                 and s >= failed_at]
        if not after or not os.path.isdir(folder):
            continue
        (result,) = analyze(folder, replay=False).results
        inc = result.incident
        if inc is None:  # saved after the failure, but before non-finite values reached it
            continue
        assert inc.origin == "checkpoint", name
        assert inc.step in after, name
        assert inc.layer is not None and inc.last_finite_step is not None
        assert inc.last_finite_step < failed_at
        checked += 1
    assert checked >= 2
