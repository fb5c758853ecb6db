"""Every corpus file through every entry point: no traceback, no exception, nothing written.

Each file of ``tests/fuzz/corpus/`` becomes a run folder of its own (under the name its
target's readers look for), and the folder of all of them is read by ``forensics analyze``,
``forensics inspect`` and ``forensics replay``, by the Python API, by each reader directly
(every file by every reader, whatever its kind: a log fed to the checkpoint scanner, an
event file read as a log) and by the dashboard, page by page.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzer.ingest.checkpoints import is_checkpoint_file
from tests.fuzz.make_corpus import TARGETS, corpus_files

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = ["timeline", "layers", "findings", "replay", "logs"]

_NAMES = {"tfrecord": "events.out.tfevents.{i}.corpus", "logs": "train.log",
          "safetensors": "model.safetensors"}


def _name(target: str, source: str, i: int) -> str:
    """The file name a run would give this input, so that discovery hands it to its reader."""
    base = os.path.basename(source)
    if target == "logs" and base.endswith(".json"):
        return "trainer_state.json"
    if target == "logs" and base.endswith((".log", ".txt", ".out", ".err")):
        return f"train{os.path.splitext(base)[1]}"
    if target == "checkpoints":  # an index names its shards and maybe itself: keep names
        return base if is_checkpoint_file(base) else "model.pt"
    return _NAMES[target].format(i=i)


def _inputs() -> list[tuple[str, str]]:
    return [(t, f) for t in TARGETS for f in corpus_files(t)]


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    inputs = _inputs()
    if not inputs:
        pytest.skip("the fuzz corpus is empty (python -m tests.fuzz.make_corpus)")
    root = tmp_path_factory.mktemp("corpus") / "runs"
    for i, (target, source) in enumerate(inputs):
        run = root / f"{target}-{i:03d}-{os.path.basename(source)}"
        run.mkdir(parents=True)
        shutil.copyfile(source, run / _name(target, source, i))
    yield root


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): "folder" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.fuzz
def test_the_command_line_never_fails_on_a_corpus_file(
        corpus_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analyzer.cli import main

    before = _snapshot(corpus_root)
    assert main(["analyze", str(corpus_root), "-q"]) in (0, 1, 2)
    assert main(["analyze", str(corpus_root), "--json", "-", "--no-verify"]) in (0, 1, 2)
    for run in sorted(corpus_root.iterdir()):
        assert main(["analyze", str(run), "--json", "-"]) in (0, 1, 2), run.name
        for path in _files(run):
            assert main(["inspect", str(path)]) in (0, 1, 2), path
            assert main(["inspect", str(path), "--json"]) in (0, 1, 2), path
        assert main(["replay", str(run)]) in (0, 1, 2), run.name
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    assert _snapshot(corpus_root) == before


@pytest.mark.fuzz
def test_the_python_api_and_every_reader_never_raise_on_a_corpus_file(
        corpus_root: Path, tmp_path: Path) -> None:
    import analyzer
    from analyzer.ingest.checkpoints import scan_checkpoint
    from analyzer.ingest.logs import read_log
    from analyzer.ingest.tb import read_event_file

    before = _snapshot(corpus_root)
    report = analyzer.analyze(str(corpus_root))
    assert len(report.results) == len(list(corpus_root.iterdir()))
    analyzer.incidents(report)
    analyzer.scalars(str(corpus_root))
    for path in _files(corpus_root):
        # Every reader on every file, whatever the file is: a reader given the wrong kind of
        # file reports it, it does not raise.
        read_event_file(str(path))
        scan_checkpoint(str(path))
        as_log = tmp_path / "as.log"
        shutil.copyfile(path, as_log)
        read_log(str(as_log))
        as_state = tmp_path / "trainer_state.json"
        shutil.copyfile(path, as_state)
        read_log(str(as_state))
    assert _snapshot(corpus_root) == before


@pytest.mark.fuzz
def test_the_dashboard_shows_every_corpus_run(corpus_root: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    before = _snapshot(corpus_root)
    monkeypatch.setenv("FORENSICS_RUNS", str(corpus_root))
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=600).run()
    assert not at.exception, [e.value for e in at.exception]
    names = list(at.dataframe[0].value["run"])
    assert len(names) == len(list(corpus_root.iterdir()))
    for name in names:
        at.selectbox(key="run_picker").set_value(name)
        for page in PAGES:
            at.switch_page(f"app_pages/{page}.py").run()
            assert not at.exception, (name, page, [e.value for e in at.exception])
    assert _snapshot(corpus_root) == before
