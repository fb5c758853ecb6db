"""What the alignment tests share: one run analysed without replay, its one alignment, and
a loss curve that goes NaN written by torch's SummaryWriter at a chosen offset."""

from __future__ import annotations

import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from analyzer.api import analyze
from analyzer.model import Alignment, RunResult

STEPS = 60
BAD = 41
"""The loop index (0-based) at which ``loss`` goes NaN."""


def loss(index: int) -> float:
    return float("nan") if index >= BAD else 3.0 * math.exp(-index / 25) + 0.013 * (index % 5)


def write_events(run: Path, tag: str, at: int, steps: range = range(STEPS)) -> None:
    """The loss of loop index ``i`` written at step ``i + at``."""
    writer = SummaryWriter(str(run))
    for index in steps:
        writer.add_scalar(tag, loss(index), index + at)
    writer.close()


def only_result(run: Path) -> RunResult:
    """The result of the one run in ``run``."""
    (result,) = analyze(str(run), replay=False).results
    return result


def only_alignment(result: RunResult) -> Alignment:
    """The one alignment of a run whose log has one numbering."""
    (placed,) = result.run.alignments
    return placed
