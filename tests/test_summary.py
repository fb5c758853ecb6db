"""The sweep summary on results built by hand: the tests it runs, the keys it skips, the
counts, causes and steps it reports, its text, JSON and frames; and the hyperparameters a
run's metadata readers keep for it."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.fleet.hyperparams import hyperparameters
from analyzer.fleet.summary import summarize, summary_json
from analyzer.frames import summary_frames
from analyzer.model import (
    CaptureMeta,
    CaptureTrigger,
    Event,
    FactorySpec,
    Finding,
    Incident,
    Location,
    MetadataFile,
    OptimizerSpec,
    Run,
    RunMetadata,
    RunResult,
)
from analyzer.model.captures import AmpSettings
from analyzer.model.fleet import SweepSummary
from analyzer.report.summary import format_summary

Value = bool | int | float | str


def _finding(code: str, score: float = 1.0, confidence: str = "high") -> Finding:
    return Finding(code, f"name-{code}", "title", confidence, "cause", (), "fix",  # type: ignore[arg-type]
                   score)


def _result(i: int, failed: bool, keys: Mapping[str, Value] | None = None, *,
            step: int | None = 10, findings: Sequence[Finding] = (),
            readable: bool = True, env: Mapping[str, object] | None = None) -> RunResult:
    path = f"/sweep/trial_{i}"
    meta = None if keys is None else RunMetadata(files=(MetadataFile(
        f"{path}/hparams.yaml", "hparams", "lightning", "read", dict(keys)),))
    events = (Event("restart", 0, Location(f"{path}/log"), "start"),) if readable else ()
    run = Run(path=path, name=f"trial_{i}", files=(), events=events, metadata=meta, env=env)
    incident = Incident(step, "train/loss", "nan", None, Location(f"{path}/log")) \
        if failed else None
    return RunResult(run=run, incident=incident, findings=tuple(findings))


def _lr_sweep(n: int = 60, seed: int = 0, threshold: float = 3e-3) -> list[RunResult]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lr = 10 ** rng.uniform(-4, -1)
        keys: dict[str, Value] = {"lr": lr, "activation": rng.choice(["relu", "gelu"]),
                                  "seed": i, "run_name": f"trial-{i}", "optimizer": "sgd"}
        failed = lr > threshold
        out.append(_result(i, failed, keys, step=rng.randint(5, 90),
                           findings=[_finding("NF202")] if failed else []))
    return out


def _separator_keys(summary: SweepSummary) -> list[str]:
    return [s.key for s in summary.separators if s.significant]


def test_a_numeric_threshold_is_named_with_its_direction_and_both_sides() -> None:
    results = _lr_sweep()
    summary = summarize(results)
    assert _separator_keys(summary) == ["lr"]
    lr = summary.separators[0]
    assert lr.test == "mann-whitney" and lr.p_adjusted < 0.01
    rows = [(r.run.metadata.files[0].fields["lr"], r.failed) for r in results]  # type: ignore[union-attr]
    healthy = max(v for v, f in rows if not f)
    diverged = min(v for v, f in rows if f)
    assert lr.failing.op == ">=" and lr.failing.value == diverged
    assert lr.other.op == "<=" and lr.other.value == healthy
    assert (lr.failing.failed, lr.failing.runs) == (summary.failed, summary.failed)
    assert (lr.other.failed, lr.other.runs) == (0, summary.finite)
    text = format_summary(summary)
    assert f"lr >= {diverged:.4g}: {summary.failed} of {summary.failed} failed" in text
    assert f"lr <= {healthy:.4g}: 0 of {summary.finite} failed" in text


def test_the_irrelevant_keys_are_not_separators_and_the_skipped_ones_are_counted() -> None:
    summary = summarize(_lr_sweep())
    tested = {s.key: s for s in summary.separators}
    assert not tested["activation"].significant
    skipped = {k.key: k.reason for k in summary.skipped}
    assert skipped == {"run_name": "identifier", "seed": "identifier", "optimizer": "constant"}
    assert "not significant: activation" in format_summary(summary)


def test_separators_come_sorted_by_adjusted_p_and_holm_is_applied() -> None:
    summary = summarize(_lr_sweep())
    adjusted = [s.p_adjusted for s in summary.separators]
    assert adjusted == sorted(adjusted)
    raw = sorted(s.p_value for s in summary.separators)
    m = len(raw)
    # Holm, written out: the k-th smallest p times (m - k), never below the one before.
    expected = list(np.maximum.accumulate([min(1.0, (m - k) * p) for k, p in enumerate(raw)]))
    assert adjusted == pytest.approx(expected)


def test_the_best_cut_is_the_one_a_brute_force_search_finds() -> None:
    """The oracle: every threshold between two values, Youden's J from counts."""
    rng = random.Random(3)
    results = []
    for i in range(80):
        x = rng.gauss(0, 1)
        results.append(_result(i, rng.random() < (0.85 if x < -0.3 else 0.15), {"x": x}))
    sep = summarize(results).separators[0]
    pairs = sorted((r.run.metadata.files[0].fields["x"], r.failed) for r in results)  # type: ignore[union-attr]
    n_fail = sum(f for _, f in pairs)
    n_ok = len(pairs) - n_fail
    best = max(range(1, len(pairs)), key=lambda k: abs(
        sum(f for _, f in pairs[:k]) / n_fail - sum(not f for _, f in pairs[:k]) / n_ok))
    assert sep.failing.op == "<=" and sep.failing.value == pairs[best - 1][0]
    assert sep.other.value == pairs[best][0]
    assert sep.failing.runs == best and sep.failing.failed == sum(f for _, f in pairs[:best])


