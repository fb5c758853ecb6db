"""One training is one run: discovery groups the folders frameworks write by their layouts.

The trees come from the real libraries: the corpus of tests/frameworks (Lightning, the
Hugging Face Trainer, tensorboardX, torchrun) and, for layouts it lacks, the libraries'
own loggers, trackers and folder-naming functions writing into tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.ingest.discover import RunFiles, discover, find_runs
from analyzer.ingest.layouts import is_save_dir
from tests.frameworks import corpus
from tests.readonly import snapshot

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                        "ignore::UserWarning")


def _by_name(root: Path) -> dict[str, RunFiles]:
    return {r.name: r for r in find_runs([str(root)])}


def _rel(run: RunFiles, paths: tuple[str, ...]) -> list[str]:
    return [os.path.relpath(p, run.path) for p in paths]


@pytest.fixture(scope="module")
def lightning_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus.get("lightning_nan", tmp_path_factory).parent


def test_regression_root_log_and_lightning_version_folder_are_one_run(
        lightning_family: Path) -> None:
    runs = _by_name(lightning_family)
    run = runs["lightning_nan"]
    assert "lightning_nan/lightning_logs/version_0" not in runs
    assert run.layouts == ("lightning",)
    assert _rel(run, run.log_files) == ["train.log"]
    assert [os.path.basename(os.path.dirname(f)) for f in run.event_files] == ["version_0"]
    assert {os.path.dirname(p) for p in _rel(run, run.checkpoint_files)} == {
        "lightning_logs/version_0/checkpoints"}
    assert _rel(run, run.metadata_files) == ["lightning_logs/version_0/hparams.yaml"]


def test_regression_folder_of_trainings_gives_one_run_per_training(
        lightning_family: Path) -> None:
    before = snapshot(lightning_family)
    assert sorted(_by_name(lightning_family)) == sorted(corpus.FAMILIES["lightning"])
    assert snapshot(lightning_family) == before


def test_discovery_opens_no_file(lightning_family: Path, monkeypatch: pytest.MonkeyPatch,
                                 ) -> None:
    import builtins
    import io

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"discovery opened {args[0]!r}")

    for owner, name in ((builtins, "open"), (io, "open"), (os, "open")):
        monkeypatch.setattr(owner, name, refuse)
    assert len(find_runs([str(lightning_family)])) == len(corpus.FAMILIES["lightning"])


def test_regression_lightning_restart_versions_are_one_runs_segments(
        lightning_family: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = lightning_family / "lightning_restart"
    (run,) = find_runs([str(folder)])
    assert [s.label for s in run.segments] == ["lightning_logs/version_0",
                                               "lightning_logs/version_1"]
    assert [Path(f).parent.name for f in run.event_files] == ["version_0", "version_1"]
    before = snapshot(folder)
    assert main(["analyze", str(folder), "--json", "-", "--no-replay"]) == 1
    assert snapshot(folder) == before
    (result,) = json.loads(capsys.readouterr().out)["runs"]
    assert result["incident"]["step"] == 35 and result["incident"]["tag"] == "train_loss"
    assert "version_1" in result["incident"]["location"]["file"]
    restarts = [e for e in result["events"] if e["kind"] == "restart"]
    assert [Path(e["location"]["file"]).parent.name for e in restarts] == ["version_1"]
    layout = result["layout"]
    assert layout["root"] == str(folder) and layout["layouts"] == ["lightning"]
    roles = {(Path(f["path"]).name, f["role"], f["segment"]) for f in layout["files"]}
    assert ("train.log", "log", None) in roles
    assert ("hparams.yaml", "metadata", 1) in roles
    assert ("last.ckpt", "checkpoint", 0) in roles and ("last.ckpt", "checkpoint", 1) in roles


def test_regression_trainer_runs_folder_and_checkpoints_are_one_run(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    family = corpus.get("hf_nan", tmp_path_factory).parent
    runs = _by_name(family)
    assert sorted(runs) == ["hf_healthy", "hf_nan"]
    run = runs["hf_nan"]
    assert run.layouts == ("huggingface",)
    (segment,) = run.segments
    assert segment.label.startswith("runs/") and not segment.parallel
    assert [os.path.dirname(p) for p in _rel(run, run.event_files)] == [segment.label]
    # the root log, and the history of the latest save only
    assert _rel(run, run.log_files) == ["train.log", "checkpoint-24/trainer_state.json"]
    assert _rel(run, run.listed_files) == ["checkpoint-8/trainer_state.json",
                                           "checkpoint-16/trainer_state.json"]
    roles = {os.path.relpath(f.path, run.path): f.role for f in run.layout().files}
    assert roles["checkpoint-8/trainer_state.json"] == "listed"
    assert roles["checkpoint-24/trainer_state.json"] == "log"
    assert {os.path.dirname(p) for p in _rel(run, run.checkpoint_files)} == {
        "checkpoint-8", "checkpoint-16", "checkpoint-24"}
    names = {os.path.basename(p) for p in run.metadata_files}
    assert {"training_args.bin", "trainer_state.json"} - names == {"trainer_state.json"}
    assert {"config.json", "scheduler.pt", "rng_state.pth"} <= names


def test_regression_tb_subfolder_joins_the_root_log(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = corpus.get("amp_benign", tmp_path_factory)
    (run,) = find_runs([str(folder)])
    assert _rel(run, run.event_files)[0].startswith("tb/")
    assert _rel(run, run.log_files) == ["train.log"]
    # the skips the event file shows are the same training's as the log's grad_norm nan
    assert analyze(str(folder), replay=False).failed is False


def test_regression_torchrun_log_dir_joins_the_training(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = corpus.get("ddp_gloo", tmp_path_factory)
    (run,) = find_runs([str(folder)])
    assert run.layouts == ("torchrun",)
    (attempt,) = run.segments
    assert attempt.label.startswith("torchrun_logs/") and attempt.label.endswith("/attempt_0")
    logs = _rel(run, run.log_files)
    assert logs[0] == "train.log"
    # Each worker's error.json is read with its logs (the message of the failure).
    assert sorted(os.path.relpath(p, attempt.label) for p in logs[1:]) == [
        "0/error.json", "0/stderr.log", "0/stdout.log", "1/error.json", "1/stderr.log",
        "1/stdout.log"]
    assert _rel(run, run.event_files)[0].startswith("tb/")


def test_regression_runs_subfolder_of_a_plain_loop_joins_its_log(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = corpus.get("tbx_nan", tmp_path_factory)
    (run,) = find_runs([str(folder)])
    assert [s.label for s in run.segments] == ["runs/tbx"]
    assert _rel(run, run.log_files) == ["train.log"]


def test_regression_model_epoch0_checkpoint_is_not_a_run_of_its_own(tmp_path: Path) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    model = torch.nn.Linear(3, 2)
    writer = SummaryWriter(str(tmp_path / "tb"))
    with open(tmp_path / "train.log", "w") as log:
        for step in range(3):
            writer.add_scalar("train/loss", 1.0 / (step + 1), step)
            log.write(f"step {step} loss {1.0 / (step + 1):.4f}\n")
    writer.close()
    (tmp_path / "saved").mkdir()
    torch.save(model.state_dict(), tmp_path / "saved" / "model_epoch0.pt")
    (run,) = find_runs([str(tmp_path)])
    assert _rel(run, run.checkpoint_files) == ["saved/model_epoch0.pt"]
    report = analyze(str(tmp_path), replay=False)
    assert [r.run.name for r in report.results] == [tmp_path.name]
    assert not report.failed


def _tb_logger(save_dir: Path, **kwargs: Any) -> Any:
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(save_dir=str(save_dir), **kwargs)
    logger.log_hyperparams({"lr": 0.1})
    for step in range(3):
        logger.log_metrics({"train_loss": 1.0 / (step + 1)}, step=step)
    logger.finalize("success")
    return logger


def test_lightning_logger_variants(tmp_path: Path) -> None:
    warnings.simplefilter("ignore")
    _tb_logger(tmp_path / "plain")
    _tb_logger(tmp_path / "plain")  # a second fit: version_1
    _tb_logger(tmp_path / "nameless", name="")
    sub = _tb_logger(tmp_path / "sub", sub_dir="tb")
    _tb_logger(tmp_path / "shared", name="exp_a")
    _tb_logger(tmp_path / "shared", name="exp_b")
    (tmp_path / "plain" / "train.log").write_text("started\n")
    runs = _by_name(tmp_path)
    assert sorted(runs) == ["nameless", "plain", "shared/exp_a", "shared/exp_b", "sub"]
    assert [s.label for s in runs["plain"].segments] == ["lightning_logs/version_0",
                                                         "lightning_logs/version_1"]
    assert [s.label for s in runs["nameless"].segments] == ["version_0"]
    assert [os.path.dirname(f) for f in runs["sub"].event_files] == [sub.log_dir]
    assert [s.label for s in runs["shared/exp_a"].segments] == ["version_0"]


def test_lightning_logger_save_dir_below_the_training(tmp_path: Path) -> None:
    warnings.simplefilter("ignore")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "train.log").write_text("started\n")
    logger = _tb_logger(tmp_path / "exp" / "tb_out")  # Trainer(logger=TensorBoardLogger(...))
    (run,) = find_runs([str(tmp_path)])
    assert run.path == str(tmp_path / "exp")
    assert [os.path.dirname(f) for f in run.event_files] == [logger.log_dir]


def test_lightning_versions_in_their_numbers_order(tmp_path: Path) -> None:
    warnings.simplefilter("ignore")
    for _ in range(11):
        _tb_logger(tmp_path)
    (run,) = find_runs([str(tmp_path)])
    assert [s.label for s in run.segments] == [f"lightning_logs/version_{n}" for n in range(11)]
    assert [Path(f).parent.name for f in run.event_files] == [f"version_{n}" for n in range(11)]


def test_trainer_logging_dir_default_and_checkpoint_names(tmp_path: Path) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainingArguments
    from transformers.integrations.integration_utils import default_logdir
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    out = tmp_path / "out"
    args = TrainingArguments(output_dir=str(out), report_to=["tensorboard"], use_cpu=True)
    writer = SummaryWriter(os.path.join(args.output_dir, default_logdir()))
    writer.add_scalar("train/loss", 1.0, 1)
    writer.close()
    save = out / f"{PREFIX_CHECKPOINT_DIR}-1"
    save.mkdir()
    torch.save(args, save / "training_args.bin")
    torch.save({"w": torch.ones(2)}, save / "optimizer.pt")
    (run,) = find_runs([str(tmp_path)])
    assert run.path == str(out) and run.layouts == ("huggingface",)
    assert [os.path.basename(f) for f in run.metadata_files] == ["training_args.bin"]


@pytest.mark.parametrize("logging_dir", [None, "tracking"])
def test_accelerate_project_dir(tmp_path: Path, logging_dir: str | None) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import ProjectConfiguration

    project = tmp_path / "project"
    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True,
        logging_dir=None if logging_dir is None else str(project / logging_dir))
    acc = Accelerator(cpu=True, log_with="tensorboard", project_config=config)
    acc.init_trackers("tiny")
    acc.log({"train/loss": 1.0}, step=0)
    acc.save_state()
    acc.end_training()
    AcceleratorState._reset_state(True)
    runs = find_runs([str(tmp_path)])
    assert [r.path for r in runs] == [str(project)], [r.name for r in runs]
    (run,) = runs
    assert "accelerate" in run.layouts
    assert [os.path.relpath(os.path.dirname(f), config.logging_dir) for f in run.event_files
            ] == ["tiny"]
    assert any("random_states_0.pkl" in f for f in run.metadata_files)


def test_keras_train_and_validation_streams_are_not_restarts(tmp_path: Path) -> None:
    # Keras' TensorBoard callback writes log_dir/train and log_dir/validation.
    from torch.utils.tensorboard import SummaryWriter

    for stream, values in (("train", [1.0, 0.5]), ("validation", [1.2, 0.7])):
        writer = SummaryWriter(str(tmp_path / "logs" / stream))
        for epoch, value in enumerate(values):
            writer.add_scalar("epoch_loss", value, epoch)
        writer.close()
    (run,) = find_runs([str(tmp_path / "logs")])
    assert [(s.label, s.parallel) for s in run.segments] == [("train", True),
                                                             ("validation", True)]
    (result,) = analyze(str(tmp_path / "logs"), replay=False).results
    assert [e for e in result.run.events if e.kind == "restart"] == []


def test_torchrun_attempts_are_ordered_segments(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    specs = DefaultLogsSpecs(log_dir=str(tmp_path / "elastic"), redirects=Std.ALL)
    for attempt in range(2):
        envs = {r: {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": str(attempt)}
                for r in range(2)}
        dest = specs.reify(envs)
        for rank, path in dest.stdouts.items():
            Path(path).write_text(f"[rank {rank}] step {attempt} loss 1.0\n")
    (run,) = find_runs([str(tmp_path / "elastic")])
    assert [s.label.rsplit("/", 1)[-1] for s in run.segments] == ["attempt_0", "attempt_1"]
    assert len(run.log_files) == 4 and run.layouts == ("torchrun",)


def test_rank_logs_of_one_folder(tmp_path: Path) -> None:
    for name in ("rank0.log", "log_rank_1.txt"):
        (tmp_path / name).write_text("step 1 loss 1.0\n")
    (run,) = find_runs([str(tmp_path)])
    assert run.layouts == ("ranks",) and len(run.log_files) == 2


# --run-root


def test_run_root_takes_everything_below_as_one_run(
        tmp_path: Path, summary_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    summary_run({"train/loss": [1.0, float("nan")]}, name="exp/a")
    summary_run({"train/loss": [1.0, 0.5]}, name="exp/b")
    summary_run({"train/loss": [1.0, 0.5]}, name="other")
    assert sorted(_by_name(tmp_path)) == ["exp/a", "exp/b", "other"]
    runs = {r.name: r for r in find_runs([str(tmp_path)], run_roots=[str(tmp_path / "exp")])}
    assert sorted(runs) == ["exp", "other"] and runs["exp"].layouts == ("run-root",)
    assert len(runs["exp"].event_files) == 2
    assert main(["analyze", str(tmp_path), "--run-root", str(tmp_path / "exp"), "-q"]) == 1
    table = capsys.readouterr().out
    assert "\nexp " in table and "exp/a" not in table


def test_run_root_through_the_python_api(tmp_path: Path, summary_run: Any) -> None:
    from analyzer.api import read

    summary_run({"train/loss": [1.0, 0.5]}, name="exp/a")
    summary_run({"train/loss": [1.0, 0.25]}, name="exp/b")
    assert [r.name for r in read(str(tmp_path))] == ["exp/a", "exp/b"]
    (run,) = read(str(tmp_path), run_roots=[str(tmp_path / "exp")])
    assert run.layout is not None and run.layout.layouts == ("run-root",)
    assert len(run.files) == 2


def test_run_root_splits_lightning_versions(lightning_family: Path) -> None:
    folder = lightning_family / "lightning_restart"
    versions = [str(folder / "lightning_logs" / v) for v in ("version_0", "version_1")]
    runs = find_runs([str(folder)], run_roots=versions)
    assert sorted(r.name for r in runs) == ["lightning_logs/version_0",
                                            "lightning_logs/version_1", "lightning_restart"]


def test_run_root_outside_the_paths_is_walked_too(tmp_path: Path, summary_run: Any) -> None:
    summary_run({"train/loss": [1.0]}, name="a")
    summary_run({"train/loss": [1.0]}, name="b/c")
    runs = find_runs([str(tmp_path / "a")], run_roots=[str(tmp_path / "b")])
    assert [r.path for r in runs] == [str(tmp_path / "a"), str(tmp_path / "b")]


def test_run_root_must_be_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path), "--run-root", str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "f.log").write_text("x\n")
    assert main(["analyze", str(tmp_path), "--run-root", str(tmp_path / "f.log")]) == 2
    assert "names a folder" in capsys.readouterr().err


def test_text_report_lists_files_by_role(lightning_family: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    main(["analyze", str(lightning_family / "lightning_restart"), "--no-replay",
          "--no-checkpoints"])
    out = capsys.readouterr().out
    assert "   files: lightning; segments lightning_logs/version_0, lightning_logs/version_1" \
        in out
    assert "     log: train.log" in out


# Renaming a training's folder never changes how the trees below are grouped.

_TRAININGS = ("lightning_restart", "hf_nan", "ddp_gloo", "amp_benign", "tbx_nan")
_TRICKY = ["logs", "tb", "train", "validation", "runs", "version_3", "lightning_logs",
           "attempt_0", "0", "rank_1", "events", "exp", "run-1", "ümlaut"]


def _reserved(name: str) -> bool:
    from analyzer.capture.folder import is_capture_container

    return is_save_dir(name) or is_capture_container(name) or name.startswith(".") or \
        name in {"__pycache__", "node_modules", "venv"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    for name in _TRAININGS:
        shutil.copytree(corpus.get(name, tmp_path_factory), folder / name)
    return folder


def _partition(root: Path, renamed: dict[str, str]) -> set[frozenset[str]]:
    """Each run's files relative to ``root``, with renamed folders given their first name."""
    back = {new: old for old, new in renamed.items()}
    found = discover([str(root)])
    out = set()
    for run in found.runs:
        files = set()
        for f in (*run.event_files, *run.log_files, *run.checkpoint_files,
                  *run.metadata_files, *run.capture_dirs):
            top, _, rest = os.path.relpath(f, root).partition(os.sep)
            files.add(os.path.join(back.get(top, top), rest))
        out.add(frozenset(files))
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(which=st.sampled_from(_TRAININGS),
       name=st.one_of(st.sampled_from(_TRICKY),
                      st.text(st.characters(codec="utf-8", exclude_characters="/\0"),
                              min_size=1, max_size=12)))
