"""Records as tidy pandas DataFrames (long format: one row per point)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.model import Report, Run

SCALAR_COLUMNS = ["run", "tag", "step", "value", "wall_time", "source", "position"]
INCIDENT_COLUMNS = ["run", "tag", "step", "kind", "last_finite_step", "layer", "file",
                    "offset", "line", "first"]


def scalars_frame(runs: list[Run]) -> pd.DataFrame:
    parts = []
    for run in runs:
        for s in run.series:
            n = len(s)
            parts.append(pd.DataFrame({
                "run": np.full(n, run.name, dtype=object),
                "tag": np.full(n, s.tag, dtype=object),
                "step": s.steps,
                "value": s.values,
                "wall_time": s.wall_times,
                "source": np.full(n, s.source, dtype=object),
                "position": s.positions,
            }))
    if not parts:
        return pd.DataFrame({c: [] for c in SCALAR_COLUMNS})
    frame = pd.concat(parts, ignore_index=True)
    for col in ("run", "tag", "source"):
        frame[col] = frame[col].astype("category")
    return frame


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
    return pd.DataFrame(rows, columns=INCIDENT_COLUMNS)
