"""The sweep summary on a fleet it was not written against: bench/fleetgen.py's.

The summary's tests and its level (alpha 0.01 after Holm's correction, at least 3 runs of
each outcome) were set on :mod:`analyzer.scenarios.sweep` (a factorisation model, full-batch
SGD). This fleet comes from other trainings (an MLP, SGD with momentum and a warm-up,
logged by torch's SummaryWriter and tensorboardX beside a text log), whose learning rate
alone decides the outcome and whose other keys are drawn at random: the summary must name
the rate, with its cut between the trainings that train and those that diverge, and none
of the others.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from analyzer import api
from analyzer.fleet.summary import summarize
from tests.benchmods import bench_module


def _fleetgen() -> ModuleType:
    return bench_module("fleetgen")


@pytest.mark.slow
def test_the_summary_names_the_rate_and_nothing_else_on_another_generators_fleet(
        tmp_path: Path) -> None:
    trials = _fleetgen().make_fleet(str(tmp_path / "fleet"), 80, seed=11)
    results = list(api.iter_analyze(str(tmp_path / "fleet"), replay=False, jobs=1))
    truth = {t.name: t for t in trials}
    assert {r.run.name: r.failed for r in results} == {n: t.failed for n, t in truth.items()}
    summary = summarize(results)
    assert (summary.runs, summary.failed) == (80, sum(t.failed for t in trials))
    named = {s.key: s for s in summary.separators if s.significant}
    assert set(named) == {"lr"}
    healthy = max(t.lr for t in trials if not t.failed)
    diverged = min(t.lr for t in trials if t.failed)
    lr = named["lr"]
    assert lr.test == "mann-whitney"
    tested = {s.key for s in summary.separators}
    assert {"batch_size", "weight_decay", "precision"} <= tested  # tested, and not named
    assert lr.failing.op == ">=" and healthy < float(lr.failing.value) <= diverged
    assert lr.failing.failed == lr.failing.runs == summary.failed  # every diverged run
    assert lr.other.failed == 0
