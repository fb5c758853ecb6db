"""Regressions found in review of the checkpoint reader: messages that quoted a file's
contents, values read through a memory map or from a reading torch does not use, and a
second folder walk. Fixtures come from torch.save and safetensors, then are altered."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from analyzer.cli.inspect import inspect_command
from analyzer.ingest import discover
from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.ingest.ckpt.staticpickle import read_pickle
from analyzer.model.checkpoints import CheckpointScan
from analyzer.report.checkpoints import format_scan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "ghp_SECRETTOKEN123abcXYZ"


def _leaked(text: str, secret: str = SECRET) -> list[str]:
    """Every 6-character piece of ``secret`` that ``text`` holds."""
    return sorted({secret[i : i + 6] for i in range(len(secret) - 5) if secret[i : i + 6] in text})


def _everything_said(scan: CheckpointScan) -> str:
    return "\n".join([format_scan(scan), json.dumps(scan.to_dict())])


def _rezip(source: Path, target: Path, change: dict[str, bytes]) -> None:
    """A copy of a torch archive with some members' bytes replaced (named after the
    archive's folder); zipfile does not align records, so no alignment is declared."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for name in src.namelist():
            leaf = name.split("/", 1)[1]
            if leaf != ".storage_alignment":
                out.writestr(name, change.get(leaf, src.read(name)))


# -- S8: a file's contents are never quoted -------------------------------------------------


def test_regression_symlinked_credentials_file_is_described_not_quoted(tmp_path: Path) -> None:
    secret_file = tmp_path / "git-credentials"
    text = f"https://alice:{SECRET}@github.com\n"
    secret_file.write_text(text)
    run = tmp_path / "leak"
    run.mkdir()
    (run / "model.pt").symlink_to(secret_file)
    scan = scan_checkpoint(str(run / "model.pt"))
    assert scan.read_mode == "none"
    (issue,) = scan.issues
    assert issue.message.startswith(f"not a checkpoint: a text file of {len(text)} bytes")
    assert _leaked(_everything_said(scan)) == []
    for as_json in (False, True):
        out = io.StringIO()
        assert inspect_command([str(run)], as_json=as_json, stream=out) == 2
        assert _leaked(out.getvalue()) == []


