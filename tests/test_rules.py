"""The rule catalogue: its contract, each rule on small constructed runs, and its docs."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from analyzer.cli import main
from analyzer.model import Event, Location, Run, Series
from analyzer.onset import locate
from analyzer.rules import RULES, SECTIONS, evaluate, explain
from analyzer.rules.docs import render
from analyzer.rules.signals import growth, robust_z

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_codes_names_and_docs() -> None:
    codes = [r.code for r in RULES]
    assert len(set(codes)) == len(codes)
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert re.fullmatch(r"NF\d{3}", r.code)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.name)
        assert r.role in ("cause", "symptom", "warning")
        for heading in SECTIONS:
            assert r.section(heading), (r.code, heading)
        assert "```" in r.section("Fix"), r.code


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_explain_every_code(rule, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["explain", rule.code]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{rule.code} {rule.name}")
    assert explain(rule.name) == explain(rule.code)


def test_rules_command(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    assert all(r.code in out for r in RULES)
    assert main(["explain", "NF999"]) == 2


def _series(tag: str, values: list[float], start: int = 0) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(start, start + n, dtype=np.int64),
                  values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                  source="events", positions=np.arange(n, dtype=np.int64) * 40)


def _run(*series: Series, events: tuple[Event, ...] = (), path: str = "r") -> Run:
    return Run(path=path, name=os.path.basename(path), files=("events",), series=series,
               events=events)


def _names(run: Run) -> list[str]:
    findings, _ = evaluate(locate(run))
    return [f.name for f in findings]


def test_growth_fit_recovers_rate_and_onset() -> None:
    steps = np.arange(100)
    values = np.where(steps < 60, 1.0 + 0.01 * np.sin(steps), 10 ** ((steps - 60) * 0.25))
    g = growth(steps, values)
    assert g is not None
    assert abs(g.slope - 0.25) < 1e-6 and 58 <= g.onset_step <= 61
    assert math.isclose(g.doubling_steps, math.log10(2) / 0.25, rel_tol=1e-6)
    assert growth(steps, np.ones(100)) is None


def test_robust_z_flags_a_spike_only() -> None:
    values = np.ones(80) + 0.01 * np.sin(np.arange(80))
    values[70] = 50.0
    z = robust_z(values)
    assert np.argmax(z) == 70 and z[70] > 100 and (np.delete(z, 70) < 6).all()


def test_exploding_gradients_and_lr_too_high() -> None:
    grads = [10 ** (0.5 * i) for i in range(30)] + [math.inf]
    loss = [1.0 + 0.1 * i for i in range(30)] + [math.inf]
    names = _names(_run(_series("train/grad_norm", grads), _series("train/loss", loss),
                        _series("train/lr", [0.5] * 31)))
    assert names[0] == "learning-rate-too-high"
    assert "exploding-gradients" in names


def test_bad_initialisation_needs_huge_and_lasting_early_gradients() -> None:
    grads = [3e6, 5e7, 8e8, 1e10, math.inf]
    loss = [2.0, 3.0, 9.0, 1e3, math.nan]
    assert _names(_run(_series("train/grad_norm", grads), _series("train/loss", loss)))[0] == \
        "bad-initialisation"
    recovered = [3e6, 5.0, 4.0, 3.0, 2.0, 2.0, 1.0, math.inf]
    loss = [2.0] * 7 + [math.nan]
    assert "bad-initialisation" not in _names(_run(_series("train/grad_norm", recovered),
                                                   _series("train/loss", loss)))


def test_learning_rate_jump() -> None:
    lr = [1e-4] * 40 + [1e-2] * 5
    loss = [1.0] * 44 + [math.nan]
    names = _names(_run(_series("train/lr", lr), _series("train/loss", loss)))
    assert names[0] == "learning-rate-jump"


def test_loss_scale_collapse_versus_benign_skips() -> None:
    scale = [2.0 ** (16 - i) for i in range(20)]
    loss = [1.0] * 19 + [math.nan]
    grads = [math.inf] * 20
    names = _names(_run(_series("amp/loss_scale", scale), _series("train/loss", loss),
                        _series("train/grad_norm", grads)))
    assert names[0] == "loss-scale-collapse"
    benign_scale = [65536.0, 32768.0, 16384.0] + [16384.0] * 40
    benign_grads = [math.inf, math.inf] + [1.0] * 41
    result = locate(_run(_series("amp/loss_scale", benign_scale),
                         _series("train/loss", [1.0] * 43),
                         _series("train/grad_norm", benign_grads)))
    assert result.incident is None
    findings, _ = evaluate(result)
    assert not [f for f in findings if f.is_failure]


def test_constant_scale_of_one_is_not_a_collapse() -> None:
    names = _names(_run(_series("loss_scale", [1.0] * 10),
                        _series("train/loss", [1.0] * 9 + [math.nan])))
    assert "loss-scale-collapse" not in names


def test_loss_spikes_before_failure() -> None:
    loss = list(1.0 + 0.01 * np.sin(np.arange(60)))
    loss[40] = loss[50] = loss[55] = 30.0
    names = _names(_run(_series("train/loss", [*loss, math.nan])))
    assert "loss-spike" in names


def test_anomaly_message_without_capture() -> None:
    event = Event("nonfinite", 12, Location("train.log", line=40), "RuntimeError: ...",
                  {"tag": "loss", "kind": "nan", "function": "LogBackward0",
                   "user_frames": ["train.py:88"]})
    findings, skipped = evaluate(locate(_run(_series("train/loss", [1.0] * 12),
                                             events=(event,))))
    assert findings[0].name == "log-of-zero" and findings[0].confidence == "medium"
    assert "train.py:88" in findings[0].evidence[0].text
    reasons = {s.name: s.reason for s in skipped}
    assert "no capture" in reasons["frequent-clipping"]


def test_environment_drift_against_a_healthy_sibling(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from analyzer.pipeline import rank_all

    # Ingest reads env.json into the Run (tests/test_capture_folder.py reads it from disk);
    # the rules and the sibling gathering read only the record.
    bad, good = tmp_path / "bad", tmp_path / "good"
    failed = locate(replace(_run(_series("train/loss", [1.0, math.nan]), path=str(bad)),
                            env={"torch": "2.3.0", "blas": "mkl"}))
    healthy = locate(replace(_run(_series("train/loss", [1.0, 0.5]), path=str(good)),
                             env={"torch": "2.1.0", "blas": "mkl"}))
    results = rank_all([failed, healthy])
    drift = [f for f in results[0].findings if f.name == "environment-drift"]
    assert drift and "torch '2.3.0' vs '2.1.0'" in drift[0].evidence[0].text
    assert not results[1].findings


def test_docs_page_is_up_to_date(sample_report) -> None:  # type: ignore[no-untyped-def]
    with open(os.path.join(ROOT, "docs", "rules.md"), encoding="utf-8") as fh:
        committed = fh.read()
    with open(os.path.join(ROOT, "docs", "evaluation.json"), encoding="utf-8") as fh:
        evaluation = json.load(fh)
    assert render(sample_report, evaluation) == committed, (
        "docs/rules.md is stale: make evaluate (or python -m analyzer.rules.docs sample_runs "
        "--evaluation docs/evaluation.json > docs/rules.md)")


def test_missing_warmup() -> None:
    grads = [10 ** (0.5 * i) for i in range(20)] + [math.inf]
    loss = [1.0] * 20 + [math.nan]
    findings, _ = evaluate(locate(_run(_series("train/grad_norm", grads),
                                       _series("train/loss", loss),
                                       _series("train/lr", [3e-3] * 21))))
    warm = [f for f in findings if f.name == "learning-rate-jump"]
    assert warm and warm[0].confidence == "low" and "warmup" in warm[0].title
    # a warmed-up schedule is not flagged
    ramp = [3e-3 * min(1.0, (i + 1) / 10) for i in range(21)]
    findings, _ = evaluate(locate(_run(_series("train/grad_norm", grads),
                                       _series("train/loss", loss), _series("train/lr", ramp))))
    assert not [f for f in findings if f.name == "learning-rate-jump"]
