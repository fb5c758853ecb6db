"""End to end on runs the real frameworks wrote (tests/frameworks/): one training is one
run, failing runs exit 1 at the step and tag TensorBoard's own EventAccumulator reads from
the same files, healthy runs exit 0, and nothing is written into a run folder.

Assertions that the analyzer does not meet yet are marked ``xfail(strict=True)`` with the
part of issue 15 they wait on: each turns into a failure (XPASS) when that part lands, and
its mark is then removed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from analyzer.cli import main
from tests.frameworks import corpus
from tests.frameworks.truth import FirstBad, first_nonfinite
from tests.readonly import snapshot

pytestmark = pytest.mark.slow


# What EventAccumulator reads, written down so that a change in a framework's behaviour
# shows here rather than as a puzzling analyzer failure.
EXPECTED_FIRST: dict[str, tuple[int, str, str]] = {
    "lightning_nan": (25, "train_loss", "+inf"),
    "lightning_restart": (35, "train_loss", "+inf"),
    "hf_nan": (9, "train/grad_norm", "nan"),
    "tbx_nan": (29, "loss", "nan"),
    "ddp_gloo": (5, "train/loss", "nan"),
    # Benign: the scaler skipped these steps (see test_amp_benign_skips_are_the_scalers).
    "amp_benign": (0, "train/grad_norm", "nan"),
}
ANOMALY_STEP = 5
"""lightning_anomaly dies in the backward pass of global step 5, before logging it."""

# What the console log alone says (no event file beside it): the bar's, the Trainer's or
# the loop's own numbers placed on the framework's global step. Each matches the event
# file's value at that step (test_corpus_console_steps_agree_with_the_events).
CONSOLE_FIRST: dict[str, tuple[int, str, str]] = {
    "lightning_nan": (25, "train_loss", "+inf"),  # TQDM: "Epoch 3: ... 2/8 [..., train_loss=inf.0]"
    "lightning_restart": (39, "train_loss", "nan"),  # rich, one line a fit: "Epoch 4/4 ... 8/8"
    "hf_nan": (9, "grad_norm", "nan"),  # {'loss': '0', 'grad_norm': 'nan', ...}
    "tbx_nan": (29, "loss", "nan"),  # "step 29 loss nan"
    "ddp_gloo": (5, "loss", "nan"),  # "[default1]:[rank 1] step 5 loss nan"
}
CONFIGURED_LR = {"lightning_nan": 1.0, "lightning_healthy": 0.05, "hf_nan": 30.0,
                 "hf_healthy": 5e-3}


@dataclass(frozen=True)
class Analysed:
    root: Path
    code: int
    report: dict[str, Any]
    before: dict[str, tuple[int, str]]
    after: dict[str, tuple[int, str]]


_ANALYSED: dict[str, Analysed] = {}


def _analyse(path: Path, report_file: Path) -> tuple[int, dict[str, Any]]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["analyze", "--no-replay", "-q", "--json", str(report_file), str(path)])
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return code, report


def analysed(name: str, factory: pytest.TempPathFactory) -> Analysed:
    """Run ``name`` of the corpus through ``forensics analyze --json``, once a session."""
    if name not in _ANALYSED:
        root = corpus.get(name, factory)
        before = snapshot(root)
        code, report = _analyse(root, factory.mktemp("reports") / f"{name}.json")
        _ANALYSED[name] = Analysed(root, code, report, before, snapshot(root))
    return _ANALYSED[name]


def console_only(name: str, factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    """The run's train.log alone in a folder of its own, analysed."""
    folder = factory.mktemp(f"console_{name}")
    shutil.copy(corpus.get(name, factory) / "train.log", folder / "train.log")
    return _analyse(folder, factory.mktemp("reports") / f"console_{name}.json")


def _values(tree: Any, key: str) -> Iterator[Any]:
    """Every value stored under ``key`` anywhere in a JSON tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == key:
                yield v
            yield from _values(v, key)
    elif isinstance(tree, list):
        for item in tree:
            yield from _values(item, key)


def _strings(tree: Any) -> Iterator[str]:
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _strings(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _strings(item)


def training_run(a: Analysed) -> dict[str, Any]:
    """The report's run for the training folder (the only run, once grouping works)."""
    runs = a.report.get("runs", [])
    at_root = [r for r in runs if Path(r["path"]).resolve() == a.root.resolve()]
    if len(runs) == 1:
        return dict(runs[0])
    assert len(at_root) == 1, [r["path"] for r in runs]
    return dict(at_root[0])


