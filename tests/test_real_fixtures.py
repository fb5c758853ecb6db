"""Event files from real projects parse with no issue and agree with their provenance."""

from __future__ import annotations

import json
import os

import pytest

from analyzer.api import analyze
from analyzer.ingest.tb import read_event_file
from tests.conftest import REAL_FIXTURES

SOURCES = os.path.join(REAL_FIXTURES, "sources.json")
pytestmark = pytest.mark.skipif(not os.path.exists(SOURCES),
                                reason="the shared real event-file fixtures are not present")


def _entries() -> list[dict]:  # type: ignore[type-arg]
    if not os.path.exists(SOURCES):
        return []
    with open(SOURCES, encoding="utf-8") as fh:
        return list(json.load(fh))


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["file"].split("/")[0])
def test_real_file_matches_sources(entry: dict) -> None:  # type: ignore[type-arg]
    path = os.path.join(REAL_FIXTURES, entry["file"])
    assert os.path.getsize(path) == entry["bytes"]
    result = read_event_file(path)
    assert result.issues == ()
    assert result.records == entry["records"]
    assert result.file_version == entry["file_version"]
    counts = {s.tag: len(s) for s in result.series}
    for tag, desc in entry["scalar_tags"].items():
        assert counts[tag] == int(desc.split()[0]), tag
    assert set(counts) == set(entry["scalar_tags"])
    for tag, desc in entry["scalar_tags"].items():
        if "steps" in desc:
            lo, hi = desc.split("steps ")[1].split("..")
            s = next(s for s in result.series if s.tag == tag)
            assert (int(s.steps.min()), int(s.steps.max())) == (int(lo), int(hi))


def test_real_runs_are_finite() -> None:
    report = analyze(REAL_FIXTURES)
    assert len(report.results) == 3
    assert not report.failed
