"""Steps per epoch as the logs print it (log parsers' ``epoch_length``, rules.evidence_epoch).

Real Lightning fits (a TQDM bar captured to ``train.log`` as ``python train.py > train.log
2>&1`` would) and a real Hugging Face Trainer's training header (``log_level="info"``, the
Trainer's ``logger.info`` lines, captured the same way)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.hf import HuggingFaceParser
from analyzer.ingest.logformats.lightning import last_frames
from analyzer.ingest.logs import read_log
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_epoch import log_steps_per_epoch
from analyzer.rules.evidence_periodic import periodic
from tests.frameworks._common import offline, regression, seed
from tests.frameworks.generate import _run_logged
from tests.readonly import analyse_read_only

BAD = 45
"""Record 45 of 64 in batches of 8: batch 5 of every epoch."""


def _guarded_module() -> Any:
    import lightning.pytorch as pl
    import torch
    from torch import nn

    class Guarded(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            # the loop's own guard: Lightning skips a batch whose step returns None
            return loss if torch.isfinite(loss) else None

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Guarded()


def make_lightning(folder: Path, epochs: int, bad: int | None, accumulate: int,
                   logger: bool) -> Path:
    offline()
    seed(0)
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import TQDMProgressBar
    from torch.utils.data import DataLoader

    data = regression(64, value=5)
    if bad is not None:
        data.tensors[0][bad, 1] = math.nan
    trainer = pl.Trainer(default_root_dir=str(folder), max_epochs=epochs,
                         log_every_n_steps=1, accelerator="cpu", devices=1,
                         callbacks=[TQDMProgressBar()], logger=logger,
                         enable_checkpointing=logger, enable_model_summary=False,
                         accumulate_grad_batches=accumulate, deterministic=True)
    trainer.fit(_guarded_module(), DataLoader(data, batch_size=8, shuffle=False))
    return folder


def make_hf(folder: Path, steps: int, accumulate: int) -> Path:
    from tests.frameworks.hf_runs import _train

    return _train(folder, lr=5e-3, steps=steps, save_steps=1000, log_level="info",
                  gradient_accumulation_steps=accumulate)


def _generate(kind: str, root: Path, **kwargs: Any) -> Path:
    """One run made in a fresh interpreter whose console goes to ``root/train.log`` at the
    file-descriptor level (pytest's own capture would keep the bar out of the file)."""
    done = subprocess.run([sys.executable, "-m", "tests.test_epoch", kind, str(root),
                           json.dumps(kwargs)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return root


def _fit(root: Path, *, epochs: int, bad: int | None = BAD, accumulate: int = 1,
         logger: bool = True) -> Path:
    return _generate("lightning", root, epochs=epochs, bad=bad, accumulate=accumulate,
                     logger=logger)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs, no bad record, no logger and no saves (read, never written, by each test
    that takes it)."""
    return _fit(tmp_path_factory.mktemp("clean") / "run", epochs=2, bad=None, logger=False)


def test_a_lightning_bar_gives_its_total_in_batches(clean_run: Path) -> None:
    run = clean_run
    length = read_log(str(run / "train.log")).epoch_length
    assert length is not None
    assert (length.length, length.unit) == (8, "batch")
    assert "progress bar's total" in length.how and length.line >= 1


@pytest.fixture(scope="module")
def bad_record_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs, a NaN record at batch 5 of each, no logger and no saves."""
    return _fit(tmp_path_factory.mktemp("bad") / "run", epochs=2, logger=False)


def test_regression_the_bar_frame_drawn_over_a_nan_frame_is_kept(bad_record_run: Path
                                                                ) -> None:
    """tqdm's refresh at count 7 repeats step 5's NaN before step 6's own loss is drawn
    over it; the collapse of redraws kept the NaN frame and dropped the one after it,
    so step 6 read NaN too (and the bad steps were never isolated)."""
    read = read_log(str(bad_record_run / "train.log"))
    (loss,) = [s for s in read.series if s.tag == "train_loss"]
    keep = last_frames(loss.steps)
    values = dict(zip(loss.steps[keep].tolist(), loss.values[keep].tolist(), strict=True))
    assert math.isnan(values[5]) and math.isnan(values[13])
    assert math.isfinite(values[6]) and math.isfinite(values[14])


def test_regression_a_bad_record_whose_only_period_is_the_lightning_bar(bad_record_run: Path
                                                                        ) -> None:
    """The bar's total is the only period source. Before the log exposed it, two
    recurrences were too few to read a period from (three are needed) and no periodic
    reading was made."""
    run = bad_record_run
    result = analyse_read_only(run)
    found = periodic(RunEvidence(result))
    assert found is not None
    assert (found.period, found.position, found.steps) == (8, 5, (5, 13))
    assert "progress bar's total (8 batches per epoch), train.log:" in found.source
    causes = [f for f in result.findings if f.role == "cause"]
    assert causes and causes[0].name == "nan-in-batch"
    text = " ".join(e.text for e in causes[0].evidence)
    assert "recur every 8 steps, at batch 5 of each epoch" in text
    assert "progress bar's total" in text


def test_no_bad_record_gives_no_periodic_reading_from_the_bar(clean_run: Path) -> None:
    run = clean_run
    result = analyse_read_only(run)
    assert periodic(RunEvidence(result)) is None
    assert not [f for f in result.findings if f.role == "cause"]


def test_accumulation_puts_the_bars_batches_on_optimizer_steps(tmp_path: Path) -> None:
    """accumulate_grad_batches=2: the bar counts 8 batches an epoch, the global step (the
    event file's, the saves' ``epoch=1-step=8``) 4 optimizer steps."""
    run = _fit(tmp_path / "run", epochs=2, bad=None, accumulate=2)
    assert sorted(p.name for p in run.rglob("*.ckpt")) == ["epoch=1-step=8.ckpt"]
    result = analyse_read_only(run)
    (reading,) = log_steps_per_epoch(RunEvidence(result))
    assert (reading.steps, reading.unit) == (4, "optimizer_step")
    assert "8 batches per epoch" in reading.source and "2 batches per optimizer step" in \
        reading.source


def _hf_header(root: Path, *, steps: int, accumulate: int) -> Path:
    return _generate("hf", root, steps=steps, accumulate=accumulate) / "train.log"


@pytest.fixture(scope="module")
def hf_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 64 examples in batches of 4, accumulated 2: 8 optimizer steps an epoch; max_steps 12
    return _hf_header(tmp_path_factory.mktemp("hf") / "run", steps=12, accumulate=2)


def test_the_trainers_header_gives_its_update_steps_per_epoch(hf_log: Path) -> None:
    text = hf_log.read_text(encoding="utf-8", errors="replace")
    assert "Num update steps per epoch = 8" in text and "Num Epochs = 2" in text
    length = read_log(str(hf_log)).epoch_length
    assert length is not None
    assert (length.length, length.unit) == (8, "optimizer_step")
    assert "Num update steps per epoch = 8" in length.how


def test_the_trainers_header_is_a_period_on_the_global_step(hf_log: Path) -> None:
    """The Trainer's run (event files on its global step, the optimizer's) reads the
    header's 8 steps an epoch as they are: its accumulation is already in them."""
    result = analyse_read_only(hf_log.parent)
    (reading,) = log_steps_per_epoch(RunEvidence(result))
    assert (reading.steps, reading.unit) == (8, "optimizer_step")
    assert reading.source.startswith("its 'Num update steps per epoch = 8', train.log:")


def test_regression_an_older_header_is_not_max_steps_over_the_epochs(hf_log: Path,
                                                                     tmp_path: Path) -> None:
    """The same header without 'Num update steps per epoch' (releases before it printed
    one): max_steps 12 over 'Num Epochs = 2' is 6, not the run's 8 steps an epoch; the
    examples over the total batch size (64 / 8) are, and the epochs printed agree."""
    lines = [ln for ln in hf_log.read_text(encoding="utf-8", errors="replace").splitlines()
             if "Num update steps per epoch" not in ln]
    old = tmp_path / "train.log"
    old.write_text("\n".join(lines) + "\n", encoding="utf-8")
    length = read_log(str(old)).epoch_length
    assert length is not None
    assert (length.length, length.unit) == (8, "optimizer_step")
    assert "Num examples = 64" in length.how
    # the number the Trainer's dict lines are placed by (epoch x steps per epoch) too
    parser, ctx = HuggingFaceParser(), Context(str(old))
    for number, line in enumerate(lines, 1):
        ctx.line = number
        if line.strip():
            parser.parse(line, ctx)
    assert parser.steps_per_epoch() == 8


def test_a_data_set_without_a_length_has_no_epoch_length(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("***** Running training *****\n  Num examples = 48\n"
                   "  Num Epochs = 9,223,372,036,854,775,807\n"
                   "  Num update steps per epoch = 12\n"
                   "  Total train batch size (w. parallel, distributed & accumulation) = 4\n"
                   "  Total optimization steps = 12\n", encoding="utf-8")
    assert read_log(str(log)).epoch_length is None


if __name__ == "__main__":
    _make = {"lightning": make_lightning, "hf": make_hf}[sys.argv[1]]
    _options = json.loads(sys.argv[3])
    if _run_logged(lambda folder: _make(folder, **_options), Path(sys.argv[2])) is not None:
        raise SystemExit(1)
