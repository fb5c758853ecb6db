"""The public API: pinned names, lazy imports, DataFrames."""

from __future__ import annotations

import subprocess
import sys

import analyzer

PUBLIC = [
    "Event", "EventFile", "ForensicsError", "Histogram", "Incident", "IngestIssue", "Location",
    "ReadError", "Report", "Run", "RunFiles", "RunResult", "SCHEMA_VERSION", "Series",
    "UsageError", "analyze", "find_runs", "incidents", "layer_from_tag", "locate", "read",
    "read_event_file", "scalars", "tool_version",
]


def test_all_is_pinned_and_resolves() -> None:
    assert sorted(analyzer.__all__) == sorted(PUBLIC)
    for name in analyzer.__all__:
        assert getattr(analyzer, name) is not None


def test_import_is_cheap() -> None:
    code = ("import sys, analyzer; heavy = [m for m in ('numpy', 'torch', 'pandas', 'streamlit')"
            " if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout


def test_dataframes(summary_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    summary_run({"train/loss": [1.0, 0.5, float("nan")], "lr": [0.1, 0.1, 0.1]}, name="a")
    summary_run({"train/loss": [2.0, 1.0]}, name="b")
    frame = analyzer.scalars(str(tmp_path))
    assert list(frame.columns) == ["run", "tag", "step", "value", "wall_time", "source",
                                   "position"]
    assert len(frame) == 8
    loss_a = frame[(frame["run"] == "a") & (frame["tag"] == "train/loss")]
    assert loss_a["step"].tolist() == [0, 1, 2] and loss_a["value"].isna().tolist()[-1]
    report = analyzer.analyze(str(tmp_path), replay=False)
    incidents = analyzer.incidents(report)
    first = incidents[incidents["first"]]
    assert first[["run", "tag", "step", "kind"]].values.tolist() == [["a", "train/loss", 2,
                                                                      "nan"]]
