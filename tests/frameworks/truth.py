"""What TensorBoard's own reader sees in a run: the reference the analyzer must match."""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple


class FirstBad(NamedTuple):
    step: int
    tag: str
    value: float
    folder: str
    """The event folder, relative to the run."""


def event_folders(run: Path) -> list[Path]:
    return sorted({p.parent for p in run.rglob("*tfevents*") if p.is_file()})


def first_nonfinite(run: Path) -> FirstBad | None:
    """The lowest step at which any event folder under ``run`` has a non-finite scalar
    (ties broken by tag name), read with EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: list[FirstBad] = []
    for folder in event_folders(run):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for event in acc.Scalars(tag):
                if not math.isfinite(event.value):
                    found.append(FirstBad(event.step, tag, event.value,
                                          str(folder.relative_to(run))))
                    break
    return min(found, key=lambda f: (f.step, f.tag)) if found else None


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of every event folder, keyed ``folder:tag``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for folder in event_folders(run):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out[f"{folder.relative_to(run)}:{tag}"] = [(e.step, e.value)
                                                       for e in acc.Scalars(tag)]
    return out
