"""Progress bars and messages as the real libraries print them: Lightning's tqdm and rich
bars and its callbacks' messages, tensorboardX's warning, a loop's own overflow lines,
launcher and logger rank prefixes, and the elastic agent's failure report."""

from __future__ import annotations

import glob
import io
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest.logformats.elastic import error_file_report
from analyzer.ingest.logs import LogRead, read_log
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.test_fuzz_logs import DAMAGE, ENDS, ONE_CHUNK, chunking, outcome

_LIGHTNING = textwrap.dedent(
    """
    import os, sys
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
    from torch.utils.data import DataLoader, TensorDataset


    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), prog_bar=True)

        def configure_optimizers(self):
            # Far too high for inputs of this scale: the loss diverges to inf, then NaN.
            return torch.optim.SGD(self.parameters(), lr=0.5)


    def fit(root, bar):
        torch.manual_seed(0)
        x = torch.randn(40, 4) * 3
        data = TensorDataset(x, x.sum(1, keepdim=True))
        checkpoint = ModelCheckpoint(monitor="val_loss", verbose=True, save_top_k=2)
        trainer = pl.Trainer(default_root_dir=root, max_epochs=3, log_every_n_steps=1,
                             accelerator="cpu", enable_model_summary=False,
                             callbacks=[bar, checkpoint])
        trainer.fit(Regression(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))


    for name, bar in (("tqdm", TQDMProgressBar()), ("rich", RichProgressBar())):
        root = os.path.join(sys.argv[1], name)
        os.makedirs(root)
        # As `python train.py > train.log 2>&1` would: both streams into the file.
        sys.stdout.flush(); sys.stderr.flush()
        fd = os.open(os.path.join(root, "train.log"), os.O_WRONLY | os.O_CREAT)
        os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
        fit(root, bar)
        sys.stdout.flush(); sys.stderr.flush()
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_DISABLED="true")
    env.pop("COLUMNS", None)  # rich lays its bar out to the console's width
    return env


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real Lightning trainings that diverge, one with each progress bar."""
    root = tmp_path_factory.mktemp("lightning")
    subprocess.run([sys.executable, "-c", _LIGHTNING, str(root)], check=True, env=_env(),
                   timeout=300, stdin=subprocess.DEVNULL)
    return root


def _event_file_first_nonfinite(run: Path, tag: str) -> tuple[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (path,) = glob.glob(str(run / "lightning_logs" / "version_0" / "events.out.tfevents.*"))
    acc = EventAccumulator(path, size_guidance={"scalars": 0})
    acc.Reload()
    first = next(s for s in acc.Scalars(tag) if not math.isfinite(s.value))
    return first.step, first.value


def _first_bad(read: LogRead, tag: str) -> tuple[int, float, int]:
    (series,) = [s for s in read.series if s.tag == tag]
    for step, value, line in zip(series.steps, series.values, series.positions, strict=True):
        if not math.isfinite(float(value)):
            return int(step), float(value), int(line)
    raise AssertionError(f"{tag} is finite throughout")


def test_regression_tqdm_padded_nonfinite_values_are_read(lightning_runs: Path) -> None:
    """Lightning's Tqdm.format_num pads inf to 'inf.0' (nan to 'nan.0', -inf to '-inf.');
    they were dropped as not numbers, so a diverging Lightning log read as finite."""
    log = lightning_runs / "tqdm" / "train.log"
    text = log.read_bytes().decode("utf-8")
    assert "train_loss=inf.0" in text
    read = read_log(str(log))
    assert read.framework == "lightning"
    step, value, line = _first_bad(read, "train_loss")
    tb_step, tb_value = _event_file_first_nonfinite(lightning_runs / "tqdm", "train_loss")
    # The bar counts batches from 1 and is read as the global_step Lightning's logger
    # writes at, from 0.
    assert step == tb_step
    assert value == tb_value == math.inf
    assert "train_loss=inf.0" in text.split("\n")[line - 1]


def test_regression_rich_bar_wrapped_metrics_keep_the_bar_step(lightning_runs: Path) -> None:
    """The rich bar wraps its metrics onto the next lines, under the bar; they were read
    by the fallback in record order, so the failure late in training was 'step 1'."""
    log = lightning_runs / "rich" / "train.log"
    lines = log.read_text(encoding="utf-8").splitlines()
    bar = next(i for i, line in enumerate(lines) if line.startswith("Epoch 2/2"))
    assert "train_loss" not in lines[bar] and "train_loss: inf" in lines[bar + 1]
    read = read_log(str(log))
    step, value, line = _first_bad(read, "train_loss")
    assert (step, line) == (2 * 10 + 10 - 1, bar + 2)  # epoch 2 of 10 batches, batch 10
    assert value == math.inf
    assert {s.axis.label for s in read.series} == {"batch"}
    assert not any("position among such lines" in n for n in read.notes)


def test_lightning_checkpoint_saves_are_events(lightning_runs: Path) -> None:
    for bar in ("tqdm", "rich"):
        read = read_log(str(lightning_runs / bar / "train.log"))
        saves = [e for e in read.events if e.kind == "checkpoint_save"]
        folder = lightning_runs / bar / "lightning_logs" / "version_0" / "checkpoints"
        names = sorted(p.name for p in folder.iterdir())
        steps = sorted(int(n.split("step=")[1].split(".")[0]) for n in names)
        assert [e.detail["global_step"] for e in saves] == steps[: len(saves)]
        assert len(saves) == 2
        for e in saves:
            global_step = e.detail["global_step"]
            assert isinstance(global_step, int)
            assert e.detail["last_logged_step"] == global_step - 1
            assert e.detail["epoch"] == global_step // 10 - 1
        if bar == "tqdm":  # glued to the bar it was printed onto: after that bar's count
            assert [e.detail["after_step"] for e in saves] == [9, 19]
            assert read.series[0].tag == "train_loss"


def test_rich_wrapped_metric_split_from_its_value(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    pad = " " * 60
    log.write_text(
        "Epoch 4/9  ━━━━━━━━━━━━━━━━━━━━ 12/20 0:00:03 • 0:00:02 4.10it/s v_num: 0.000 loss:\n"
        f"{pad}nan val_loss: 0.731\n"
        f"{pad}grad_norm: inf\n"
        f"{pad}not a metric line\n",
        encoding="utf-8",
    )
    read = read_log(str(log))
    got = {s.tag: (int(s.steps[0]), float(s.values[0])) for s in read.series}
    assert set(got) == {"loss", "val_loss", "grad_norm"}
    assert got["loss"][0] == got["grad_norm"][0] == 4 * 20 + 12 - 1
    assert math.isnan(got["loss"][1]) and got["grad_norm"][1] == math.inf


def test_early_stopping_nonfinite_monitor_is_an_event(tmp_path: Path) -> None:
    import torch
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning_utilities.core.rank_zero import rank_prefixed_message

    stop = EarlyStopping(monitor="val_loss", verbose=True)
    stop.best_score = torch.tensor(0.25)
    should_stop, reason = stop._evaluate_stopping_criteria(torch.tensor(float("nan")))
    assert should_stop and reason
    log = tmp_path / "train.log"
    log.write_text(
        "Epoch 1:  50%|█████     | 5/10 [00:01<00:01, 4.10it/s, v_num=0, train_loss=0.512]\n"
        + rank_prefixed_message(reason, 1) + "\n",
        encoding="utf-8",
    )
    (event,) = [e for e in read_log(str(log)).events if e.kind == "nonfinite"]
    assert event.detail["tag"] == "val_loss" and event.detail["kind"] == "nan"
    assert event.detail["rank"] == 1 and event.detail["after_step"] == 14


_TENSORBOARDX = textwrap.dedent(
    """
    import math, sys
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(sys.argv[1])
    loss = 2.0
    for step in range(10):
        loss = loss * 0.9 if step < 6 else loss * 1e200
        grad = loss * 3
        print(f"step {step} loss {loss:.4f}", flush=True)
        writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/grad", grad - grad if math.isinf(grad) else grad, step)
    writer.close()
    """
)


def test_regression_tensorboardx_nan_warning_is_an_event(tmp_path: Path) -> None:
    """tensorboardX logs 'NaN or Inf found in input tensor.' for each non-finite value it
    is handed; the warning was ignored."""
    log = tmp_path / "train.log"
    with log.open("wb") as out:
        subprocess.run([sys.executable, "-c", _TENSORBOARDX, str(tmp_path / "tb")],
                       stdout=out, stderr=subprocess.STDOUT, check=True, env=_env(), timeout=120)
    text = log.read_text(encoding="utf-8")
    assert "NaN or Inf found in input tensor." in text
    read = read_log(str(log))
    events = [e for e in read.events if e.kind == "nonfinite"]
    # Step 7's loss overflows to inf (two warnings: loss, then inf - inf for the gradient).
    first = events[0]
    assert first.detail["tag"] == "tensorboardX" and first.detail["tag_named"] is False
    assert first.detail["kind"] == "nan-or-inf"
    assert first.detail["after_step"] == 7
    assert [e.detail["after_step"] for e in events] == [7, 8, 9]  # one per step
    assert any("names no tag" in n for n in read.notes)


LOOP_SKIPS = [
    ("step 120: gradient overflow, skipping step, loss scale 65536.0 -> 32768.0",
     120, {"attempted_scale": 65536.0, "new_scale": 32768.0}),
    ("Gradient overflow.  Skipping step, reducing loss scale to 32768.0",
     None, {"new_scale": 32768.0}),
    ("Gradient overflow, change scale from 1024.000000 to 512.000000",
     None, {"attempted_scale": 1024.0, "new_scale": 512.0}),
    ("[iter 7] non-finite gradients: skipped update (scale 1024 to 512)",
     7, {"attempted_scale": 1024.0, "new_scale": 512.0}),
    ("2024-05-01 10:00:00 INFO overflow detected at step=45, skipping optimizer step",
     45, {}),
]


@pytest.mark.parametrize(("line", "step", "detail"), LOOP_SKIPS)
def test_regression_hand_written_overflow_line_is_a_skip(
    tmp_path: Path, line: str, step: int | None, detail: dict[str, float]
) -> None:
    """A loop's own 'gradient overflow, skipping step, loss scale X -> Y' was not a skip."""
    log = tmp_path / "train.log"
    log.write_text(f"step 3 loss 2.31\n{line}\nstep 4 loss 2.30\n", encoding="utf-8")
    (skip,) = [e for e in read_log(str(log)).events if e.kind == "overflow_skip"]
    assert skip.step == step
    got = {k: v for k, v in skip.detail.items() if k in ("attempted_scale", "new_scale")}
    assert got == detail
    if step is None:
        assert skip.detail["after_step"] == 3


@pytest.mark.parametrize("line", [
    "Skipped 3 corrupt images in shard 12",
    "loss scale 1024.0",
    "skipping validation: no val loader",
])
def test_other_skip_lines_are_not_overflow_skips(tmp_path: Path, line: str) -> None:
    log = tmp_path / "train.log"
    log.write_text(f"step 3 loss 2.31\n{line}\n", encoding="utf-8")
    assert not [e for e in read_log(str(log)).events if e.kind == "overflow_skip"]


def test_regression_role_and_template_prefixes_name_the_rank(tmp_path: Path) -> None:
    """torchrun's console copy is prefixed '[{role}{local_rank}]:' ('[trainer1]:' with
    --role trainer) or by a TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE such as '[${rank}]:';
    only '[default1]:' was read, so a failing rank was not named."""
    from torch.distributed.elastic.multiprocessing.tail_log import TailLog

    outs = {}
    for rank, lines in ((0, ["step 0 loss 2.10", "step 1 loss 2.00"]),
                        (1, ["step 0 loss 2.10", "step 1 loss nan"])):
        outs[rank] = tmp_path / f"stdout_{rank}.log"
        outs[rank].write_text("\n".join(lines) + "\n")
    for prefixes, expected in ((None, "[trainer1]:"), ({0: "[0]:", 1: "[1]:"}, "[1]:")):
        console = io.StringIO()
        tail = TailLog("trainer", {r: str(p) for r, p in outs.items()}, console,
                       log_line_prefixes=prefixes, interval_sec=0.01).start()
        tail.stop()
        log = tmp_path / "console.log"
        log.write_text(console.getvalue())
        assert f"{expected}step 1 loss nan" in console.getvalue()
        read = read_log(str(log))
        bad = [s for s in read.series if not all(math.isfinite(v) for v in s.values)]
        assert [(s.tag, s.rank) for s in bad] == [("loss", 1)]
        assert {s.rank for s in read.series} == {0, 1}


def test_regression_accelerate_rank_mark_after_the_logging_header(tmp_path: Path) -> None:
    """Accelerate's logger with main_process_only=False puts '[RANK N]' after the
    logging header, not at the start of the line; the rank was not read."""
    from accelerate import PartialState
    from accelerate.logging import get_logger

    PartialState()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(name)s - %(message)s"))
    base = logging.getLogger("train_script")
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    try:
        logger = get_logger("train_script")
        for step, loss in ((1, 2.5), (2, math.nan)):
            logger.info(f"step {step} loss {loss}", main_process_only=False)
    finally:
        base.removeHandler(handler)
    assert "- [RANK 0] step 2 loss nan" in stream.getvalue()
    log = tmp_path / "train.log"
    log.write_text(stream.getvalue())
    (series,) = read_log(str(log)).series
    assert series.rank == 0 and list(series.steps) == [1, 2]


def _elastic_failure(tmp_path: Path) -> tuple[str, Path]:
    """The agent's report of a worker whose backward returned NaN: a real error file
    written by the worker's ErrorHandler, read back by the agent's ChildFailedError."""
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

    error_file = tmp_path / "attempt_0" / "1" / "error.json"
    error_file.parent.mkdir(parents=True)
    os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    try:
        x = torch.zeros(3, requires_grad=True)
        with torch.autograd.detect_anomaly(check_nan=True):
            try:
                (torch.log(x) * 0).sum().backward()  # type: ignore[no-untyped-call]
            except RuntimeError as exc:
                ErrorHandler().record_exception(exc)
    finally:
        del os.environ["TORCHELASTIC_ERROR_FILE"]
    failed = ProcessFailure(local_rank=1, pid=4242, exitcode=1, error_file=str(error_file))
    killed = ProcessFailure(local_rank=0, pid=4241, exitcode=-15, error_file="<N/A>")
    killed.timestamp = failed.timestamp + 5  # stopped by the agent after rank 1 failed
    report = str(ChildFailedError("train.py", {0: killed, 1: failed}))
    return report, error_file


@pytest.mark.filterwarnings("ignore:Anomaly Detection:UserWarning")
@pytest.mark.filterwarnings("ignore:Error detected:UserWarning")
def test_regression_elastic_failure_names_the_failing_rank(tmp_path: Path) -> None:
    """The elastic agent's failure table names the rank that failed first; its traceback
    was read as a rankless anomaly error."""
    report, error_file = _elastic_failure(tmp_path)
    log = tmp_path / "console.log"
    log.write_text(
        "[default0]:step 0 loss 2.10\n[default1]:step 0 loss 2.10\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/bin/torchrun", line 8, in <module>\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: " + report + "\n"
    )
    read = read_log(str(log))
    errors = [e for e in read.events if e.kind == "error" and "root_cause" in e.detail]
    root = [e for e in errors if e.detail["root_cause"]]
    assert [(e.detail["rank"], e.detail["local_rank"], e.detail["exitcode"]) for e in root] \
        == [(1, 1, 1)]
    assert root[0].detail["type"] == "RuntimeError"
    assert root[0].detail["error_file"] == str(error_file)
    assert "returned nan values" in root[0].message
    (other,) = [e for e in errors if not e.detail["root_cause"]]
    assert other.detail["rank"] == 0 and other.detail["exitcode"] == -15
    (nonfinite,) = [e for e in read.events if e.kind == "nonfinite"]
    assert nonfinite.detail["rank"] == 1
    assert str(nonfinite.detail["tag"]).startswith("autograd:")
    lines = log.read_text().splitlines()
    assert "returned nan values" in lines[nonfinite.location.line - 1]  # type: ignore[operator]


@pytest.mark.filterwarnings("ignore:Anomaly Detection:UserWarning")
@pytest.mark.filterwarnings("ignore:Error detected:UserWarning")
def test_elastic_error_file_is_read(tmp_path: Path) -> None:
    _, error_file = _elastic_failure(tmp_path)
    got = error_file_report(error_file.read_bytes())
    assert got is not None and got.type == "RuntimeError"
    assert "returned nan values" in got.message
    assert got.traceback is not None and "Traceback" in got.traceback
    assert got.timestamp is not None
    for damaged in (b"", b"{", b"[]", json.dumps({"message": 3}).encode(), b"\xff" * 40):
        assert error_file_report(damaged) is None


def test_regression_a_scripts_nan_error_names_its_step_and_rank(tmp_path: Path) -> None:
    """'FloatingPointError: loss is nan at step 5', a script's own check, was only an
    error event: no non-finite report, no step, and in the agent's table no rank."""
    log = tmp_path / "train.log"
    log.write_text("[rank1]: step 4 loss 2.2\n"
                   "[rank1]: FloatingPointError: rank 1: loss is nan at step 5\n")
    (event,) = [e for e in read_log(str(log)).events if e.kind == "nonfinite"]
    assert (event.step, event.detail["tag"], event.detail["kind"], event.detail["rank"]) \
        == (5, "loss", "nan", 1)


def test_ddp_corpus_names_the_rank_that_went_nan(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The corpus' 2-rank gloo run under torchrun: rank 1 raises on a NaN loss at step 5,
    rank 0 dies of the closed connection; the console's table and rank 1's error.json."""
    from tests.frameworks import corpus

    run = corpus.get("ddp_gloo", tmp_path_factory)
    read = read_log(str(run / "train.log"))
    table = [e for e in read.events if e.kind == "error" and "root_cause" in e.detail]
    # Rank 1 fails; whether the agent's table also lists rank 0 (stopped by the closed
    # connection, or terminated first) depends on how the two processes were scheduled.
    ranks = sorted(str(e.detail["rank"]) for e in table)
    assert ranks in (["0", "1"], ["1"])
    by_rank = {e.detail["rank"]: e for e in table}
    assert by_rank[1].detail["type"] == "FloatingPointError"
    assert by_rank[1].detail["exitcode"] == 1
    nan = [(e.step, e.detail["rank"]) for e in read.events
           if e.kind == "nonfinite" and e.detail.get("reported_by") == "torchelastic"]
    assert nan == [(5, 1)]
    assert {s.rank for s in read.series} == {0, 1}
    report = error_file_report(Path(str(by_rank[1].detail["error_file"])).read_bytes())
    assert report is not None and report.type == "FloatingPointError"
    assert "loss is nan at step 5" in report.message


def test_corpus_amp_loop_skip_lines(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The corpus' GradScaler loop prints its own skip line for each halving."""
    from tests.frameworks import corpus

    run = corpus.get("amp_benign", tmp_path_factory)
    read = read_log(str(run / "train.log"))
    skips = [e for e in read.events if e.kind == "overflow_skip"]
    assert len(skips) == 7
    scales = [(float(str(e.detail["attempted_scale"])), float(str(e.detail["new_scale"])))
              for e in skips]
    assert all(after == before / 2 for before, after in scales[1:])
    assert scales[-1][1] == 8192.0


# Fuzz targets: the formats above among damage, and an oracle for the bars' steps.

_PAD = st.sampled_from([24, 40, 63, 82])
_VALUE = st.sampled_from(["nan", "inf", "-inf", "0.25", "12.5", "1e-07", "3.000"])
_MY_LINES = st.one_of(
    st.builds("Epoch {}: 50%|#| {}/20 [00:01<00:01, 3.1it/s, v_num=0, train_loss={}]".format,
              st.integers(0, 9), st.integers(0, 20),
              st.sampled_from(["nan.0", "inf.0", "-inf.", "0.250", "12.50"])),
    st.builds("Epoch {}/9  ━━━━━━━━━━ {}/20 0:00:01 • 0:00:02 3.1it/s v_num: 0.000 {}".format,
              st.integers(0, 9), st.integers(0, 20), st.sampled_from(["", "loss:", "a: 1.0"])),
    st.builds("{}{}: {}".format, _PAD.map(" ".__mul__), st.sampled_from(["loss", "val_loss"]),
              _VALUE),
    st.builds("Epoch {}, global step {}: 'val_loss' reached {} (best 0.1), saving model to "
              "'x/epoch=0-step=5.ckpt' as top 1".format, st.integers(0, 9), st.integers(0, 99),
              _VALUE),
    st.just("NaN or Inf found in input tensor."),
    st.builds("step {}: gradient overflow, skipping step, loss scale {} -> {}".format,
              st.integers(0, 99), _VALUE, _VALUE),
    st.sampled_from(["Failures:", "Root Cause (first observed failure):", "=" * 60, "-" * 60,
                     "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 7)",
                     "  error_file: <N/A>", "  time      : 2024-01-01_00:00:00",
                     "  traceback : Signal 9 (SIGKILL) received by PID 7",
                     "  FloatingPointError: loss is nan at step 4"]),
    st.builds("{}step {} loss {}".format,
              st.sampled_from(["[trainer1]:", "[3]:", "[rank: 2] ", "x - [RANK 1] ", ""]),
              st.integers(0, 99), _VALUE),
)


@st.composite
def _my_logs(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(1, 25))):
        text = draw(_MY_LINES).encode("utf-8")
        if draw(st.booleans()):
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(DAMAGE) + text[at:]
        out.append(text + draw(ENDS))
    return b"".join(out)


@pytest.mark.fuzz
@fuzz_settings(200)
@given(_my_logs(), st.integers(1, 160), st.sampled_from([24, 64, 1 << 16]))
def test_fuzz_progress_formats_do_not_depend_on_where_chunks_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, chunk: int, cap: int
) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(data)
    with chunking(monkeypatch, ONE_CHUNK, cap):
        whole = read_log(str(path))
    with chunking(monkeypatch, chunk, cap):
        read = read_log(str(path))
    assert outcome(read) == outcome(whole)


@pytest.mark.fuzz
@fuzz_settings(150)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 99), st.integers(1, 99),
                          st.lists(st.tuples(st.sampled_from(["loss", "val_loss", "lr"]),
                                             st.floats(allow_nan=True, allow_infinity=True)),
                                   min_size=1, max_size=4),
                          st.integers(0, 3), st.booleans()),
                min_size=1, max_size=6))