def test_a_categorical_separator_by_fisher_exact_test() -> None:
    from scipy.stats import fisher_exact

    results = []
    for i in range(40):
        precision = "16-mixed" if i % 2 else "32"
        failed = precision == "16-mixed" and i % 10 != 1
        results.append(_result(i, failed, {"precision": precision, "batch": 32}))
    summary = summarize(results)
    sep = summary.separators[0]
    assert sep.key == "precision" and sep.test == "fisher" and sep.significant
    assert (sep.failing.op, sep.failing.value) == ("==", "16-mixed")
    assert (sep.failing.failed, sep.failing.runs) == (16, 20)
    assert (sep.other.op, sep.other.value, sep.other.failed, sep.other.runs) == \
        ("==", "32", 0, 20)  # of two values, the other by name
    # A two-valued key is one test: its p is the 2x2 table's, not doubled.
    assert sep.p_value == pytest.approx(fisher_exact([[16, 4], [0, 20]]).pvalue)
    assert "precision == 16-mixed: 16 of 20 failed" in format_summary(summary)


def test_a_category_of_three_values_pays_for_each_value_tested() -> None:
    from scipy.stats import fisher_exact

    names = ["adam", "sgd", "lion"]
    results = [_result(i, names[i % 3] == "lion" and i % 4 != 0, {"opt": names[i % 3]})
               for i in range(45)]
    sep = summarize(results).separators[0]
    failed_lion = sum(1 for i in range(45) if i % 3 == 2 and i % 4 != 0)
    table = [[failed_lion, 15 - failed_lion], [0, 30]]
    assert (sep.failing.op, sep.failing.value) == ("==", "lion")
    assert (sep.other.op, sep.other.value, sep.other.runs) == ("!=", "lion", 30)
    assert sep.p_value == pytest.approx(min(1.0, 3 * fisher_exact(table).pvalue))


def test_mixed_types_under_one_key_are_compared_as_categories() -> None:
    """Lightning's precision may be 16 (an int) in one run and "bf16-mixed" in another."""
    results = []
    for i in range(30):
        value: Value = 16 if i % 3 == 0 else ("bf16-mixed" if i % 3 == 1 else True)
        results.append(_result(i, i % 3 == 0, {"precision": value}))
    sep = summarize(results).separators[0]
    assert sep.kind == "category" and sep.failing.value == "16"
    assert (sep.failing.failed, sep.failing.runs) == (10, 10)