def _kind(value: float) -> str:
    return "nan" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def _xfail(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=reason)


def _params(names: tuple[str, ...], failing: dict[str, str]) -> list[Any]:
    return [pytest.param(n, marks=_xfail(failing[n])) if n in failing else n for n in names]


# -- the corpus is what it says it is ---------------------------------------------------


@pytest.mark.parametrize("name", corpus.NAMES)
def test_corpus_first_nonfinite_is_as_documented(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    found = first_nonfinite(corpus.get(name, tmp_path_factory))
    expected = EXPECTED_FIRST.get(name)
    if expected is None:
        assert found is None, found
    else:
        assert found is not None
        assert (found.step, found.tag, _kind(found.value)) == expected


def test_corpus_healthy_lightning_checkpoints_hold_an_infinite_kth_value(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Real ModelCheckpoint state: the false alarm of issue 15 is in every file."""
    import torch

    root = corpus.get("lightning_healthy", tmp_path_factory)
    files = sorted(root.rglob("*.ckpt"))
    assert len(files) == 4
    for file in files:
        state = torch.load(file, weights_only=True)
        kth = [v["kth_value"] for k, v in state["callbacks"].items()
               if k.startswith("ModelCheckpoint")]
        assert any(math.isinf(float(t)) for t in kth), file


def test_amp_benign_skips_are_the_scalers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each non-finite grad norm of amp_benign is a step whose scale the scaler cut."""
    from tests.frameworks.truth import scalars

    series = scalars(corpus.get("amp_benign", tmp_path_factory))
    norms = dict(series["tb:train/grad_norm"])
    scale = dict(series["tb:train/loss_scale"])
    bad = sorted(s for s, v in norms.items() if not math.isfinite(v))
    assert bad == list(range(7))
    assert all(scale[s] == 2.0 ** (19 - s) for s in bad)
    assert all(scale[s] == scale[bad[-1]] for s in norms if s > bad[-1])


def test_corpus_console_steps_agree_with_the_events(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.frameworks.truth import scalars

    for name, (step, _, kind) in CONSOLE_FIRST.items():
        series = scalars(corpus.get(name, tmp_path_factory))
        at_step = [v for points in series.values() for s, v in points if s == step]
        assert kind in {_kind(v) for v in at_step if not math.isfinite(v)}, name


# -- one training, one run --------------------------------------------------------------


@pytest.mark.parametrize("name", corpus.NAMES)
def test_one_training_is_one_run(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    a = analysed(name, tmp_path_factory)
    assert [Path(r["path"]).resolve() for r in a.report["runs"]] == [a.root.resolve()]


@pytest.mark.parametrize("family", ["lightning", "hf", "plain"])
def test_a_folder_of_trainings_gives_one_run_each(
        family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    names = corpus.FAMILIES[family]
    parent = corpus.get(names[0], tmp_path_factory).parent
    _, report = _analyse(parent, tmp_path_factory.mktemp("reports") / f"{family}.json")
    paths = sorted(Path(r["path"]).resolve() for r in report["runs"])
    assert paths == sorted((parent / n).resolve() for n in names)


# -- exit code and the first step -------------------------------------------------------


@pytest.mark.parametrize("name", corpus.NAMES)
def test_exit_code_is_1_when_failing_and_0_when_healthy(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    a = analysed(name, tmp_path_factory)
    assert a.code == (1 if name in corpus.FAILING else 0)


WITH_EVENTS = ("lightning_nan", "lightning_restart", "hf_nan", "tbx_nan", "ddp_gloo")


def _truth(name: str, factory: pytest.TempPathFactory) -> FirstBad:
    found = first_nonfinite(corpus.get(name, factory))
    assert found is not None
    return found


@pytest.mark.parametrize("name", WITH_EVENTS)
def test_first_step_is_the_one_event_accumulator_reads(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = training_run(analysed(name, tmp_path_factory))
    assert run["status"] == "failed"
    assert run["incident"]["step"] == _truth(name, tmp_path_factory).step


@pytest.mark.parametrize("name", WITH_EVENTS)
def test_first_tag_and_kind_are_the_ones_event_accumulator_reads(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = training_run(analysed(name, tmp_path_factory))
    truth = _truth(name, tmp_path_factory)
    assert (run["incident"]["tag"], run["incident"]["kind"]) == (truth.tag, _kind(truth.value))


def test_anomaly_run_fails_in_the_step_that_raised(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """No event holds a non-finite value: the traceback in train.log is the evidence. It
    names no step; the last step logged is 4, so the failure is "at 5" or "after 4" (the
    bar's ``5/8`` counts batches from 1: it is step 4, not 5)."""
    run = training_run(analysed("lightning_anomaly", tmp_path_factory))
    assert run["status"] == "failed"
    incident = run["incident"]
    assert (incident["step"], incident["after"]) in {(ANOMALY_STEP, False),
                                                     (ANOMALY_STEP - 1, True)}
    assert "MseLossBackward0" in incident["tag"]


@pytest.mark.parametrize("name", corpus.HEALTHY)
def test_healthy_run_raises_no_alarm(name: str,
                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    a = analysed(name, tmp_path_factory)
    assert a.report["failed"] is False
    assert [(r["path"], r["incident"]) for r in a.report["runs"]
            if r["status"] != "finite" or r["incident"] is not None] == []


@pytest.mark.parametrize("name", corpus.NAMES)
def test_nothing_is_written_into_the_run_folder(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    a = analysed(name, tmp_path_factory)
    assert a.report, "the analysis wrote no report"
    assert a.after == a.before


@pytest.mark.parametrize("name", corpus.NAMES)
def test_every_file_of_the_training_is_in_its_run(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each file is a value of its own in the run's JSON (a path quoted in a note or a
    traceback does not count)."""
    a = analysed(name, tmp_path_factory)
    named = set(_strings(training_run(a)))
    missing = [str(p.relative_to(a.root)) for p in sorted(a.root.rglob("*"))
               if p.is_file() and str(p) not in named]
    assert missing == []


@pytest.mark.parametrize("name", tuple(CONFIGURED_LR))
def test_configured_learning_rate_is_in_the_json(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Lightning's hparams.yaml (``lr``), the Trainer's training_args.bin (read without
    unpickling): the learning rate the user set, under the report's ``learning_rate``."""
    run = training_run(analysed(name, tmp_path_factory))
    found = [v.get("value") if isinstance(v, dict) else v
             for v in _values(run, "learning_rate")]
    assert CONFIGURED_LR[name] in found


@pytest.mark.parametrize("name", corpus.NAMES)
def test_no_step_in_the_json_is_below_zero(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every framework here counts steps from 0 or 1: a negative ``step`` or ``onset``
    anywhere in the report (incidents, findings' evidence) is a misplaced line."""
    run = training_run(analysed(name, tmp_path_factory))
    steps = [v for key in ("step", "onset") for v in _values(run, key)
             if isinstance(v, int) and not isinstance(v, bool)]
    assert [v for v in steps if v < 0] == []


# -- the console log alone --------------------------------------------------------------


@pytest.mark.parametrize("name", CONSOLE_FIRST)
def test_the_console_log_alone_gives_the_first_step(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    code, report = console_only(name, tmp_path_factory)
    assert code == 1
    [run] = report["runs"]
    incident = run["incident"]
    assert (incident["step"], incident["tag"], incident["kind"]) == CONSOLE_FIRST[name]


def test_the_ddp_console_names_rank_1_as_the_one_that_failed(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 0's own lines stay finite (it died waiting in the all-reduce): every
    non-finite line of torchrun's console is rank 1's."""
    _, report = console_only("ddp_gloo", tmp_path_factory)
    [run] = report["runs"]
    assert run["incident"]["rank"] == 1
    assert {t["rank"] for t in run["tag_incidents"]} == {1}


def test_the_anomaly_console_alone_fails_in_the_step_that_raised(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    code, report = console_only("lightning_anomaly", tmp_path_factory)
    assert code == 1
    [run] = report["runs"]
    incident = run["incident"]
    assert (incident["step"], incident["after"]) in {(ANOMALY_STEP, False),
                                                     (ANOMALY_STEP - 1, True)}


@pytest.mark.parametrize("name", corpus.HEALTHY)
def test_a_healthy_console_alone_raises_no_alarm(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    code, report = console_only(name, tmp_path_factory)
    assert code == 0
    assert [r["incident"] for r in report["runs"]] == [None]
