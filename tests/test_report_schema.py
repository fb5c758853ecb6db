"""The JSON report against its written schema, docs/report.schema.json.

The schema is generated from the records (analyzer.model.schema); the committed file must
be what the records give today, and every report, the golden ones and reports of damaged
and refused runs, must validate against it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from analyzer.api import analyze
from analyzer.model import SCHEMA_VERSION
from analyzer.model.schema import report_schema
from analyzer.report import to_dict

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "docs" / "report.schema.json"
GOLDEN = sorted((Path(__file__).resolve().parent / "golden").glob("*.json"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_committed_schema_is_the_one_the_records_give() -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == report_schema(), (
        "docs/report.schema.json is stale: run 'make golden'")


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_reports_validate(path: Path, validator: jsonschema.protocols.Validator) -> None:
    report = json.loads(path.read_text())
    assert report["schema_version"] == SCHEMA_VERSION
    validator.validate(report)


def _valid(report: Any, validator: jsonschema.protocols.Validator) -> dict[str, Any]:
    data = json.loads(json.dumps(to_dict(report), allow_nan=False))
    validator.validate(data)
    return data


def _events(folder: Path, values: list[float]) -> None:
    writer = SummaryWriter(str(folder))
    for step, value in enumerate(values):
        writer.add_scalar("train/loss", value, step)
    writer.close()


def test_regression_checkpoint_issue_listed_once_in_one_shape(
    tmp_path: Path, validator: jsonschema.protocols.Validator
) -> None:
    # A half-written checkpoint: its read issue used to stand under runs[].issues,
    # checkpoints.issues and checkpoints.scans[].issues, in two shapes.
    run = tmp_path / "run"
    _events(run, [1.0, 0.9, 0.8])
    torch.save({"w": torch.ones(3)}, run / "step_2.pt")
    data = (run / "step_2.pt").read_bytes()
    (run / "step_2.pt").write_bytes(data[: len(data) // 2])
    report = _valid(analyze([str(run)], replay=False), validator)
    (result,) = report["runs"]
    text = json.dumps(report)
    assert text.count("incomplete checkpoint") == 1
    (issue,) = result["issues"]
    assert issue["kind"] == "truncated"
    assert issue["location"] == {"file": str(run / "step_2.pt"), "offset": issue["location"][
        "offset"], "line": None}
    assert "issues" not in result["checkpoints"]
    assert all("issues" not in scan for scan in result["checkpoints"]["scans"])


def test_reports_of_refused_unreadable_and_passed_over_runs_validate(
    tmp_path: Path, validator: jsonschema.protocols.Validator
) -> None:
    # A sample run whose capture names code nobody trusted, an unreadable run and a
    # symlinked folder the walk does not follow: each part of the report that the golden
    # reports leave empty.
    refused = tmp_path / "refused"
    shutil.copytree(ROOT / "sample_runs" / "division_by_zero", refused)
    (meta_path,) = refused.glob("capture/step_*/meta.json")
    meta = json.loads(meta_path.read_text())
    meta["model"]["factory"] = "os:system"
    meta_path.write_text(json.dumps(meta))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "events.out.tfevents.1.host").write_bytes(b"")
    os.symlink(refused, tmp_path / "link")
    report = _valid(analyze([str(tmp_path)]), validator)
    by_name = {r["name"]: r for r in report["runs"]}
    assert by_name["refused"]["replay_refused"]["target"] == "os:system"
    assert by_name["empty"]["status"] == "unreadable"
    assert [i["kind"] for i in report["issues"]] == ["not_followed"]


def test_a_changed_record_fails_validation(validator: jsonschema.protocols.Validator) -> None:
    # The schema is closed: a key the records do not have, or one missing, is an error.
    report = json.loads(GOLDEN[0].read_text())
    report["runs"][0]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(report)
    del report["runs"][0]["surprise"]
    del report["runs"][0]["incident"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(report)
