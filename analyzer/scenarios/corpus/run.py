"""Train one corpus case into a run folder that holds what a dead run leaves, no capture.

The loop is :mod:`analyzer.scenarios.harness`'s, with the flight recorder replaced by one
that records nothing, and the SummaryWriter behind a filter that keeps only the tags the
case's ``logged`` profile names: real runs log far less than the sample runs do.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from analyzer.scenarios.corpus.cases import Case
from analyzer.scenarios.harness import Outcome, _train
from analyzer.scenarios.logstyles import STYLES

PROFILES: dict[str, tuple[str, ...]] = {
    "full": ("",),
    "loss_lr": ("train/loss", "train/lr", "amp/loss_scale"),
    "totals": ("train/loss", "train/lr", "train/grad_norm", "amp/loss_scale"),
    "layers": ("train/loss", "train/lr", "grad_norm/", "weight_norm/", "amp/loss_scale"),
    "none": (),
}
"""Tag prefixes each profile writes to the event file (``none``: the text log only)."""

INFO_FILE = "case.json"
"""What the case is and how its training ended; a file ``forensics`` does not read."""


class _NoRecorder:
    """Stands in for the FlightRecorder: the corpus's runs leave no capture."""

    def __init__(self) -> None:
        self.capture_path: str | None = None
        self.errors: list[str] = []

    @contextlib.contextmanager
    def step(self, step: int, inputs: Any, targets: Any = None) -> Iterator[_NoRecorder]:
        yield self

    def loss(self, value: Any) -> None:
        pass


class _Filtered:
    """A SummaryWriter that writes only the tags with one of ``prefixes``."""

    def __init__(self, writer: Any, prefixes: tuple[str, ...], histograms: bool) -> None:
        self.writer = writer
        self.prefixes = prefixes
        self.histograms = histograms

    def _keeps(self, tag: str) -> bool:
        return any(tag.startswith(p) for p in self.prefixes)

    def add_scalar(self, tag: str, value: Any, step: int) -> None:
        if self._keeps(tag):
            self.writer.add_scalar(tag, value, step)

    def add_histogram(self, tag: str, values: Any, step: int) -> None:
        if self.histograms:
            self.writer.add_histogram(tag, values, step)

    def close(self) -> None:
        self.writer.close()


def run_case(case: Case, out_dir: str) -> Outcome:
    """Train ``case`` into ``out_dir/<name>``; return what the loop observed."""
    from torch.utils.tensorboard import SummaryWriter

    from analyzer.capture.env import write_env

    sc = case.scenario
    run_dir = os.path.join(out_dir, sc.name)
    os.makedirs(run_dir, exist_ok=True)
    torch.manual_seed(sc.seed)
    model = sc.model.build().to(sc.dtype)
    loss_fn = sc.loss.build()
    opt_cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam,
               "adamw": torch.optim.AdamW}[sc.optimizer]
    optimizer = opt_cls(model.parameters(), **sc.optimizer_kwargs)
    if case.schedule is not None:
        sc = replace(sc, on_step=case.schedule(optimizer))
    scaler = torch.amp.GradScaler("cpu", **sc.scaler) if sc.scaler is not None else None
    if case.env:
        write_env(run_dir, sc.seed)
    prefixes = PROFILES[case.logged]
    writer: Any = None
    if prefixes:
        writer = _Filtered(SummaryWriter(log_dir=run_dir, flush_secs=3600), prefixes,
                           histograms=case.logged == "full")
    else:
        writer = _Filtered(_Discard(), (), histograms=False)
    outcome = Outcome()
    with open(os.path.join(run_dir, case.log_name), "w", encoding="utf-8", newline="") as fh:
        log = STYLES[sc.log_style](fh, sc.steps, sc.steps_per_epoch)
        log.begin("training")  # never the case's title: it would state the cause
        try:
            _train(sc, run_dir, model, loss_fn, optimizer, scaler, _NoRecorder(),  # type: ignore[arg-type]
                   writer, log, outcome)
        finally:
            writer.close()
    return outcome


class _Discard:
    def add_scalar(self, tag: str, value: Any, step: int) -> None:
        pass

    def add_histogram(self, tag: str, values: Any, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def write_info(case: Case, out_dir: str, outcome: Outcome, split: str) -> None:
    """``case.json`` beside the run: its intended cause, family, half and outcome."""
    sc = case.scenario
    data = {
        "case": sc.name,
        "family": case.family,
        "intended": case.intended,
        "split": split,
        "batch": case.batch,
        "healthy": sc.healthy,
        "logged": case.logged,
        "log_style": sc.log_style,
        "first_nonfinite_step": outcome.first_nonfinite_step,
        "first_nonfinite_tag": outcome.first_nonfinite_tag,
        "stop_reason": outcome.stop_reason,
        "steps_run": outcome.steps_run,
        "skipped_steps": outcome.skipped_steps,
        "checkpoints": outcome.checkpoints,
        "last_loss": outcome.last_loss if math.isfinite(outcome.last_loss)
        else repr(outcome.last_loss),
    }
    with open(os.path.join(out_dir, sc.name, INFO_FILE), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
