"""Each framework's step numbering, declared by its parser and placed by the align stage.

Every log is written in the framework's own format, with the format strings of its
source: Megatron-LM's ``training_log`` (`` iteration {:8d}/{:8d} |``, ``{:.6E}`` for a
loss, incremented before printing), nanoGPT's ``train.py`` (``iter {iter_num}: loss
{lossf:.4f}, ...``, from 0), mmengine's ``LogProcessor`` (``Epoch(train) [e][i/n]`` and
``Iter(train) [i/N]``, ``runner.iter + 1``), Lightning's ``TQDMProgressBar`` (``Epoch e:
..| i/n [...]``, ``batch_idx + 1``), Keras 3's ``Progbar`` (``i/n ━━━ ... - loss: ...``,
from 1) and ``TerminateOnNaN`` (``Batch N: Invalid loss``, 0-based), and the Trainer's
``trainer_state.json`` (``log_history[].step``, its ``global_step``). Beside each, an event
file written by torch's SummaryWriter at the step that framework's TensorBoard logging
uses (Megatron at ``iteration``, mmengine at ``iter + 1``, Lightning at ``global_step``,
the Trainer at ``global_step``) or at a script's 0-based loop index.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.tensorboard import SummaryWriter

from analyzer.model import RunResult
from analyzer.wording import alignment_words
from tests.aligning import BAD, STEPS
from tests.aligning import loss as _loss
from tests.aligning import only_alignment as _placed
from tests.aligning import only_result as _result
from tests.aligning import write_events as _events


def _log_incident_step(result: RunResult, tag: str) -> int | None:
    found = next(i for i in result.tag_incidents if i.tag == tag)
    assert found.aligned
    return found.step


def _megatron_line(iteration: int, loss: float, total: int = STEPS) -> str:
    # Megatron leaves a NaN loss out of the line and counts it instead.
    nan = 1 if math.isnan(loss) else 0
    body = "" if nan else f" lm loss: {loss:.6E} |"
    return (f" iteration {iteration:8d}/{total:8d} | consumed samples: {iteration * 32:12d} |"
            f" elapsed time per iteration (ms): 81.2 | learning rate: 2.500000E-04 |"
            f" global batch size:    32 |{body} loss scale: 1.0 | grad norm: 1.234 |"
            f" number of skipped iterations:   0 | number of nan iterations: {nan:3d} |")


def _megatron_log(run: Path) -> None:
    # `iteration += 1` comes before training_log: loop index i prints iteration i + 1.
    lines = [_megatron_line(i + 1, _loss(i)) for i in range(STEPS)]
    (run / "train.log").write_text("training ...\n" + "\n".join(lines) + "\n")


def test_megatron_iteration_beside_its_own_tensorboard_is_the_step_itself(tmp_path: Path) -> None:
    # Megatron's writer.add_scalar('lm loss', ..., iteration): the counter as it prints it.
    run = tmp_path / "run"
    _events(run, "lm loss", at=1)
    _megatron_log(run)
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 1, "iteration")
    assert placed.axis.counts_skipped
    assert (placed.confidence, placed.offset, placed.stride) == ("exact", 0, 1)
    assert result.incident is not None and result.incident.step == BAD + 1
    assert alignment_words(placed).startswith(
        "exact: step = iteration, by Megatron's iteration counter (from 1), as the event "
        "files count it, which lm loss agrees with lm loss on")


def test_megatron_iteration_beside_a_zero_based_writer_is_one_lower(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _events(run, "train/loss", at=0)
    _megatron_log(run)
    result = _result(run)
    placed = _placed(result)
    assert (placed.confidence, placed.offset) == ("exact", -1)
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (BAD, "train/loss")
    # The NaN iteration BAD + 1 (counted, its loss left out) is global step BAD.
    assert _log_incident_step(result, "lm loss") == BAD
    assert alignment_words(placed) == (
        f"exact: step = iteration - 1, by Megatron's iteration counter (from 1), which lm loss "
        f"agrees with train/loss on ({BAD} of {BAD} agree)")


def test_megatron_iteration_alone_is_reported_as_printed(tmp_path: Path) -> None:
    # No event file: nothing else counts the run's steps, so the console's iteration is it.
    run = tmp_path / "run"
    run.mkdir()
    _megatron_log(run)
    result = _result(run)
    placed = _placed(result)
    assert (placed.confidence, placed.offset) == ("exact", 0)
    assert alignment_words(placed) == (
        "exact: step = iteration, by Megatron's iteration counter (from 1), as printed: no "
        "event file to count from")
    assert _log_incident_step(result, "lm loss") == BAD + 1


def test_nanogpt_iter_is_zero_based(tmp_path: Path) -> None:
    # train.py: print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu ...")
    run = tmp_path / "run"
    _events(run, "train/loss", at=0)
    lines = [f"iter {i}: loss {_loss(i):.4f}, time 35.12ms, mfu 12.34%" for i in range(STEPS)]
    lines.insert(0, "step 0: train loss 3.0000, val loss 3.0100")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 0, "iter")
    assert (placed.confidence, placed.offset) == ("exact", 0)
    assert _log_incident_step(result, "loss") == BAD
    assert alignment_words(placed).startswith(
        "exact: step = iter, by nanoGPT's iter counter (from 0), which loss agrees with "
        "train/loss on")


def _mmengine_line(i: int, head: str) -> str:
    loss = _loss(i)
    shown = "nan" if math.isnan(loss) else f"{loss:.4f}"
    return (f"11/29 17:49:28 - mmengine - INFO - {head}  lr: 1.0000e-02  eta: 0:00:03  "
            f"time: 0.0190  data_time: 0.0040  memory: 120  loss: {shown}")


@pytest.mark.parametrize("by_epoch", [True, False])
def test_mmengine_counts_from_one_as_its_visualizer_writes(tmp_path: Path, by_epoch: bool) -> None:
    # LoggerHook: runner.visualizer.add_scalars(tag, step=runner.iter + 1); LogProcessor
    # prints Epoch(train) [runner.epoch + 1][batch_idx + 1/len] or Iter(train) [iter + 1/N].
    per_epoch = 20
    run = tmp_path / "run"
    _events(run, "loss", at=1)
    lines = []
    for i in range(STEPS):
        epoch, batch = divmod(i, per_epoch)
        head = (f"Epoch(train)  [{epoch + 1}][{batch + 1:2d}/{per_epoch}]" if by_epoch
                else f"Iter(train) [{i + 1:3d}/{STEPS}]")
        lines.append(_mmengine_line(i, head))
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 1, "iter")
    assert (placed.confidence, placed.offset) == ("exact", 0)
    assert result.incident is not None and result.incident.step == BAD + 1
    assert _log_incident_step(result, "loss") == BAD + 1
    assert "mmengine's iter counter (from 1), as the event files count it" in placed.method


def test_lightning_bar_counts_from_one_and_global_step_from_zero(tmp_path: Path) -> None:
    # TQDMProgressBar: n = batch_idx + 1 after each batch; self.log in training_step goes to
    # the logger at global_step, 0 for the first batch.
    per_epoch = 16
    run = tmp_path / "run"
    _events(run, "train_loss", at=0)
    parts = []
    for i in range(STEPS):
        epoch, index = divmod(i, per_epoch)
        done = index + 1
        loss = _loss(i)
        shown = "nan" if math.isnan(loss) else f"{loss:.3f}"
        bar = "█" * (10 * done // per_epoch)
        parts.append(f"\rEpoch {epoch}: {100 * done // per_epoch:3d}%|{bar:10s}| {done}/"
                     f"{per_epoch} [00:00<00:00, 36.50it/s, v_num=0, train_loss={shown}]")
        if done == per_epoch:
            parts.append("\n")
    (run / "train.log").write_text("".join(parts) + "\n")
    result = _result(run)
    placed = _placed(result)
    # The parser reads the bar's count as the batches done before it (from 0).
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 0, "batch")
    assert (placed.confidence, placed.offset) == ("exact", 0)
    assert result.incident is not None and result.incident.step == BAD
    assert _log_incident_step(result, "train_loss") == BAD
    assert alignment_words(placed).startswith(
        "exact: step = batch, by Lightning's batch counter (from 0)")


def test_lightning_bar_of_unknown_length_is_placed_by_its_values_only(tmp_path: Path) -> None:
    # An iterable dataset under RichProgressBar: `i/?`, the batch within its epoch only.
    run = tmp_path / "run"
    _events(run, "train_loss", at=0, steps=range(12))
    lines = [f"Epoch 0/2  {'━' * 20} {i + 1}/? 0:00:12 • -:--:-- 3.21it/s v_num: 0 "
             f"train_loss: {_loss(i):.3f}" for i in range(12)]
    (run / "train.log").write_text("\n".join(lines) + "\n")
    placed = _placed(_result(run))
    assert placed.axis.kind == "epoch"
    assert (placed.confidence, placed.offset, placed.stride) == ("inferred", -1, 1)
    assert placed.method == "matching train_loss with the event files' train_loss"


def test_keras_batch_is_zero_based_against_its_one_based_bar(tmp_path: Path) -> None:
    # Progbar counts batches from 1 (update(batch + 1)); TerminateOnNaN prints the callback's
    # 0-based batch. The event file is a SummaryWriter at a 0-based global batch.
    per_epoch = 25
    run = tmp_path / "run"
    _events(run, "train/loss", at=0, steps=range(BAD + 1))
    bar = "━" * 20
    lines = []
    for i in range(BAD):
        epoch, index = divmod(i, per_epoch)
        if index == 0:
            lines.append(f"Epoch {epoch + 1}/3")
        lines.append(f"{index + 1:4d}/{per_epoch} {bar} 1s 2ms/step - loss: {_loss(i):.4f}")
    epoch, index = divmod(BAD, per_epoch)
    lines.append(f"Batch {index}: Invalid loss, terminating training")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 1, "batch")
    assert (placed.confidence, placed.offset) == ("exact", -1)
    event = next(e for e in result.run.events if e.kind == "nonfinite")
    assert event.step == BAD and event.detail["batch"] == index
    assert result.incident is not None and result.incident.step == BAD
    assert "Keras' batch counter (from 1)" in placed.method


def test_trainer_state_step_is_the_global_step(tmp_path: Path) -> None:
    # The Trainer logs at global_step (optimizer steps so far, from 1) in log_history and
    # its TensorBoardCallback writes at the same global_step.
    every = 5
    run = tmp_path / "run"
    run.mkdir()
    writer = SummaryWriter(str(run))
    history = []
    for step in range(every, STEPS, every):
        loss = round(_loss(step - 1), 4)
        writer.add_scalar("train/loss", loss, step)
        history.append({"epoch": round(step / STEPS, 2), "grad_norm": 1.5,
                         "learning_rate": 5e-05, "loss": loss, "step": step})
    writer.close()
    state = {"best_metric": None, "epoch": 1.0, "global_step": STEPS, "log_history": history,
             "logging_steps": every, "max_steps": STEPS, "num_train_epochs": 1}
    (run / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.label) == ("global", "global_step")
    assert (placed.confidence, placed.offset, placed.stride) == ("exact", 0, 1)
    first_nan = next(s for s in range(every, STEPS, every) if s - 1 >= BAD)
    assert result.incident is not None and result.incident.step == first_nan
    assert _log_incident_step(result, "loss") == first_nan
    assert alignment_words(placed).startswith(
        "exact: by the Trainer's global_step, which loss agrees with train/loss on")


def test_regression_a_stop_line_naming_a_global_step_in_a_lightning_log_is_not_moved(
    tmp_path: Path,
) -> None:
    # The script's own check prints `Loss is nan at step {global_step}`: a global step, not
    # the bar's batch count, so placing the bar one lower must leave it where it is (it was
    # moved to BAD - 1, ahead of the event file's first NaN).
    per_epoch = 50
    run = tmp_path / "run"
    _events(run, "train_loss", at=0, steps=range(BAD + 1))
    parts = [f"\rEpoch 0:   8%|          | {i + 1}/{per_epoch} [00:00<00:00, 86.55it/s, "
             f"v_num=0, train_loss={_loss(i):.3f}]" for i in range(BAD)]
    (run / "train.log").write_text(
        "".join(parts) + f"\nLoss is nan at step {BAD}, stopping training.\n")
    result = _result(run)
    assert _placed(result).offset == 0
    (stop,) = [e for e in result.run.events if e.kind == "nonfinite"]
    assert stop.step == BAD and stop.detail["step_axis"] == "global"
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (BAD, "train_loss")
    assert result.incident.origin != "log"


def _hf_header(epochs: int, max_steps: int, per_epoch: int | None = None) -> list[str]:
    # Trainer._inner_training_loop's logger.info lines (the log level set to INFO).
    lines = ["***** Running training *****", "  Num examples = 1,920",
             f"  Num Epochs = {epochs:,}"]
    if per_epoch is not None:
        lines.append(f"  Num update steps per epoch = {per_epoch:,}")
    lines += ["  Instantaneous batch size per device = 32",
              "  Total train batch size (w. parallel, distributed & accumulation) = 32",
              "  Gradient Accumulation steps = 1", f"  Total optimization steps = {max_steps:,}"]
    return lines


def _hf_printer_log(run: Path, every: int, per_epoch: int, rounded: bool = False,
                    header: list[str] | None = None) -> None:
    """PrinterCallback (disable_tqdm=True): print(logs), the epoch as state.epoch holds it
    (epoch + (batch + 1) / batches), and no bar; the global step is never printed."""
    lines = list(header if header is not None else _hf_header(1, STEPS))
    for step in range(every, STEPS, every):
        loss = _loss(step - 1)
        epoch = step / per_epoch
        shown = "nan" if math.isnan(loss) else repr(round(loss, 4))
        lines.append(f"{{'loss': {shown}, 'grad_norm': 1.25, 'learning_rate': 5e-05, "
                     f"'epoch': {round(epoch, 2) if rounded else epoch!r}}}")
    (run / "train.log").write_text("\n".join(lines) + "\n")


def _hf_events(run: Path, every: int) -> None:
    # TensorBoardCallback.on_log: add_scalar("train/" + k, v, state.global_step), for
    # the loss at every logging step; the global step is the one the loss was logged at.
    writer = SummaryWriter(str(run))
    for step in range(every, STEPS, every):
        writer.add_scalar("train/loss", round(_loss(step - 1), 4), step)
        writer.add_scalar("train/epoch", step / STEPS, step)
    writer.close()


def test_hf_epoch_fractions_place_the_records_by_steps_per_epoch(tmp_path: Path) -> None:
    every = 5
    run = tmp_path / "run"
    _hf_events(run, every)
    _hf_printer_log(run, every, per_epoch=STEPS // 3, header=_hf_header(3, STEPS))
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.label) == ("global", "epoch x steps per epoch")
    assert (placed.confidence, placed.offset, placed.stride) == ("exact", 0, 1)
    first_nan = next(s for s in range(every, STEPS, every) if s - 1 >= BAD)
    assert _log_incident_step(result, "loss") == first_nan
    assert alignment_words(placed).startswith(
        "exact: by the Trainer's epoch x steps per epoch, which loss agrees with train/loss on")
    (log,) = result.run.logs
    assert any("epoch x 20 steps per epoch (from its 'Total optimization steps = 60' over "
               "'Num Epochs = 3')" in note for note in log.notes)


def test_hf_epoch_fractions_without_an_event_file_name_global_steps(tmp_path: Path) -> None:
    # The header prints the steps per epoch itself (newer releases): a log alone is placed.
    every = 4
    run = tmp_path / "run"
    run.mkdir()
    _hf_printer_log(run, every, per_epoch=12, header=_hf_header(5, STEPS, per_epoch=12))
    result = _result(run)
    assert _placed(result).confidence == "exact"
    assert result.incident is not None and result.incident.aligned
    assert result.incident.step == next(s for s in range(every, STEPS, every) if s - 1 >= BAD)


def test_hf_epoch_rounded_too_coarsely_leaves_the_records_to_the_values(
    tmp_path: Path,
) -> None:
    # The bar on stderr, the tqdm callback's round(epoch, 2) on stdout: of a 300-step
    # epoch 0.02 is any of steps 5..7. The record order stands and the values place it.
    every = 5
    run = tmp_path / "run"
    _hf_events(run, every)
    _hf_printer_log(run, every, per_epoch=300, rounded=True, header=_hf_header(1, 300))
    placed = _placed(_result(run))
    assert placed.axis.kind == "record"
    assert (placed.confidence, placed.offset, placed.stride) == ("inferred", 0, every)


def test_hf_epoch_rounded_to_two_places_still_names_the_step_of_a_short_epoch(
    tmp_path: Path,
) -> None:
    # Of a 60-step epoch, round(epoch, 2) is within 0.3 of a step: 0.07 x 60 = 4.2 is step 4.
    every = 4
    run = tmp_path / "run"
    run.mkdir()
    _hf_printer_log(run, every, per_epoch=STEPS, rounded=True)
    result = _result(run)
    assert _placed(result).axis.label == "epoch x steps per epoch"
    steps = next(s for s in result.run.series if s.tag == "loss").steps
    assert steps.tolist() == list(range(every, STEPS, every))


def test_hf_epochs_not_dividing_the_total_give_no_steps_per_epoch(tmp_path: Path) -> None:
    # max_steps=60 over 7 epochs: max_steps was set, the last epoch is cut short.
    run = tmp_path / "run"
    run.mkdir()
    _hf_printer_log(run, 5, per_epoch=9, header=_hf_header(7, STEPS))
    assert _placed(_result(run)).axis.kind == "record"


def _counter_log(run: Path, framework: str) -> None:
    """Loop index i as each framework prints it: Megatron's iteration i + 1, mmengine's
    Iter [i + 1/N], nanoGPT's iter i."""
    if framework == "megatron":
        _megatron_log(run)
        return
    if framework == "mmengine":
        lines = [_mmengine_line(i, f"Iter(train) [{i + 1:3d}/{STEPS}]") for i in range(STEPS)]
    else:
        lines = [f"iter {i}: loss {_loss(i):.4f}, time 35.12ms, mfu 12.34%" for i in range(STEPS)]
    (run / "train.log").write_text("\n".join(lines) + "\n")


@settings(max_examples=15, deadline=None)
@given(framework=st.sampled_from(["megatron", "mmengine", "nanogpt"]), at=st.integers(-2, 6))
def test_a_writer_counting_from_anywhere_never_moves_the_first_global_step(
    tmp_path_factory: pytest.TempPathFactory, framework: str, at: int
) -> None:
    # The event file counts loop index i as i + at (a 0-based script, a 1-based framework,
    # a resumed run...); the log counts it its own way. The run's first step is the event
    # file's, and the log's NaN lands on that same global step.
    run = tmp_path_factory.mktemp("run")
    _events(run, "loss", at=at)
    _counter_log(run, framework)
    result = _result(run)
    assert result.incident is not None and result.incident.step == BAD + at
    assert result.incident.origin != "log"
    placed = _placed(result)
    assert placed.aligned and placed.stride == 1
    assert placed.confidence == ("exact" if placed.offset in (0, -placed.axis.base) else "inferred")
    tag = "lm loss" if framework == "megatron" else "loss"
    assert _log_incident_step(result, tag) == BAD + at
