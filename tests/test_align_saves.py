"""Records placed by what a log says about saves and evaluations.

The Hugging Face Trainer's console, without a progress bar, prints a dict per logging
step and, after it at the same global step, an evaluation's dict (``eval_loss``,
``eval_runtime``, ... at every ``eval_steps``) and, at the end, ``train()``'s summary
(``train_runtime``, ``train_loss``). Lightning's ``ModelCheckpoint(verbose=True)`` prints
``Epoch e, global step N: 'val_loss' reached ... saving model to '...'`` after the batch
whose values its loggers wrote at step N - 1. Event files are written by torch's
SummaryWriter.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from analyzer.align import by_saves
from analyzer.model import Alignment, Event, Location, StepAxis
from tests.aligning import only_result as _result

STEPS = 80
BAD = 61
EVERY = 5


def _loss(step: int) -> float:
    return float("nan") if step >= BAD else 2.0 * math.exp(-step / 40) + 0.01 * (step % 7)


def _hf(value: float) -> str:
    return "nan" if math.isnan(value) else repr(round(value, 4))




def test_regression_evaluation_dicts_between_training_dicts_keep_the_stride(
    tmp_path: Path,
) -> None:
    # Each evaluation took a record number of its own, so the training records were at
    # 5, 10, 15, 20, 30, ... (every fifth one skipping a place): no stride fit, and the
    # log was left unaligned.
    run = tmp_path / "run"
    writer = SummaryWriter(str(run))
    for step in range(STEPS):
        writer.add_scalar("train/loss", _loss(step), step)
    for step in range(20, STEPS, 20):
        writer.add_scalar("eval/loss", 1.5 - step / 100, step)
    writer.close()
    lines = []
    for step in range(EVERY, STEPS, EVERY):
        epoch = f"'epoch': {step / STEPS:.2f}"
        lines.append(f"{{'loss': {_hf(_loss(step))}, 'grad_norm': 1.25, 'learning_rate': "
                     f"5e-05, {epoch}}}")
        if step % 20 == 0:
            lines.append(f"{{'eval_loss': {round(1.5 - step / 100, 4)!r}, 'eval_runtime': "
                         f"0.41, 'eval_samples_per_second': 97.5, 'eval_steps_per_second': "
                         f"12.2, {epoch}}}")
    lines.append("{'train_runtime': 12.5, 'train_samples_per_second': 51.2, "
                 "'train_steps_per_second': 6.4, 'train_loss': 1.3, 'epoch': 1.0}")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    (placed,) = result.run.alignments
    assert (placed.axis.kind, placed.confidence, placed.offset, placed.stride) == (
        "record", "inferred", 0, EVERY)
    evals = next(s for s in result.run.series if s.tag == "eval_loss")
    assert evals.steps.tolist() == list(range(20, STEPS, 20))
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == 65
    assert result.incident is not None and result.incident.step == BAD


def test_lightning_saves_pair_the_batch_before_with_the_step_its_values_were_logged_at(
) -> None:
    # ModelCheckpoint's "global step 16" comes after bar count 16, whose values the loggers
    # wrote at step 15: two such saves place the records at count - 1.
    def save(after: int, step: int) -> Event:
        return Event("checkpoint_save", None, Location("train.log", line=after), "saving",
                     {"after_step": after, "global_step": step, "last_logged_step": step - 1})

    unplaced = Alignment("train.log", StepAxis("epoch", base=1, label="batch"), "unaligned",
                         "no value")
    placed = by_saves(unplaced, [save(16, 16), save(32, 32), save(48, 48)])
    assert placed is not None
    assert (placed.confidence, placed.offset, placed.stride) == ("inferred", -1, 1)
    assert placed.method == ("the checkpoints it saved (global step 16 after batch 16, global "
                             "step 32 after batch 32, global step 48 after batch 48)")
