"""The corpus's fresh batch (analyzer/scenarios/corpus/fresh.py): held out whole, and each
case fails (or lives) of the mechanism it was built with, read from what the run wrote:
its case.json and its event file. Nothing here runs the analysis."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from analyzer.scenarios.corpus import CASES, HEALTHY, SPLIT, fresh, split
from analyzer.scenarios.corpus.run import INFO_FILE, PROFILES

FIRST = tuple(c for c in CASES if c.batch == "first")
FRESH = tuple(c for c in CASES if c.batch == "fresh")
BY_NAME = {c.name: c for c in FRESH}


def test_the_fresh_batch_is_ten_failures_and_three_controls() -> None:
    assert FRESH == fresh.CASES
    failing = [c for c in FRESH if c.intended != HEALTHY]
    assert len(failing) == 10 and len(FRESH) - len(failing) == 3
    assert len({c.family for c in failing}) == 6
    assert len({c.logged for c in FRESH}) == len(PROFILES)
    assert len({c.scenario.log_style for c in FRESH}) == 6


def test_fresh_intended_causes_are_catalogue_rule_names() -> None:
    from analyzer.rules import BY_NAME as RULES

    for case in FRESH:
        assert case.intended == HEALTHY or case.intended in RULES, case.name


def test_fresh_cases_are_all_heldout_and_move_no_first_case() -> None:
    assert {SPLIT[c.name] for c in FRESH} == {"heldout"}
    # The first batch's halves are what they were without the fresh batch.
    assert {c.name: SPLIT[c.name] for c in FIRST} == split(FIRST)
    assert split(reversed(CASES)) == SPLIT


def test_fresh_cases_repeat_no_first_model_and_loss() -> None:
    first = {(c.scenario.model.path, tuple(sorted(c.scenario.model.kwargs.items())),
              c.scenario.loss.path) for c in FIRST}
    for case in FRESH:
        sc = case.scenario
        key = (sc.model.path, tuple(sorted(sc.model.kwargs.items())), sc.loss.path)
        assert key not in first, case.name
    assert not {c.name for c in FRESH} & {c.name for c in FIRST}


def test_a_fresh_case_trains_the_same_twice(tmp_path: Path) -> None:
    from analyzer.scenarios.corpus.__main__ import generate

    name = "fresh_gat_isolated_node"
    for out in ("a", "b"):
        generate(str(tmp_path / out), [name])
    a, b = (json.loads((tmp_path / out / name / INFO_FILE).read_text()) for out in "ab")
    assert a == b and a["first_nonfinite_step"] is not None
    assert ({k: [repr(v) for v in vs] for k, vs in _scalars(tmp_path / "a" / name).items()}
            == {k: [repr(v) for v in vs] for k, vs in _scalars(tmp_path / "b" / name).items()})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analyzer.scenarios.corpus.__main__ import generate

    out = tmp_path_factory.mktemp("fresh")
    generate(str(out), [c.name for c in FRESH])
    return out


def _scalars(run: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _info(runs: Path, name: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((runs / name / INFO_FILE).read_text())
    return info


def _batches(name: str, upto: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches the case's steps 0..upto drew (the streams are seeded)."""
    sc = BY_NAME[name].scenario
    stream = sc.batches(sc.seed)
    for _ in range(upto + 1):
        yield next(stream)


@pytest.mark.slow
def test_every_fresh_case_fails_or_stays_healthy_as_intended(runs: Path) -> None:
    for case in FRESH:
        run = runs / case.name
        info = _info(runs, case.name)
        assert info["intended"] == case.intended and info["split"] == "heldout"
        assert not any("capture" in d for _, dirs, _ in os.walk(run) for d in dirs)
        assert (run / case.log_name).is_file() and (run / "env.json").is_file() == case.env
        series = _scalars(run)
        prefixes = PROFILES[case.logged]
        assert all(any(t.startswith(p) for p in prefixes) for t in series), case.name
        if case.logged != "none":
            assert "train/loss" in series, case.name
        if case.intended == HEALTHY:
            assert info["first_nonfinite_step"] is None, case.name
            assert info["stop_reason"] == "completed", case.name
            assert all(math.isfinite(v) for v in series["train/loss"]), case.name
            assert bool(info["skipped_steps"]) == case.scenario.benign_skips, case.name
            continue
        first = info["first_nonfinite_step"]
        assert first is not None and info["stop_reason"] != "completed", case.name
        if "train/loss" in series:
            assert all(math.isfinite(v) for v in series["train/loss"][:first]), case.name
        text = (run / case.log_name).read_text().lower()
        assert "nan" in text or "inf" in text, case.name


def _first(runs: Path, name: str) -> int:
    step = _info(runs, name)["first_nonfinite_step"]
    assert isinstance(step, int)
    return step


@pytest.mark.slow
def test_gat_fails_at_the_first_batch_with_an_isolated_node(runs: Path) -> None:
    name = "fresh_gat_isolated_node"
    first = _first(runs, name)
    features = BY_NAME[name].scenario.model.kwargs.get("features", 8)
    isolated = [bool((x[..., features:].sum(-1) == 0).any()) for x, _ in _batches(name, first)]
    assert isolated == [False] * first + [True]
    assert _info(runs, name)["first_nonfinite_tag"] == "train/loss"


