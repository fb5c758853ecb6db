"""Runs on object storage: the same analysis through a URL as on the same folder on disk,
against a real S3 API server on loopback (moto's server mode, :mod:`tests.s3server`),
with its request log telling what was listed and fetched, and that nothing was written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analyzer.cli import main
from analyzer.errors import UsageError
from analyzer.ingest import storage
from tests.readonly import snapshot
from tests.s3server import BUCKET, S3Server, filesystem

pytest_plugins = ("tests.remote_fixtures",)  # the s3 and remote_samples fixtures

ROOT = Path(__file__).resolve().parent.parent
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


def _cli_json(args: list[str], tmp_path: Path, name: str) -> tuple[int, str]:
    out = tmp_path / f"{name}.json"
    code = main([*args, "--json", str(out)])
    return code, out.read_text(encoding="utf-8")


def _written(server: S3Server) -> list[str]:
    return [f"{r.method} {r.path}" for r in server.requests if r.method in WRITES]


def test_analyze_a_bucket_gives_the_json_of_the_same_folder_on_disk(
        s3: S3Server, remote_samples: tuple[Path, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    local, url = remote_samples
    before_bucket, before_disk = s3.snapshot(BUCKET), snapshot(local)
    s3.clear()
    code_remote, remote = _cli_json(["analyze", url + "/", "-j", "1"], tmp_path, "remote")
    code_local, on_disk = _cli_json(["analyze", str(local), "-j", "1"], tmp_path, "local")
    assert code_remote == code_local == 1
    assert url + "/adam_eps_fp16/events.out.tfevents" in remote
    assert remote == on_disk.replace(str(local), url)  # the run paths differ by prefix only
    replayed = json.loads(remote)["runs"]
    assert all(r["replay_error"] is None for r in replayed)  # captures replayed in place
    assert sum(r["replay"] is not None for r in replayed) == 11
    assert not _written(s3)
    assert s3.snapshot(BUCKET) == before_bucket and snapshot(local) == before_disk
    capsys.readouterr()


def test_the_api_reads_a_url_and_a_file_url(
        remote_samples: tuple[Path, str]) -> None:
    import analyzer
    from analyzer.report.json import to_json

    local, url = remote_samples
    on_disk = to_json(analyzer.analyze(str(local / "nan_in_batch"), replay=False))
    remote = to_json(analyzer.analyze(url + "/nan_in_batch", replay=False))
    as_file_url = to_json(analyzer.analyze((local / "nan_in_batch").as_uri(), replay=False))
    assert remote == on_disk.replace(str(local), url)
    assert as_file_url == on_disk  # file:// is a local path, read as one


def test_discovery_of_a_bucket_finds_the_runs_of_the_folder(
        s3: S3Server, remote_samples: tuple[Path, str]) -> None:
    from analyzer.ingest.discover import discover

    local, url = remote_samples
    s3.clear()
    remote = discover([url]).runs
    listed = [r for r in s3.requests if r.is_list]
    on_disk = discover([str(local)]).runs
    assert [r.name for r in remote] == [r.name for r in on_disk]
    assert [r.capture_dirs for r in remote] == [
        tuple(c.replace(str(local), url) for c in r.capture_dirs) for r in on_disk]
    assert len(listed) == len(s3.requests) == 1  # one recursive listing, the root's look too
    assert not any(r.method == "GET" and r.key for r in s3.requests)  # nothing opened


def test_without_fsspec_a_url_is_a_usage_error_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from analyzer.ingest.discover import discover

    for module in ("fsspec", "fsspec.core"):
        monkeypatch.setitem(sys.modules, module, None)  # import fsspec raises ImportError
    with pytest.raises(UsageError, match=r"nan-forensics\[remote\]"):
        discover(["s3://bucket/runs"])
    assert main(["analyze", "s3://bucket/runs"]) == 2
    assert "pip install 'nan-forensics[remote]'" in capsys.readouterr().err
    assert discover([str(ROOT / "sample_runs" / "healthy_control")]).runs  # local still works


def test_a_local_analysis_does_not_import_fsspec() -> None:
    code = ("import sys, analyzer; analyzer.analyze('sample_runs/healthy_control', "
            "replay=False); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fsspec', 's3fs', 'botocore')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_listing_of_thousands_of_keys_takes_a_request_per_thousand(
        s3: S3Server) -> None:
    from analyzer.ingest.discover import discover

    blobs: dict[str, bytes] = {}
    for k in range(200):
        run = f"{BUCKET}/fleet/trial_{k:03d}"
        blobs[f"{run}/train.log"] = b"step 1 loss 0.5\n"
        blobs[f"{run}/events.out.tfevents.1700000000.host.1.0"] = b""
        for n in range(13):
            blobs[f"{run}/checkpoints/step_{n}.pt"] = b"x"
    # Folder markers (as consoles and Hadoop tools write them) are not files.
    blobs[f"{BUCKET}/fleet/trial_000/checkpoints/"] = b""
    blobs[f"{BUCKET}/fleet/empty_$folder$"] = b""
    s3.put(blobs)  # a PUT each through the server would take 20 s
    s3.clear()
    runs = discover([f"s3://{BUCKET}/fleet"]).runs
    listed = [r for r in s3.requests if r.is_list]
    keys = len(blobs)
    assert keys > 3000
    assert len(listed) == len(s3.requests) == math.ceil(keys / 1000)  # pages of 1,000
    assert len(runs) == 200
    first = runs[0]
    assert first.path == f"s3://{BUCKET}/fleet/trial_000"
    assert len(first.checkpoint_files) == 13 and len(first.log_files) == 1
    assert not any(r.issues for r in runs)
    assert not any(r.method == "GET" and r.key for r in s3.requests)


def _large_checkpoint(path: Path) -> int:
    import torch

    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(1_000_000), "b": torch.randn(10)}, "step": 7}
    torch.save(state, path)
    return path.stat().st_size


def _fetched(server: S3Server, key: str) -> int:
    return sum(r.sent for r in server.requests if r.method == "GET" and r.key == key)


def test_a_checkpoint_is_listed_from_its_directory_without_fetching_its_tensors(
        s3: S3Server, tmp_path: Path) -> None:
    from analyzer.ingest.checkpoints import scan_checkpoint
    from analyzer.ingest.ckpt.archive import read_archive
    from analyzer.ingest.ckpt.ranges import FileRanges

    size = _large_checkpoint(tmp_path / "step_7.pt")
    key = "big/step_7.pt"
    url = f"s3://{BUCKET}/{key}"
    s3.upload(str(tmp_path), f"s3://{BUCKET}/big")
    s3.clear()
    with FileRanges(url) as ranges:
        archive = read_archive(ranges)
        pickle = archive.member("data.pkl")
        assert pickle is not None and ranges.read(pickle.data_offset, pickle.stored_size)
    assert archive.complete and not archive.issues and len(archive.entries) > 3
    listed = _fetched(s3, key)
    assert 0 < listed < size // 10  # the zip directory and the pickle, no tensor values

    s3.clear()
    scan = scan_checkpoint(url)
    assert not scan.issues and scan.size == size
    scanned = _fetched(s3, key)
    # NaN counts read every value: the object about once (its directory and pickle are
    # read twice, by the static reading and by torch's), never twice over.
    assert 4_000_000 <= scanned < size * 5 // 4
    assert scan.to_dict() == json.loads(json.dumps(scan_checkpoint(
        str(tmp_path / "step_7.pt")).to_dict()).replace(str(tmp_path / "step_7.pt"), url))


def test_an_analysis_without_checkpoints_fetches_none(
        s3: S3Server, tmp_path: Path) -> None:
    import analyzer

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    size = _large_checkpoint(run / "checkpoints" / "step_7.pt")
    (run / "train.log").write_text("step 1 loss 0.5\nstep 2 loss nan\n", encoding="utf-8")
    s3.upload(str(run), f"s3://{BUCKET}/nockpt/run")
    s3.clear()
    report = analyzer.analyze(f"s3://{BUCKET}/nockpt/run", checkpoints=False, replay=False)
    assert report.results[0].run.checkpoints is None or not report.results[0].run.checkpoints
    assert _fetched(s3, "nockpt/run/checkpoints/step_7.pt") == 0
    assert _fetched(s3, "nockpt/run/train.log") < size // 100


def test_inspect_accepts_a_url(
        remote_samples: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    local, url = remote_samples
    name = "nan_in_batch/checkpoints/step_29.pt"
    capsys.readouterr()
    code_remote = main(["inspect", f"{url}/{name}", "--json"])
    remote = capsys.readouterr().out
    code_local = main(["inspect", str(local / name), "--json"])
    on_disk = capsys.readouterr().out
    assert code_remote == code_local
    assert remote == on_disk.replace(str(local), url)
    code_remote = main(["inspect", f"{url}/nan_in_batch", "--json"])  # a folder's, walked
    remote = capsys.readouterr().out
    code_local = main(["inspect", str(local / "nan_in_batch"), "--json"])
    on_disk = capsys.readouterr().out
    assert code_remote == code_local
    assert remote == on_disk.replace(str(local), url)
    below: dict[str, Any] = json.loads(remote)
    assert len(below["checkpoints"]["scans"]) == 7  # 4 saves and the capture's 3


def test_replay_accepts_the_url_of_a_capture(
        remote_samples: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    local, url = remote_samples
    capsys.readouterr()
    code_remote = main(["replay", f"{url}/unnormalized_inputs", "--json", "-"])
    remote = capsys.readouterr().out
    code_local = main(["replay", str(local / "unnormalized_inputs"), "--json", "-"])
    on_disk = capsys.readouterr().out
    assert code_remote == code_local == 1
    assert remote == on_disk.replace(str(local), url)


def test_paths_of_urls_keep_their_bucket() -> None:
    assert storage.parent("s3://b/runs/a") == "s3://b/runs"
    assert storage.parent("s3://b") == "s3://b"
    assert storage.name("s3://b/runs/a/") == "a" and storage.name("s3://b") == "b"
    assert storage.normalize("s3://b/runs/") == "s3://b/runs"
    assert storage.normalize("file:///tmp/x%20y") == "/tmp/x y"
    assert storage.join("s3://b/runs/", "a") == "s3://b/runs/a"
    assert storage.relative("s3://b/runs/a/v_0", "s3://b/runs") == "a/v_0"
    assert storage.inside("s3://b/runs/a", "s3://b/runs")
    assert not storage.inside("s3://b/runs2", "s3://b/runs")
    assert storage.is_url("gs://b/k") and not storage.is_url("file:///x")
    assert not storage.is_url("runs/a") and storage.absolute("s3://b/x/") == "s3://b/x"
    assert storage.parent("runs/a") == "runs"  # a local path as os.path has it


def test_any_fsspec_filesystem_serves_a_run(tmp_path: Path) -> None:
    """memory:// (no server): a filesystem other than s3fs, whose paths start with '/'."""
    import fsspec

    import analyzer
    from analyzer.report.json import to_json

    local = ROOT / "sample_runs" / "nan_in_batch"
    memory = fsspec.filesystem("memory")
    url = "memory://forensics-test/nan_in_batch"
    try:
        memory.pipe({f"{url}/{p.relative_to(local).as_posix()}": p.read_bytes()
                     for p in local.rglob("*") if p.is_file()})
        remote = to_json(analyzer.analyze(url, replay=False))
        on_disk = to_json(analyzer.analyze(str(local), replay=False))
    finally:
        memory.rm("memory://forensics-test", recursive=True)
    assert remote == on_disk.replace(str(local), url)