def test_numbers_written_as_text_in_some_runs_are_still_numbers() -> None:
    """PyYAML reads ``lr: 5e-3`` as the string "5e-3" (YAML 1.1 wants ``5.0e-3``)."""
    results = _lr_sweep(40)
    for k, r in enumerate(results[::3]):
        fields = r.run.metadata.files[0].fields  # type: ignore[union-attr]
        fields["lr"] = f"{fields['lr']:e}" if k % 2 else str(fields["lr"])  # type: ignore[index]
    summary = summarize(results)
    lr = summary.separators[0]
    assert lr.key == "lr" and lr.kind == "number" and lr.significant
    assert isinstance(lr.failing.value, float)
    fields = results[1].run.metadata.files[0].fields  # type: ignore[union-attr]
    fields["lr"] = "1e999"  # type: ignore[index]
    # Not a number (it would be inf): the key's values are then texts, each different.
    assert ("lr", "identifier") in [(k.key, k.reason) for k in summarize(results).skipped]


def test_too_few_runs_of_one_outcome_are_not_tested_and_n_is_stated() -> None:
    results = [_result(i, i < 2, {"lr": 0.1 if i < 2 else 0.001 * (i + 1)}) for i in range(20)]
    summary = summarize(results)
    assert summary.separators == ()
    assert [(k.key, k.reason, k.runs) for k in summary.skipped] == [("lr", "too_few", 20)]
    text = format_summary(summary)
    assert "none tested" in text and "1 too few runs of one outcome" in text


def test_a_perfect_split_on_few_runs_is_listed_as_not_significant() -> None:
    """Four of each outcome split perfectly: p = 0.029 > 0.01, so it is no separator."""
    results = [_result(i, i >= 4, {"lr": 10.0 ** (i - 8)}) for i in range(8)]
    summary = summarize(results)
    (sep,) = summary.separators
    assert not sep.significant and sep.p_adjusted > 0.01
    assert sep.runs == 8
    text = format_summary(summary)
    assert "none: no key separates" in text and "lr (p=0.029, n=8)" in text


def test_all_failed_counts_and_names_no_separator() -> None:
    results = [_result(i, True, {"lr": 0.01 * (i + 1)}, step=i,
                       findings=[_finding("NF202")] if i % 2 else []) for i in range(10)]
    summary = summarize(results)
    assert (summary.runs, summary.failed, summary.finite, summary.unreadable) == (10, 10, 0, 0)
    assert summary.separators == ()
    assert [(k.key, k.reason) for k in summary.skipped] == [("lr", "one_outcome")]
    assert [(c.code, c.runs) for c in summary.causes] == [("NF202", 5), (None, 5)]
    assert "min 0  q1 2.25  median 4.5  q3 6.75  max 9" in format_summary(summary)
    stepless = summarize([_result(i, True, step=None) for i in range(3)])
    assert "none of the 3 failed runs names a global step" in format_summary(stepless)


def test_no_hyperparameters_at_all() -> None:
    results = [_result(i, i % 2 == 0, None) for i in range(10)]
    summary = summarize(results)
    assert summary.separators == () and summary.skipped == ()
    assert "none tested" in format_summary(summary)
    frames = summary_frames(summary)
    assert list(frames["runs"].columns) == ["run", "path", "status", "cause", "causes",
                                            "first_step"]
    assert frames["separators"].empty


def test_a_key_missing_in_most_runs_is_skipped() -> None:
    results = [_result(i, i % 2 == 0, {"lr": 0.1 * i} if i < 4 else {}) for i in range(20)]
    summary = summarize(results)
    assert [(k.key, k.reason, k.runs) for k in summary.skipped] == [("lr", "missing", 4)]


def test_unreadable_runs_are_counted_and_judged_for_nothing() -> None:
    results = _lr_sweep(40)
    results += [_result(100 + i, False, {"lr": 1.0}, readable=False) for i in range(5)]
    summary = summarize(results)
    assert summary.unreadable == 5 and summary.runs == 45
    lr = next(s for s in summary.separators if s.key == "lr")
    assert lr.runs == 40


