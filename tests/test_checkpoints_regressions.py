"""Regressions of issue #12 in the checkpoint reader, one test per defect, named after it.

Fixtures come from torch.save and safetensors in tmp_path, then are damaged on purpose.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from analyzer.cli.inspect import inspect_command
from analyzer.ingest.checkpoints import (
    checkpoint_incident,
    scan_checkpoint,
    scan_run_checkpoints,
)
from analyzer.ingest.ckpt import safetensors_file
from analyzer.model import CheckpointScan
from analyzer.report.checkpoints import format_history, format_scan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Names, sizes and hashes of every file below ``folder``."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path)] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def _rezip(source: Path, target: Path, change: dict[str, bytes]) -> None:
    """Copy a torch zip archive, replacing the bytes of the members named in ``change``
    (by their name after the archive's prefix folder). zipfile does not align records as
    torch does, so the copy does not declare torch's alignment."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for name in src.namelist():
            leaf = name.split("/", 1)[1]
            if leaf != ".storage_alignment":
                out.writestr(name, change.get(leaf, src.read(name)))


@dataclass
class _Config:
    lr: float = 0.1


# -- 2: a non-finite save with no step fails the run --------------------------------------


@pytest.mark.parametrize("where", ["final.pt", "checkpoints/model.safetensors"])
def test_regression_stepless_nonfinite_checkpoint_fails_the_run(tmp_path: Path, where: str) -> None:
    from analyzer.cli import main

    run = tmp_path / "run"
    path = run / where
    path.parent.mkdir(parents=True)
    weights = {"fc.weight": torch.tensor([1.0, float("nan"), 2.0])}
    if where.endswith(".safetensors"):
        save_file(weights, str(path))
    else:
        torch.save({"model": weights}, path)
    history = scan_run_checkpoints([str(path)])
    incident = checkpoint_incident(history)
    assert incident is not None
    assert (incident.step, incident.kind, incident.layer) == (None, "nan", "fc")
    assert incident.decided_by is not None and "no step" in incident.decided_by
    assert "step None" not in format_history(history)
    assert "no step" in format_history(history)
    before = _snapshot(tmp_path)
    assert main(["analyze", str(run), "--no-replay"]) == 1
    assert _snapshot(tmp_path) == before


def test_regression_stepless_saves_sort_last_and_are_named(tmp_path: Path) -> None:
    paths = []
    for name, value in [("final.pt", float("nan")), ("step_20.pt", 2.0), ("step_10.pt", 1.0)]:
        torch.save({"model": {"fc.weight": torch.full((2,), value)}}, tmp_path / name)
        paths.append(str(tmp_path / name))
    history = scan_run_checkpoints(paths)
    assert [s.step for s in history.saves] == [10, 20, None]
    assert history.first_nonfinite == 2
    incident = checkpoint_incident(history)
    assert incident is not None and incident.step is None and incident.last_finite_step == 20
    text = format_history(history)
    assert "1 with no step in their name or contents" in text
    assert str(tmp_path / "final.pt") in text.split("no step in their name or contents")[1]
    assert "first save with a non-finite tensor: no step" in text


# -- 5: a tensor's extent is checked before its bytes are read ---------------------------


def _short_record_archive(tmp_path: Path, *, needs_globals: bool) -> Path:
    """``a`` is zeros whose record is cut to 16 of its 256 bytes; ``b`` after it is NaN."""
    good = tmp_path / "good.pt"
    payload: dict[str, object] = {"a": torch.zeros(64), "b": torch.full((64,), float("nan"))}
    if needs_globals:
        payload["config"] = _Config()
    torch.save(payload, good)
    with zipfile.ZipFile(good) as archive:
        key = next(n for n in archive.namelist() if n.endswith("data/0"))
        data = archive.read(key)
    short = tmp_path / "short.pt"
    _rezip(good, short, {"data/0": data[:16]})
    return short


@pytest.mark.parametrize("needs_globals", [False, True], ids=["weights_only", "static"])
def test_regression_short_storage_record_is_reported_and_not_scanned(
    tmp_path: Path, needs_globals: bool
) -> None:
    path = _short_record_archive(tmp_path, needs_globals=needs_globals)
    scan = scan_checkpoint(str(path))
    by_name = {t.name: t for t in scan.tensors}
    assert by_name["a"].stats is None and "data/0" in (by_name["a"].note or "")
    b = by_name["b"].stats
    assert b is not None and b.nan == 64
    assert [t.name for t in scan.nonfinite_tensors] == ["b"]
    (issue,) = [i for i in scan.issues if "data/0" in i.message]
    assert issue.kind == "bad_checkpoint" and "holds 16 bytes" in issue.message
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(next(n for n in archive.namelist() if n.endswith("data/0")))
    assert issue.location.offset == info.header_offset + 30 + len(info.filename)


class _Storage:
    """Stands for a storage in a hand-written torch pickle (see ``_archive_with_view``)."""


class _View:
    def __init__(self, storage: _Storage, size: int) -> None:
        self.storage, self.size = storage, size

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        args = (self.storage, 0, (self.size,), (1,), False, OrderedDict())
        return torch._utils._rebuild_tensor_v2, args


class _TorchPickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, "0", "cpu", 64)
        return None


