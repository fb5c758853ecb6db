"""One metric's curve from a run's series: the training series of a role, the tag among
them with the most points, and their values merged on one step axis.

The align stage matches a log's curve with its event files' this way, and the rules read
the loss, gradient-norm and learning-rate curves the same way, so both pick the same tag.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from analyzer.model import FloatArray, IntArray, Series
from analyzer.tags import TagRole, is_validation, role


def training(series: Iterable[Series], wanted: TagRole) -> list[Series]:
    """The non-empty series of one role from the training pass (validation tags left out)."""
    return [s for s in series if role(s.tag) is wanted and not is_validation(s.tag) and len(s)]


def most_points(pick: Sequence[Series]) -> list[Series]:
    """The series of the tag with the most points among ``pick`` (on a tie, the last name);
    empty when ``pick`` is."""
    by_tag: dict[str, list[Series]] = {}
    for s in pick:
        by_tag.setdefault(s.tag, []).append(s)
    if not by_tag:
        return []
    return by_tag[max(by_tag, key=lambda t: (sum(len(s) for s in by_tag[t]), t))]


def last_per_step(series: Sequence[Series]) -> tuple[IntArray, FloatArray]:
    """The points of ``series`` in step order, the value written last kept where a step
    repeats (a restarted writer, a tag in two files)."""
    steps = np.concatenate([s.steps for s in series]).astype(np.int64)
    values = np.concatenate([s.values for s in series]).astype(np.float64)
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    last = np.r_[steps[1:] != steps[:-1], True]
    return steps[last], values[last]
