"""Evidence carries the values its rule computed (step, onset, value, ratio, tensor), and its
sentence names each of them: checked rule by rule on small constructed runs and on the
sample runs, and between text and fields for every finding of every sample run."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from analyzer.model import Event, Evidence, Finding, Location, Run, RunResult, Series
from analyzer.onset import locate
from analyzer.rules import evaluate
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.gradients import gradient_growth
from analyzer.rules.signals import growth
from tests.conftest import scenarios

SAMPLES = sorted(scenarios())


def _series(tag: str, values: list[float], start: int = 0, rank: int | None = None) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(start, start + n, dtype=np.int64),
                  values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                  source="events", positions=np.arange(n, dtype=np.int64) * 40, rank=rank)


def _run(*series: Series, events: tuple[Event, ...] = (), **fields: object) -> Run:
    return replace(Run(path="r", name="r", files=("events",), series=series, events=events),
                   **fields)


def _finding(run: Run | RunResult, name: str) -> Finding:
    result = run if isinstance(run, RunResult) else locate(run)
    findings = result.findings or evaluate(result)[0]
    hits = [f for f in findings if f.name == name]
    assert hits, f"no {name} among {[f.name for f in findings]}"
    return hits[0]


def _sample(report, name: str) -> RunResult:  # type: ignore[no-untyped-def]
    return next(r for r in report.results if r.run.name == name)


# What each field looks like in a sentence; a field the sentence does not name is a mismatch.

def _names_step(text: str, step: int) -> bool:
    return re.search(rf"\bstep {step}(?!\d)", text) is not None


def _names_number(text: str, value: float) -> bool:
    shown = {f"{value:{fmt}}" for fmt in ("g", ".3g", ".4g", ".0e")}
    return any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\d])", text) for s in shown)


def _names_ratio(text: str, ratio: float) -> bool:
    if f"{ratio:.0%}" in text or f"x{ratio:.3g}" in text or f"{ratio:.3g}x " in text:
        return True
    if ratio > 0 and f"{math.log10(ratio):.1f} orders of magnitude" in text:
        return True
    ends = re.search(r"from (\S+) to (\S+?)[ ,)]", text + " ")
    if ends is None:
        return False
    try:
        start, end = float(ends.group(1)), float(ends.group(2))
    except ValueError:
        return False
    return start > 0 and math.isclose(end / start, ratio, rel_tol=1e-3)


def mismatches(e: Evidence, replay_step: int | None) -> list[str]:
    """The values ``e`` carries that its text does not name. A fact the replay found may
    leave its step unsaid when that step is the replay's."""
    out = []
    if e.step is not None and not _names_step(e.text, e.step) and e.step != replay_step:
        out.append(f"step {e.step}")
    if e.onset is not None and not _names_step(e.text, e.onset):
        out.append(f"onset {e.onset}")
    if e.value is not None and not _names_number(e.text, e.value):
        out.append(f"value {e.value!r}")
    if e.ratio is not None and not _names_ratio(e.text, e.ratio):
        out.append(f"ratio {e.ratio!r}")
    if e.tensor is not None and e.tensor not in e.text:
        out.append(f"tensor {e.tensor}")
    return out


def _sample_evidence(report) -> Iterator[tuple[str, Finding, Evidence, int | None]]:  # type: ignore[no-untyped-def]
    for result in report.results:
        replay_step = result.replay.step if result.replay is not None else None
        for f in result.findings:
            for e in f.evidence:
                yield result.run.name, f, e, replay_step


def test_every_sample_finding_names_the_values_its_evidence_carries(sample_report) -> None:  # type: ignore[no-untyped-def]
    carried: dict[str, int] = {"onset": 0, "value": 0, "ratio": 0, "tensor": 0}
    bad = []
    for result in sample_report.results:
        for f in result.findings:
            assert f.evidence, (result.run.name, f.code)
    for run, f, e, replay_step in _sample_evidence(sample_report):
        for key in carried:
            carried[key] += getattr(e, key) is not None
        if e.step is not None and not _names_step(e.text, e.step):
            assert e.step == replay_step, (run, f.code, e.text)
        bad += [f"{run} {f.code}: {m} not in {e.text!r}" for m in mismatches(e, replay_step)]
    assert not bad, "\n".join(bad)
    assert all(carried.values()), carried  # each field is exercised by some sample run


def test_the_consistency_check_catches_a_value_its_text_does_not_state(sample_report) -> None:  # type: ignore[no-untyped-def]
    # Tamper with each carried value in turn: the check must notice every one.
    caught = 0
    for _run_name, _f, e, replay_step in _sample_evidence(sample_report):
        for key, wrong in (("onset", (e.onset or 0) + 1000), ("value", (e.value or 0) * 3 + 7),
                           ("ratio", (e.ratio or 0) * 3 + 7), ("tensor", "nowhere.weight")):
            if getattr(e, key) is None:
                continue
            assert mismatches(replace(e, **{key: wrong}), replay_step), (key, e.text)
            caught += 1
        if e.step is not None and e.step != replay_step:
            assert mismatches(replace(e, step=e.step + 1000), replay_step), e.text
            caught += 1
    assert caught > 10


