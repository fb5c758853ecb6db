"""Which folders are runs, and which files belong to each."""

from __future__ import annotations

import os

import pytest
import torch

from analyzer.api import analyze
from analyzer.ingest.discover import find_runs


def _touch(path: str, data: bytes = b"") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def test_layouts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path)
    _touch(f"{root}/lightning_logs/version_0/events.out.tfevents.1.a")
    _touch(f"{root}/lightning_logs/version_0/checkpoints/epoch=0-step=10.ckpt")
    _touch(f"{root}/lightning_logs/version_1/events.out.tfevents.2.a")
    _touch(f"{root}/hf/checkpoint-500/model.safetensors")
    _touch(f"{root}/hf/checkpoint-500/training_args.bin")
    _touch(f"{root}/hf/events.out.tfevents.3.a")
    _touch(f"{root}/rec/capture/step_7/state.pt")
    _touch(f"{root}/rec/events.out.tfevents.4.a")
    _touch(f"{root}/.hidden/events.out.tfevents.5.a")
    _touch(f"{root}/notes/readme.md")
    runs = {r.name: r for r in find_runs([root])}
    top = os.path.basename(root)  # Lightning's versions are segments of the training above
    assert sorted(runs) == sorted(["hf", top, "rec"])
    assert [s.label for s in runs[top].segments] == ["lightning_logs/version_0",
                                                     "lightning_logs/version_1"]
    assert [os.path.basename(f) for f in runs[top].checkpoint_files] == [
        "epoch=0-step=10.ckpt"]
    assert [os.path.basename(f) for f in runs["hf"].checkpoint_files] == ["model.safetensors"]
    assert runs["rec"].checkpoint_files == ()  # a capture's tensors are not checkpoints
    assert [os.path.basename(c) for c in runs["rec"].capture_dirs] == ["step_7"]


def test_run_from_checkpoints_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "only_ckpts"
    run.mkdir()
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for step in (10, 20, 30):
        if step == 30:
            with torch.no_grad():
                model[1].weight[0, 0] = float("nan")
        torch.save({"model": model.state_dict(), "step": step}, run / f"ckpt_{step}.pt")
    before = sorted(os.listdir(run))
    report = analyze(str(run))
    assert sorted(os.listdir(run)) == before
    (result,) = report.results
    inc = result.incident
    assert inc is not None and inc.origin == "checkpoint"
    assert (inc.step, inc.kind, inc.last_finite_step, inc.layer) == (30, "nan", 20, "1")
    assert inc.location.file.endswith("ckpt_30.pt")


def test_unsafe_checkpoint_is_reported_and_rest_still_read(tmp_path, summary_run) -> None:  # type: ignore[no-untyped-def]
    path = summary_run({"train/loss": [1.0, float("nan")]}, name="run")
    folder = os.path.dirname(path)

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {tmp_path}/pwned",))

    torch.save({"model": {"w": torch.ones(2)}, "evil": Evil()}, os.path.join(folder, "bad.pt"))
    report = analyze(folder)
    (result,) = report.results
    assert not (tmp_path / "pwned").exists()
    assert result.incident is not None and result.incident.step == 1
    assert result.run.checkpoints is not None
    assert result.run.checkpoints.scans[0].read_mode == "static"


@pytest.mark.parametrize("flag", [True, False])
def test_checkpoints_can_be_skipped(tmp_path, flag) -> None:  # type: ignore[no-untyped-def]
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    (result,) = analyze(str(tmp_path), checkpoints=flag).results
    assert (result.run.checkpoints is not None) == flag


def _json(capsys):  # type: ignore[no-untyped-def]
    import json

    return json.loads(capsys.readouterr().out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["train.log", "events.out.tfevents.1.host", "model.pt"])
