"""The dashboard's first paint: the Runs table and a run's analysis come from the fast path
(read, align, locate, rank: what ``forensics analyze --no-replay`` gives), torch waits for
a page that needs it, and a run's replay runs in the background, once, and then shows.

The speed itself is measured in bench/paint.py, not here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "app" / "streamlit_app.py"
SAMPLES = ROOT / "sample_runs"
TIMEOUT = 300.0
REPLAY_WAIT_S = 600.0
"""How long a test waits for a background replay before calling it lost (not a timing)."""

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest  # noqa: E402

TIE_BROKEN_BY_REPLAY = "nan_in_batch"
"""A sample whose top causes tie without its replay and which the replay settles."""


def _captured_failure() -> str:
    if (SAMPLES / TIE_BROKEN_BY_REPLAY / "capture").is_dir():
        return TIE_BROKEN_BY_REPLAY
    for path in sorted(SAMPLES.glob("*/scenario.json")):
        sc = json.loads(path.read_text())
        if sc.get("capture") and sc["expected"]["first_nonfinite_step"] is not None:
            return path.parent.name
    pytest.skip("sample_runs/ holds no failed run with a capture")


@pytest.fixture()
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A failed sample run with a capture, and the healthy control, without their
    checkpoints (whose scan needs torch)."""
    out = tmp_path / "runs"
    for name in (_captured_failure(), "healthy_control"):
        shutil.copytree(SAMPLES / name, out / name,
                        ignore=shutil.ignore_patterns("checkpoints", "__pycache__"))
    monkeypatch.setenv("FORENSICS_RUNS", str(out))
    yield out


def _table(at: AppTest) -> Any:
    assert not at.exception, [e.value for e in at.exception]
    return next(f.value for f in at.dataframe if "replay" in f.value.columns).set_index("run")


def test_runs_page_shows_rows_from_the_fast_path_without_replaying(root: Path) -> None:
    from app import data

    failed = _captured_failure()
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    table = _table(at)
    # Streamlit writes a page's bare top-level strings: none of the page's notes shows.
    assert not [m.value for m in at.markdown if "run_row" in m.value]
    assert table.loc[failed, "status"] == "failed"
    assert isinstance(table.loc[failed, "cause"], str) and table.loc[failed, "cause"]
    assert table.loc[failed, "replay"] == data.NOT_REPLAYED
    refs = data.list_runs(data.root())
    assert not isinstance(refs, str)
    ref = next(r for r in refs if r.name == failed)
    assert data.replay_state(ref) == "pending"
    healthy = next(r for r in refs if r.name == "healthy_control")
    assert data.replay_state(healthy) == "none"


_NO_TORCH = r"""
import json
import sys
from concurrent.futures import Future
from streamlit.testing.v1 import AppTest
from app import data
queued = []
def held(capture, digest, paths):  # the replay is queued, not run: it would import torch
    queued.append(capture)
    return Future()
data.replays.submit = held
at = AppTest.from_file(sys.argv[1], default_timeout=300).run()
assert not at.exception, [e.value for e in at.exception]
rows = [f.value for f in at.dataframe if "replay" in f.value.columns][0]
after_runs = "torch" in sys.modules
at.query_params["run"] = sys.argv[2]
at.switch_page("app_pages/run.py").run()
assert not at.exception, [e.value for e in at.exception]
headline = [m.value for m in at.markdown if m.value.startswith(f"**{sys.argv[2]}**")]
after_page = "torch" in sys.modules
refs = data.list_runs(data.root())
loaded = [data.load_fast(r, refs) for r in refs]
after_fast = "torch" in sys.modules
del data.replays.submit  # the real queue again
data.load(next(r for r in refs if r.name == sys.argv[2]), refs)  # replays: torch comes
print(json.dumps({"rows": len(rows), "runs": after_runs, "fast": after_fast,
                  "page": after_page, "headline": headline, "queued": len(queued),
                  "full": "torch" in sys.modules,
                  "results": [x.result is not None for x in loaded]}))
"""