def test_a_safetensors_header_is_read_without_its_tensors(
        s3: S3Server, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from analyzer.ingest.checkpoints import scan_checkpoint
    from analyzer.ingest.ckpt.ranges import FileRanges
    from analyzer.ingest.ckpt.safetensors_file import read_header

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(1_000_000), "b": torch.zeros(3)}, str(path))
    size = path.stat().st_size
    s3.upload(str(tmp_path), f"s3://{BUCKET}/safe")
    key = "safe/model.safetensors"
    s3.clear()
    with FileRanges(f"s3://{BUCKET}/{key}") as ranges:
        header = read_header(ranges)
    assert len(header.tensors) == 2
    assert _fetched(s3, key) <= storage.SMALL_BLOCK + 1024  # the header, no value
    s3.clear()
    scan = scan_checkpoint(f"s3://{BUCKET}/{key}")
    assert not scan.issues and size <= _fetched(s3, key) < size * 5 // 4


def test_a_run_read_where_it_was_not_listed_is_listed_once(
        s3: S3Server, remote_samples: tuple[Path, str]) -> None:
    """As in a pool's worker, which did not do the discovery: one listing of the run, not a
    look at each object for its size."""
    from analyzer.ingest.discover import discover
    from analyzer.ingest.runs import read_runs

    _, url = remote_samples
    (found,) = discover([f"{url}/division_by_zero"]).runs
    storage.filesystem(url)[0].invalidate_cache()
    s3.clear()
    read_runs([found], checkpoints=True)
    requests = s3.requests
    opened = len({*found.event_files, *found.log_files, *found.checkpoint_files})
    assert opened >= 6
    assert sum(r.is_list for r in requests) == 1
    assert sum(r.method == "HEAD" for r in requests) <= 1


