"""Logs the real frameworks wrote (tests/frameworks/), read as a user's run gives them:
the console alone, without the event files beside it, on the global step those files
count; the frames, skip lines and error files each framework prints read for what they
are."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.api import analyze
from analyzer.ingest.logs import is_log_file, read_log
from analyzer.model import Event, Location
from analyzer.onset import event_incident
from tests.frameworks import corpus
from tests.frameworks.truth import first_nonfinite, scalars
from tests.fuzz.budget import fuzz_settings
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


def _error_files(run: Path) -> dict[int, Path]:
    found = sorted(run.glob("torchrun_logs/*/attempt_0/*/error.json"))
    return {int(p.parent.name): p for p in found}


def test_regression_torchrun_error_files_are_read_as_the_run_s_logs(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each worker's error.json was named only in the console's table (when the console
    was kept): its message, rank 1's FloatingPointError, was no event of the run."""
    run = corpus.get("ddp_gloo", tmp_path_factory)
    files = _error_files(run)
    assert sorted(files) == [0, 1]
    (result,) = analyze(str(run), replay=False).results
    logs = {log.path for log in result.run.logs}
    assert {str(p) for p in files.values()} <= logs
    mine = [e for e in result.run.events if e.location.file == str(files[1])]
    assert [(e.kind, e.detail.get("type"), e.detail.get("local_rank")) for e in mine] == [
        ("error", "FloatingPointError", 1), ("nonfinite", "FloatingPointError", 1)]
    nonfinite = mine[1]
    assert (nonfinite.step, nonfinite.detail["tag"], nonfinite.detail["kind"]) == (5, "loss", "nan")
    (other,) = [e for e in result.run.events if e.location.file == str(files[0])]
    assert other.kind == "error" and other.detail["type"] == "RuntimeError"


def test_a_torchrun_error_file_alone_fails_the_run_at_the_step_it_names(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    run = corpus.get("ddp_gloo", tmp_path_factory)
    here = tmp_path_factory.mktemp("elastic") / "logs" / "run_x" / "attempt_0" / "1"
    here.mkdir(parents=True)
    shutil.copy(_error_files(run)[1], here / "error.json")
    (result,) = analyze(str(here.parents[2]), replay=False).results
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (5, "loss")


def test_an_error_json_elsewhere_is_not_read(tmp_path: Path) -> None:
    data = json.dumps({"message": {"message": "FloatingPointError: loss is nan at step 5",
                                   "extraInfo": {"timestamp": "1"}}})
    for where in ("error.json", "logs/error.json", "attempt_x/1/error.json",
                  "attempt_0/a/error.json"):
        path = tmp_path / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data, encoding="utf-8")
        assert not is_log_file(str(path)), where
    assert is_log_file(str(tmp_path / "r" / "attempt_3" / "0" / "error.json"))


def test_an_error_file_of_another_shape_is_reported_not_read(tmp_path: Path) -> None:
    path = tmp_path / "attempt_0" / "0" / "error.json"
    path.parent.mkdir(parents=True)
    for data, kind in ((b'{"error": "FloatingPointError: loss is nan"}', "bad_json"),
                       (b"not json at all", "bad_json"), (b"  \n", "empty_file")):
        path.write_bytes(data)
        read = read_log(str(path))
        assert [i.kind for i in read.issues] == [kind]
        assert read.events == () and read.series == ()


@pytest.mark.fuzz
@fuzz_settings(100)
@given(st.one_of(st.binary(max_size=400), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["message", "extraInfo", "py_callstack", "timestamp", "x"]), inner,
        max_size=4), max_leaves=12).map(lambda doc: json.dumps(doc).encode())))