def test_causes_ranked_with_ties_and_no_cause_counted() -> None:
    results = [_result(0, True, findings=[_finding("NF101")]),
               _result(1, True, findings=[_finding("NF101")]),
               _result(2, True, findings=[_finding("NF101"), _finding("NF202")]),
               _result(3, True, findings=[_finding("NF202"), _finding("NF101", 0.5)]),
               _result(4, True, findings=[_finding("NF303", 1.0, "low")]),
               _result(5, True), _result(6, True), _result(7, True),
               _result(8, False, findings=[_finding("NF999")])]
    causes = summarize(results).causes
    assert [(c.code, c.runs, c.tied) for c in causes] == [
        ("NF101", 3, 1), (None, 3, 0), ("NF202", 2, 1), ("NF303", 1, 0)]
    text = format_summary(summarize(results))
    assert "3  NF101 name-NF101 (1 tied with another cause)" in text
    assert "counts for each of them" in text


def test_first_step_distribution_matches_numpy() -> None:
    steps = [3, 7, 7, 12, 40, 41, 41, 99]
    results = [_result(i, True, step=s) for i, s in enumerate(steps)]
    unaligned = _result(52, True, step=5)
    assert unaligned.incident is not None
    unaligned = dataclasses.replace(unaligned, incident=dataclasses.replace(
        unaligned.incident, aligned=False))  # a log's own record count, not a global step
    results += [_result(50, True, step=None), _result(51, False), unaligned]
    dist = summarize(results).steps
    assert (dist.runs, dist.without_step, dist.minimum, dist.maximum) == (8, 2, 3, 99)
    assert [dist.q1, dist.median, dist.q3] == list(np.percentile(steps, [25, 50, 75]))
    assert sum(b.runs for b in dist.bins) == 8
    assert dist.bins[0].low == 3 and dist.bins[-1].high == 99
    assert all(a.high + 1 == b.low for a, b in zip(dist.bins, dist.bins[1:], strict=False))
    for b in dist.bins:
        assert b.runs == sum(b.low <= s <= b.high for s in steps)


def test_json_and_frames_carry_the_same_summary() -> None:
    summary = summarize(_lr_sweep(40))
    doc = json.loads(json.dumps(summary_json(summary), allow_nan=False))
    assert doc["failed"] == summary.failed and len(doc["rows"]) == 40
    assert doc["separators"][0]["key"] == "lr"
    assert doc["separators"][0]["failing"]["op"] == ">="
    frames = summary_frames(summary)
    assert set(frames) == {"runs", "causes", "steps", "separators"}
    runs = frames["runs"]
    assert len(runs) == 40 and {"lr", "activation", "seed"} <= set(runs.columns)
    assert list(runs["status"]).count("failed") == summary.failed
    assert frames["separators"]["key"].iloc[0] == "lr"
    assert frames["separators"]["failing"].iloc[0].startswith("lr >= ")
    assert int(frames["steps"]["runs"].sum()) == summary.steps.runs


# --- hyperparameters: what a run's records give, without opening a file ---------------

def _capture_meta() -> CaptureMeta:
    return CaptureMeta(folder="/r/capture/step_5", step=5, trigger=CaptureTrigger("loss"),
                       model=FactorySpec("m:f"), loss=None,
                       optimizer=OptimizerSpec("torch.optim.Adam", {"lr": 0.1, "eps": 1e-8,
                                                                    "betas": [0.9, 0.99]},
                                               1, (0.05, 0.1)),
                       dtype="float32", amp=AmpSettings("float16", "cuda", True), device="cuda",
                       mode="every_step", grad_clip=1.0)


