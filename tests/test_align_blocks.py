"""One file, several numberings: each parser's lines on their own step axis.

A Trainer run under DeepSpeed prints, in one console log, the Trainer's dict lines (no
step: numbered by their order without a bar) and DeepSpeed's ``log_dist`` progress line
``step={global_steps + 1}, skipped={skipped_steps}, lr={lr}, mom={mom}`` (its engine
prints ``global_steps + 1`` before it counts the step, skipped steps included), and its
loss scaler's ``OVERFLOW! Rank 0 Skipping step.`` messages, which name no step. Beside it,
an event file written by torch's SummaryWriter at the loop's 0-based index.
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.tensorboard import SummaryWriter

from analyzer.model import GLOBAL
from analyzer.wording import alignment_words
from tests.aligning import only_result as _result

STEPS = 80
BAD = 61
"""The loop index (0-based) at which the loss goes NaN."""
EVERY = 5
OVERFLOW_AFTER = 50
"""The loop index whose DeepSpeed step line (step=51) the overflow message follows."""


def _loss(index: int) -> float:
    return float("nan") if index >= BAD else 2.0 * math.exp(-index / 40) + 0.01 * (index % 7)


def _lr(index: int) -> float:
    return 1e-5 * (index + 1)  # a warm-up: every step's rate tells it apart


def _events(run: Path) -> None:
    writer = SummaryWriter(str(run))
    for index in range(STEPS):
        writer.add_scalar("train/loss", _loss(index), index)
        writer.add_scalar("train/lr", _lr(index), index)
    writer.close()


def _hf(value: float) -> str:
    return "nan" if math.isnan(value) else repr(round(value, 4))


_DS = "[2024-05-14 08:12:05,870] [INFO] [logging.py:96:log_dist] [Rank 0] "
_OVERFLOW = ("[2024-05-14 08:12:06,311] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
             "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768")


def _mixed_log(run: Path, shift: int = 0) -> None:
    """Dict lines at the loop indices EVERY, 2 EVERY, ... (no bar: numbered by their
    order), each followed by DeepSpeed's progress line for that step, counted from 1
    (``shift`` added to it), and one overflow message after step OVERFLOW_AFTER."""
    lines = []
    for index in range(EVERY, STEPS, EVERY):
        lines.append(f"{{'loss': {_hf(_loss(index))}, 'learning_rate': {_lr(index)!r}, "
                     f"'epoch': {index / STEPS:.2f}}}")
        lines.append(f"{_DS}step={index + 1 + shift}, skipped=0, lr=[{_lr(index):.6e}], "
                     "mom=[(0.9, 0.999)]")
        if index == OVERFLOW_AFTER:
            lines.append(_OVERFLOW)
    (run / "train.log").write_text("\n".join(lines) + "\n")




def test_regression_deepspeed_lines_in_a_trainer_log_keep_their_own_numbers(
    tmp_path: Path,
) -> None:
    # One axis per file: the dict lines made the whole file "records", so DeepSpeed's
    # step=50 line was moved with them to step 250 and its overflow read "after record 10"
    # (placed at 250 too); the Trainer's lr and DeepSpeed's lr were one series.
    run = tmp_path / "run"
    _events(run)
    _mixed_log(run)
    result = _result(run)
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (BAD, "train/loss")
    records, steps = result.run.alignments
    assert (records.axis.kind, records.confidence, records.offset, records.stride) == (
        "record", "inferred", 0, EVERY)
    assert (steps.axis.kind, steps.axis.base, steps.axis.label) == ("counter", 1, "step")
    assert (steps.confidence, steps.offset, steps.stride) == ("exact", -1, 1)
    assert alignment_words(steps).startswith(
        "exact: step = step - 1, by DeepSpeed's step counter (from 1), which lr agrees with "
        "train/lr on")
    log = [s for s in result.run.series if s.source.endswith("train.log")]
    assert all(s.axis == GLOBAL for s in log)
    skipped = next(s for s in log if s.tag == "skipped")
    assert skipped.steps.tolist() == list(range(EVERY, STEPS, EVERY))
    lr = [s for s in log if s.tag == "lr"]
    assert len(lr) == 2 and all(s.steps.tolist() == list(range(EVERY, STEPS, EVERY))
                                for s in lr)
    (overflow,) = [e for e in result.run.events if e.kind == "overflow_skip"]
    assert overflow.axis == GLOBAL and overflow.detail["after_step"] == OVERFLOW_AFTER
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == 65  # the first logging step past BAD


def test_a_block_left_unaligned_does_not_take_the_files_other_lines_with_it(
    tmp_path: Path,
) -> None:
    # The dict lines share no value with the event file (no loss, a constant lr): their
    # records stay their own; DeepSpeed's lines are still on the global step.
    run = tmp_path / "run"
    writer = SummaryWriter(str(run))
    for index in range(STEPS):
        writer.add_scalar("train/lr", _lr(index), index)
        writer.add_scalar("train/loss", _loss(index), index)
    writer.close()
    lines = []
    for index in range(EVERY, STEPS, EVERY):
        accuracy = _hf(0.5 if index < 60 else math.nan)
        lines.append(f"{{'eval_accuracy': {accuracy}, 'epoch': {index / STEPS:.2f}}}")
        lines.append(f"{_DS}step={index + 1}, skipped=0, lr=[{_lr(index):.6e}], "
                     "mom=[(0.9, 0.999)]")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    by_kind = {a.axis.kind: a for a in result.run.alignments}
    assert by_kind["record"].confidence == "unaligned"
    assert (by_kind["counter"].confidence, by_kind["counter"].offset) == ("exact", -1)
    assert not result.run.is_aligned(by_kind["record"].source)  # not all its lines are
    assert result.incident is not None and result.incident.step == BAD
    accuracy = next(i for i in result.tag_incidents if i.tag == "eval_accuracy")
    assert not accuracy.aligned and accuracy.step == 12  # its 12th record
    # Only the placed lines count as the run's numbering.
    placed = {s.tag for s in result.run.global_series if s.source.endswith("train.log")}
    assert placed == {"skipped", "lr"}


@settings(max_examples=12, deadline=None)
@given(shift=st.integers(-3, 30))
def test_shifting_one_blocks_numbering_never_moves_the_first_global_step(
    tmp_path_factory: object, shift: int
) -> None:
    # DeepSpeed's counter shifted by a constant (a resumed engine, another base): its
    # values still place it, and neither it nor the record block moves the run's first
    # global step.
    run = tmp_path_factory.mktemp("run")  # type: ignore[attr-defined]
    _events(run)
    _mixed_log(run, shift)
    result = _result(run)
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (BAD, "train/loss")
    (overflow,) = [e for e in result.run.events if e.kind == "overflow_skip"]
    assert overflow.detail["after_step"] == OVERFLOW_AFTER
