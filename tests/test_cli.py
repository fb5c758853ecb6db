"""The command line: exit codes, the JSON report, nothing written, a light start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from analyzer.cli import main
from analyzer.model import SCHEMA_VERSION


def _snapshot(folder: str) -> dict[str, tuple[int, float]]:
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime)
    return out


@pytest.fixture
def runs(tmp_path, summary_run):  # type: ignore[no-untyped-def]
    summary_run({"train/loss": [1.0, 0.5, float("nan")], "grad_norm/fc1.weight": [1, 2, 3]},
                name="sweep/run_0")
    summary_run({"train/loss": [1.0, 0.5, 0.25]}, name="sweep/run_1")
    return tmp_path


def test_exit_1_when_non_finite_and_nothing_written(runs, capsys) -> None:  # type: ignore[no-untyped-def]
    before = _snapshot(str(runs))
    assert main(["analyze", str(runs)]) == 1
    out = capsys.readouterr().out
    assert "sweep/run_0" in out and "FAILED" in out
    assert "step 2  train/loss = nan  (last finite step 1)" in out
    assert _snapshot(str(runs)) == before


def test_exit_0_when_finite(runs, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["analyze", str(runs / "sweep" / "run_1")]) == 0
    assert "1 run: 0 with non-finite values" in capsys.readouterr().out


def test_exit_2_on_missing_path_and_no_runs(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["analyze", str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no runs" in capsys.readouterr().err


def test_json_report(runs, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.json"
    assert main(["analyze", str(runs), "--json", str(out), "-q"]) == 1
    report = json.loads(out.read_text())
    assert report["schema_version"] == SCHEMA_VERSION
    by_name = {r["name"]: r for r in report["runs"]}
    failed = by_name["sweep/run_0"]
    assert failed["status"] == "failed"
    assert failed["incident"]["step"] == 2 and failed["incident"]["kind"] == "nan"
    assert failed["incident"]["last_finite_step"] == 1
    assert failed["incident"]["location"]["offset"] > 0
    assert by_name["sweep/run_1"]["incident"] is None
    capsys.readouterr()
    assert main(["analyze", str(runs), "--json", "-"]) == 1
    assert json.loads(capsys.readouterr().out)["failed"] is True


def test_jobs_gives_the_same_report(runs, capsys) -> None:  # type: ignore[no-untyped-def]
    main(["analyze", str(runs), "--json", "-"])
    one = capsys.readouterr().out
    main(["analyze", str(runs), "--json", "-", "--jobs", "2"])
    assert capsys.readouterr().out == one


def test_single_event_file_path(runs, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = runs / "sweep" / "run_0"
    (path,) = [p for p in folder.iterdir() if "tfevents" in p.name]
    assert main(["analyze", str(path)]) == 1


def test_start_up_imports_neither_torch_nor_streamlit(runs) -> None:  # type: ignore[no-untyped-def]
    code = ("import sys; from analyzer.cli import main; rc = main(['analyze', sys.argv[1], '-q']);"
            "bad = [m for m in ('torch', 'streamlit', 'pandas') if m in sys.modules];"
            "print(bad); sys.exit(0 if not bad else 3)")
    proc = subprocess.run([sys.executable, "-c", code, str(runs)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    helped = subprocess.run([sys.executable, "-m", "analyzer.cli", "--help"],
                            capture_output=True, text=True, check=False)
    assert helped.returncode == 0 and "analyze" in helped.stdout


def test_jobs_fall_back_when_workers_cannot_start(runs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from concurrent.futures.process import BrokenProcessPool

    import analyzer.ingest.runs as runs_module
    from analyzer.api import analyze

    class Broken:
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            pass

        def __enter__(self):  # type: ignore[no-untyped-def]
            raise BrokenProcessPool("no workers")

        def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
            pass

    monkeypatch.setattr(runs_module, "ProcessPoolExecutor", Broken)
    report = analyze(str(runs), jobs=2, replay=False)
    assert [r.incident.step if r.incident else None for r in report.results] == [2, None]


def test_regression_internal_error_exits_3_with_one_line(runs, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import analyzer.api

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr(analyzer.api, "analyze", broken)
    assert main(["analyze", str(runs)]) == 3
    err = capsys.readouterr().err
    assert err.strip() == ("forensics: internal error: RuntimeError: a bug "
                           "(run again with --debug for the traceback)")
    assert main(["analyze", str(runs), "--debug"]) == 3
    assert "Traceback" in capsys.readouterr().err
    assert main(["--debug", "analyze", str(runs)]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_regression_nothing_readable_exits_2(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.out.tfevents.1.host").write_bytes(b"")
    (run / "events.out.tfevents.2.host").write_bytes(b"not an event file at all" * 10)
    before = _snapshot(str(run))
    assert main(["analyze", str(run), "--json", str(tmp_path / "r.json")]) == 2
    captured = capsys.readouterr()
    assert "nothing readable" in captured.out and "nothing readable" in captured.err
    assert "1 run: 0 with non-finite values, 0 finite, 1 with nothing readable" in captured.out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["runs"][0]["status"] == "unreadable" and not report["failed"]
    assert _snapshot(str(run)) == before


def test_regression_readable_and_unreadable_runs_exit_0_when_the_readable_are_finite(
        tmp_path, summary_run, capsys) -> None:  # type: ignore[no-untyped-def]
    summary_run({"train/loss": [1.0, 0.5]}, name="good")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "events.out.tfevents.1.host").write_bytes(b"")
    assert main(["analyze", str(tmp_path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "2 runs: 0 with non-finite values, 1 finite, 1 with nothing readable" in out
    assert "unreadable" in out


def test_regression_json_tag_counts_keep_every_series_of_a_tag(tmp_path, summary_run) -> None:  # type: ignore[no-untyped-def]
    import shutil

    first = summary_run({"train/loss": [1.0] * 100, "lr": [0.1] * 100}, name="a")
    second = summary_run({"train/loss": [1.0] * 100}, name="b", start=100)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(first, run / "events.out.tfevents.1000.host")
    shutil.copy(second, run / "events.out.tfevents.2000.host")
    (run / "train.log").write_text("".join(f"step {i} train/loss 1.0\n" for i in range(50)))
    out = tmp_path / "r.json"
    assert main(["analyze", str(run), "--json", str(out), "-q"]) == 0
    tags = json.loads(out.read_text())["runs"][0]["tags"]
    assert tags["train/loss"] == 250 and tags["lr"] == 100


def test_regression_an_empty_capture_folder_does_not_make_a_run_readable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    (run / "capture" / "step_1").mkdir(parents=True)
    (run / "train.log").write_text("")
    assert main(["analyze", str(run), "-q"]) == 2


def test_regression_a_reader_that_stops_early_keeps_the_exit_status(runs) -> None:  # type: ignore[no-untyped-def]
    script = (f"set -o pipefail; {sys.executable} -m analyzer.cli analyze {runs} | head -c 1; "
              "exit ${PIPESTATUS[0]}")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