def _archive_with_view(tmp_path: Path, size: int) -> Path:
    """A torch archive whose one tensor views ``size`` elements of a 64-element storage."""
    buffer = io.BytesIO()
    _TorchPickler(buffer, protocol=2).dump({"w": _View(_Storage(), size)})
    path = tmp_path / "view.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("view/data.pkl", buffer.getvalue())
        archive.writestr("view/byteorder", b"little")
        archive.writestr("view/data/0", torch.full((64,), 0.5).numpy().tobytes())
        archive.writestr("view/version", b"3\n")
    return path


def test_regression_view_reaching_past_its_storage_is_not_scanned(tmp_path: Path) -> None:
    fits = scan_checkpoint(str(_archive_with_view(tmp_path, 64)))
    assert fits.issues == () and fits.tensors[0].stats is not None
    assert fits.tensors[0].stats.sum_squares == pytest.approx(16.0)
    scan = scan_checkpoint(str(_archive_with_view(tmp_path, 80)))
    assert scan.tensors[0].stats is None and "not scanned" in (scan.tensors[0].note or "")
    assert any("needs 320 bytes" in i.message and "data/0" in i.message for i in scan.issues)


_SHRINK_CHILD = r"""
import os, sys, torch
from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.ingest.ckpt import scan as scan_module

path = sys.argv[1]
torch.save({"w": torch.ones(1 << 20)}, path)
# The pickle is judged without torch (wopredict) when it can be, else by torch.load.
decide = scan_module.agrees_without_torch

def decide_then_shrink(*args, **kwargs):
    # The trainer overwrites the file in place once the checkpoint has been opened.
    out = decide(*args, **kwargs)
    os.truncate(path, 4096)
    return out

scan_module.agrees_without_torch = decide_then_shrink
scan = scan_checkpoint(path)
print(scan.tensors[0].note)
"""


def test_regression_file_shrinking_while_scanned_is_reported_not_fatal(tmp_path: Path) -> None:
    # Before: values were read through torch.load(mmap=True), and the process died of SIGBUS.
    child = subprocess.run(
        [sys.executable, "-c", _SHRINK_CHILD, str(tmp_path / "last.ckpt")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert child.returncode == 0, child.stderr
    assert "values present in the file" in child.stdout


def test_regression_weights_only_archive_is_not_memory_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, object]] = []
    load = torch.load

    def recording(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "load", recording)
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3).t(), "v": torch.ones(3)}, path)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "weights_only"
    # torch.save's own layout is judged without torch (wopredict): no call at all then.
    assert all(not c.get("mmap") and c.get("weights_only") for c in calls)
    w = next(t for t in scan.tensors if t.name == "w")
    assert w.stats is not None and w.stats.sum_squares == pytest.approx(55.0)


# -- 12: a safetensors header of millions of tensors is refused ----------------------------


def test_regression_safetensors_header_with_too_many_tensors_is_too_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = safetensors_file.MAX_TENSORS + 1
    entries = ",".join(
        f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(count)
    )
    header = ("{" + entries + "}").encode()
    path = tmp_path / "many.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(count))

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the header must be refused before it is parsed")

    monkeypatch.setattr(safetensors_file.json, "loads", no_parse)
    scan = scan_checkpoint(str(path))
    (issue,) = scan.issues
    assert issue.kind == "too_large" and scan.tensors == () and scan.read_mode == "none"
    assert f"{count:,}" in issue.message and f"{safetensors_file.MAX_TENSORS:,}" in issue.message


