"""The align stage: logs placed on the run's global step beside an event file.

Event files are written with torch's SummaryWriter; logs in the Hugging Face Trainer's
format (the dict it prints at every logging step, values rounded to 4 places as its
``log`` does) or as a script's ``step N loss X`` lines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.tensorboard import SummaryWriter

from analyzer.align import best_placement
from analyzer.api import analyze, read
from analyzer.cli import main

STEPS = 80
BAD = 61
"""The global step at which the loss goes NaN."""


def _loss(step: int) -> float:
    return float("nan") if step >= BAD else 2.0 * math.exp(-step / 40) + 0.01 * (step % 7)


def _events(run: Path, steps: range = range(STEPS)) -> None:
    writer = SummaryWriter(str(run))
    for step in steps:
        writer.add_scalar("train/loss", _loss(step), step)
        writer.add_scalar("train/lr", 5e-5, step)
    writer.close()


def _hf_value(x: float) -> str:
    return "nan" if math.isnan(x) else repr(round(x, 4))


def _hf_log(run: Path, every: int, keys: tuple[str, ...] = ("loss", "learning_rate")) -> None:
    """The Trainer's dict lines, one per logging step (global steps every, 2*every, ...),
    without a progress bar: the lines name no step."""
    lines = []
    for k, step in enumerate(range(every, STEPS, every), start=1):
        values = {"loss": _hf_value(_loss(step)), "grad_norm": "1.25",
                  "learning_rate": "5e-05", "epoch": f"{step / STEPS:.2f}"}
        body = ", ".join(f"'{key}': {values[key]}" for key in (*keys, "epoch"))
        lines.append("{" + body + "}")
        del k
    (run / "train.log").write_text("\n".join(lines) + "\n")


def _only(report_runs: list) -> object:  # type: ignore[type-arg]
    (result,) = report_runs
    return result


def test_regression_hf_records_are_placed_on_the_event_files_global_steps(
    tmp_path: Path,
) -> None:
    # The Nth dict line used to be "step N": its NaN at the 13th record (global step 65)
    # came before the event file's step 61... and a log NaN at record 13 said "step 13".
    run = tmp_path / "run"
    _events(run)
    _hf_log(run, every=5)
    report = analyze(str(run), replay=False)
    result = report.results[0]
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (BAD, "train/loss")
    (placed,) = result.run.alignments
    assert (placed.confidence, placed.offset, placed.stride) == ("inferred", 0, 5)
    assert placed.axis.kind == "record" and placed.agreement == 1.0
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == 65  # the first logging step at or past 61


def test_a_log_that_shares_no_metric_is_unaligned_and_never_first(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _events(run, range(70))
    lines = ["{'loss': nan, 'epoch': 0.1}" if k == 2 else "{'loss': 9.5, 'epoch': 0.1}"
             for k in range(1, 6)]
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = analyze(str(run), replay=False).results[0]
    assert result.incident is not None and result.incident.tag == "train/loss"
    assert result.incident.step == BAD
    (placed,) = result.run.alignments
    assert placed.confidence == "unaligned"
    (log_loss,) = [i for i in result.tag_incidents if i.tag == "loss"]
    assert not log_loss.aligned and log_loss.step == 2
    assert main(["analyze", str(run), "--no-replay", "--json", str(tmp_path / "r.json")]) == 1
    data = json.loads((tmp_path / "r.json").read_text())
    (shown,) = data["runs"][0]["alignments"]
    assert shown["confidence"] == "unaligned" and shown["axis"]["kind"] == "record"
    listed = {i["tag"]: i for i in data["runs"][0]["tag_incidents"]}
    assert listed["loss"]["aligned"] is False


def test_unaligned_incident_is_worded_in_its_sources_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run whose only source is a log of records: nothing to place them on.
    run = tmp_path / "run"
    run.mkdir()
    _hf_log(run, every=5)
    assert main(["analyze", str(run), "--no-replay"]) == 1
    out = capsys.readouterr().out
    assert "FIRST NON-FINITE  record 13  loss = nan" in out
    assert "steps: unaligned" in out


def test_a_constant_value_decides_no_placement(tmp_path: Path) -> None:
    # Only the learning rate is shared, and it is constant: any offset fits it.
    run = tmp_path / "run"
    _events(run)
    _hf_log(run, every=5, keys=("learning_rate",))
    (placed,) = read(str(run))[0].alignments
    assert placed.confidence == "unaligned"


def _step_log(run: Path, shift: int, every: int) -> None:
    lines = [f"step {step + shift} loss {_hf_value(_loss(step))}"
             for step in range(0, STEPS, every)]
    (run / "train.log").write_text("\n".join(lines) + "\n")


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(-3, 40), every=st.sampled_from([1, 2, 5]))
def test_shifting_a_logs_numbering_never_moves_the_first_global_step(
    tmp_path_factory: pytest.TempPathFactory, shift: int, every: int
) -> None:
    # A script counting from 1 (shift 1), or from an offset, or logging every few steps:
    # the run's first non-finite step is the event file's, and the log's NaN lands on it.
    run = tmp_path_factory.mktemp("run")
    _events(run)
    _step_log(run, shift, every)
    result = analyze(str(run), replay=False).results[0]
    assert result.incident is not None and result.incident.step == BAD
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned
    assert log_loss.step == next(s for s in range(0, STEPS, every) if s >= BAD)
    (placed,) = result.run.alignments
    assert placed.offset == -shift and placed.stride == 1


def test_best_placement_finds_offset_and_stride_and_refuses_ambiguity() -> None:
    ref_steps = np.arange(0, 200, dtype=np.int64)
    ref_values = np.sin(ref_steps / 7.0) + ref_steps / 50.0
    own = np.arange(1, 30, dtype=np.int64)
    values = np.round(np.interp(10 * own - 3, ref_steps, ref_values), 4)
    assert best_placement(own, values, ref_steps, ref_values)[:2] == (-3, 10)  # type: ignore[index]
    flat = np.full(200, 0.1)
    assert best_placement(own, np.full(29, 0.1), ref_steps, flat) is None