def test_first_paint_imports_no_torch(root: Path) -> None:
    # A fresh interpreter: the test process has imported torch long ago.
    out = subprocess.run([sys.executable, "-c", _NO_TORCH, str(ENTRY), _captured_failure()],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["rows"] == 2 and all(seen["results"]), seen
    assert not seen["runs"], "the Runs page imported torch"
    assert not seen["fast"], "load_fast imported torch"
    assert seen["headline"] and not seen["page"], "a run page's first render imported torch"
    assert seen["queued"] == 1, "the run page queues the replay"
    assert seen["full"], "the full analysis replays, which needs torch"


def test_background_replay_lands_once_and_then_shows(root: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from analyzer import pipeline
    from app import data

    calls: list[str] = []
    real = pipeline.attempt_replay

    def counted(capture: str, **kw: Any) -> Any:
        calls.append(capture)
        return real(capture, **kw)

    monkeypatch.setattr(pipeline, "attempt_replay", counted)
    failed = _captured_failure()
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    assert _table(at).loc[failed, "replay"] == data.NOT_REPLAYED
    refs = data.list_runs(data.root())
    assert not isinstance(refs, str)
    ref = next(r for r in refs if r.name == failed)
    fast = data.load_fast(ref, refs).result
    assert fast is not None and fast.replay is None
    assert data.start_replay(ref) == "pending"
    capture = data.capture_of(fast)
    assert capture is not None
    data.replays.submit(capture, ref.digest, ()).result(timeout=REPLAY_WAIT_S)  # queued
    assert data.replay_state(ref) == "done"
    assert data.start_replay(ref) == "done"  # kept: not replayed again
    full = data.load_fast(ref, refs).result
    assert full is not None and full.replay is not None
    again = data.load(ref, refs).result
    assert again is not None and again.replay is not None  # NaN stats: no == on the whole
    assert (again.replay.phase, again.replay.verdict.kind) == (full.replay.phase,
                                                               full.replay.verdict.kind)
    assert [f.code for f in again.findings] == [f.code for f in full.findings]
    at.run()  # the table made again holds the replay's verdict and place
    row = _table(at).loc[failed]
    assert row["replay"] not in (None, data.NOT_REPLAYED) and full.replay.verdict.kind in row[
        "replay"]
    from analyzer.wording import failing_place, place_words

    place = failing_place(full)
    if place is not None:
        assert row["layer"] == place_words(place, "cell")
    assert calls == [capture], calls


def test_runs_table_fills_as_runs_are_read(root: Path) -> None:
    # Before: the table came whole, after every run was read and replayed, behind a bar.
    from app import data

    data.list_runs.clear()
    refs = data.list_runs(data.root())
    assert not isinstance(refs, str) and len(refs) == 2
    seen: list[tuple[int, list[str], list[str]]] = []

    def partial(rows: Any, done: int) -> None:
        seen.append((done, list(rows["run"]), list(rows["status"])))

    table = data.runs_table(refs, partial=partial)
    names = [r.name for r in refs]
    assert seen[0] == (0, names, [data.NOT_READ, data.NOT_READ])
    assert seen[1][0] == 1 and seen[1][1] == names
    assert seen[1][2][0] in ("failed", "finite") and seen[1][2][1] == data.NOT_READ
    assert list(table["run"]) == names  # the discovery's order, kept
    assert data.NOT_READ not in set(table["status"])


def test_run_page_paints_before_the_replay_then_shows_it(root: Path) -> None:
    from analyzer.wording import cause_words, failing_place, place_words
    from app import data

    failed = _captured_failure()
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.query_params["run"] = failed
    at.switch_page("app_pages/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(c.value.startswith("Replaying") for c in at.caption)
    (before,) = [m.value for m in at.markdown if m.value.startswith(f"**{failed}**")]
    data.replays.drain(timeout=REPLAY_WAIT_S)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not any(c.value.startswith("Replaying") for c in at.caption)
    refs = data.list_runs(data.root())
    assert not isinstance(refs, str)
    full = data.load(next(r for r in refs if r.name == failed), refs).result
    assert full is not None and full.replay is not None
    place = failing_place(full)
    (line,) = [m.value for m in at.markdown if m.value.startswith(f"**{failed}**")]
    if place is not None:
        assert place_words(place, mark="**") in line
    assert cause_words(full.findings) in line
    if failed == TIE_BROKEN_BY_REPLAY:  # the replay changed what the headline says
        assert line != before


def test_replays_run_once_each_the_last_asked_first_and_survive_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from analyzer import pipeline
    from app import data

    started = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def fake(capture: str, **kw: Any) -> Any:
        order.append(capture)
        if capture == "first":
            started.set()
            release.wait(REPLAY_WAIT_S)
        if capture == "crash":
            raise SystemExit(3)  # what hostile code might do; the worker must live on
        return None, f"replayed {capture}", None

    monkeypatch.setattr(pipeline, "attempt_replay", fake)
    queue = data._Replays()
    first = queue.submit("first", "d", ())
    assert started.wait(REPLAY_WAIT_S)
    later = [queue.submit(name, "d", ()) for name in ("older", "crash", "newest")]
    assert queue.submit("older", "d", ()) is later[0]  # queued once
    release.set()
    queue.drain(timeout=REPLAY_WAIT_S)
    assert order == ["first", "newest", "crash", "older"]
    assert first.result().error == "replayed first"
    assert "SystemExit" in str(later[1].result().error)
    assert queue.done("older", "d") is not None and queue.finished == 4
    again = queue.submit("older", "d", ())
    assert again.done() and order.count("older") == 1
