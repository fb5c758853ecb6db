"""Shared fixtures: event files written by the real writers into tmp_path."""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable, Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))  # the event generator benchmarks use

REAL_FIXTURES = os.path.join(os.path.dirname(ROOT), "shared", "fixtures", "real-tfevents")


def write_summary_run(folder: str, values: dict[str, Sequence[float]], *,
                      start: int = 0) -> str:
    """Write every tag's values at steps start, start+1, ... with torch's SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(folder)
    length = max(len(v) for v in values.values())
    for i in range(length):
        for tag, vals in values.items():
            if i < len(vals):
                writer.add_scalar(tag, vals[i], start + i)
    writer.close()
    return only_event_file(folder)


def only_event_file(folder: str) -> str:
    files = sorted(glob.glob(os.path.join(folder, "*tfevents*")))
    assert len(files) == 1, files
    return files[0]


@pytest.fixture
def summary_run(tmp_path: object) -> Callable[..., str]:
    def make(values: dict[str, Sequence[float]], name: str = "run", start: int = 0) -> str:
        folder = os.path.join(str(tmp_path), name)
        return write_summary_run(folder, values, start=start)

    return make