def test_regression_safetensors_header_above_the_byte_limit_is_too_large(tmp_path: Path) -> None:
    length = safetensors_file.MAX_HEADER_BYTES + 1
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", length) + b"{")
        handle.truncate(8 + length + 16)  # sparse: the header's bytes are never read
    scan = scan_checkpoint(str(path))
    (issue,) = scan.issues
    assert issue.kind == "too_large"
    assert f"{length:,}" in issue.message
    assert f"{safetensors_file.MAX_HEADER_BYTES:,}" in issue.message


# -- 14: judged by content, messages that say what is wrong, one exit rule ---------------


def test_regression_torch_zip_named_safetensors_is_read_by_content(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.tensor([1.0, float("inf")])}, path)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "weights_only" and scan.format == "state_dict"
    assert [t.name for t in scan.nonfinite_tensors] == ["w"]
    assert any("named like a safetensors file but holds a torch zip" in i.message
               for i in scan.issues)


@pytest.mark.parametrize("text", ["cat and dog\n", "config: 1\nlr: 0.1\n", "(not a pickle)\n"])
def test_regression_text_file_is_not_a_checkpoint(tmp_path: Path, text: str) -> None:
    path = tmp_path / "notes.pt"
    path.write_text(text)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "none"
    messages = " ".join(i.message for i in scan.issues)
    assert "not a checkpoint: a text file" in messages
    assert "globals" not in messages and "--trust-pickle" not in messages


def test_regression_pickle_refused_for_another_reason_says_why(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"lr": 0.1, "steps": [1, 2]}, protocol=4))
    scan = scan_checkpoint(str(path))
    (issue,) = scan.issues
    assert issue.kind == "unsafe_checkpoint"
    assert "FRAME" in issue.message and "refused it" in issue.message
    assert "globals" not in issue.message and "--trust-pickle" not in issue.message
    assert scan.read_mode == "static"


def _unreadable(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.pt"
    contents = {"text_c": b"cat and dog\n", "text_h": b"hello world\n",
                "binary": bytes(range(200, 256)) * 4, "empty": b"",
                "bad_pickle": b"(\xff\xfe\xfd"}
    path.write_bytes(contents[kind])
    return path


@pytest.mark.parametrize("kind", ["text_c", "text_h", "binary", "empty", "bad_pickle"])
def test_regression_inspect_exit_status_follows_one_rule(tmp_path: Path, kind: str) -> None:
    bad = _unreadable(tmp_path, kind)
    out = io.StringIO()
    assert inspect_command([str(bad)], stream=out) == 2, out.getvalue()
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    assert inspect_command([str(good)], stream=io.StringIO()) == 0
    assert inspect_command([str(good), str(bad)], stream=io.StringIO()) == 2
    nan = tmp_path / "nan.pt"
    torch.save({"w": torch.tensor([float("nan")])}, nan)
    assert inspect_command([str(nan), str(bad)], stream=io.StringIO()) == 1


# -- 16: sharded index cycles, a bad central directory, one JSON shape for issues --------


def test_regression_index_naming_itself_is_reported_once(tmp_path: Path) -> None:
    shard = tmp_path / "model-00001-of-00001.safetensors"
    save_file({"a.w": torch.tensor([1.0, float("nan")])}, str(shard))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.w": shard.name, "b.w": index.name}}))
    scan = scan_checkpoint(str(index))
    assert [t.name for t in scan.tensors] == ["a.w"] and scan.files == (str(index), str(shard))
    named = [i for i in scan.issues if "names itself" in i.message]
    assert len(named) == 1 and len(scan.issues) == 2
    history = scan_run_checkpoints([str(index), str(shard)])
    assert [s.path for s in history.saves] == [str(index)] and history.first_nonfinite == 0


def test_regression_indexes_naming_each_other_are_not_followed(tmp_path: Path) -> None:
    shard = tmp_path / "shard.safetensors"
    save_file({"a.w": torch.ones(2)}, str(shard))
    first, second = tmp_path / "a.safetensors.index.json", tmp_path / "b.safetensors.index.json"
    first.write_text(json.dumps({"weight_map": {"a.w": shard.name, "x": second.name}}))
    second.write_text(json.dumps({"weight_map": {"y": first.name}}))
    scan = scan_checkpoint(str(first))
    assert [t.name for t in scan.tensors] == ["a.w"]
    assert sum("another index" in i.message for i in scan.issues) == 1
    out = io.StringIO()
    # b names nothing but a: no tensor can be read through it, so it is unreadable.
    assert inspect_command([str(tmp_path)], stream=out) == 2
    assert out.getvalue().count("as a shard: not followed") == 4  # per scan, then in history


def test_regression_central_directory_outside_file_falls_back_to_local_headers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cd.pt"
    torch.save({"w": torch.tensor([1.0, float("nan")]), "v": torch.ones(3)}, path)
    data = bytearray(path.read_bytes())
    record = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, record + 42, len(data) + 1000)  # first entry's header offset
    path.write_bytes(bytes(data))
    scan = scan_checkpoint(str(path))
    assert scan.issues[0].kind == "bad_checkpoint"
    assert "central directory" in scan.issues[0].message
    assert scan.issues[0].location.offset == len(data) + 1000
    by_name = {t.name: t for t in scan.tensors}
    assert by_name["w"].stats is not None and by_name["w"].stats.nan == 1
    assert by_name["v"].stats is not None and by_name["v"].stats.sum_squares == 3.0
    assert scan.read_mode == "static" and scan.format == "state_dict"


