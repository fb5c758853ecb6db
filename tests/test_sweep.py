"""The sweep summary on a real sweep: tiny trainings whose truth the generator's manifest
records (kept outside the run folders), logged by Lightning's TensorBoardLogger, read by
the analyzer like any Lightning runs, then summarised."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from analyzer.model import Report
from analyzer.model.fleet import SweepSummary
from tests.readonly import snapshot

RUNS = 48
SEED = 0  # conftest.SWEEP_SEED, the session sweep's


@pytest.fixture(scope="session")
def sweep(sweep_of: Callable[[int, str], tuple[Path, dict[str, Any]]]
          ) -> tuple[Path, dict[str, Any]]:
    """The session's sweep (tests/conftest.py trains it once for every module that asks),
    its first RUNS trials; the manifest as written beside the folder."""
    folder, _ = sweep_of(RUNS, "sweep")
    return folder, json.loads((folder.parent / "manifest.json").read_text())


@pytest.fixture(scope="session")
def analysed(sweep: tuple[Path, dict[str, Any]]) -> tuple[Report, SweepSummary]:
    import analyzer
    from analyzer.fleet.summary import summarize

    folder, _ = sweep
    before = snapshot(folder)
    report = analyzer.analyze([str(folder)])
    assert snapshot(folder) == before  # nothing written into the analysed folders
    return report, summarize(report.results)


def _trials(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return list(manifest["trials"])


def test_the_truth_is_real_runs_above_a_rate_diverge_unless_clipped(
        sweep: tuple[Path, dict[str, Any]]) -> None:
    """The generator's claim, checked on what the trainings did: no clipped trial went
    non-finite, and among the others one rate splits the diverged from the healthy."""
    _, manifest = sweep
    trials = _trials(manifest)
    assert not any(t["diverged"] for t in trials if t["clip_gradients"])
    free = [t for t in trials if not t["clip_gradients"]]
    healthy = max(t["lr"] for t in free if not t["diverged"])
    diverged = min(t["lr"] for t in free if t["diverged"])
    assert healthy < diverged
    assert 0.25 <= sum(t["diverged"] for t in trials) / len(trials) <= 0.6
    for t in trials:
        assert (t["first_nonfinite_step"] is not None) == t["diverged"]


def test_the_sweep_is_laid_out_as_lightning_runs_with_some_checkpoints(
        sweep: tuple[Path, dict[str, Any]]) -> None:
    folder, manifest = sweep
    trials = sorted(p.name for p in folder.iterdir())
    assert trials == sorted(t["name"] for t in _trials(manifest))  # the truth is elsewhere
    for name in trials:
        version = folder / name / "version_0"
        assert (version / "hparams.yaml").is_file()
        assert list(version.glob("events.out.tfevents.*"))
    saved = [t["checkpoint"] for t in _trials(manifest) if t["checkpoint"]]
    assert saved and all((folder / p).is_file() for p in saved)


def test_counts_match_the_manifest(analysed: tuple[Report, SweepSummary],
                                   sweep: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = sweep
    _, summary = analysed
    diverged = sum(t["diverged"] for t in _trials(manifest))
    assert (summary.runs, summary.failed, summary.finite, summary.unreadable) == \
        (RUNS, diverged, RUNS - diverged, 0)
    failed = {r.name for r in summary.rows if r.status == "failed"}
    assert failed == {t["name"] for t in _trials(manifest) if t["diverged"]}
    steps = {r.name: r.first_step for r in summary.rows if r.status == "failed"}
    assert steps == {t["name"]: t["first_nonfinite_step"] for t in _trials(manifest)
                     if t["diverged"]}
    assert summary.steps.runs == diverged
    assert summary.steps.minimum == min(steps.values())


def test_lr_is_named_with_its_direction_and_a_threshold_the_truth_allows(
        analysed: tuple[Report, SweepSummary], sweep: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = sweep
    _, summary = analysed
    named = {s.key: s for s in summary.separators if s.significant}
    assert "lr" in named
    lr = named["lr"]
    assert lr.test == "mann-whitney" and lr.p_adjusted < summary.alpha
    free = [t for t in _trials(manifest) if not t["clip_gradients"]]
    healthy = max(t["lr"] for t in free if not t["diverged"])
    diverged = min(t["lr"] for t in free if t["diverged"])
    assert lr.failing.op == ">=" and lr.other.op == "<="
    assert healthy <= lr.other.value < lr.failing.value <= diverged  # type: ignore[operator]
    assert lr.failing.failed == summary.failed  # every diverged run is above the cut
    assert lr.other.failed == 0


def test_the_irrelevant_key_is_not_named_and_the_clipping_is(
        analysed: tuple[Report, SweepSummary]) -> None:
    _, summary = analysed
    tested = {s.key: s for s in summary.separators}
    assert not tested["activation"].significant
    assert "seed" not in tested  # distinct in every trial: a label, not tested
    clip = tested["clip_gradients"]
    assert clip.test == "fisher" and clip.significant
    assert clip.failing.value is False or clip.failing.value == "false"
    assert clip.other.failed == 0
    skipped = {k.key: k.reason for k in summary.skipped}
    assert skipped["optimizer"] == "constant" and skipped["max_steps"] == "constant"
    assert skipped["seed"] == "identifier"


def test_causes_are_ranked_and_account_for_every_failed_run(
        analysed: tuple[Report, SweepSummary]) -> None:
    _, summary = analysed
    counts = [c.runs for c in summary.causes]
    assert counts == sorted(counts, reverse=True)
    # Each failed run counts once, or once for each cause tied at its top.
    assert sum(counts) >= summary.failed
    if not any(c.tied for c in summary.causes):
        assert sum(counts) == summary.failed
    assert summary.causes[0].code is not None  # a cause is named for most failed runs


def test_the_text_json_and_frames_of_the_sweep(analysed: tuple[Report, SweepSummary]) -> None:
    from analyzer.fleet.summary import summary_json
    from analyzer.frames import summary_frames
    from analyzer.report.summary import format_summary

    _, summary = analysed
    text = format_summary(summary)
    assert f"Sweep: {RUNS} runs: {summary.failed} failed" in text
    lr = next(s for s in summary.separators if s.key == "lr")
    assert f"lr >= {lr.failing.value:.4g}: {lr.failing.failed} of {lr.failing.runs} failed" \
        in text
    doc = json.loads(json.dumps(summary_json(summary), allow_nan=False))
    assert doc["runs"] == RUNS and doc["separators"][0]["significant"] is True
    runs = summary_frames(summary)["runs"]
    assert len(runs) == RUNS and {"lr", "activation", "clip_gradients", "seed"} <= set(runs)


def test_the_sweep_is_the_same_for_the_same_seed() -> None:
    from analyzer.scenarios.sweep import draw

    assert draw(10, 7) == draw(10, 7) and draw(10, 7) != draw(10, 8)
    lrs = [t.lr for t in draw(200, 7)]
    from analyzer.scenarios.sweep import LR_HIGH, LR_LOW

    assert all(LR_LOW <= lr <= LR_HIGH for lr in lrs)


def test_the_command_writes_trials_and_the_manifest_where_asked(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    from analyzer.scenarios.sweep import main

    out, truth = tmp_path / "sweep", tmp_path / "truth.json"
    assert main([str(out), "--runs", "3", "--seed", "5", "--manifest", str(truth)]) == 0
    manifest = json.loads(truth.read_text())
    assert [t["name"] for t in manifest["trials"]] == ["trial_000", "trial_001", "trial_002"]
    assert sorted(p.name for p in out.iterdir()) == ["trial_000", "trial_001", "trial_002"]
    assert "3 trials" in capsys.readouterr().err


def test_the_first_trials_of_the_session_sweep_are_the_sweep_of_that_many(
        sweep_of: Callable[[int, str], tuple[Path, dict[str, Any]]], tmp_path: Path) -> None:
    """What lets every module share one sweep (tests/conftest.py's sweep_of): its first n
    trials are what ``generate`` writes for a sweep of n, trained alike."""
    from analyzer.scenarios.sweep import draw, generate
    from tests.conftest import SWEEP_SEED, SWEEP_TRIALS

    assert SEED == SWEEP_SEED and RUNS <= SWEEP_TRIALS
    assert draw(SWEEP_TRIALS, SEED)[:20] == draw(20, SEED)
    shared, manifest = sweep_of(4, "first_four")
    alone = generate(str(tmp_path / "runs"), 4, SEED, str(tmp_path / "manifest.json"))
    assert manifest == alone == json.loads((shared.parent / "manifest.json").read_text())

    def layout(folder: Path) -> list[str]:  # event files' names hold a time and a host
        return sorted(re.sub(r"tfevents\..*", "tfevents", p.relative_to(folder).as_posix())
                      for p in folder.rglob("*"))

    assert layout(shared) == layout(tmp_path / "runs")