def test_hyperparameters_from_files_env_and_capture_by_precedence() -> None:
    files = (
        MetadataFile("/r/version_0/hparams.yaml", "hparams", "lightning", "read",
                     {"lr": 0.5, "model.depth": 4, "name": "a"}),
        MetadataFile("/r/version_1/hparams.yaml", "hparams", "lightning", "read",
                     {"lr": 0.25, "name": "b"}),
        MetadataFile("/r/ckpt/last.ckpt", "checkpoint_hparams", "lightning", "read",
                     {"lr": 0.125, "precision": "16-mixed"}),
        MetadataFile("/r/trainer_state.json", "trainer_state", "transformers", "read",
                     {"global_step": 90, "epoch": 1.5, "logging_steps": 5, "best_metric": None,
                      "total_flos": 1e9, "trial_params.lr": 0.3}),
        MetadataFile("/r/scheduler.pt", "scheduler", "torch", "read",
                     {"base_lr": 0.1, "last_lr": 0.01, "last_epoch": 12}),
    )
    env = {"format": "nan-forensics-env", "version": 1, "torch": "2.5.0", "cuda": None,
           "gpus": ["NVIDIA H100", "NVIDIA H100"], "deterministic_algorithms": True,
           "num_threads": 8, "extra": {"nested": 1}}
    run = Run(path="/r", name="r", files=(), metadata=RunMetadata(files=files), env=env,
              capture_metas=(_capture_meta(),))
    got = hyperparameters(RunResult(run=run, incident=None))
    assert got["lr"] == 0.125  # a checkpoint's hyperparameters over hparams.yaml
    assert got["name"] == "b" and got["model.depth"] == 4  # the latest version first
    assert got["precision"] == "16-mixed" and got["logging_steps"] == 5
    assert got["base_lr"] == 0.1
    assert got["trial_params.lr"] == 0.3
    for progress in ("global_step", "epoch", "best_metric", "total_flos", "last_lr",
                     "last_epoch"):
        assert progress not in got
    assert got["env.torch"] == "2.5.0" and got["env.gpu"] == "NVIDIA H100"
    assert got["env.gpu_count"] == 2 and got["env.deterministic_algorithms"] is True
    assert "env.cuda" not in got and "env.format" not in got and "env.extra" not in got
    assert got["capture.optimizer"] == "torch.optim.Adam" and got["capture.lr"] == 0.1
    assert got["capture.optimizer.eps"] == 1e-8 and "capture.optimizer.betas" not in got
    assert got["capture.amp.autocast_dtype"] == "float16"
    assert got["capture.amp.grad_scaler"] is True and got["capture.grad_clip"] == 1.0
    assert list(got) == sorted(got)


def test_regression_hparams_yaml_keeps_the_keys_no_rule_looks_for(tmp_path: Path) -> None:
    """hparams.yaml's fields held only the keys a setting is read from: a sweep's
    ``activation`` or ``normalize_inputs`` was lost before any summary could see it."""
    import yaml

    from analyzer.ingest.metadata.hparams import read_hparams
    from analyzer.ingest.metadata.keys import MAX_FIELDS

    path = tmp_path / "hparams.yaml"
    document = {"lr": 0.01, "activation": "gelu", "normalize_inputs": False,
                "model": {"width": 16, "deep": {"depth": 3, "lr": 0.5}},
                "betas": [0.9, 0.99], "wandb_api_key": "s3cret", "hub_token": "hf_x",
                "tail": {f"k{i}": i for i in range(2 * MAX_FIELDS)}}
    path.write_text(yaml.safe_dump(document))
    got = read_hparams(str(path))
    assert not got.issues
    fields = got.fields
    assert fields["lr"] == 0.01 and fields["activation"] == "gelu"
    assert fields["normalize_inputs"] is False and fields["model.width"] == 16
    assert fields["model.deep.lr"] == 0.5  # a recognised key, at any depth, as before
    assert "model.deep.depth" not in fields  # two levels down: not kept
    assert "betas" not in fields
    assert not any("api_key" in k or "token" in k for k in fields)
    assert sum(k.startswith("tail.") for k in fields) <= MAX_FIELDS
    settings = {k: v for k, (_, v) in got.settings.items()}
    assert settings == {"learning_rate": 0.01}


def test_yaml_aliases_do_not_multiply_the_fields_kept(tmp_path: Path) -> None:
    """A top level of aliases to one big mapping: the walk stops at its visit bound."""
    from analyzer.ingest.metadata.hparams import read_hparams
    from analyzer.ingest.metadata.keys import MAX_FIELDS

    body = "base: &b {" + ", ".join(f"m{i}: {{x: 1}}" for i in range(3000)) + "}\n"
    body += "".join(f"a{i}: *b\n" for i in range(3000))
    path = tmp_path / "hparams.yaml"
    path.write_text(body)
    got = read_hparams(str(path))
    assert len(got.fields) <= MAX_FIELDS