def test_fuzz_an_error_file_never_raises(tmp_path_factory: pytest.TempPathFactory,
                                         data: bytes) -> None:
    path = tmp_path_factory.mktemp("attempt") / "attempt_0" / "0" / "error.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    read = read_log(str(path))
    assert bool(read.issues) != bool(read.events)


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Lightning training logged by ``CSVLogger`` alone (no event file): SGD at
    lr=1.0 on inputs of scale 3 diverges, as lightning_nan does, with a validation loop."""
    from tests.frameworks._common import offline, regression, seed
    from tests.frameworks.lightning_runs import _loader, _module

    offline()
    seed(0)
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    root = tmp_path_factory.mktemp("csv_logger")
    data = regression(64, value=0)
    data.tensors = (data.tensors[0] * 3.0, data.tensors[1] * 3.0)
    trainer = pl.Trainer(default_root_dir=str(root), max_epochs=4, log_every_n_steps=1,
                         accelerator="cpu", devices=1, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         logger=CSVLogger(str(root)), deterministic=True)
    trainer.fit(_module(1.0), _loader(data), _loader(regression(16, value=0)))
    return root


def _csv_first_nonfinite(path: Path) -> tuple[int, str]:
    """Oracle: the first row (file order, which is step order) with a non-finite metric,
    read with the csv module."""
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            for name, cell in row.items():
                if name not in ("epoch", "step") and cell and not math.isfinite(float(cell)):
                    return int(row["step"]), name
    raise AssertionError("finite throughout")


def test_regression_a_csv_logger_run_is_read_on_the_global_step(csv_run: Path) -> None:
    """``lightning_logs/version_0/metrics.csv`` (and hparams.yaml) was all a CSVLogger run
    left, and no reader took the CSV: the run was reported as having nothing to read."""
    (metrics,) = csv_run.rglob("metrics.csv")
    assert metrics.read_text().splitlines()[0].startswith("epoch,step,")
    before = sorted((p, p.stat().st_size) for p in csv_run.rglob("*"))
    (result,) = analyze(str(csv_run), replay=False).results
    assert sorted((p, p.stat().st_size) for p in csv_run.rglob("*")) == before
    assert result.run.path == str(csv_run)
    assert [log.path for log in result.run.logs] == [str(metrics)]
    assert result.run.logs[0].framework == "lightning"
    step, tag = _csv_first_nonfinite(metrics)
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (step, tag)
    assert all(a.confidence == "exact" and a.offset == 0 for a in result.run.alignments)
    # Each column is a series at the rows that hold it: validation at its epoch's last step.
    series = {s.tag: s for s in result.run.series}
    assert set(series) == {"train_loss", "val_loss"}
    assert series["val_loss"].steps.tolist() == [7, 15, 23, 31][: len(series["val_loss"])]


def test_a_damaged_metrics_csv_keeps_what_it_could_read(csv_run: Path, tmp_path: Path) -> None:
    (metrics,) = csv_run.rglob("metrics.csv")
    lines = metrics.read_bytes().split(b"\n")
    damaged = tmp_path / "metrics.csv"
    cut = [*lines[:6], b"0,x,1.0,", b"0,5,1.0,2.0,3.0", b"0,5,oops,", lines[6][:5]]
    damaged.write_bytes(b"\n".join(cut))
    read = read_log(str(damaged))
    assert [(i.kind, i.location.line) for i in read.issues] == [
        ("bad_record", 7), ("bad_record", 8), ("bad_record", 9)]
    (loss,) = read.series
    # Steps 0-4, then the row cut mid-value ("0,5,3"): read as it stands, as a log's
    # last line without its newline is.
    assert loss.steps.tolist() == [0, 1, 2, 3, 4, 5] and loss.values[-1] == 3.0
    other = tmp_path / "other" / "metrics.csv"
    other.parent.mkdir()
    other.write_text("epoch,loss\n0,nan\n")
    read = read_log(str(other))
    assert [i.kind for i in read.issues] == ["bad_record"] and read.series == ()


def test_the_ddp_run_names_rank_1_as_the_failing_rank(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The whole run (console, per-rank logs, error files, rank 0's all-reduced events):
    every incident that names a rank names rank 1, in the JSON and in the text."""
    import contextlib
    import io

    from analyzer.cli import main
    from tests.test_frameworks import analysed, training_run

    run = training_run(analysed("ddp_gloo", tmp_path_factory))
    ranks = {t["rank"] for t in run["tag_incidents"] if t["rank"] is not None}
    assert ranks == {1}
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        main(["analyze", "--no-replay", str(corpus.get("ddp_gloo", tmp_path_factory))])
    assert "rank 1" in text.getvalue() and "rank 0 went" not in text.getvalue()
