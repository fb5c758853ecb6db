"""What the Fleet page shows, reshaped from a sweep summary: plain values, no Streamlit.

The summary (:func:`analyzer.fleet.summary.summarize`) has decided everything: the counts,
the causes ranked, the tests and their effects. This module only picks and reshapes: the
rows of its tables, the runs a cause filter keeps, the values a strip chart draws, and the
choice of a log axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.frames import RUN_COLUMNS
from analyzer.model.fleet import CauseCount, HyperValue, Separator, SweepSummary
from analyzer.report.summary import effect

EVERY_CAUSE = "every cause"
HEALTHY = "healthy"
"""A run that ran to its end with every value finite (status ``finite``)."""


def cause_label(cause: CauseCount) -> str:
    """``NF202 lr-too-high``; the failed runs without a cause by their name alone."""
    return f"{cause.code} {cause.name}" if cause.code else cause.name


def cause_rows(summary: SweepSummary) -> list[dict[str, object]]:
    """The causes, most runs first, with their share of the failed runs."""
    return [{"cause": cause_label(c), "runs": c.runs,
             "share of failed": c.runs / summary.failed if summary.failed else 0.0,
             "tied": c.tied} for c in summary.causes]


def cause_code(summary: SweepSummary, label: str) -> str | None:
    """The rule code of the cause labelled ``label`` (None: no cause named); KeyError when
    no cause has that label."""
    for c in summary.causes:
        if cause_label(c) == label:
            return c.code
    raise KeyError(label)


def p_text(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def separator_rows(summary: SweepSummary) -> list[dict[str, object]]:
    """One row per key tested, the smallest adjusted p first: the test, on how many runs,
    its p-values, whether it separates at the summary's level, and its effect in words."""
    return [{"key": s.key, "test": "Mann-Whitney U" if s.test == "mann-whitney" else
             "Fisher's exact", "runs": s.runs, "failed": s.failed,
             "p": p_text(s.p_value), "p (Holm)": p_text(s.p_adjusted),
             "separates": "yes" if s.significant else "not significant",
             "effect": effect(s)} for s in summary.separators]


def separating_keys(summary: SweepSummary) -> list[str]:
    return [s.key for s in summary.separators if s.significant]


def top_numeric(summary: SweepSummary) -> Separator | None:
    """The separating number with the smallest adjusted p, which the strip chart draws."""
    return next((s for s in summary.separators if s.significant and s.kind == "number"), None)


def _number(value: HyperValue | None) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Strip:
    """Each judged run's value of one key, by outcome (``failed`` or ``healthy``)."""

    key: str
    values: Mapping[str, list[float]]
    names: Mapping[str, list[str]]
    cut: float | None
    log: bool


def spans_decades(values: Sequence[float]) -> bool:
    """A log axis when every value is positive and they span two decades or more."""
    vals = np.asarray(values, dtype=np.float64)
    if vals.size < 2 or (vals <= 0).any():
        return False
    return bool(vals.max() / vals.min() >= 100.0)


def strip(summary: SweepSummary, separator: Separator) -> Strip:
    """The values of ``separator``'s key in the failed and the healthy runs, and the cut
    between its two sides (midway, or at the geometric mean on a log axis)."""
    values: dict[str, list[float]] = {"failed": [], HEALTHY: []}
    names: dict[str, list[str]] = {"failed": [], HEALTHY: []}
    for row in summary.rows:
        outcome = {"failed": "failed", "finite": HEALTHY}.get(row.status)
        x = _number(row.hyperparameters.get(separator.key))
        if outcome is None or x is None:
            continue
        values[outcome].append(x)
        names[outcome].append(row.name)
    log = spans_decades(values["failed"] + values[HEALTHY])
    a, b = _number(separator.failing.value), _number(separator.other.value)
    cut = None
    if a is not None and b is not None:
        cut = math.sqrt(a * b) if log and a > 0 and b > 0 else (a + b) / 2
    return Strip(separator.key, values, names, cut, log)


def fleet_runs(runs: pd.DataFrame, summary: SweepSummary, keys: Sequence[str],
               cause: str | None = EVERY_CAUSE,
               ties: Mapping[str, tuple[str, ...]] | None = None) -> pd.DataFrame:
    """The runs table: run, status, cause (labelled as the causes table labels it), first
    step and each separating key, keeping only the failed runs of ``cause`` when one is
    chosen (a rule code, or None for the failed runs without a named cause).

    ``ties`` (a run's path: the codes of its top causes, when several tie) lets a run count
    under each cause it ties on, as the causes table counts it; without it a run is under
    its first cause only."""
    labels = {c.code: cause_label(c) for c in summary.causes if c.code}
    unnamed = next((cause_label(c) for c in summary.causes if c.code is None), None)
    codes = [ties[p] if ties and p in ties else ((c,) if isinstance(c, str) else ())
             for p, c in zip(runs["path"], runs["cause"], strict=True)]
    out = pd.DataFrame({
        "run": runs["run"],
        "status": runs["status"],
        "cause": [", ".join(labels.get(c, c) for c in mine) if mine else
                  (unnamed if status == "failed" else None)
                  for mine, status in zip(codes, runs["status"], strict=True)],
        "first_step": runs["first_step"],
    })
    for key in keys:
        column = f"hp.{key}" if key in RUN_COLUMNS else key  # as summary_frames names it
        if column in runs.columns:
            out[key] = runs[column]
    if cause != EVERY_CAUSE:
        keep = [status == "failed" and (cause in mine if cause is not None else not mine)
                for mine, status in zip(codes, runs["status"], strict=True)]
        out = out[keep]
    return out.reset_index(drop=True)