def test_regression_training_args_keep_every_plain_field_but_secrets(tmp_path: Path) -> None:
    """training_args.bin kept only the fields settings use; it now keeps every plain one of
    the dataclass's state, enums by value, never ``hub_token``."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import TrainingArguments

    from analyzer.ingest.metadata.torchsaved import read_training_args

    args = TrainingArguments(output_dir=str(tmp_path / "out"), learning_rate=3e-4,
                             hub_token="hf_not_to_be_kept", report_to=["tensorboard"],
                             save_strategy="no", dataloader_num_workers=3)
    path = tmp_path / "training_args.bin"
    torch.save(args, path)
    fields = read_training_args(str(path)).fields
    assert fields["learning_rate"] == 3e-4 and fields["dataloader_num_workers"] == 3
    assert fields["save_strategy"] == "no"  # an enum, by its value
    assert "hub_token" not in fields and "hf_not_to_be_kept" not in fields.values()
    assert not any(k.startswith("_") for k in fields)


def test_hyperparameters_of_real_trainer_runs_hold_settings_not_progress(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Hugging Face Trainer's save folders, from the shared corpus: training_args.bin,
    trainer_state.json, config.json and scheduler.pt each give their keys; the counters
    of how far it went do not, nor the hub token."""
    import analyzer
    from tests.frameworks import corpus

    nan_run = corpus.get("hf_nan", tmp_path_factory)
    healthy = corpus.get("hf_healthy", tmp_path_factory)
    results = {Path(r.run.path).name: r for r in
               analyzer.analyze([str(nan_run), str(healthy)]).results}
    got = {name: hyperparameters(r) for name, r in results.items()}
    assert got["hf_nan"]["learning_rate"] == 30 and got["hf_healthy"]["learning_rate"] == 5e-3
    for keys in got.values():
        assert keys["n_embd"] == 16 and keys["max_steps"] in (20, 24)
        assert "optim" in keys and "per_device_train_batch_size" in keys
        assert not {"global_step", "epoch", "total_flos", "hub_token"} & set(keys)
        assert not any(k.startswith("log_history") for k in keys)
    summary = summarize(list(results.values()))
    assert (summary.failed, summary.finite) == (1, 1)
    assert {k.reason for k in summary.skipped} <= {"too_few", "constant"}


_values = st.one_of(st.booleans(), st.integers(-5, 5), st.floats(-1e6, 1e6, allow_nan=False),
                    st.sampled_from(["a", "b", "c", "1e-3", "16-mixed"]),
                    st.floats(allow_nan=True, allow_infinity=True))
