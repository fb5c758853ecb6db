"""Golden reports: ``forensics analyze`` on each sample run, text and JSON, against the files
committed under ``tests/golden/``.

The reports are deterministic (seeded runs, replay on CPU), so any difference is a change of
behaviour: a deliberate one is taken with ``make golden``, which rewrites the files for the
diff to be read in review. What depends on the machine, not on the tool, is normalised: the folders
torch and the project lie in (replay names source lines in both) and the tool's version.

What depends on the processor is allowed for in the JSON: torch's CPU kernels pick their
vector width (AVX2, AVX-512) at run time, and a float32 sum taken in another order differs in
its last digits, an overflowing one may be ``inf - inf = nan`` on one machine where it stays
``inf`` on another. So numbers agree within :data:`REL`, a tensor's non-finite values are
compared as one count, and a replay pass's fingerprint (a hash of its values, compared between
passes on one machine) only by its form. The text report is compared byte for byte.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import re
from pathlib import Path

import pytest

from analyzer import cli

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
SAMPLES = sorted(p.name for p in (ROOT / "sample_runs").iterdir() if p.is_dir())
UPDATE = os.environ.get("FORENSICS_GOLDEN") == "update"
REL, ABS = 1e-4, 1e-7
"""How far a number may move between processors: float32 kernels reordered."""
NONFINITE = ("nan", "posinf", "neginf")


def machine_differences(want: object, got: object, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want`` by more than another processor explains."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        if all(k in want and k in got for k in NONFINITE):
            if sum(want[k] for k in NONFINITE) != sum(got[k] for k in NONFINITE):
                out.append(f"{path}: {[want[k] for k in NONFINITE]} non-finite (nan, +inf, "
                           f"-inf), now {[got[k] for k in NONFINITE]}")
            want = {k: v for k, v in want.items() if k not in NONFINITE}
            got = {k: v for k, v in got.items() if k not in NONFINITE}
        for key in sorted(set(want) | set(got)):
            if key not in want or key not in got:
                out.append(f"{path}/{key}: {'added' if key in got else 'removed'}")
            elif key == "fingerprint" and isinstance(want[key], str) \
                    and isinstance(got[key], str):
                if not re.fullmatch(r"[0-9a-f]{16}", got[key]):
                    out.append(f"{path}/{key}: {got[key]!r} is not a fingerprint")
            else:
                out += machine_differences(want[key], got[key], f"{path}/{key}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items, now {len(got)}"]
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True))
                for d in machine_differences(w, g, f"{path}[{i}]")]
    numbers = (int, float)
    if isinstance(want, numbers) and isinstance(got, numbers) \
            and not isinstance(want, bool) and not isinstance(got, bool):
        if want == got or math.isclose(want, got, rel_tol=REL, abs_tol=ABS):
            return []
    elif type(want) is type(got) and want == got:
        return []
    return [f"{path}: {want!r}, now {got!r}"]


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
        if got == want:
            continue
        if path.suffix == ".json":
            differences = machine_differences(json.loads(want), json.loads(got))
            if differences:
                shown = "\n".join(differences[:40])
                pytest.fail(f"{path.name} differs ('make golden' takes it):\n{shown}")
        else:
            diff = difflib.unified_diff(
                want.splitlines(), got.splitlines(), "golden", "now", n=1, lineterm=""
            )
            shown = "\n".join(itertools.islice(diff, 60))
            pytest.fail(f"{path.name} differs ('make golden' takes it):\n{shown}")


def test_machine_differences_allow_only_what_a_processor_changes() -> None:
    stats = {"nan": 320, "posinf": 0, "neginf": 0, "absmin": 0.32628491520881653}
    same = {"nan": 0, "posinf": 288, "neginf": 32, "absmin": 0.3262850046157837}
    assert machine_differences({"t": stats, "fingerprint": "77ca231ade8b86ec"},
                               {"t": same, "fingerprint": "7a36b43bcab21a4d"}) == []
    assert machine_differences(stats, {**same, "posinf": 287}) == \
        [": [320, 0, 0] non-finite (nan, +inf, -inf), now [0, 287, 32]"]
    assert machine_differences({"a": 0.326}, {"a": 0.327}) == ["/a: 0.326, now 0.327"]
    assert machine_differences({"a": [1, 2]}, {"a": [1]}) == ["/a: 2 items, now 1"]
    assert machine_differences({"a": "x"}, {"b": "x"}) == ["/a: removed", "/b: added"]
    assert machine_differences({"fingerprint": "77ca231ade8b86ec"},
                               {"fingerprint": "none"}) == ["/fingerprint: 'none' is not a "
                                                            "fingerprint"]
    assert machine_differences({"ok": True}, {"ok": 1}) == ["/ok: True, now 1"]


def test_every_golden_file_has_its_sample_run() -> None:
    # A renamed or removed sample run leaves no stale golden file behind.
    stems = {p.name.rsplit(".", 1)[0] for p in GOLDEN.glob("*.*")}
    assert stems <= set(SAMPLES)