@pytest.mark.parametrize("name", [n for n in SAMPLES if n in ("sgd_lr_too_high",
                                                             "unnormalized_inputs")])
def test_growth_values_are_the_fit_the_rule_made(sample_report, name: str) -> None:  # type: ignore[no-untyped-def]
    result = _sample(sample_report, name)
    found = gradient_growth(RunEvidence(result))
    assert found is not None
    curve, g = found
    for rule in ("exploding-gradients", "learning-rate-too-high"):
        e = _finding(result, rule).evidence[0]
        assert e.onset == g.onset_step and e.step == g.onset_step
        assert e.value == g.doubling_steps and e.ratio == 10 ** g.decades
        assert e.subject == curve.tag and e.location == curve.location_at(g.onset_step)
        assert f"to {g.end_step}," in e.text  # the end of the trend stays in the sentence


def test_growth_factor_beyond_float_range_is_inf() -> None:
    # A float64 text log can hold values whose span passes 10**308.
    steps = np.arange(18, dtype=np.int64)
    g = growth(steps, 10.0 ** (-300.0 + 35.0 * steps))
    assert g is not None and g.decades > 308
    assert g.factor == math.inf


def test_bad_initialisation_carries_the_norm() -> None:
    e = _finding(_run(_series("train/grad_norm", [3e6, 5e7, 8e8, 1e10, math.inf]),
                      _series("train/loss", [2.0, 3.0, 9.0, 1e3, math.nan])),
                 "bad-initialisation").evidence[0]
    assert (e.step, e.value, e.subject) == (0, 3e6, "train/grad_norm")


def test_learning_rate_jump_carries_onset_rate_and_factor() -> None:
    lr = [1e-4] * 40 + [1e-2] * 5
    e = _finding(_run(_series("train/lr", lr), _series("train/loss", [1.0] * 44 + [math.nan])),
                 "learning-rate-jump").evidence[0]
    assert e.onset == e.step == 40
    assert e.value == 1e-2 and math.isclose(e.ratio or 0, 100.0)


def test_missing_warmup_carries_the_first_rate_and_the_growth() -> None:
    grads = [10 ** (0.5 * i) for i in range(20)] + [math.inf]
    f = _finding(_run(_series("train/grad_norm", grads), _series("train/loss", [1.0] * 20 +
                                                                  [math.nan]),
                      _series("train/lr", [3e-3] * 21)), "learning-rate-jump")
    assert (f.evidence[0].step, f.evidence[0].value) == (0, 3e-3)
    assert f.evidence[1].onset is not None and f.evidence[1].ratio is not None


def test_learning_rate_too_high_carries_the_steady_rate() -> None:
    grads = [10 ** (0.5 * i) for i in range(30)] + [math.inf]
    f = _finding(_run(_series("train/grad_norm", grads),
                      _series("train/loss", [1.0 + 0.1 * i for i in range(30)] + [math.inf]),
                      _series("train/lr", [0.5] * 31)), "learning-rate-too-high")
    lr = [e for e in f.evidence if e.subject == "lr"]
    assert lr and lr[0].value == 0.5


def test_loss_spike_carries_the_largest_spike() -> None:
    loss = list(1.0 + 0.01 * np.sin(np.arange(60)))
    loss[40], loss[50], loss[55] = 30.0, 80.0, 30.0
    e = _finding(_run(_series("train/loss", [*loss, math.nan])), "loss-spike").evidence[0]
    assert (e.step, e.value, e.subject) == (50, 80.0, "train/loss")


def test_loss_scale_collapse_carries_floor_and_fall() -> None:
    scale = [2.0 ** (16 - i) for i in range(20)]
    e = _finding(_run(_series("amp/loss_scale", scale),
                      _series("train/loss", [1.0] * 19 + [math.nan]),
                      _series("train/grad_norm", [math.inf] * 20)),
                 "loss-scale-collapse").evidence[0]
    assert e.value == 2.0 ** -3 and e.ratio == 2.0 ** -19 and e.step == 19


def test_regression_loss_scale_floor_step_is_not_a_nan_step() -> None:
    # argmin stopped at the NaN logged after the floor: the text named step 18, where the
    # scale was NaN, instead of step 16, where it first reached 1.
    scale = [2.0 ** (16 - i) for i in range(17)] + [1.0, math.nan, 1.0]
    e = _finding(_run(_series("amp/loss_scale", scale),
                      _series("train/loss", [1.0] * 19 + [math.nan])),
                 "loss-scale-collapse").evidence[0]
    assert e.step == 16 and e.text.endswith("(step 16)") and e.value == 1.0
    assert e.location == Location("events", offset=16 * 40)