@pytest.mark.slow
def test_weighted_mean_fails_at_the_first_batch_of_zero_weights(runs: Path) -> None:
    name = "fresh_mlp_weighted_sources"
    first = _first(runs, name)
    zero = [bool(y[:, 1].sum() == 0) for _, y in _batches(name, first)]
    assert zero == [False] * first + [True] and first > 20
    assert math.isnan(_scalars(runs / name)["train/loss"][first])


@pytest.mark.slow
def test_csv_case_fails_at_the_batch_holding_the_empty_cell(runs: Path) -> None:
    name = "fresh_gru_csv_missing"
    first = _first(runs, name)
    nan = [int(x.isnan().sum()) for x, _ in _batches(name, first)]
    assert nan == [0] * first + [1]
    assert not list((runs / name).glob("events.out.tfevents.*"))  # the text log only


@pytest.mark.slow
def test_rmsnorm_fails_in_backward_at_the_first_padded_batch(runs: Path) -> None:
    name = "fresh_gru_masked_rmsnorm"
    first = _first(runs, name)
    padded = [bool((x == 0).any()) for x, _ in _batches(name, first)]
    assert padded == [False] * first + [True]
    info = _info(runs, name)
    assert info["first_nonfinite_tag"].startswith(("train/grad_norm", "grad_norm/"))
    assert math.isfinite(_scalars(runs / name)["train/loss"][first])  # forward was finite
    assert first in info["checkpoints"]  # saved right after, with the NaN weights


@pytest.mark.slow
def test_std1_init_is_huge_before_any_update(runs: Path) -> None:
    series = _scalars(runs / "fresh_mlp_deep_std1")
    assert series["train/loss"][0] > 1e12 and series["train/grad_norm"][0] > 1e12
    assert _first(runs, "fresh_mlp_deep_std1") <= 2


@pytest.mark.slow
def test_raw_pcm_inputs_are_in_the_int16_range(runs: Path) -> None:
    name = "fresh_cnn_raw_pcm"
    (x, _), = _batches(name, 0)
    assert 1e4 < float(x.abs().max()) <= 32768 and torch.equal(x, x.round())
    assert math.isfinite(_scalars(runs / name)["train/loss"][0])
    assert _first(runs, name) >= 1


@pytest.mark.slow
def test_relu_rate_case_dies_in_the_forward_after_training(runs: Path) -> None:
    name = "fresh_cnn_relu_counts"
    first = _first(runs, name)
    loss = _scalars(runs / name)["train/loss"]
    assert first > 10 and loss[first - 1] < loss[0] and not math.isfinite(loss[first])
    assert _info(runs, name)["stop_reason"] == "loss-check"
    counts = torch.cat([y for _, y in _batches(name, first)])
    assert bool((counts == 0).any())  # empty frames pull the rate down to 0


@pytest.mark.slow
def test_flow_loss_runs_negative_until_exp_overflows(runs: Path) -> None:
    name = "fresh_flow_unbounded_scale"
    first = _first(runs, name)
    loss = _scalars(runs / name)["train/loss"]
    # -sum(log-scale) dominates the loss: it falls without bound, with no finite optimum.
    assert loss[first - 1] < loss[first - 10] < loss[first - 50] < 0 < loss[0]
    assert loss[first - 1] < -50
    assert _info(runs, name)["stop_reason"] == "loss-check"


@pytest.mark.slow
def test_gumbel_case_fails_once_the_temperature_underflows(runs: Path) -> None:
    name = "fresh_dvae_gumbel_anneal"
    first = _first(runs, name)
    assert first > 300 and 0.8**first < 1e-30 and 0.8 ** (first - 40) > 1e-36
    assert all(math.isfinite(v) for v in _scalars(runs / name)["train/loss"][:first])


@pytest.mark.slow
def test_restart_fails_within_ten_steps_of_a_100x_jump(runs: Path) -> None:
    name = "fresh_metric_restart_100x"
    lr = _scalars(runs / name)["train/lr"]
    jump = next(i for i in range(1, len(lr)) if lr[i] != lr[i - 1])
    assert lr[jump] == pytest.approx(100 * lr[jump - 1])
    assert jump < _first(runs, name) <= jump + 10


@pytest.mark.slow
def test_plateau_control_sits_at_exactly_log_two(runs: Path) -> None:
    loss = _scalars(runs / "fresh_healthy_logc_plateau")["train/loss"]
    # Zero logits: float32 cross-entropy gives log(2) to the last bit, the same each step.
    assert loss[:30] == [loss[0]] * 30 and loss[0] == pytest.approx(math.log(2.0), abs=1e-6)
    assert loss[30] == loss[0] and loss[-1] < 0.3


@pytest.mark.slow
def test_spike_control_spikes_once_and_recovers(runs: Path) -> None:
    grads = _scalars(runs / "fresh_healthy_one_spike")["train/grad_norm"]
    peak = max(range(len(grads)), key=grads.__getitem__)
    rest = sorted(g for i, g in enumerate(grads) if i != peak)
    assert peak == 70 and grads[peak] > 10 * rest[len(rest) // 2] and grads[peak] > 3 * rest[-1]


@pytest.mark.slow
def test_amp_control_skips_a_few_steps_and_warms_up_steeply(runs: Path) -> None:
    name = "fresh_healthy_amp_steep_warmup"
    info = _info(runs, name)
    series = _scalars(runs / name)
    assert 1 <= len(info["skipped_steps"]) <= 20 and "amp/loss_scale" in series
    assert series["train/lr"][5] >= 100 * series["train/lr"][0]