_BARE_PICKLE = b"\x80\x02}q\x00(X\x01\x00\x00\x00wq\x01"


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("model.pt", f"({SECRET}\n".encode()),  # protocol 0 pickles start with these
        ("model.pt", f"c{SECRET} x\n".encode()),
        ("model.bin", f"]{SECRET}\n".encode()),
        ("model.safetensors", f"{SECRET}\n".encode()),  # its first 8 bytes read as a length
        ("model.safetensors", f"}}{SECRET}\n".encode()),
        ("model.pt", _BARE_PICKLE + f"I{SECRET}\n".encode() + b"\xff\xfe"),  # int() quotes it
        ("model.pt", b"\x80\x02S" + SECRET.encode() + b"\n."),  # pickletools quotes it
    ],
)
def test_regression_not_a_checkpoint_message_quotes_nothing(
    tmp_path: Path, name: str, body: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(body)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "none" and scan.issues
    assert _leaked(_everything_said(scan)) == [], [i.message for i in scan.issues]
    if body.isascii():
        assert "a text file" in " ".join(i.message for i in scan.issues)
        assert "holds a pickle" not in " ".join(i.message for i in scan.issues)


def test_regression_static_pickle_error_quotes_no_value() -> None:
    for body in (b"(I" + SECRET.encode() + b"\n", b"\x80\x02S" + SECRET.encode() + b"\n.",
                 b"\x80\x02h\x05"):
        result = read_pickle(body)
        assert result.error is not None and _leaked(result.error) == [], result.error


def test_regression_safetensors_header_values_are_described_not_quoted(tmp_path: Path) -> None:
    long_secret = SECRET * 3
    for spec, said in [
        ({"dtype": long_secret, "shape": [1], "data_offsets": [0, 4]}, "a string of 72"),
        ({"dtype": "F32", "shape": [long_secret], "data_offsets": [0, 4]}, "a list of 1 items"),
        ({"dtype": "F32", "shape": [1], "data_offsets": {long_secret: 1}}, "an object of 1"),
    ]:
        header = json.dumps({"w": spec}).encode()
        path = tmp_path / "w.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 4)
        scan = scan_checkpoint(str(path))
        (issue,) = scan.issues
        assert said in issue.message and _leaked(issue.message) == [], issue.message


def test_regression_byteorder_record_is_not_quoted(tmp_path: Path) -> None:
    saved = tmp_path / "saved.pt"
    torch.save({"w": torch.ones(3)}, saved)
    path = tmp_path / "odd.pt"
    _rezip(saved, path, {"byteorder": SECRET.encode()})
    scan = scan_checkpoint(str(path))
    assert _leaked(_everything_said(scan)) == [], [i.message for i in scan.issues]
    assert any("byteorder record names neither" in i.message for i in scan.issues)
    assert scan.tensors[0].stats is None


# -- S9: values come from the reading torch uses, never through a memory map --------------


def _big_endian(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor whose bytes in memory are ``tensor``'s values stored big-endian."""
    width = tensor.element_size() // 2 if tensor.is_complex() else tensor.element_size()
    raw = tensor.contiguous().reshape(-1).view(torch.uint8).view(-1, width).flip(1)
    return raw.reshape(-1).view(tensor.dtype).reshape(tensor.shape)


def _values() -> dict[str, torch.Tensor]:
    grid = torch.arange(12.0).reshape(3, 4) - 5.5
    return {
        "f32": torch.tensor([1.5, float("nan"), -2.25, float("inf"), 70000.0]),
        "f16": torch.tensor([0.5, -3.0, float("-inf")], dtype=torch.float16),
        "bf16": torch.tensor([1.0, 256.0, -0.125], dtype=torch.bfloat16),
        "f64": torch.tensor([1e300, -2.0], dtype=torch.float64),
        "c64": torch.tensor([1 + 2j, -3 - 0.5j], dtype=torch.complex64),
        "i64": torch.tensor([1, -7, 1 << 40]),
        "grid": grid,
    }


_BIG_ENDIAN_CHILD = r"""
import dataclasses, json, sys, types, torch
import torch.serialization as serialization
from analyzer.ingest.checkpoints import scan_checkpoint
from tests.test_checkpoints_review import _big_endian, _values

path = sys.argv[1]
values = {k: _big_endian(v) for k, v in _values().items()}
tensors = {k: v for k, v in values.items() if k != "grid"}
tensors["grid_t"] = values["grid"].t()  # a strided view of its storage
real = serialization.sys
serialization.sys = types.SimpleNamespace(byteorder="big")  # as on a big-endian machine
try:
    torch.save(tensors, path)
finally:
    serialization.sys = real
scan = scan_checkpoint(path)
print(json.dumps({t.name: t.stats and dataclasses.asdict(t.stats) for t in scan.tensors}))
"""


def test_regression_big_endian_archive_is_byte_swapped_as_read(tmp_path: Path) -> None:
    # Before: such an archive went to torch.load(map_location="meta"), which byte-swaps
    # meta storages and killed the process (SIGSEGV).
    path = tmp_path / "big.pt"
    child = subprocess.run([sys.executable, "-c", _BIG_ENDIAN_CHILD, str(path)],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    scanned = json.loads(child.stdout.strip().splitlines()[-1])
    loaded = torch.load(path, weights_only=True)  # torch swaps them back
    values = _values()
    assert torch.equal(loaded["grid_t"], values["grid"].t())
    native = tmp_path / "little.pt"
    torch.save({**{k: v for k, v in values.items() if k != "grid"},
                "grid_t": values["grid"].t()}, native)
    expected = {t.name: t.stats and dataclasses.asdict(t.stats)
                for t in scan_checkpoint(str(native)).tensors}
    assert scanned == expected
    assert scanned["f32"]["nan"] == 1 and scanned["f32"]["abs_max"] == 70000.0


class _Rebuilt:
    """A tensor pickled as torch pickles one, followed by a BUILD whose state torch's
    weights_only unpickler applies with ``set_`` (the static reader has no such step)."""

    def __init__(self, tensor: torch.Tensor, state: tuple[object, ...]) -> None:
        self.tensor, self.state = tensor, state

    def __reduce__(self) -> tuple[object, ...]:
        t = self.tensor
        args = (t._typed_storage(), 0, tuple(t.shape), t.stride(), False, OrderedDict())
        return torch._utils._rebuild_tensor_v2, args, self.state


def _record_offset(path: Path, key: str) -> int:
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(f"/data/{key}"))
    with open(path, "rb") as handle:
        handle.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
    return info.header_offset + 30 + name_length + extra_length


@pytest.mark.parametrize("trust", [False, True])
def test_regression_storage_torch_grows_is_checked_against_its_record(
    tmp_path: Path, trust: bool
) -> None:
    # torch's reading gives w 40 elements over a 4-element record; the static one, 4.
    small, after = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.full((64,), float("nan"))
    path = tmp_path / "grown.pt"
    torch.save({"w": _Rebuilt(small, (small._typed_storage(), 0, (40,), (1,))),
                "after": after}, path)
    scan = scan_checkpoint(str(path), trust_pickle=trust)
    by_name = {t.name: t for t in scan.tensors}
    assert by_name["after"].stats is not None and by_name["after"].stats.nan == 64
    assert by_name["w"].shape == (40,) and by_name["w"].stats is None
    (issue,) = [i for i in scan.issues if "record holds 16 bytes" in i.message]
    assert issue.kind == "bad_checkpoint" and "torch's reading" in issue.message
    assert issue.location.offset == _record_offset(path, "0")


def test_regression_static_reading_is_not_used_where_torch_places_a_tensor_elsewhere(
    tmp_path: Path,
) -> None:
    # Same name, shape and dtype in both readings, but torch's w lies over the NaN record.
    small, other = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.full((4,), float("nan"))
    path = tmp_path / "moved.pt"
    torch.save({"w": _Rebuilt(small, (other._typed_storage(), 0, (4,), (1,))),
                "other": other}, path)
    assert torch.load(path, weights_only=True)["w"].isnan().all()
    scan = scan_checkpoint(str(path))
    w = next(t for t in scan.tensors if t.name == "w")
    assert w.stats is not None and w.stats.nan == 4


def test_regression_trusted_archive_is_read_without_a_memory_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[object, dict[str, object]]] = []
    load = torch.load

    def recording(source: object, *args: object, **kwargs: object) -> object:
        calls.append((source, kwargs))
        return load(source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "load", recording)
    path = tmp_path / "trusted.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3).t(), "v": torch.ones(3)}, path)
    scan = scan_checkpoint(str(path), trust_pickle=True)
    assert scan.read_mode == "trusted"
    assert calls and all(not kw.get("mmap") for _, kw in calls)
    assert not any(isinstance(source, str | os.PathLike) for source, _ in calls)
    w = next(t for t in scan.tensors if t.name == "w")
    assert w.stats is not None and w.stats.sum_squares == pytest.approx(55.0)


_SHRINK_TRUSTED_CHILD = r"""
import os, sys, torch
from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.ingest.ckpt import scan as scan_module

path = sys.argv[1]
torch.save({"w": torch.ones(1 << 20)}, path)
load = scan_module._torch_load

def load_then_shrink(*args, **kwargs):
    out = load(*args, **kwargs)
    os.truncate(path, 4096)  # overwritten in place once torch has read the pickle
    return out

scan_module._torch_load = load_then_shrink
print(scan_checkpoint(path, trust_pickle=True).tensors[0].note)
"""


def test_regression_trusted_file_shrinking_while_scanned_is_reported_not_fatal(
    tmp_path: Path,
) -> None:
    # Before: torch.load(path, mmap=True) mapped it, and the process died of SIGBUS.
    child = subprocess.run(
        [sys.executable, "-c", _SHRINK_TRUSTED_CHILD, str(tmp_path / "last.ckpt")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert "values present in the file" in child.stdout


# -- one folder walk; one look at an index --------------------------------------------------


def test_regression_inspect_walks_folders_with_discovers_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walked: list[str] = []
    walk = discover.walk_tree

    def recording(root: str, descend: object) -> object:
        walked.append(root)
        return walk(root, descend)  # type: ignore[arg-type]

    monkeypatch.setattr(discover, "walk_tree", recording)
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    os.mkfifo(tmp_path / "b.pt")
    out = io.StringIO()
    assert inspect_command([str(tmp_path)], as_json=True, stream=out) == 2
    assert walked == [str(tmp_path)]
    payload = json.loads(out.getvalue())
    assert payload["checkpoint"]["path"] == str(tmp_path / "a.pt")
    (passed,) = payload["passed_over"]
    assert passed["kind"] == "not_regular"
    assert passed["location"] == {"file": str(tmp_path / "b.pt"), "offset": None, "line": None}


def test_regression_sharded_index_is_looked_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "model-1.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    looks: list[str] = []
    stat, opened = os.stat, os.open

    def counting_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if os.fspath(path) == str(index):  # type: ignore[arg-type]
            looks.append("stat")
        return stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def counting_open(path: object, *args: object, **kwargs: object) -> int:
        if os.fspath(path) == str(index):  # type: ignore[arg-type]
            looks.append("open")
        return opened(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting_stat)
    monkeypatch.setattr(os, "open", counting_open)
    scan = scan_checkpoint(str(index))
    assert [t.name for t in scan.tensors] == ["w"]
    # scan_checkpoint's own isdir, then safeio's open_regular: one stat and one open.
    assert looks == ["stat", "stat", "open"], looks