def test_the_signature_of_an_object_changes_with_it(s3: S3Server) -> None:
    url = f"s3://{BUCKET}/signed/train.log"
    fs = filesystem()
    fs.pipe_file(url, b"step 1 loss 1.0\n")
    first = storage.signature(url)
    assert first.startswith("16:") and storage.signature(url) == first
    fs.pipe_file(url, b"step 1 loss 2.0\n")  # same size, new ETag
    assert storage.signature(url) not in ("", first)
    assert storage.signature(f"s3://{BUCKET}/signed/gone.log") == ""


def test_a_bucket_named_alone_a_run_root_and_an_extra_log(s3: S3Server) -> None:
    from analyzer.ingest.discover import discover

    s3.create_bucket("solo")
    s3.upload(str(ROOT / "sample_runs" / "nan_in_batch"), "s3://solo")
    for named in ("s3://solo", "s3://solo/"):
        (run,) = discover([named]).runs
        assert (run.path, run.name) == ("s3://solo", "solo")
        assert run.capture_dirs == ("s3://solo/capture/step_28",)
        assert len(run.checkpoint_files) == 4
    (forced,) = discover(["s3://solo"], run_roots=["s3://solo/"]).runs
    assert forced.path == "s3://solo" and "run-root" in forced.layouts
    (single,) = discover(["s3://solo/train.log"], extra_logs=["s3://solo/README.md"]).runs
    assert single.log_files == ("s3://solo/train.log", "s3://solo/README.md")


