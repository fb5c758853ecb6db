"""Golden reports: ``forensics analyze`` on each sample run, text and JSON, against the files
committed under ``tests/golden/``.

The reports are deterministic (seeded runs, replay on CPU), so any difference is a change of
behaviour: a deliberate one is taken with ``make golden``, which rewrites the files for the
diff to be read in review. What depends on the machine, not on the tool, is normalised: the folders
torch and the project lie in (replay names source lines in both) and the tool's version.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
from pathlib import Path

import pytest

from analyzer import cli

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
SAMPLES = sorted(p.name for p in (ROOT / "sample_runs").iterdir() if p.is_dir())
UPDATE = os.environ.get("FORENSICS_GOLDEN") == "update"


def _torch_dirs() -> list[str]:
    import torch

    folder = os.path.dirname(os.path.abspath(torch.__file__))
    return [folder, os.path.relpath(folder, ROOT)]


def normalise(text: str) -> str:
    """``text`` with the machine's torch folder as ``<torch>`` and the project's own as
    ``<root>`` (replay names the source lines of both)."""
    absolute, relative = _torch_dirs()
    text = text.replace(absolute + os.sep, "<torch>/").replace(str(ROOT) + os.sep, "<root>/")
    return text.replace(relative + os.sep, "<torch>/")


def _report(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "report.json"
    code = cli.main(["analyze", f"sample_runs/{name}", "--json", str(out)])
    text = capsys.readouterr().out
    assert code in (0, 1), text
    report = json.loads(out.read_text())
    report["tool_version"] = "<version>"
    return normalise(text), normalise(json.dumps(report, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", SAMPLES)
def test_golden_report(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, report = _report(name, tmp_path, capsys, monkeypatch)
    files = {GOLDEN / f"{name}.txt": text, GOLDEN / f"{name}.json": report}
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        for path, got in files.items():
            path.write_text(got)
        return
    for path, got in files.items():
        assert path.exists(), f"no golden file {path.name}: run 'make golden'"
        want = path.read_text()
        if got != want:
            diff = difflib.unified_diff(
                want.splitlines(), got.splitlines(), "golden", "now", n=1, lineterm=""
            )
            shown = "\n".join(itertools.islice(diff, 60))
            pytest.fail(f"{path.name} differs ('make golden' takes it):\n{shown}")


def test_every_golden_file_has_its_sample_run() -> None:
    # A renamed or removed sample run leaves no stale golden file behind.
    stems = {p.name.rsplit(".", 1)[0] for p in GOLDEN.glob("*.*")}
    assert stems <= set(SAMPLES)
