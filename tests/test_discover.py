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
    assert sorted(runs) == ["hf", "lightning_logs/version_0", "lightning_logs/version_1", "rec"]
    assert [os.path.basename(f) for f in runs["lightning_logs/version_0"].checkpoint_files] == [
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
