"""The capture folder format's one owner (analyzer.capture.folder): which folders are
captures, the checked meta.json, env.json, and that ingest, the replay and the rules agree."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analyzer.api import analyze
from analyzer.capture import FlightRecorder, folder
from analyzer.cli import main
from analyzer.ingest.discover import discover
from analyzer.pipeline import rank_all
from analyzer.replayer import capture_folder, load_capture
from analyzer.scenarios import models
from tests.conftest import ROOT, SAMPLE_RUNS
from tests.readonly import snapshot

MLP = "analyzer.scenarios.models:mlp"
MLP_KW = {"in_features": 3, "hidden": 4, "out_features": 1, "depth": 2, "seed": 0}


def _sample(tmp_path: Path, name: str = "nan_in_batch") -> Path:
    run = tmp_path / name
    shutil.copytree(os.path.join(SAMPLE_RUNS, name), run)
    return run


def _partial_copy(capture: Path, name: str) -> Path:
    """What a run killed while the recorder wrote leaves: the tensors, no meta.json (the
    recorder writes it last)."""
    partial = capture.parent / name
    partial.mkdir()
    for part in ("state.pt", "batch.pt"):
        shutil.copy(capture / part, partial / part)
    return partial


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose capture the real recorder wrote: NaN in the batch of step 2."""
    run = tmp_path_factory.mktemp("rec") / "run"
    torch.manual_seed(0)
    model = models.mlp(**MLP_KW)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(run, model, opt, model_factory=MLP, model_kwargs=MLP_KW,
                         loss_factory="analyzer.scenarios.losses:mse", seed=0, grad_clip=1.0)
    for step in range(4):
        x, y = torch.randn(4, 3), torch.randn(4, 1)
        if step == 2:
            x[0, 0] = float("nan")
        with rec.step(step, x, y) as r:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            r.loss(loss)
            loss.backward()
            opt.step()
    assert rec.capture_path == str(run / "capture" / "step_2"), rec.errors
    return run