def test_regression_checkpoint_issues_use_the_one_json_shape(tmp_path: Path) -> None:
    path = _short_record_archive(tmp_path, needs_globals=False)
    scan = scan_checkpoint(str(path))
    assert scan.to_dict()["issues"] == [i.to_dict() for i in scan.issues]
    out = io.StringIO()
    inspect_command([str(path)], as_json=True, stream=out)
    issue = json.loads(out.getvalue())["checkpoint"]["issues"][0]
    assert set(issue) == {"kind", "message", "location"}
    assert set(issue["location"]) == {"file", "offset", "line"}
    history = scan_run_checkpoints([str(path)])
    assert history.to_dict()["issues"] == [i.to_dict() for i in history.issues]


# -- non-regular files, deep folders --------------------------------------------------------


def test_regression_fifo_and_device_named_like_checkpoints_are_refused_by_type(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    device = tmp_path / "zeros.safetensors"
    device.symlink_to("/dev/zero")
    results: dict[str, CheckpointScan] = {}

    def scan_both() -> None:
        for path in (fifo, device):
            results[path.name] = scan_checkpoint(str(path))

    worker = threading.Thread(target=scan_both, daemon=True)
    worker.start()
    worker.join(120)  # a reader that opens the FIFO would block here forever
    assert not worker.is_alive(), "scanning a FIFO blocked"
    for name, scan in results.items():
        (issue,) = scan.issues
        assert issue.kind == "not_regular", name
        assert scan.read_mode == "none"
    assert "FIFO" in results["model.pt"].issues[0].message
    assert "character device" in results["zeros.safetensors"].issues[0].message


def test_regression_inspect_walks_deep_folders_without_recursion(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(1)}, tmp_path / "top.pt")
    folder = str(tmp_path)
    out = io.StringIO()
    try:
        for _ in range(1200):  # one level at a time: os.makedirs itself recurses
            folder = os.path.join(folder, "d")
            os.mkdir(folder)
        torch.save({"w": torch.ones(1)}, os.path.join(folder, "deep.pt"))
        assert inspect_command([str(tmp_path)], stream=out) == 0
    finally:  # shutil.rmtree recurses too: take the tree down one level at a time
        if os.path.exists(os.path.join(folder, "deep.pt")):
            os.remove(os.path.join(folder, "deep.pt"))
        while folder != str(tmp_path):
            os.rmdir(folder)
            folder = os.path.dirname(folder)
    text = out.getvalue()
    assert "top.pt" in text and "deep.pt" not in text
    from analyzer.ingest.discover import MAX_DEPTH

    assert f"too_deep: 1 sub-folder(s) more than {MAX_DEPTH} levels below" in text


def test_regression_scan_renders_no_step_in_words(tmp_path: Path) -> None:
    path = tmp_path / "final.pt"
    torch.save({"w": torch.ones(1)}, path)
    assert "no step]" in format_scan(scan_checkpoint(str(path)))


def test_the_globals_read_without_torch_are_on_torchs_weights_only_allow_list() -> None:
    # A global the static reader rebuilds but torch's weights_only unpickler refuses would
    # make a file read as weights_only that torch.load(weights_only=True) does not open
    # (torch has no typed float8 storages: such a name is not torch's).
    from torch._weights_only_unpickler import _get_allowed_globals

    from analyzer.ingest.ckpt import wopredict

    assert wopredict.GLOBALS.issubset(_get_allowed_globals())
