"""The evaluation corpus (analyzer.scenarios.corpus) and its scoring (bench/evaluate.py)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from analyzer.ingest.tb import is_event_file
from analyzer.scenarios.corpus import CASES, FAMILIES, HALVES, HEALTHY, SPLIT, split
from analyzer.scenarios.corpus.run import INFO_FILE
from tests.readonly import snapshot

ROOT = Path(__file__).resolve().parent.parent
HELDOUT_FLOOR = 12 / 23
"""Top-cause accuracy on the whole held-out set (the first batch's held-out half and the
fresh batch): 12 of 23 after the post-hoc readings of scale, sudden faults, checkpoints and
the model's make-up (7 of 13 on the first batch's half, 5 of 10 on the fresh batch;
docs/evaluation.md). Later rule work may only raise it."""


def _evaluate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_evaluate", ROOT / "bench" / "evaluate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ev = _evaluate_module()


def test_corpus_size_and_families() -> None:
    failing = [c for c in CASES if c.intended != HEALTHY]
    healthy = [c for c in CASES if c.intended == HEALTHY]
    assert len(failing) >= 20 and len(healthy) >= 5
    assert {c.family for c in failing} == set(FAMILIES)
    assert len({c.name for c in CASES}) == len(CASES)
    assert len({c.logged for c in CASES}) >= 4 and len({c.scenario.log_style for c in CASES}) >= 5


def test_intended_causes_are_rule_names() -> None:
    from analyzer.rules import BY_NAME
    from analyzer.scenarios.corpus.failing import PROPOSED

    assert not set(PROPOSED) & set(BY_NAME)  # a proposal that became a rule leaves the list
    for case in CASES:
        assert case.intended in {*BY_NAME, *PROPOSED, HEALTHY}, case.name


@pytest.mark.parametrize("name", ["mlp_hand_bce", "attn_empty_sequence"])
def test_a_case_trains_the_same_twice(name: str, tmp_path: Path) -> None:
    from analyzer.scenarios.corpus.__main__ import generate

    for out in ("a", "b"):
        generate(str(tmp_path / out), [name])
    a, b = (json.loads((tmp_path / out / name / INFO_FILE).read_text()) for out in "ab")
    assert a == b and a["first_nonfinite_step"] is not None
    logged = [{tag: [repr(v) for v in values] for tag, values in _scalars(tmp_path / out / name)
               .items()} for out in "ab"]  # repr: NaN equals NaN
    assert logged[0] == logged[1]


def test_split_is_deterministic_and_balanced() -> None:
    shuffled = list(CASES)
    random.Random(7).shuffle(shuffled)
    assert split(shuffled) == SPLIT == split(CASES)
    assert set(SPLIT.values()) == set(HALVES)
    first = [c for c in CASES if c.batch == "first"]  # the fresh batch is all held out
    for half in HALVES:
        members = [c for c in first if SPLIT[c.name] == half]
        assert {c.family for c in members if c.intended != HEALTHY} == set(FAMILIES), half
        assert sum(c.intended == HEALTHY for c in members) >= 2, half
    sizes = [sum(SPLIT[c.name] == h for c in first) for h in HALVES]
    assert abs(sizes[0] - sizes[1]) <= 2


def test_split_of_a_group_alternates_by_name_hash() -> None:
    group = [c for c in CASES if c.group == HEALTHY]
    halves = [SPLIT[c.name] for c in sorted(group, key=lambda c: _sha(c.name))]
    assert all(a != b for a, b in itertools.pairwise(halves))


def _sha(name: str) -> str:
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()


def test_prediction_skips_warnings() -> None:
    r = ev.Ranked
    assert ev.prediction(False, [r("loss-scale-warm-up", "warning")]) == (ev.HEALTHY, "")
    assert ev.prediction(True, [r("loss-scale-warm-up", "warning")]) == (ev.NO_CAUSE, "")
    assert ev.prediction(True, [r("w", "warning"), r("loss-spike", "symptom", "low"),
                                r("log-of-zero", "cause")]) == ("loss-spike", "low")


def test_a_tie_at_the_top_is_undetermined_and_never_right() -> None:
    r = ev.Ranked
    tied = [r("nan-in-batch", "cause", "low", 0.4), r("division-by-zero", "cause", "low", 0.4),
            r("loss-spike", "symptom", "low", 0.4)]
    assert ev.prediction(True, tied) == ("undetermined (nan-in-batch, division-by-zero)", "")
    apart = [r("nan-in-batch", "cause", "low", 0.5), r("division-by-zero", "cause", "low", 0.4)]
    assert ev.prediction(True, apart) == ("nan-in-batch", "low")
    rows = [ev.Scored("a", "t", "nan-in-batch", ev.prediction(True, tied)[0])]
    got = ev.score(rows)
    assert got["top_cause_right"] == 0 and got["precision"] == {}


def test_a_tie_that_names_the_intended_cause_is_counted_apart() -> None:
    s = ev.Scored
    rows = [s("a", "t", "nan-in-batch", "undetermined (division-by-zero, nan-in-batch)"),
            s("b", "t", "log-of-zero", "undetermined (division-by-zero, nan-in-batch)"),
            s("c", "t", "log-of-zero", "log-of-zero", "medium")]
    got = ev.score(rows)
    assert got["top_cause_right"] == 1 and got["right_cause_named"] == 2


def test_calibration_counts_the_top_finding_by_confidence() -> None:
    s = ev.Scored
    rows = [s("a", "t", "log-of-zero", "log-of-zero", "high"),
            s("b", "t", "log-of-zero", "division-by-zero", "high"),
            s("c", "t", "nan-in-batch", "nan-in-batch", "medium"),
            s("d", "t", HEALTHY, "loss-spike", "low"), s("e", "t", "x", "no-cause")]
    assert ev.calibration(rows) == {"high": {"right": 1, "made": 2, "precision": 0.5},
                                    "medium": {"right": 1, "made": 1, "precision": 1.0},
                                    "low": {"right": 0, "made": 1, "precision": 0.0}}


def test_scoring_on_a_fixed_example() -> None:
    s = ev.Scored
    rows = [s("a", "t", "log-of-zero", "log-of-zero"), s("b", "t", "log-of-zero", "loss-spike"),
            s("c", "t", "division-by-zero", "log-of-zero"), s("d", "t", "nan-in-batch", "no-cause"),
            s("e", "t", HEALTHY, HEALTHY), s("f", "t", HEALTHY, "loss-spike")]
    got = ev.score(rows)
    assert got["failing"] == 4 and got["top_cause_right"] == 1
    assert got["top_cause_accuracy"] == 0.25
    assert got["healthy"] == 2 and got["false_alarms"] == 1 and got["false_alarm_runs"] == ["f"]
    assert got["confusion"]["log-of-zero"] == {"log-of-zero": 1, "loss-spike": 1}
    assert got["confusion"][HEALTHY] == {HEALTHY: 1, "loss-spike": 1}
    assert got["precision"] == {
        "log-of-zero": {"right": 1, "made": 2, "precision": 0.5},
        "loss-spike": {"right": 0, "made": 2, "precision": 0.0},
    }
    assert ev.score([])["top_cause_accuracy"] is None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analyzer.scenarios.corpus.__main__ import generate

    out = tmp_path_factory.mktemp("corpus")
    generate(str(out))
    return out


def _scalars(run: Path) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    for name in sorted(os.listdir(run)):
        if is_event_file(name):
            for event in EventFileLoader(str(run / name)).Load():
                for value in event.summary.value:
                    if value.HasField("tensor") and value.tensor.float_val:
                        series.setdefault(value.tag, []).append(value.tensor.float_val[0])
                    elif value.HasField("simple_value"):
                        series.setdefault(value.tag, []).append(value.simple_value)
    return series


@pytest.mark.slow
def test_every_case_fails_or_stays_healthy_as_intended(corpus: Path) -> None:
    for case in CASES:
        run = corpus / case.name
        info = json.loads((run / INFO_FILE).read_text())
        assert info["intended"] == case.intended and info["split"] == SPLIT[case.name]
        assert not any("capture" in d for _, dirs, _ in os.walk(run) for d in dirs), case.name
        assert (run / case.log_name).is_file()
        assert (run / "env.json").is_file() == case.env
        series = _scalars(run)
        logged_values = [v for values in series.values() for v in values]
        if case.intended == HEALTHY:
            assert info["first_nonfinite_step"] is None, case.name
            assert info["stop_reason"] == "completed", case.name
            assert all(math.isfinite(v) for v in series.get("train/loss", [])), case.name
            assert bool(info["skipped_steps"]) == case.scenario.benign_skips, case.name
            continue
        assert info["first_nonfinite_step"] is not None, case.name
        assert info["stop_reason"] != "completed", case.name
        if info["first_nonfinite_tag"] == "train/loss" and "train/loss" in series:
            assert not all(math.isfinite(v) for v in logged_values), case.name
        # What the text log says: a non-finite number or the loop's stop message.
        text = (run / case.log_name).read_text().lower()
        assert "nan" in text or "inf" in text or "minimum" in text, case.name


@pytest.mark.slow
def test_zero_loss_control_really_reaches_zero(corpus: Path) -> None:
    assert 0.0 in _scalars(corpus / "healthy_zero_loss")["train/loss"]


@pytest.fixture(scope="module")
def scores(corpus: Path) -> dict[str, Any]:
    before = snapshot(corpus)
    got = ev.evaluate(str(corpus))
    assert snapshot(corpus) == before  # the scoring reads the runs, never writes there
    return json.loads(json.dumps(got))


@pytest.mark.slow
def test_the_committed_scores_are_todays(scores: dict[str, Any]) -> None:
    """docs/evaluation.json (and the docs/rules.md rendered from it) is what the corpus
    scores now: re-run ``make evaluate`` after changing a rule."""
    committed = json.loads((ROOT / "docs" / "evaluation.json").read_text(encoding="utf-8"))
    assert set(scores) == set(committed) - {"frameworks"}
    for half in scores:
        assert scores[half] == committed[half], f"docs/evaluation.json is stale ({half})"


@pytest.mark.slow
def test_heldout_score_does_not_fall(scores: dict[str, Any]) -> None:
    held = scores["heldout"]
    assert held["failing"] == sum(SPLIT[c.name] == "heldout" and c.intended != HEALTHY
                                  for c in CASES)
    assert held["top_cause_accuracy"] >= HELDOUT_FLOOR
    assert held["false_alarms"] == 0