def _copy(recorded: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    return run


# The bug: analyze sorted capture/ folders by the digits of their names and took any of
# them, so a run killed mid-write had its leftover .step_N.<random> replayed (and failed);
# forensics replay took step_N folders only and worked.
@pytest.mark.parametrize("leftover", [".step_28.kqzvwxab", ".step_3.mhtdwqpe"])
def test_regression_interrupted_capture_write_is_ignored(
        tmp_path: Path, leftover: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sample(tmp_path)
    complete = run / "capture" / "step_28"
    _partial_copy(complete, leftover)
    before = snapshot(run)

    (result,) = analyze(str(run)).results
    assert result.run.captures == (str(complete),)
    assert result.replay is not None and result.replay_error is None
    assert result.findings[0].name == "nan-in-batch"
    assert not [i for i in result.run.issues if leftover in i.location.file]
    out = tmp_path / "report.json"
    assert main(["analyze", str(run), "--json", str(out), "-q"]) == 1
    assert json.loads(out.read_text())["runs"][0]["captures"] == [str(complete)]
    # The replay command and the dashboard (which lists runs with ingest's discovery and
    # replays run.captures[0]) take the same folder.
    assert capture_folder(str(run)) == str(complete)
    assert load_capture(str(run)).path == str(complete)
    assert discover([str(run)]).runs[0].capture_dirs == (str(complete),)
    assert snapshot(run) == before
    capsys.readouterr()


# A step_N folder without meta.json cannot come from the recorder (it renames complete
# folders into place): a copy cut short, files removed by hand. It is not a capture: it is
# reported as an incomplete one and the run's complete capture is replayed, by analyze and
# by the replay alike. Before, both took it and failed on the missing meta.json.
def test_regression_step_folder_without_meta_is_not_a_capture(tmp_path: Path) -> None:
    run = _sample(tmp_path)
    complete = run / "capture" / "step_28"
    partial = _partial_copy(complete, "step_3")
    before = snapshot(run)

    (result,) = analyze(str(run)).results
    assert result.run.captures == (str(complete),)
    assert result.replay is not None and result.findings[0].name == "nan-in-batch"
    (issue,) = [i for i in result.run.issues if i.location.file == str(partial)]
    assert issue.kind == "truncated" and "meta.json" in issue.message
    assert capture_folder(str(run)) == str(complete)
    assert load_capture(str(run)).path == str(complete)
    assert snapshot(run) == before


def test_names_the_recorder_writes_are_the_ones_read(recorded: Path) -> None:
    assert folder.step_of(folder.step_dir_name(12)) == 12
    assert folder.step_of(folder.temporary_prefix(12) + "abc123") is None
    for name in ("step_", "step_1a", "Step_1", "step_-1", "checkpoint_3", "step_1.tmp"):
        assert folder.step_of(name) is None, name
    capture = recorded / folder.CAPTURE_DIR / folder.step_dir_name(2)
    meta = folder.read_capture_meta(str(capture))
    assert sorted(os.listdir(capture)) == sorted(meta.files)
    assert (meta.step, meta.mode, meta.dtype, meta.device) == (2, "every_step", "float32", "cpu")
    assert (meta.trigger.what, meta.trigger.kind) == ("loss", "nan")
    assert meta.model.factory == MLP and dict(meta.model.kwargs) == MLP_KW
    assert meta.optimizer.cls == "torch.optim.SGD" and meta.optimizer.hyperparameters["lr"] == 0.1
    assert meta.grad_clip == 1.0 and meta.lr == 0.1 and meta.amp.grad_scaler is False
    assert meta.env is not None and meta.env["torch"] == torch.__version__
    assert folder.run_of_capture(str(capture)) == str(recorded)


def test_captures_are_listed_earliest_step_first(recorded: Path, tmp_path: Path) -> None:
    run = _copy(recorded, tmp_path)
    for step in (10, 9):
        shutil.copytree(run / "capture" / "step_2", run / "captures" / f"step_{step}")
    (run / "capture" / "notes").mkdir()
    (result,) = analyze(str(run), replay=False).results
    assert [os.path.basename(c) for c in result.run.captures] == ["step_2", "step_9", "step_10"]
    assert [m.step for m in result.run.capture_metas] == [2, 2, 2]


def _damage(meta_path: Path, how: str) -> None:
    meta = json.loads(meta_path.read_text())
    if how == "cut":
        meta_path.write_text(meta_path.read_text()[:200])
    elif how == "not_utf8":
        meta_path.write_bytes(b'{"format": "\xff"}')
    elif how == "list":
        meta_path.write_text("[1, 2]")
    elif how == "fifo":
        meta_path.unlink()
        os.mkfifo(meta_path)
    elif how == "huge":
        with open(meta_path, "r+b") as fh:
            fh.truncate(folder.JSON_BYTES + 1)  # sparse: nothing is written to the disk
    else:
        key, value = {"format": ("format", "other"), "version": ("version", 99),
                      "step": ("step", "2"), "env": ("env", [1]), "dtype": ("dtype", "int8"),
                      "amp": ("amp", {"grad_scaler": "yes"}),
                      "factory": ("model", {"kwargs": {}})}[how]
        meta[key] = value
        meta_path.write_text(json.dumps(meta))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how, kind, words", [
    ("cut", "bad_json", "column"), ("not_utf8", "bad_json", "not UTF-8 at byte 12"),
    ("list", "bad_json", "not a JSON object"), ("fifo", "not_regular", "FIFO"),
    ("huge", "too_large", "more than"), ("format", "bad_record", "format key"),
    ("version", "bad_record", "capture version 99"), ("step", "bad_record", "'step'"),
    ("env", "bad_record", "'env'"), ("dtype", "bad_record", "'int8'"),
    ("amp", "bad_record", "'amp.grad_scaler'"), ("factory", "bad_record", "'factory' string"),
])
def test_bad_meta_is_an_issue_on_the_run_and_the_replay_names_it(
        recorded: Path, tmp_path: Path, how: str, kind: str, words: str) -> None:
    run = _copy(recorded, tmp_path)
    meta_path = run / "capture" / "step_2" / "meta.json"
    _damage(meta_path, how)
    (result,) = analyze(str(run)).results
    (issue,) = [i for i in result.run.issues if i.location.file == str(meta_path)]
    assert issue.kind == kind and words in issue.message
    if how == "cut":  # the JSON ends inside a string on the cut file's last line
        assert issue.location.line == meta_path.read_text().count("\n") + 1
    if how == "not_utf8":
        assert issue.location.offset == 12
    assert result.run.captures == (str(meta_path.parent),) and result.run.capture_metas == ()
    # The replay fails on the same words; the run's env.json still stands.
    assert result.replay is None and result.replay_error is not None
    assert words in result.replay_error
    assert result.run.env is not None and result.run.env["torch"] == torch.__version__