def test_an_object_opened_by_safeio_takes_an_io_wrapper(s3: S3Server) -> None:
    """A remote handle is a raw binary stream: io.TextIOWrapper (and BufferedReader) take it."""
    import io

    from analyzer.ingest.safeio import open_regular

    url = f"s3://{BUCKET}/wrapped/train.log"
    filesystem().pipe_file(url, b"step 1 loss 1.0\nstep 2 loss nan\n")
    handle, size = open_regular(url)
    with io.TextIOWrapper(handle, encoding="utf-8", newline="\n") as text:
        assert text.readlines() == ["step 1 loss 1.0\n", "step 2 loss nan\n"]
    assert size == 32 and handle.closed


def test_the_servers_direct_put_writes_what_a_put_through_it_writes(s3: S3Server) -> None:
    """S3Server.put (the large fixtures' writer) against s3fs's PUTs: the same keys, sizes
    and ETags, folder markers included."""
    blobs = {"run/train.log": b"step 1 loss 1.0\n", "run/events.out.tfevents.1.h": b"",
             "run/checkpoints/": b"", "empty_$folder$": b""}
    s3.create_bucket("viaput")
    s3.create_bucket("viahttp")
    s3.put({f"viaput/{k}": v for k, v in blobs.items()})
    filesystem().pipe({f"viahttp/{k}": v for k, v in blobs.items()})
    assert s3.snapshot("viaput") == s3.snapshot("viahttp")
    assert sorted(s3.snapshot("viaput")) == sorted(blobs)
    assert filesystem().cat_file("s3://viaput/run/train.log") == blobs["run/train.log"]
