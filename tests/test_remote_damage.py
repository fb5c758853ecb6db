"""Damaged and unreachable objects: the same issues as on disk, named by their URL, and a
clear message (never a traceback) for what a store refuses or cannot be reached."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.errors import UsageError
from analyzer.model import IngestIssue
from tests.conftest import write_summary_run
from tests.s3server import BUCKET, S3Server

pytest_plugins = ("tests.remote_fixtures",)  # the s3 fixture

ROOT = Path(__file__).resolve().parent.parent


def _issues(issues: tuple[IngestIssue, ...], local: Path | None = None,
            url: str = "") -> list[tuple[str, str, int | None, int | None, str]]:
    out = []
    for i in issues:
        file = i.location.file.replace(str(local), url) if local is not None else \
            i.location.file
        message = i.message.replace(str(local), url) if local is not None else i.message
        out.append((i.kind, file, i.location.offset, i.location.line, message))
    return sorted(out)


def _damaged_run(folder: Path) -> None:
    """An event file cut inside its last record, a checkpoint cut mid-save, a log."""
    import torch

    run = folder / "run"
    event = Path(write_summary_run(str(run), {"train/loss": [1.0, 0.5, 0.25, float("nan")]}))
    data = event.read_bytes()
    event.write_bytes(data[:-7])
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.ones(5000)}, "step": 3}, buffer)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_3.pt").write_bytes(buffer.getvalue()[:12_000])
    (run / "train.log").write_text("step 1 loss 1.0\nstep 2 loss nan\n", encoding="utf-8")


def test_a_truncated_event_file_and_a_half_written_checkpoint_give_the_issues_on_disk(
        s3: S3Server, tmp_path: Path) -> None:
    import analyzer

    _damaged_run(tmp_path)
    url = f"s3://{BUCKET}/damaged"
    s3.upload(str(tmp_path), url)
    before = s3.snapshot(BUCKET)
    on_disk = analyzer.analyze(str(tmp_path / "run"), replay=False).results[0].run
    remote = analyzer.analyze(f"{url}/run", replay=False).results[0].run
    kinds = {i.kind for i in on_disk.issues}
    assert {"truncated"} <= kinds, on_disk.issues
    assert any(i.location.file.endswith("step_3.pt") for i in on_disk.issues)
    assert _issues(remote.issues) == _issues(on_disk.issues, tmp_path, url)
    assert any(i.location.offset for i in remote.issues
               if "tfevents" in i.location.file)  # the offset where the cut record starts
    assert s3.snapshot(BUCKET) == before


def test_an_object_gone_between_listing_and_reading_is_an_issue(
        s3: S3Server, tmp_path: Path) -> None:
    from analyzer.ingest.discover import discover
    from analyzer.ingest.runs import read_runs

    _damaged_run(tmp_path)
    url = f"s3://{BUCKET}/vanishing"
    s3.upload(str(tmp_path), url)
    (found,) = discover([f"{url}/run"]).runs
    client = s3.client()
    for path in (*found.event_files, *found.log_files, *found.checkpoint_files):
        client.delete_object(Bucket=BUCKET, Key=path.removeprefix(f"s3://{BUCKET}/"))
    (run,) = read_runs([found])
    gone = {i.location.file: i for i in run.issues}
    for path in (*found.event_files, *found.log_files, *found.checkpoint_files):
        assert path in gone, run.issues
        assert gone[path].kind == "unreadable"
        assert "does not exist" in gone[path].message or "no such" in gone[path].message, \
            gone[path].message


def test_a_denied_object_is_an_issue_naming_the_refusal(s3: S3Server, tmp_path: Path) -> None:
    import analyzer

    _damaged_run(tmp_path)
    url = f"s3://{BUCKET}/denied"
    s3.upload(str(tmp_path), url)
    s3.deny(f"{BUCKET}/denied/run/train.log", f"{BUCKET}/denied/run/checkpoints/")
    try:
        run = analyzer.analyze(f"{url}/run", replay=False).results[0].run
    finally:
        s3.deny()
    refused = {i.location.file: i for i in run.issues if i.kind == "unreadable"}
    for name in ("train.log", "checkpoints/step_3.pt"):
        issue = refused[f"{url}/run/{name}"]
        assert "denied" in issue.message.lower() or "forbidden" in issue.message.lower(), \
            issue.message
    assert run.series  # the event file was read all the same


def test_an_unreachable_endpoint_is_a_usage_error(tmp_path: Path) -> None:
    """The store's retries are its own settings: here fsspec's FSSPEC_S3 configuration
    (documented in docs/remote.md) makes the answer quick."""
    pytest.importorskip("s3fs")
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
           "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3": '{"config_kwargs": {"connect_timeout": 2, '
                        '"retries": {"max_attempts": 1}}}'}
    done = subprocess.run([sys.executable, "-m", "analyzer.cli", "analyze", "s3://b/runs"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "s3://b/runs: cannot be looked at" in done.stderr
    assert "Could not connect" in done.stderr and "Traceback" not in done.stderr


def test_a_missing_prefix_is_a_usage_error(s3: S3Server) -> None:
    from analyzer.ingest.discover import discover

    with pytest.raises(UsageError, match="no such object or folder"):
        discover([f"s3://{BUCKET}/nothing/here"])
