"""Shared fixtures: event files written by the real writers into tmp_path."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The trusted folders of `forensics trust` live in the user's configuration folder: the
# tests (and the commands they start) get one of their own, empty at start.
os.environ["FORENSICS_CONFIG_DIR"] = tempfile.mkdtemp(prefix="forensics-config-")
sys.path.insert(0, os.path.join(ROOT, "bench"))  # the event generator benchmarks use

REAL_FIXTURES = os.path.join(os.path.dirname(ROOT), "shared", "fixtures", "real-tfevents")


_MAIN = sys.modules["__main__"]
"""pytest's own __main__, as the session started."""


@pytest.fixture(autouse=True)
def _sys_path_without_repeats() -> Iterator[None]:
    """After each test, sys.path without the repeats of an entry (the first of each kept,
    in order: what an import finds is unchanged). Each run of the dashboard's entry script
    under AppTest puts the repository root on sys.path once more (Streamlit's folder of the
    script goes in front of it, so the script's check that the root leads fails); after the
    app tests' hundreds of runs every lookup along sys.path (each import, the trust
    checks' candidate folders) walked hundreds of copies, and a trust fuzz test took 49 s
    instead of 5."""
    yield
    if len(set(sys.path)) < len(sys.path):
        sys.path[:] = list(dict.fromkeys(sys.path))
    # AppTest runs the entry script as a module named __main__ and leaves it there: a
    # process spawned afterwards (a Dask nanny's worker, a spawn pool) re-ran
    # app/streamlit_app.py as its own __main__ and died before it started.
    if sys.modules.get("__main__") is not _MAIN:
        sys.modules["__main__"] = _MAIN
    # The dashboard replays on a background thread of this process: a replay an app test
    # queued must not run on into the next tests, whose subprocesses and timeouts it would
    # starve of CPU (a pool test's 60 s and torchrun's error files were lost so in a full run).
    # A signal left ignored by a test (a server's or a cluster's own handling) is inherited
    # by every process started afterwards: a child that ignores SIGINT cannot be
    # interrupted, and the test of interrupting a pool waited 60 s for it in a full run.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    data = sys.modules.get("app.data")
    if data is not None:
        data.replays.drain(timeout=600)


def write_summary_run(folder: str, values: dict[str, Sequence[float]], *,
                      start: int = 0) -> str:
    """Write every tag's values at steps start, start+1, ... with torch's SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(folder)
    length = max(len(v) for v in values.values())
    for i in range(length):
        for tag, vals in values.items():
            if i < len(vals):
                writer.add_scalar(tag, vals[i], start + i)
    writer.close()
    return only_event_file(folder)


def only_event_file(folder: str) -> str:
    files = sorted(glob.glob(os.path.join(folder, "*tfevents*")))
    assert len(files) == 1, files
    return files[0]


@pytest.fixture
def summary_run(tmp_path: object) -> Callable[..., str]:
    def make(values: dict[str, Sequence[float]], name: str = "run", start: int = 0) -> str:
        folder = os.path.join(str(tmp_path), name)
        return write_summary_run(folder, values, start=start)

    return make


SAMPLE_RUNS = os.path.join(ROOT, "sample_runs")


def scenarios() -> dict[str, dict]:  # type: ignore[type-arg]
    """Each sample run's scenario.json, by run folder name."""
    import json

    out = {}
    if os.path.isdir(SAMPLE_RUNS):
        for name in sorted(os.listdir(SAMPLE_RUNS)):
            path = os.path.join(SAMPLE_RUNS, name, "scenario.json")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as fh:
                    out[name] = json.load(fh)
    return out


@pytest.fixture(scope="session")
def sample_report():  # type: ignore[no-untyped-def]
    """The full analysis of sample_runs/ (replay and rules included), computed once."""
    from analyzer.api import analyze

    if not scenarios():
        pytest.skip("sample_runs/ holds no scenario runs")
    return analyze(SAMPLE_RUNS)



SWEEP_TRIALS = 48
"""The most trials a test asks of :func:`sweep_of` (tests/test_sweep.py's sweep)."""
SWEEP_SEED = 0


@pytest.fixture(scope="session")
def sweep_of(tmp_path_factory: pytest.TempPathFactory
             ) -> Callable[[int, str], tuple[Path, dict[str, Any]]]:
    """``sweep_of(n, name)``: a fresh folder ``<name>/runs`` holding the first ``n`` trials of
    one sweep of :mod:`analyzer.scenarios.sweep` (seed SWEEP_SEED), and its manifest, also
    written beside that folder (``<name>/manifest.json``), never inside it.

    The SWEEP_TRIALS trainings are made once per session and each call copies the first
    ``n``: :func:`~analyzer.scenarios.sweep.draw` draws trial after trial from one
    generator, and a trial's training depends on its own keys and the fixed data alone, so
    the first ``n`` trials of the sweep are the sweep of ``n`` (tests/test_sweep.py checks
    this against ``generate``). Each caller gets its own copy: one module's reads cannot
    touch another's folder."""
    import copy
    import json
    import shutil

    pytest.importorskip("analyzer.scenarios.sweep")
    trained: list[tuple[Path, dict[str, Any]]] = []

    def make(runs: int, name: str) -> tuple[Path, dict[str, Any]]:
        assert 0 < runs <= SWEEP_TRIALS, runs
        if not trained:
            from analyzer.scenarios.sweep import generate

            base = tmp_path_factory.mktemp("sweep_trained")
            trained.append((base / "runs", generate(str(base / "runs"), SWEEP_TRIALS,
                                                    SWEEP_SEED, str(base / "manifest.json"))))
        root, document = trained[0]
        manifest = copy.deepcopy({**document, "runs": runs,
                                  "trials": document["trials"][:runs]})
        out = tmp_path_factory.mktemp(name)
        for trial in manifest["trials"]:
            shutil.copytree(root / trial["name"], out / "runs" / trial["name"])
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        return out / "runs", manifest

    return make