_runs = st.lists(st.tuples(st.booleans(), st.booleans(),
                           st.dictionaries(st.sampled_from(["k1", "k2", "k3", "k4"]), _values,
                                           max_size=4)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(_runs)
def test_any_mixture_of_keys_and_outcomes_is_summarised_consistently(
        runs: list[tuple[bool, bool, dict[str, Value]]]) -> None:
    results = [_result(i, failed, keys, readable=readable or failed)
               for i, (failed, readable, keys) in enumerate(runs)]
    summary = summarize(results)
    assert summary.runs == summary.failed + summary.finite + summary.unreadable == len(runs)
    json.dumps(summary_json(summary), allow_nan=False)
    format_summary(summary)
    summary_frames(summary)
    judged = [r for r in results if r.status != "unreadable"]
    present = {k for r in judged for k in hyperparameters(r)}
    tested = [s.key for s in summary.separators]
    assert sorted(tested + [k.key for k in summary.skipped]) == sorted(present)
    for s in summary.separators:
        assert 0.0 <= s.p_value <= s.p_adjusted <= 1.0
        assert s.significant == (s.p_adjusted < summary.alpha)
        assert s.failing.runs + s.other.runs == s.runs
        assert s.failing.failed + s.other.failed == s.failed
        assert min(s.failed, s.runs - s.failed) >= summary.min_runs
        assert s.failing.failed * s.other.runs >= s.other.failed * s.failing.runs


def test_regression_config_and_trainer_state_keep_every_plain_top_level_field(
        tmp_path: Path) -> None:
    """config.json kept only its model type, dtype, eps and sizes, trainer_state.json only
    its counters: a sweep over dropout or a search's trial_params was not seen."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, TrainerState

    from analyzer.ingest.metadata.hfjson import read_model_config, read_trainer_state

    GPT2Config(n_layer=1, n_embd=16, n_head=2, resid_pdrop=0.25).save_pretrained(tmp_path)
    config = read_model_config(str(tmp_path / "config.json")).fields
    assert config["resid_pdrop"] == 0.25 and config["activation_function"] == "gelu_new"
    assert config["n_embd"] == 16  # a field the rules read, as before
    state = TrainerState(global_step=7, max_steps=10, trial_name="t3",
                         trial_params={"learning_rate": 0.02, "warmup": 3})
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    fields = read_trainer_state(str(tmp_path / "trainer_state.json")).fields
    assert fields["trial_name"] == "t3" and fields["trial_params.learning_rate"] == 0.02
    assert fields["global_step"] == 7 and not any(k.startswith("log_history") for k in fields)


def test_a_key_named_like_a_fixed_column_gets_its_own_column() -> None:
    results = [_result(i, i % 2 == 0, {"status": "draft", "cause": i, "lr": 0.1})
               for i in range(6)]
    runs = summary_frames(summarize(results))["runs"]
    assert list(runs.columns) == ["run", "path", "status", "cause", "causes", "first_step",
                                  "hp.cause", "lr", "hp.status"]  # the keys in their sorted order
    assert set(runs["status"]) == {"failed", "finite"} and set(runs["hp.status"]) == {"draft"}


def test_regression_a_seed_is_a_label_not_a_magnitude() -> None:
    # The generated sweep's seed 2 drew its larger seeds for its larger rates by chance: a
    # rank test on seeds named "seed >= 822068462" a separator. A seed's order means
    # nothing: distinct seeds are identifiers, and repeated ones are compared as values.
    rng = random.Random(2)
    results = []
    for i in range(40):
        lr = 10 ** rng.uniform(-4, -1)
        failed = lr > 3e-3
        seed = int(lr * 1e9) + i  # ordered as the rates are
        results.append(_result(i, failed, {"lr": lr, "seed": seed, "data_seed": seed + 1,
                                           "trial.seed": seed}))
    summary = summarize(results)
    assert _separator_keys(summary) == ["lr"]
    skipped = {k.key: k.reason for k in summary.skipped}
    assert skipped == {"seed": "identifier", "data_seed": "identifier",
                       "trial.seed": "identifier"}
    assert "3 a different value in every run" in format_summary(summary)
    # Three seeds, each over every rate: a seed's value is tested as a category.
    repeated = [_result(i, r.failed, {"lr": r.run.metadata.files[0].fields["lr"],  # type: ignore[union-attr]
                                      "seed": i % 3})
                for i, r in enumerate(results)]
    tested = {s.key: s for s in summarize(repeated).separators}
    assert tested["seed"].test == "fisher" and not tested["seed"].significant


def test_regression_a_run_tied_on_two_causes_is_a_run_of_each() -> None:
    # The causes table counts a run once for each cause tied at its top, but the run's row
    # kept only the first: the runs of the second cause, looked up by row, missed it.
    results = [_result(0, True, findings=[_finding("NF101"), _finding("NF202")]),
               _result(1, True, findings=[_finding("NF202")]),
               _result(2, True, findings=[_finding("NF202"), _finding("NF101", 0.5)]),
               _result(3, False)]
    summary = summarize(results)
    assert [r.causes for r in summary.rows] == [("NF101", "NF202"), ("NF202",), ("NF202",), ()]
    assert [r.cause for r in summary.rows] == ["NF101", "NF202", "NF202", None]
    runs = summary_frames(summary)["runs"]
    for c in summary.causes:
        of_cause = [row for row in summary.rows if c.code in row.causes]
        assert len(of_cause) == c.runs
        assert int(runs["causes"].map(lambda codes, code=c.code: code in codes).sum()) == c.runs
    assert summary_json(summary)["rows"][0]["causes"] == ["NF101", "NF202"]  # type: ignore[index]
