"""Gradient accumulation: a log that counts batches beside an event file that counts
optimizer steps.

Lightning with ``accumulate_grad_batches=k`` steps the optimizer once every k batches; its
loggers write a ``training_step``'s values only on the batch that stepped, at the count of
optimizer steps taken (``_batches_that_stepped``), so the TQDM bar (``Epoch e: ..| i/n
[..., train_loss=...]``, ``batch_idx + 1`` over the epochs) shows a new value once every
k batches. The event file is written by torch's SummaryWriter at the optimizer step.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.tensorboard import SummaryWriter

from analyzer.wording import alignment_words
from tests.aligning import only_alignment as _placed
from tests.aligning import only_result as _result

K = 4
PER_EPOCH = 32
"""Batches per epoch: 8 optimizer steps."""
EPOCHS = 5
BAD = 29
"""The optimizer step (0-based) whose loss is the first NaN."""


def _loss(step: int) -> float:
    return float("nan") if step >= BAD else 3.0 * math.exp(-step / 12) + 0.017 * (step % 3)


def _events(run: Path) -> None:
    writer = SummaryWriter(str(run))
    for step in range(EPOCHS * PER_EPOCH // K):
        writer.add_scalar("train_loss", _loss(step), step)
    writer.close()


def _shown(value: float) -> str:
    return "nan.0" if math.isnan(value) else f"{value:.3f}"


def _bar_log(run: Path, k: int = K, sep: str = "\r") -> None:
    """The bar after each batch: batch b (from 1) shows the value logged when optimizer
    step b // k - 1 was taken (none before the first). tqdm redraws it with ``sep``
    ("\r"), of which the reader keeps each epoch's last state and the non-finite ones."""
    records = []
    for b in range(1, EPOCHS * PER_EPOCH + 1):
        epoch, i = divmod(b - 1, PER_EPOCH)
        step = b // k - 1
        post = "v_num=0" + (f", train_loss={_shown(_loss(step))}" if step >= 0 else "")
        pct = 100 * (i + 1) // PER_EPOCH
        records.append(f"Epoch {epoch}: {pct:3d}%|          | {i + 1}/{PER_EPOCH} "
                       f"[00:00<00:00, 21.27it/s, {post}]")
        if i + 1 == PER_EPOCH:
            records[-1] += "\n"
    (run / "train.log").write_text(sep.join(records) + "\n")




def test_regression_a_batch_count_is_divided_by_the_accumulation_found_by_the_values(
    tmp_path: Path,
) -> None:
    # Before: the bar's batch b was step b - 1 (integer strides only), four times the
    # optimizer step: the log's values were compared at the wrong steps and its NaN,
    # shown from batch 120, read as step 119.
    run = tmp_path / "run"
    _events(run)
    _bar_log(run)
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.label, placed.confidence, placed.offset, placed.divisor) == (
        "batch", "exact", 0, K)
    assert placed.to_global(4 * BAD + 3) == BAD  # the bar's count 4 * BAD + 4, from 0
    assert alignment_words(placed).startswith(
        f"exact: step = batch // {K}, by Lightning's batch counter (from 0), {K} batches "
        f"per optimizer step ({K} batches per step, found by the values), which train_loss "
        "agrees with train_loss on")
    assert result.incident is not None and result.incident.step == BAD
    log = next(s for s in result.run.series if s.source.endswith("train.log"))
    assert int(log.steps.max()) == EPOCHS * PER_EPOCH // K - 1


def test_accumulation_from_the_run_metadata_is_said(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _events(run)
    _bar_log(run)
    (run / "hparams.yaml").write_text(f"lr: 0.01\naccumulate_grad_batches: {K}\n")
    result = _result(run)
    placed = _placed(result)
    if result.run.metadata is None or result.run.metadata.gradient_accumulation_steps != K:
        # The run's metadata does not reach the aligner: the values still decide.
        assert placed.divisor == K
        return
    assert placed.divisor == K
    assert f"accumulate_grad_batches = {K} in hparams.yaml" in placed.method


def test_a_bar_without_accumulation_gets_no_divisor(tmp_path: Path) -> None:
    # Every batch steps: the bar's count is the step plus one, as before.
    run = tmp_path / "run"
    writer = SummaryWriter(str(run))
    for step in range(EPOCHS * PER_EPOCH):
        writer.add_scalar("train_loss", _loss(step // K), step)
    writer.close()
    _bar_log(run, k=1)
    placed = _placed(_result(run))
    assert placed.divisor == 1


def test_accumulation_from_a_lightning_checkpoint_loop_state(tmp_path: Path) -> None:
    # A Lightning checkpoint's fit loop counts the batches it completed, and global_step the
    # optimizer steps: 40 over 10 is 4 batches per step.
    import torch

    run = tmp_path / "run"
    _events(run)
    _bar_log(run)
    (run / "checkpoints").mkdir()
    torch.save({"epoch": 1, "global_step": 10, "pytorch-lightning_version": "2.6.6",
                "state_dict": {"layer.weight": torch.ones(2, 2)},
                "loops": {"fit_loop": {
                    "epoch_loop.batch_progress": {
                        "total": {"ready": 40, "started": 40, "processed": 40, "completed": 40},
                        "current": {"ready": 8, "started": 8, "processed": 8, "completed": 8}},
                    "epoch_loop.state_dict": {"_batches_that_stepped": 10}}}},
               run / "checkpoints" / "epoch=1-step=10.ckpt")
    result = _result(run)
    placed = _placed(result)
    assert placed.divisor == K
    scans = result.run.checkpoints.scans if result.run.checkpoints else ()
    if any(getattr(s, "meta", None) is not None and s.meta.counters for s in scans):
        assert "40 batches over global_step 10 in epoch=1-step=10.ckpt" in placed.method


@settings(max_examples=10, deadline=None)
@given(k=st.sampled_from([2, 3, 4, 8]))
def test_any_accumulation_factor_is_found_and_never_moves_the_first_global_step(
    tmp_path_factory: pytest.TempPathFactory, k: int
) -> None:
    run = tmp_path_factory.mktemp("run")
    steps = EPOCHS * PER_EPOCH // k
    writer = SummaryWriter(str(run))
    for step in range(steps):
        writer.add_scalar("train_loss", _loss(step), step)
    writer.close()
    _bar_log(run, k=k, sep="\n")  # one state per line: every batch's value is read
    result = _result(run)
    placed = _placed(result)
    assert (placed.divisor, placed.offset) == (k, 0)
    first = BAD if steps > BAD else None
    assert (result.incident.step if result.incident else None) == first


def test_regression_a_nan_tail_does_not_place_a_bar(tmp_path: Path) -> None:
    # Three batches per step, the bar kept only at each epoch's end and where it shows NaN:
    # its finite states fit no placement, yet its eight NaN states agreed with the event
    # file's NaN tail 44 steps lower, and the bar was placed there ("matching train_loss").
    run = tmp_path / "run"
    writer = SummaryWriter(str(run))
    for step in range(EPOCHS * PER_EPOCH // 3):
        writer.add_scalar("train_loss", _loss(step), step)
    writer.close()
    _bar_log(run, k=3)
    placed = _placed(_result(run))
    assert placed.confidence == "exact" and placed.offset == 0
