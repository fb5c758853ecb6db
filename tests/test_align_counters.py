"""The counters of fairseq, detectron2, timm and Keras' own TensorBoard callback, each
placed on the global step beside an event file written by torch's SummaryWriter.

Each log is in the framework's own format: fairseq's ``train_inner`` JSON progress line
(``num_updates`` counted only for applied updates, from 1, its TensorBoard at that
number) with its trainer's overflow note; detectron2's ``CommonMetricPrinter`` (``iter:``
the trainer's 0-based iteration, every ``period`` iterations, its TensorBoard writer at
the same iteration); timm's ``train.py`` (``Train: epoch [index/updates (pct%)]``, both
from 0); Keras 3's ``Progbar`` (from 1), beside a writer at the TensorBoard callback's
``_global_train_batch`` (incremented before each batch: from 1, its ``batch_`` tags).
"""

from __future__ import annotations

import json
from pathlib import Path

from analyzer.model import GLOBAL
from analyzer.wording import alignment_words
from tests.aligning import BAD, STEPS
from tests.aligning import loss as _loss
from tests.aligning import only_alignment as _placed
from tests.aligning import only_result as _result
from tests.aligning import write_events as _events


def _fairseq_line(updates: int, loss: float) -> str:
    stats = {"epoch": 1, "update": round(updates / 1000, 3), "loss": f"{loss:.3f}",
             "ppl": "9.1", "wps": "288.7", "ups": "0.02", "wpb": "16384", "bsz": "8",
             "num_updates": str(updates), "lr": "2e-05", "gnorm": "1.25", "loss_scale": "4",
             "train_wall": "57", "gb_free": "9.3", "wall": "161"}
    return "2021-03-08 12:31:36 | INFO | train_inner | " + json.dumps(stats)


def test_fairseq_num_updates_counts_applied_updates_from_one(tmp_path: Path) -> None:
    # fairseq's own TensorBoard writes at num_updates: the counter itself. An overflow
    # note between two updates (no step of its own) is placed after the last update.
    run = tmp_path / "run"
    _events(run, "loss", at=1)
    lines = []
    for i in range(STEPS):
        lines.append(_fairseq_line(i + 1, _loss(i)))
        if i == 20:
            lines.append("2021-03-08 12:33:12 | INFO | fairseq.trainer | NOTE: gradient "
                         "overflow detected, ignoring gradient, setting loss scale to: 2.0")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 1,
                                                                       "num_updates")
    assert not placed.axis.counts_skipped
    assert (placed.confidence, placed.offset, placed.stride) == ("exact", 0, 1)
    assert alignment_words(placed).startswith(
        "exact: step = num_updates, by fairseq's num_updates counter (from 1), as the event "
        "files count it")
    assert result.incident is not None and (result.incident.step, result.incident.tag) == (
        BAD + 1, "loss")
    (skip,) = [e for e in result.run.events if e.kind == "overflow_skip"]
    assert skip.axis == GLOBAL and skip.detail["after_step"] == 21


def test_fairseq_beside_a_zero_based_writer_is_one_lower(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _events(run, "train/loss", at=0)
    (run / "train.log").write_text(
        "\n".join(_fairseq_line(i + 1, _loss(i)) for i in range(STEPS)) + "\n")
    result = _result(run)
    assert (_placed(result).confidence, _placed(result).offset) == ("exact", -1)
    assert result.incident is not None and result.incident.step == BAD
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == BAD


def test_detectron2_iter_is_zero_based(tmp_path: Path) -> None:
    # CommonMetricPrinter every 5 iterations (iter 4, 9, ...); its TensorBoard writer at the
    # same iteration.
    run = tmp_path / "run"
    _events(run, "total_loss", at=0)
    lines = [f"[11/29 17:03:40 d2.utils.events]:  eta: 0:10:00  iter: {i}  total_loss: "
             f"{_loss(i):.3f}  loss_cls: 0.8  time: 0.5012  data_time: 0.0103  lr: 0.0002  "
             "max_mem: 1234M" for i in range(4, STEPS, 5)]
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 0, "iter")
    assert (placed.confidence, placed.offset, placed.stride) == ("exact", 0, 1)
    assert "detectron2's iter counter (from 0)" in placed.method
    assert result.incident is not None and result.incident.step == BAD
    (log,) = [s for s in result.run.series if s.source.endswith("train.log")
              and s.tag == "total_loss"]
    assert log.axis == GLOBAL and log.steps.tolist() == list(range(4, STEPS, 5))


def test_timm_epoch_and_index_count_from_zero(tmp_path: Path) -> None:
    per_epoch = 20
    run = tmp_path / "run"
    _events(run, "train/loss", at=0)
    lines = []
    for i in range(STEPS):
        epoch, index = divmod(i, per_epoch)
        lines.append(f"Train: {epoch} [{index:>4d}/{per_epoch} ({100 * index / per_epoch:>3.0f}%)]"
                     f"  Loss: {_loss(i):#.3g} ({_loss(i):#.3g})  Time: 0.312s, 3280.12/s  "
                     f"(0.320s, 3200.00/s)  LR: 1.000e-04  Data: 0.011 (0.020)")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.kind, placed.axis.base, placed.axis.label) == ("counter", 0, "update")
    assert (placed.confidence, placed.offset) == ("exact", 0)
    assert "timm's update counter (from 0)" in placed.method
    assert result.incident is not None and result.incident.step == BAD
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == BAD


def test_keras_bar_beside_its_own_tensorboard_callback_is_the_count_itself(
    tmp_path: Path,
) -> None:
    # The TensorBoard callback counts _global_train_batch from 1 (incremented in
    # on_train_batch_begin) and writes batch_loss there: the bar's own count.
    per_epoch = 25
    run = tmp_path / "run"
    _events(run, "batch_loss", at=1)
    bar = "━" * 20
    lines = []
    for i in range(STEPS):
        epoch, index = divmod(i, per_epoch)
        if index == 0:
            lines.append(f"Epoch {epoch + 1}/3")
        lines.append(f"{index + 1:4d}/{per_epoch} {bar} 1s 2ms/step - loss: {_loss(i):.4f}")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    result = _result(run)
    placed = _placed(result)
    assert (placed.axis.label, placed.confidence, placed.offset) == ("batch", "exact", 0)
    assert "as the event files count it" in placed.method
    assert result.incident is not None and result.incident.step == BAD + 1
    log_loss = next(i for i in result.tag_incidents if i.tag == "loss")
    assert log_loss.aligned and log_loss.step == BAD + 1
