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

from analyzer import align as align_module
from analyzer.align import AMBIGUOUS, best_placement
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
    # A line "step -1 ..." names no step the log reader takes: it is a record of its own
    # numbering, beside the numbered lines (the alignment with the most points, first).
    placed = result.run.alignments[0]
    assert placed.axis.kind == "global"
    assert placed.offset == -shift and placed.stride == 1


def test_best_placement_finds_offset_and_stride_and_refuses_ambiguity() -> None:
    ref_steps = np.arange(0, 200, dtype=np.int64)
    ref_values = np.sin(ref_steps / 7.0) + ref_steps / 50.0
    own = np.arange(1, 30, dtype=np.int64)
    values = np.round(np.interp(10 * own - 3, ref_steps, ref_values), 4)
    assert best_placement(own, values, ref_steps, ref_values)[:2] == (-3, 10)  # type: ignore[index]
    flat = np.full(200, 0.1)
    assert best_placement(own, np.full(29, 0.1), ref_steps, flat) == AMBIGUOUS


# -- found by review: a wrong placement, and unaligned numbers leaking into global ones ---


def _writer(run: Path, points: dict[str, list[tuple[int, float]]]) -> None:
    writer = SummaryWriter(str(run))
    for tag, values in points.items():
        for step, value in values:
            writer.add_scalar(tag, value, step)
    writer.close()


def _dict_lines(run: Path, records: list[dict[str, float]], name: str = "train.log") -> None:
    (run / name).write_text("".join(
        "{" + ", ".join(f"'{k}': {_hf_value(v)}" for k, v in r.items()) + ", 'epoch': 0.1}\n"
        for r in records))


def test_regression_a_log_overlapping_a_cut_event_file_less_is_not_placed_off(
    tmp_path: Path,
) -> None:
    # The event file lost its tail (steps 1..150); the log, started at a resume, prints
    # global steps 51..200. Placed where it overlaps most (record + 44), its NaN moved 6
    # steps early; a slowly moving loss must not make a near offset agree.
    run = tmp_path / "run"

    def loss(s: int) -> float:
        return 3.0 * math.exp(-s / 3000)

    _writer(run, {"train/loss": [(s, loss(s)) for s in range(1, 151)]})
    _dict_lines(run, [{"loss": loss(g) if g < 190 else math.nan} for g in range(51, 201)])
    result = analyze(str(run), replay=False).results[0]
    (placed,) = result.run.alignments
    assert (placed.confidence, placed.offset, placed.stride) == ("inferred", 50, 1)
    assert result.incident is not None and (result.incident.tag, result.incident.step) == (
        "loss", 190)


def test_regression_a_log_starting_late_is_placed_where_it_starts(tmp_path: Path) -> None:
    # A log from a resume at step 900 of a 1200-step event file: the log's first values
    # recur in the event file long before 900, so candidates from the first matches only
    # never tried the right offset, and the reason given was "no metric it shares".
    run = tmp_path / "run"
    noise = np.random.default_rng(0).uniform(-0.05, 0.05, 1200)

    def loss(s: int) -> float:
        return math.nan if s >= 1100 else 1.0 + float(noise[s])

    _writer(run, {"train/loss": [(s, loss(s)) for s in range(1200)]})
    _dict_lines(run, [{"loss": loss(g)} for g in range(901, 1200)])
    result = analyzer_result(run)
    (placed,) = result.run.alignments
    assert (placed.confidence, placed.offset) == ("inferred", 900)
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == 1100


def analyzer_result(run: Path):  # type: ignore[no-untyped-def]
    return analyze(str(run), replay=False).results[0]


def test_regression_an_unaligned_logs_scale_drops_are_no_global_skips(tmp_path: Path) -> None:
    # The unaligned log's loss scale halves between its records 30 and 31: those are not
    # global steps, and taking them as skips hid the event file's Inf gradient at step 30.
    run = tmp_path / "run"
    grad = [(s, 1.0 + 0.01 * s if s < 30 else math.inf if s == 30 else math.nan)
            for s in range(60)]
    _writer(run, {"grad_norm": grad})
    _dict_lines(run, [{"loss": 2.0 - 0.01 * r, "loss_scale": 65536.0 if r <= 30 else 32768.0}
                      for r in range(1, 41)])
    result = analyzer_result(run)
    assert result.run.alignments[0].confidence == "unaligned"
    assert result.overflow_skips == ()
    assert result.incident is not None
    assert (result.incident.tag, result.incident.step) == ("grad_norm", 30)


def test_regression_last_finite_step_comes_from_the_incidents_own_numbering(
    tmp_path: Path,
) -> None:
    # No event file: a script's log names its steps, a Trainer log beside it only records;
    # the stop line's last finite step was record 22 of the other log.
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("".join(f"step {s} loss {1.0 - s / 100:.4f}\n"
                                           for s in (0, 10, 20))
                                   + "Loss is inf at step 23, stopping training.\n")
    _dict_lines(run, [{"loss": 0.5 + r / 1000} for r in range(1, 41)], "hf.log")
    result = analyzer_result(run)
    assert result.incident is not None
    assert (result.incident.step, result.incident.last_finite_step) == (23, 20)