def test_renaming_a_training_never_changes_the_grouping(sweep: Path, which: str,
                                                        name: str) -> None:
    assume(not _reserved(name) and name not in (".", "..", *_TRAININGS)
           and len(name.encode()) <= 200)
    expected = _partition(sweep, {})
    assert len(expected) == len(_TRAININGS)
    os.rename(sweep / which, sweep / name)
    try:
        assert _partition(sweep, {which: name}) == expected
    finally:
        os.rename(sweep / name, sweep / which)


def test_run_root_reaches_the_dashboard(tmp_path: Path) -> None:
    from analyzer.dashboard import command
    from app.data import run_roots

    cmd = command(str(tmp_path), run_roots=[str(tmp_path / "a"), str(tmp_path / "b")])
    after = cmd[cmd.index("--") + 1:]
    assert run_roots(after) == (str(tmp_path / "a"), str(tmp_path / "b"))
    assert run_roots([]) == ()


def test_replay_of_a_training_root_finds_the_capture_in_its_segment(tmp_path: Path) -> None:
    from analyzer.cli.replay import run_capture

    sample = Path(__file__).resolve().parent.parent / "sample_runs" / "nan_in_batch"
    version = tmp_path / "exp" / "lightning_logs" / "version_0"
    shutil.copytree(sample / "capture", version / "capture")
    for event in sample.glob("events.out.tfevents.*"):
        shutil.copy(event, version / event.name)
    (tmp_path / "exp" / "train.log").write_text("started\n")
    (step,) = (version / "capture").iterdir()
    assert run_capture(str(tmp_path / "exp")) == str(step)
    assert run_capture(str(version)) == str(version)  # holds capture/ itself: as before
    assert run_capture(str(tmp_path / "exp"), [str(tmp_path / "exp" / "lightning_logs")]) \
        == str(tmp_path / "exp")  # the captures are another run's now