# Python's json refuses an integer of more than 4300 digits with a plain ValueError, which
# the reader let through: analyze stopped with a traceback (found by the meta.json fuzz
# target, tests/fuzz/test_fuzz_capture_meta.py).
@pytest.mark.parametrize("name", ["capture/step_2/meta.json", "env.json"])
def test_regression_an_integer_too_long_to_convert_is_bad_json(
        recorded: Path, tmp_path: Path, name: str) -> None:
    run = _copy(recorded, tmp_path)
    (run / name).write_text('{"format": ' + "9" * 5000 + "}")
    (result,) = analyze(str(run), replay=False).results
    (issue,) = [i for i in result.run.issues if i.location.file == str(run / name)]
    assert issue.kind == "bad_json" and "digits" in issue.message


def test_env_json_first_then_the_capture_s_environment(recorded: Path, tmp_path: Path) -> None:
    run = _copy(recorded, tmp_path)
    (run / "env.json").write_text(json.dumps({"torch": "1.0", "blas": "mkl"}))
    (result,) = analyze(str(run), replay=False).results
    assert result.run.env == {"torch": "1.0", "blas": "mkl"}
    (run / "env.json").write_text('{"torch": ')
    (result,) = analyze(str(run), replay=False).results
    (issue,) = [i for i in result.run.issues if i.location.file == str(run / "env.json")]
    assert issue.kind == "bad_json"
    assert result.run.env is not None and result.run.env["torch"] == torch.__version__
    (run / "env.json").unlink()
    (result,) = analyze(str(run), replay=False).results
    assert result.run.env is not None and result.run.env["torch"] == torch.__version__
    assert not result.run.issues


def test_environment_drift_from_env_json_files(tmp_path: Path) -> None:
    """Ingest reads each run's env.json; api gathers the healthy siblings' from the runs."""
    runs = tmp_path / "runs"
    for name, version, values in (("bad", "2.3.0", ["1.0", "nan"]), ("good", "2.1.0",
                                                                    ["1.0", "0.5"])):
        (runs / name).mkdir(parents=True)
        (runs / name / "env.json").write_text(json.dumps({"torch": version, "blas": "mkl"}))
        (runs / name / "train.log").write_text(
            "".join(f"step {i} train/loss {v}\n" for i, v in enumerate(values)))
    results = {r.run.name: r for r in analyze(str(runs)).results}
    drift = [f for f in results["bad"].findings if f.name == "environment-drift"]
    assert drift and "torch '2.3.0' vs '2.1.0'" in drift[0].evidence[0].text


def test_rules_read_nothing_from_the_run_folder(tmp_path: Path) -> None:
    """Rules read env.json and meta.json off the Run: with the folder gone, same findings."""
    run = _sample(tmp_path, "adam_eps_fp16")
    whole = analyze(str(run)).results
    read = analyze(str(run), rules=False).results
    shutil.rmtree(run)
    again = rank_all(list(read))
    assert again[0].findings == whole[0].findings
    assert again[0].findings[0].name == whole[0].findings[0].name == "adam-eps-too-small"


def test_no_rule_opens_a_file() -> None:
    """Only the docs generator (it reads each sample's scenario.json) reads files."""
    calls = {"open", "read_regular", "open_regular", "check_regular"}
    modules = {"os", "json", "pathlib", "shutil", "io", "analyzer.ingest.safeio"}
    rules = Path(ROOT) / "analyzer" / "rules"
    for path in sorted(rules.glob("*.py")):
        if path.name == "docs.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        called = {getattr(n.func, "id", getattr(n.func, "attr", ""))
                  for n in ast.walk(tree) if isinstance(n, ast.Call)}
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not called & calls and not imported & modules, path.name


def test_the_owner_imports_neither_torch_nor_numpy() -> None:
    code = ("import sys, analyzer.capture.folder, analyzer.capture; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