def test_regression_rules_read_no_unaligned_series_as_global_steps(tmp_path: Path) -> None:
    # The unaligned log's loss grows over its records 30..50; against the event file's NaN
    # gradient norm at step 60 the rules called it learning rate too high and loss spikes.
    run = tmp_path / "run"
    _writer(run, {"grad_norm": [(s, 1.0 + 0.01 * s if s < 60 else math.nan) for s in range(100)],
                  "lr": [(s, 1e-3) for s in range(100)]})

    def loss(r: int) -> float:
        return 2.0 - 0.01 * r if r < 30 else 2.0 * 1.5 ** (r - 30) if r <= 50 else math.nan

    _dict_lines(run, [{"loss": loss(r), "learning_rate": 1e-3} for r in range(1, 81)])
    result = analyzer_result(run)
    assert result.run.alignments[0].confidence == "unaligned"
    names = {f.name for f in result.findings}
    assert not names & {"learning-rate-too-high", "loss-spike", "exploding-gradients"}


def test_regression_an_unaligned_incident_is_worded_in_records_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    _writer(run, {"grad_norm": [(s, 1.0 + 0.01 * s) for s in range(100)],
                  "lr": [(s, 1e-3) for s in range(100)]})
    _dict_lines(run, [{"loss": 2.0 - 0.01 * r if r < 40 else math.nan, "learning_rate": 1e-3}
                      for r in range(1, 51)])
    assert main(["analyze", str(run), "--no-replay"]) == 1
    out = capsys.readouterr().out
    assert "FIRST NON-FINITE  record 40  loss = nan  (last finite record 39)" in out
    summary = out.splitlines()[-2]  # the table's one run, above the totals line
    assert summary.split()[2:6] == ["#40", "loss", "nan", "#39"], summary


def test_a_trainer_console_log_is_placed_by_trainer_state_json_without_event_files(
    tmp_path: Path,
) -> None:
    # A Trainer output folder without TensorBoard: trainer_state.json (written as the
    # Trainer writes it: indent 2, sorted keys, NaN as a bare token) numbers the global
    # steps, and the console's dict lines, which print none, are placed against it.
    run = tmp_path / "out"
    run.mkdir()
    history = [{"epoch": step / STEPS, "grad_norm": 1.25, "learning_rate": 5e-05,
                "loss": round(_loss(step), 4), "step": step} for step in range(5, STEPS, 5)]
    state = {"best_metric": None, "global_step": STEPS - 5, "log_history": history,
             "max_steps": STEPS, "num_train_epochs": 1}
    (run / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    _hf_log(run, every=5)
    result = analyze(str(run), replay=False).results[0]
    placed = {Path(a.source).name: a for a in result.run.alignments}
    console = placed["train.log"]
    assert (console.confidence, console.offset, console.stride) == ("inferred", 0, 5)
    assert "in trainer_state.json" in console.method
    assert placed["trainer_state.json"].confidence == "exact"
    log_loss = [i for i in result.tag_incidents if i.tag == "loss"]
    assert log_loss and all(i.aligned and i.step == 65 for i in log_loss)
    assert result.incident is not None and result.incident.step == 65


def test_trainer_records_are_placed_by_the_checkpoints_the_log_says_it_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the console: the Trainer logs every 5 steps and saves checkpoint-N right after
    # logging step N ("Saving model checkpoint to out/checkpoint-20", its own message), so
    # the records are numbered by the saves though no event file or state says the steps.
    run = tmp_path / "out"
    run.mkdir()
    lines = []
    for step in range(5, STEPS, 5):
        loss = _hf_value(_loss(step))
        lines.append(f"{{'loss': {loss}, 'learning_rate': 5e-05, 'epoch': {step / STEPS:.2f}}}")
        if step % 20 == 0:
            lines.append(f"[INFO|trainer.py:3705] 2024-06-20 17:40:11,514 >> Saving model "
                         f"checkpoint to {run}/checkpoint-{step}")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = analyze(str(run), replay=False).results[0]
    (placed,) = result.run.alignments
    assert (placed.confidence, placed.offset, placed.stride) == ("inferred", 0, 5)
    assert "checkpoint-20 after record 4" in placed.method
    assert result.incident is not None and result.incident.aligned
    assert result.incident.step == 65
    assert main(["analyze", str(run), "--no-replay"]) == 1
    assert "FIRST NON-FINITE  step 65  loss = nan" in capsys.readouterr().out


@settings(max_examples=60, deadline=None)
@given(
    ref=st.lists(st.sampled_from([0.5, 0.25, 1.0, -2.0, 1e300, 0.0, 1.00001, math.nan, math.inf,
                                  -math.inf, 3.14159]), min_size=1, max_size=60),
    mine=st.lists(st.sampled_from([0.5, 0.2500001, 1.0, math.nan, 3.1416, -2.0, 0.0, 7.0]),
                  min_size=1, max_size=20),
    atol=st.sampled_from([0.0, 5e-5, 0.5]),
)
def test_the_first_values_hits_are_the_steps_where_close_says_they_agree(
    ref: list[float], mine: list[float], atol: float
) -> None:
    # _hits works out _close's answer for one value against the whole reference in a few
    # passes; each value's reference steps must be those _close itself accepts.
    ref_values = np.array(ref)
    ref_steps = np.arange(ref_values.size, dtype=np.int64) * 3 + 7
    values = np.array(mine)
    for i, at in align_module._hits(values, ref_steps, ref_values, atol):
        with np.errstate(invalid="ignore"):
            want = ref_steps[align_module._close(np.full(ref_values.shape, values[i]),
                                                 ref_values, atol)]
        assert np.array_equal(at, want[: align_module._OFFSETS * 8])
