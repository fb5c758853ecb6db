"""The JSON report written in pieces is the document json.dumps writes whole."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from analyzer import api
from analyzer.model import Report
from analyzer.report.json import json_chunks, to_dict, to_json


@pytest.fixture(scope="module")
def report() -> Report:
    return api.analyze("sample_runs", replay=False)


@pytest.mark.parametrize("keep", [slice(0, 0), slice(0, 1), slice(1, 4), slice(None)])
def test_the_pieces_are_the_whole_document(report: Report, keep: slice) -> None:
    part = replace(report, results=report.results[keep])
    whole = json.dumps(to_dict(part), indent=2, allow_nan=False)
    assert to_json(part) == whole
    assert json.loads(whole)["failed"] == part.failed  # the report's own derived values
    pieces = list(json_chunks(part))
    assert len(pieces) == (len(part.results) + 2 if part.results else 1)


def test_a_run_is_encoded_when_its_piece_is_asked_for(report: Report) -> None:
    pieces = json_chunks(report)
    head = next(pieces)
    assert head.endswith('"runs": [\n') and report.results[0].run.name not in head
    assert f'"name": "{report.results[0].run.name}"' in next(pieces)