def test_fuzz_bar_values_land_at_their_bar_step(
    tmp_path: Path,
    bars: list[tuple[int, int, int, list[tuple[str, float]], int, bool]],
) -> None:
    """Oracle: each value a tqdm bar (through Lightning's own format_num) or a rich bar
    (wrapping its metrics after ``inline`` of them) shows is read at epoch * total +
    batch - 1, as the value the bar printed; of a metric's values drawn at one count in a
    row, the last."""
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    lines, expected = [], []
    for epoch, total, batch_, metrics, inline, rich in bars:
        batch = min(batch_, total)
        step = epoch * total + batch - 1
        shown = [(name, Tqdm.format_num(v)) if not rich else (name, f"{v:.3f}")
                 for name, v in dict(metrics).items()]
        if rich:
            head = f"Epoch {epoch}/50  ━━━━━━━━━━━━━━━━━━━━ {batch}/{total} 0:00:01 • 0:00:02 "
            pairs = [f"{n}: {v}" for n, v in shown]
            lines.append(head + "3.10it/s v_num: 0.000 " + " ".join(pairs[:inline]))
            lines += [" " * 60 + p for p in pairs[inline:]]
        else:
            post = ", ".join(f"{n}={v}" for n, v in shown)
            lines.append(f"Epoch {epoch}:  50%|#   | {batch}/{total} [00:01<00:01, 3.1it/s, "
                         f"v_num=0, {post}]")
        expected += [(name, step, text) for name, text in shown]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = sorted((s.tag, int(st_), repr(float(v))) for s in read_log(str(log)).series
                 for st_, v in zip(s.steps, s.values, strict=True))

    def printed(text: str) -> float:
        return float(text.rstrip(".0") if text.rstrip(".0").endswith(("nan", "inf")) else text)

    kept = [(n, s, t) for i, (n, s, t) in enumerate(expected)
            if next((s2 for n2, s2, _ in expected[i + 1:] if n2 == n), None) != s]
    assert got == sorted((n, s, repr(printed(t))) for n, s, t in kept)