def _rnn_run(**fields: object) -> Run:
    layer = [10 ** (0.4 * i) for i in range(25)]
    flat = [1.0 + 0.01 * i for i in range(25)]
    return _run(_series("grad_norm/rnn.weight_hh_l0", layer),
                _series("grad_norm/fc.weight", flat),
                _series("train/loss", [1.0] * 25), **fields)


def test_regression_recurrent_layer_tag_under_a_family_is_recognised() -> None:
    # The recurrent-name pattern wanted a '.' or '_' before 'rnn', so the fastest-growing
    # layer's tag grad_norm/rnn.weight_hh_l0 was never taken for a recurrent layer.
    run = _rnn_run()
    event = Event("nonfinite", 25, Location("train.log", line=9), "loss is nan",
                  {"tag": "loss", "kind": "nan"})
    f = _finding(replace(run, events=(event,)), "exploding-rnn")
    curve = run.series[0]
    g = growth(curve.steps, curve.values)
    assert g is not None
    e = f.evidence[0]
    assert e.subject == curve.tag and e.onset == e.step == g.onset_step
    assert e.ratio == g.factor and e.value is None  # the sentence states no doubling time


def test_regression_layer_incident_after_a_step_is_worded_after() -> None:
    # A log line that names no step is placed after the last step logged: the evidence said
    # "at step 24" for a value that went non-finite at some later step.
    event = Event("nonfinite", None, Location("train.log", line=30), "grad is nan",
                  {"tag": "grad_norm/rnn.weight_hh_l0", "kind": "nan", "after_step": 24})
    f = _finding(replace(_rnn_run(), events=(event,)), "exploding-rnn")
    words = [e for e in f.evidence if e.text.startswith("first non-finite layer tag")]
    assert words and words[0].text.endswith("after step 24") and words[0].step == 24
    assert "at step" not in words[0].text


def test_anomaly_evidence_words_its_step() -> None:
    event = Event("nonfinite", 12, Location("train.log", line=40), "RuntimeError: ...",
                  {"tag": "loss", "kind": "nan", "function": "LogBackward0"})
    e = _finding(_run(_series("train/loss", [1.0] * 12), events=(event,)),
                 "log-of-zero").evidence[0]
    assert e.step == 12 and e.text.startswith("autograd anomaly at step 12: LogBackward0")
    assert not mismatches(e, None)


def test_lone_rank_carries_its_step() -> None:
    loss = [1.0] * 10
    bad = [1.0] * 7 + [math.nan] * 3
    e = _finding(_run(_series("train/loss", bad, rank=1), _series("train/loss", loss, rank=0)),
                 "nondeterminism-or-hardware").evidence[-1]
    assert e.step == 7 and e.subject == "ranks" and not mismatches(e, None)


def test_frequent_clipping_carries_threshold_and_share(sample_report) -> None:  # type: ignore[no-untyped-def]
    metas = [m for r in sample_report.results for m in r.run.capture_metas]
    if not metas:
        pytest.skip("no sample run has a capture")
    norms = [0.5] * 3 + [2.0] * 17
    run = _run(_series("train/grad_norm", norms), _series("train/loss", [1.0] * 20),
               capture_metas=(replace(metas[0], grad_clip=1.0),))
    e = _finding(run, "frequent-clipping").evidence[0]
    assert e.value == 1.0 and e.ratio == 0.85 and not mismatches(e, None)


def test_replay_evidence_carries_the_replays_values(sample_report) -> None:  # type: ignore[no-untyped-def]
    seen = set()
    for result in sample_report.results:
        replay = result.replay
        for f in result.findings:
            first = f.evidence[0]
            if f.name == "adam-eps-too-small":
                assert replay is not None
                names = {p.name for p in replay.update.params}
                assert first.subject == replay.update.params[0].name
                assert all(e.tensor in names for e in f.evidence[1:-1])
                meta = result.run.capture_metas[0]
                assert f.evidence[-1].value == meta.optimizer.hyperparameters["eps"]
            elif f.name == "fp16-overflow":
                assert replay is not None and replay.op is not None
                op = replay.op
                assert first.tensor == op.parameter
                assert f.evidence[1].value == max(s.absmax or 0.0
                                                  for s in (*op.inputs, *op.outputs))
            elif f.name == "unnormalized-inputs":
                assert replay is not None
                assert first.value == max(s.absmax or 0.0 for s in replay.forward.batch
                                          if "float" in s.dtype)
            elif f.name in ("log-of-zero", "division-by-zero", "sqrt-at-zero-backward"):
                assert replay is not None and replay.op is not None
                assert first.tensor == replay.op.parameter and first.step == replay.step
            else:
                continue
            seen.add(f.name)
    expected = {"adam-eps-too-small", "fp16-overflow", "unnormalized-inputs", "log-of-zero"}
    if os.path.isdir(os.path.join(os.path.dirname(__file__), "..", "sample_runs")):
        assert expected <= seen, seen
