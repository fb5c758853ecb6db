"""Records as tidy pandas DataFrames (long format: one row per point)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.model import Report, Run
from analyzer.model.fleet import SweepSummary

SCALAR_COLUMNS = ["run", "tag", "step", "value", "wall_time", "source", "position"]
INCIDENT_COLUMNS = ["run", "tag", "step", "kind", "last_finite_step", "layer", "file",
                    "offset", "line", "first"]


def scalars_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per scalar point; run, tag and source are categoricals built from codes."""
    series = [(run.name, s) for run in runs for s in run.series]
    if not series:
        return pd.DataFrame({c: [] for c in SCALAR_COLUMNS})
    sizes = np.array([len(s) for _, s in series], dtype=np.int64)

    def categorical(labels: list[str]) -> pd.Categorical:
        categories, codes = np.unique(np.asarray(labels, dtype=object), return_inverse=True)
        return pd.Categorical.from_codes(np.repeat(codes.reshape(-1), sizes),
                                         categories=categories.tolist())

    return pd.DataFrame({
        "run": categorical([name for name, _ in series]),
        "tag": categorical([s.tag for _, s in series]),
        "step": np.concatenate([s.steps for _, s in series]),
        "value": np.concatenate([s.values for _, s in series]),
        "wall_time": np.concatenate([s.wall_times for _, s in series]),
        "source": categorical([s.source for _, s in series]),
        # int64 whatever each series holds (an event file's offsets may be int32)
        "position": np.concatenate([s.positions for _, s in series]).astype(np.int64,
                                                                           copy=False),
    })


def incidents_frame(report: Report) -> pd.DataFrame:
    rows = []
    for result in report.results:
        for inc in result.tag_incidents:
            rows.append({
                "run": result.run.name, "tag": inc.tag, "step": inc.step, "kind": inc.kind,
                "last_finite_step": inc.last_finite_step, "layer": inc.layer,
                "file": inc.location.file, "offset": inc.location.offset,
                "line": inc.location.line,
                "first": result.incident is not None and inc.tag == result.incident.tag,
            })
    frame = pd.DataFrame(rows, columns=INCIDENT_COLUMNS)
    # Steps are whole numbers that may be missing: pandas' nullable integers keep both.
    return frame.astype({"step": "Int64", "last_finite_step": "Int64"})


RUN_COLUMNS = ["run", "path", "status", "cause", "causes", "first_step"]
CAUSE_COLUMNS = ["code", "name", "runs", "tied"]
STEP_COLUMNS = ["low", "high", "runs"]
SEPARATOR_COLUMNS = ["key", "kind", "test", "runs", "failed", "p_value", "p_adjusted",
                     "significant", "failing", "other"]


def summary_frames(summary: SweepSummary) -> dict[str, pd.DataFrame]:
    """A sweep summary as frames: ``runs`` (one row per run, its hyperparameters as
    columns after the fixed ones; ``causes`` the tuple of its tied top causes, ``cause``
    the first), ``causes``, ``steps`` (the histogram's bins) and
    ``separators`` (every key tested, the effect's two sides as text)."""
    from analyzer.report.summary import side_text

    keys = sorted({k for r in summary.rows for k in r.hyperparameters})
    fixed = [k for k in keys if k in RUN_COLUMNS]  # a key named like a fixed column
    runs = pd.DataFrame([{"run": r.name, "path": r.path, "status": r.status, "cause": r.cause,
                          "causes": r.causes, "first_step": r.first_step,
                          **{(f"hp.{k}" if k in fixed else k): r.hyperparameters.get(k)
                             for k in keys}}
                         for r in summary.rows],
                        columns=RUN_COLUMNS + [f"hp.{k}" if k in fixed else k for k in keys])
    runs = runs.astype({"first_step": "Int64"})
    causes = pd.DataFrame([{"code": c.code, "name": c.name, "runs": c.runs, "tied": c.tied}
                           for c in summary.causes], columns=CAUSE_COLUMNS)
    steps = pd.DataFrame([{"low": b.low, "high": b.high, "runs": b.runs}
                          for b in summary.steps.bins], columns=STEP_COLUMNS)
    separators = pd.DataFrame([{
        "key": s.key, "kind": s.kind, "test": s.test, "runs": s.runs, "failed": s.failed,
        "p_value": s.p_value, "p_adjusted": s.p_adjusted, "significant": s.significant,
        "failing": side_text(s.key, s.failing), "other": side_text(s.key, s.other),
    } for s in summary.separators], columns=SEPARATOR_COLUMNS)
    return {"runs": runs, "causes": causes, "steps": steps, "separators": separators}