def test_regression_fifo_with_a_run_file_name_is_refused_not_waited_on(
        tmp_path, capsys, name) -> None:  # type: ignore[no-untyped-def]
    from analyzer.cli import main

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / name)
    assert main(["analyze", str(run), "--json", "-"]) == 2  # nothing readable
    (result,) = _json(capsys)["runs"]
    assert result["status"] == "unreadable"
    assert [i["kind"] for i in result["issues"]] == ["not_regular"]
    assert "FIFO" in result["issues"][0]["message"]
    assert result["issues"][0]["location"]["file"] == str(run / name)


@pytest.mark.timeout(60)
def test_regression_symlink_to_an_endless_device_is_refused(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from analyzer.cli import main

    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/dev/urandom", run / "events.out.tfevents.1.host")
    os.symlink("/dev/zero", run / "train.log")
    assert main(["analyze", str(run), "--json", "-"]) == 2
    (result,) = _json(capsys)["runs"]
    assert sorted(i["kind"] for i in result["issues"]) == ["not_regular", "not_regular"]
    assert all("character device" in i["message"] for i in result["issues"])
    assert main(["analyze", str(run / "train.log")]) == 2  # named directly, too


def test_regression_a_thousand_nested_folders_give_no_recursion_error(tmp_path, capsys,
                                                                      summary_run) -> None:  # type: ignore[no-untyped-def]
    from analyzer.cli import main
    from analyzer.ingest.discover import MAX_DEPTH

    summary_run({"train/loss": [1.0, 0.5]}, name="shallow/run")
    deep = str(tmp_path)
    for _ in range(1200):  # one level at a time: os.makedirs recurses
        deep = os.path.join(deep, "d")
        os.mkdir(deep)
    _touch(os.path.join(deep, "events.out.tfevents.1.host"))
    assert main(["analyze", str(tmp_path), "--json", "-"]) == 0
    report = _json(capsys)
    assert [r["name"] for r in report["runs"]] == ["shallow/run"]
    (issue,) = report["issues"]
    assert issue["kind"] == "too_deep" and f"{MAX_DEPTH} levels" in issue["message"]
    assert issue["location"]["file"].count(os.sep + "d") == MAX_DEPTH
    assert main(["analyze", deep]) == 2  # named directly, the deep run is read (empty)
    os.remove(os.path.join(deep, "events.out.tfevents.1.host"))
    while deep != str(tmp_path):  # bottom up: a recursive removal would overflow the stack
        os.rmdir(deep)
        deep = os.path.dirname(deep)


def test_regression_symlinked_run_folders_are_reported_not_skipped_silently(
        tmp_path, capsys, summary_run) -> None:  # type: ignore[no-untyped-def]
    from analyzer.cli import main

    summary_run({"train/loss": [1.0, float("nan")]}, name="real")
    root = tmp_path / "sweep"
    root.mkdir()
    summary_run({"train/loss": [1.0, 0.5]}, name="sweep/own")
    os.symlink(tmp_path / "real", root / "latest")
    os.symlink(root, root / "own" / "loop")  # a link inside a run, pointing back up
    assert main(["analyze", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"passed over: {root / 'latest'}: not_followed: symlink to the folder" in out
    assert "read issue: " in out and "loop" in out  # the run's own link, on the run
    assert main(["analyze", str(root / "latest"), "-q"]) == 1  # the link named directly


def test_no_runs_message_names_what_was_passed_over(tmp_path, capsys, summary_run) -> None:  # type: ignore[no-untyped-def]
    from analyzer.cli import main

    summary_run({"train/loss": [1.0]}, name="elsewhere")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path / "elsewhere", root / "link")
    assert main(["analyze", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no runs" in err and "not_followed" in err and "link" in err


def test_regression_a_trailing_slash_keeps_issues_on_their_run(tmp_path, summary_run) -> None:  # type: ignore[no-untyped-def]
    from analyzer.ingest.discover import discover

    summary_run({"train/loss": [1.0]}, name="a")
    os.symlink(tmp_path, tmp_path / "a" / "up")
    for root in (str(tmp_path / "a"), str(tmp_path / "a") + os.sep):
        found = discover([root])
        assert found.issues == ()
        assert [i.kind for i in found.runs[0].issues] == ["not_followed"]
