"""Logs the real frameworks wrote (tests/frameworks/), read as a user's run gives them:
the console alone, without the event files beside it, on the global step those files
count; the frames, skip lines and error files each framework prints read for what they
are."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from analyzer.api import analyze
from analyzer.ingest.logs import is_log_file, read_log
from analyzer.model import Event, Location
from analyzer.onset import event_incident
from tests.frameworks import corpus
from tests.frameworks.truth import first_nonfinite, scalars
from tests.test_frameworks import console_only

pytestmark = pytest.mark.slow


def _nonfinite_at(run: Path, step: int) -> set[str]:
    """The kinds of non-finite values the run's event files hold at ``step``."""
    return {"nan" if math.isnan(v) else ("+inf" if v > 0 else "-inf")
            for points in scalars(run).values() for s, v in points
            if s == step and not math.isfinite(v)}


@pytest.mark.parametrize("name", ["lightning_nan", "lightning_restart"])
def test_regression_a_lightning_console_alone_is_on_the_global_step(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The bar's ``Epoch e: b/n`` was read as step e * n + b, one above the global_step
    Lightning's loggers write the batch's values at (26 for 25, 40 for 39)."""
    run = corpus.get(name, tmp_path_factory)
    code, report = console_only(name, tmp_path_factory)
    [got] = report["runs"]
    incident = got["incident"]
    assert code == 1
    # The console's first NaN/Inf frame is a step the event files hold non-finite too.
    assert incident["kind"] in _nonfinite_at(run, incident["step"])
    if name == "lightning_nan":  # TQDM draws every count: its first Inf is TB's
        truth = first_nonfinite(run)
        assert truth is not None and incident["step"] == truth.step == 25
    else:  # rich draws once, at the end of each fit: 4 * 8 + 8 - 1
        assert incident["step"] == 39


def test_regression_the_anomaly_console_alone_fails_after_the_last_logged_step(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The bar's ``5/8`` is global step 4 (TB holds train_loss at 0..4): the anomaly in
    step 5's backward is "after step 4", not "after step 5"."""
    run = corpus.get("lightning_anomaly", tmp_path_factory)
    logged = max(s for points in scalars(run).values() for s, _ in points)
    _, report = console_only("lightning_anomaly", tmp_path_factory)
    [got] = report["runs"]
    assert (got["incident"]["step"], got["incident"]["after"]) == (logged, True) == (4, True)


def test_regression_the_tqdm_reset_frame_is_no_step(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """TQDM's ``reset`` redraws ``Epoch e: 0/8 [..., train_loss=<last step's>]`` at each
    epoch start, first still under the previous epoch's description: that frame was read
    at e * 8 - 1, which for epoch 0 is step -1 (NF202's evidence read "from step -1")."""
    log = corpus.get("lightning_nan", tmp_path_factory) / "train.log"
    text = log.read_text(encoding="utf-8")
    assert "Epoch 0:   0%|          | 0/8 [00:00<?, ?it/s, v_num=0, train_loss=1.36e+11]" in text
    read = read_log(str(log))
    (loss,) = [s for s in read.series if s.tag == "train_loss"]
    assert int(loss.steps.min()) >= 0
    # One value per step: a count's two frames (the refresh, then set_postfix) are one.
    assert np.all(np.diff(loss.steps) > 0)
    truth = scalars(corpus.get("lightning_nan", tmp_path_factory))
    events = dict(next(points for key, points in truth.items() if key.endswith(":train_loss")))
    for step, value in zip(loss.steps.tolist(), loss.values.tolist(), strict=True):
        tb = events[step]
        assert (math.isnan(value) and math.isnan(tb)) or value == pytest.approx(tb, rel=0.01)


def test_regression_a_bar_at_count_zero_gives_no_point(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "Epoch 0: 100%|##########| 8/8 [00:00<00:00, 99.49it/s, v_num=0, train_loss=1.36e+11] \n"
        "Epoch 0:   0%|          | 0/8 [00:00<?, ?it/s, v_num=0, train_loss=1.36e+11]        \n"
        "Epoch 1:   0%|          | 0/8 [00:00<?, ?it/s, v_num=0, train_loss=1.36e+11]\n"
        "Epoch 1:  12%|#3        | 1/8 [00:00<00:00, 446.39it/s, v_num=0, train_loss=1.36e+11]\n"
        "Epoch 1:  12%|#3        | 1/8 [00:00<00:00, 415.36it/s, v_num=0, train_loss=nan.0]\n",
        encoding="utf-8")
    read = read_log(str(log))
    (loss,) = read.series
    assert loss.steps.tolist() == [7, 8]
    assert loss.values[0] == 1.36e11 and math.isnan(loss.values[1])
    assert loss.positions.tolist() == [1, 5]
    assert read.framework == "lightning"


def test_regression_a_skip_line_before_its_step_line_clears_that_step(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """amp_benign's loop prints ``gradient overflow, skipping step, loss scale X -> Y``
    before ``step N loss ... grad_norm nan scale Y``: the skip was put after the step
    before it, so the seven skipped steps' NaN grad norms made the console alone FAILED."""
    code, report = console_only("amp_benign", tmp_path_factory)
    [got] = report["runs"]
    assert code == 0
    assert got["incident"] is None and got["status"] == "finite"
    assert got["overflow_skips"] == list(range(7))
    truth = scalars(corpus.get("amp_benign", tmp_path_factory))
    bad = sorted(s for s, v in truth["tb:train/grad_norm"] if not math.isfinite(v))
    assert got["overflow_skips"] == bad


@pytest.mark.parametrize("order", ["before", "after"])
def test_skip_lines_go_to_the_step_whose_gradient_overflowed(tmp_path: Path, order: str) -> None:
    lines = []
    for step in range(6):
        skipped = step in (1, 2)
        metric = f"step {step} loss 1.5 grad_norm {'inf' if skipped else '0.5'} scale 1024"
        skip = "gradient overflow, skipping step, loss scale 2048 -> 1024"
        lines += ([skip, metric] if order == "before" else [metric, skip]) if skipped else [metric]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    skips = [e for e in read_log(str(log)).events if e.kind == "overflow_skip"]
    assert [e.step for e in skips] == [1, 2]
    side = "after" if order == "before" else "before"  # the step line is on the other side
    assert all(f"step {side} it" in str(e.detail["placed_by"]) for e in skips)


def test_skip_lines_without_gradients_beside_them_stay_after_the_step_before(
        tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 0 loss 1.5\ngradient overflow, skipping step, loss scale 4 -> 2\n"
                   "step 1 loss 1.4\n", encoding="utf-8")
    (skip,) = [e for e in read_log(str(log)).events if e.kind == "overflow_skip"]
    assert skip.step is None and skip.detail["after_step"] == 0


def test_regression_an_event_incident_keeps_its_rank() -> None:
    """Series incidents named their rank, incidents made from a line did not."""
    event = Event("nonfinite", 5, Location("train.log", line=14),
                  "FloatingPointError: rank 1: loss is nan at step 5",
                  {"tag": "loss", "kind": "nan", "rank": 1})
    incident = event_incident(event)
    assert incident is not None and incident.rank == 1


def test_regression_the_ddp_console_names_rank_1_in_its_event_incidents(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """torchrun's console: rank 1's ``FloatingPointError: ... loss is nan at step 5`` (its
    traceback and the agent's table) are incidents of rank 1."""
    folder = tmp_path_factory.mktemp("ddp_console")
    shutil.copy(corpus.get("ddp_gloo", tmp_path_factory) / "train.log", folder / "train.log")
    (result,) = analyze(str(folder), replay=False).results
    from_events = [event_incident(e) for e in result.run.events if e.kind == "nonfinite"]
    ranks = {i.rank for i in from_events if i is not None}
    assert ranks == {1}


def test_regression_tokenizer_files_are_not_logs(tmp_path: Path) -> None:
    """A tokenizer saved beside a Hugging Face model (WordPiece's vocab.txt, BPE's
    merges.txt, as ``tokenizers`` writes them) was read as a text log."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = ["step 5 loss nan grad_norm inf", "step 6 loss 0.5 grad_norm 1.5"] * 20
    out = tmp_path / "output"
    out.mkdir()
    (out / "train.log").write_text("step 0 loss 1.5\nstep 1 loss nan\n", encoding="utf-8")
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]").save_pretrained(str(out))
    bpe.model.save(str(out))
    bpe.model.save(str(out), "gpt")
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=60, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]))
    wordpiece.model.save(str(out))
    written = sorted(p.name for p in out.iterdir())
    assert {"merges.txt", "vocab.txt", "gpt-merges.txt", "tokenizer.json"} <= set(written)
    assert [n for n in written if is_log_file(str(out / n))] == ["train.log"]
    (result,) = analyze(str(out), replay=False).results
    assert [log.path for log in result.run.logs] == [str(out / "train.log")]
    assert result.incident is not None and result.incident.step == 1


def test_skip_lines_between_steps_printed_apart_stay_after_the_step_before(
        tmp_path: Path) -> None:
    # Steps printed every 10: the skip line says nothing of which of the 9 between it was.
    log = tmp_path / "train.log"
    log.write_text("step 10 loss 1.5 grad_norm 0.5\n"
                   "gradient overflow, skipping step, loss scale 4 -> 2\n"
                   "step 20 loss 1.4 grad_norm inf\n", encoding="utf-8")
    (skip,) = [e for e in read_log(str(log)).events if e.kind == "overflow_skip"]
    assert skip.step is None and skip.detail["after_step"] == 10