def test_dashboard_groups_by_its_run_roots(tmp_path: Path, summary_run: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from streamlit.testing.v1 import AppTest

    summary_run({"train/loss": [1.0, float("nan")]}, name="runs/exp/a")
    summary_run({"train/loss": [1.0, 0.5]}, name="runs/exp/b")
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py", "--run-root",
                                      str(tmp_path / "runs" / "exp")])
    entry = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    at = AppTest.from_file(str(entry), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    assert list(at.dataframe[0].value["run"]) == ["exp"]


def test_regression_a_recorder_folder_and_its_runs_folder_are_one_run(
        tmp_path: Path, summary_run: Any) -> None:
    """A Trainer's output_dir that died before its first save holds what the flight recorder
    wrote (env.json, capture/) beside the SummaryWriter's runs/<date>_<host>/: one training."""
    import torch

    from analyzer.capture import FlightRecorder
    from analyzer.scenarios import models

    out = tmp_path / "out"
    summary_run({"train/loss": [1.0, float("nan")]}, name="out/runs/Dec01_12-00-00_host")
    model = models.mlp(3, 4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(out, model, opt, model_factory="analyzer.scenarios.models:mlp",
                         model_kwargs={"in_features": 3, "hidden": 4, "out_features": 1},
                         loss_factory="analyzer.scenarios.losses:mse")
    with rec.step(1, torch.full((2, 3), float("nan")), torch.zeros(2, 1)) as r:
        r.loss(torch.tensor(float("nan")))
    assert rec.captured
    runs = _by_name(tmp_path)
    assert list(runs) == ["out"], sorted(runs)
    (run,) = runs.values()
    assert run.capture_dirs and [s.label for s in run.segments] == ["runs/Dec01_12-00-00_host"]


def test_regression_a_tracker_folder_in_the_recorders_folder_is_the_same_run(
        tmp_path: Path, summary_run: Any) -> None:
    """Accelerate(log_with="tensorboard", project_dir=run_dir) with init_trackers("run")
    writes its events into run_dir/run/, beside the recorder's env.json: one training."""
    from analyzer.capture import write_env

    out = tmp_path / "OUT"
    summary_run({"train/loss": [1.0, float("nan")]}, name="OUT/run")
    write_env(out)
    runs = _by_name(tmp_path)
    assert list(runs) == ["OUT"], sorted(runs)
    assert [os.path.dirname(p) for p in _rel(runs["OUT"], runs["OUT"].event_files)] == ["run"]
