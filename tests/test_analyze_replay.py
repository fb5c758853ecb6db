"""analyze with captures: a replay that cannot run is reported and everything else stays."""

from __future__ import annotations

import json
import os
import shutil

from analyzer.api import analyze
from analyzer.cli import main
from tests.conftest import SAMPLE_RUNS


def _copy_run(tmp_path, name: str) -> str:  # type: ignore[no-untyped-def]
    dest = os.path.join(str(tmp_path), name)
    shutil.copytree(os.path.join(SAMPLE_RUNS, name), dest)
    return dest


def test_unrebuildable_model_is_reported_and_the_rest_analyzed(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    run = _copy_run(tmp_path, "division_by_zero")
    (capture,) = os.listdir(os.path.join(run, "capture"))
    meta_path = os.path.join(run, "capture", capture, "meta.json")
    with open(meta_path, encoding="utf-8") as fh:
        meta = json.load(fh)
    meta["model"]["factory"] = "lab_models_that_are_gone.nets:make"
    with open(meta_path, "w", encoding="utf-8") as fh:
        json.dump(meta, fh)
    (result,) = analyze(run).results
    assert result.replay is None
    assert result.replay_error is not None and "lab_models_that_are_gone" in result.replay_error
    assert result.incident is not None and result.incident.step == 26
    assert result.run.checkpoints is not None
    # A rule skipped for want of the replay says why it did not run (every rule reads the
    # curves too now); NF102 names the division from what the run left.
    skipped = {s.code: s.reason for s in result.skipped_rules}
    assert all("lab_models_that_are_gone" in reason for reason in skipped.values()
               if reason.startswith("no replay"))
    assert result.findings and result.findings[0].code == "NF102"
    assert main(["analyze", run]) == 1
    out = capsys.readouterr().out
    assert "replay failed:" in out and "lab_models_that_are_gone" in out


def test_replay_leaves_the_run_folder_untouched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = _copy_run(tmp_path, "nan_in_batch")
    before = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime
              for d, _, files in os.walk(run) for f in files}
    (result,) = analyze(run).results
    assert result.replay is not None and result.findings[0].name == "nan-in-batch"
    after = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime
             for d, _, files in os.walk(run) for f in files}
    assert after == before
