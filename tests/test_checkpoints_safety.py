"""Checkpoints that must not be loaded: each gives a clear issue, and nothing runs."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.report.checkpoints import format_scan


class _CreatesFile:
    """Unpickling this opens (and so creates) the file named ``target`` for writing."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (self.target, "w")


def _forbid_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("this file must not be loaded")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch.jit, "load", refuse)


def test_payload_really_creates_a_file_when_unpickled(tmp_path: Path) -> None:
    # Proves the fixture is live, so that the tests below can fail.
    target = tmp_path / "proof"
    pickle.loads(pickle.dumps(_CreatesFile(str(target))))
    assert target.exists()


@pytest.mark.parametrize("writer", ["zip", "legacy", "plain_pickle"])
def test_malicious_pickle_creates_nothing(tmp_path: Path, writer: str) -> None:
    target = tmp_path / "pwned"
    payload = {"model": {"w": torch.ones(3)}, "hook": _CreatesFile(str(target))}
    path = tmp_path / "evil.pt"
    if writer == "zip":
        torch.save(payload, path)
    elif writer == "legacy":
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps({"hook": _CreatesFile(str(target))}, protocol=2))
    scan = scan_checkpoint(str(path))
    assert not target.exists()
    assert scan.read_mode == "static"
    assert scan.static is not None
    assert any(g.endswith(".open") for g in scan.static.globals_wanted)
    issue = scan.issues[0]
    assert issue.kind == "unsafe_checkpoint"
    assert "open" in issue.message and "--trust-pickle" in issue.message
    if writer == "zip":
        (w,) = [t for t in scan.tensors if t.name == "w"]
        assert w.shape == (3,) and w.dtype == "float32"
        assert w.stats is not None and w.stats.sum_squares == pytest.approx(3.0)


def test_trust_pickle_is_the_only_way_to_run_it(tmp_path: Path) -> None:
    target = tmp_path / "created"
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "hook": _CreatesFile(str(target))}, path)
    scan_checkpoint(str(path))
    assert not target.exists()
    scan = scan_checkpoint(str(path), trust_pickle=True)
    assert target.exists()
    assert scan.read_mode == "trusted"


def _saved(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    torch.manual_seed(0)
    torch.save({f"layer{i}.weight": torch.randn(64, 64) for i in range(4)}, path)
    return path


def test_truncated_mid_save_is_incomplete_and_keeps_whole_tensors(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.pt"
    with zipfile.ZipFile(path) as archive:
        third = archive.getinfo("model/data/2")
    cut.write_bytes(data[: third.header_offset + 200])
    scan = scan_checkpoint(str(cut))
    assert scan.format == "incomplete"
    assert scan.issues[0].kind == "truncated"
    assert "cut off mid-save" in scan.issues[0].message
    assert scan.issues[0].location.offset is not None
    by_name = {t.name: t for t in scan.tensors}
    assert by_name["layer0.weight"].stats is not None
    assert by_name["layer1.weight"].stats is not None
    assert by_name["layer2.weight"].stats is None
    assert "not written whole" in (by_name["layer3.weight"].note or "")
    assert "truncated" in format_scan(scan)


def test_every_truncation_is_reported_never_raised(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.pt"
    for length in [*range(0, 200, 7), *range(200, len(data), 997), len(data) - 1]:
        cut.write_bytes(data[:length])
        scan = scan_checkpoint(str(cut))
        assert scan.issues, length
        assert scan.issues[0].kind in ("truncated", "empty_file", "bad_checkpoint"), length


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_is_recognised_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), str(path))
    _forbid_loading(monkeypatch)
    scan = scan_checkpoint(str(path))
    assert scan.format == "torchscript"
    assert scan.issues[0].kind == "unsafe_checkpoint"
    assert "TorchScript" in scan.issues[0].message
    shapes = sorted(t.shape for t in scan.tensors)
    assert shapes == [(2,), (2, 3)]


def test_zip_bomb_is_refused_before_extraction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/data.pkl", pickle.dumps({"x": 1}, protocol=2))
        archive.writestr("bomb/data/0", bytes(64 << 20))
    assert path.stat().st_size < 1 << 20
    _forbid_loading(monkeypatch)
    scan = scan_checkpoint(str(path))
    assert scan.read_mode == "none" and scan.tensors == ()
    assert scan.issues[0].kind == "bad_checkpoint"
    assert "zip bomb" in scan.issues[0].message and "bomb/data/0" in scan.issues[0].message


def test_stored_entry_claiming_more_than_it_holds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model/data/1")
    central = data.find(b"PK\x01\x02")
    name = info.filename.encode()
    while True:  # the central-directory record of that member
        at = data.find(name, central)
        if data[at - 46 : at - 42] == b"PK\x01\x02":
            record = at - 46
            break
        central = at + 1
    struct.pack_into("<I", data, record + 24, 1 << 31)  # uncompressed size
    path.write_bytes(bytes(data))
    _forbid_loading(monkeypatch)
    scan = scan_checkpoint(str(path))
    assert scan.issues[0].kind == "bad_checkpoint"
    assert "claims" in scan.issues[0].message
    assert scan.issues[0].location.offset == info.header_offset


def _safetensors_with_header(tmp_path: Path, header: bytes, data: bytes = b"") -> Path:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "expected"),
    [
        (b"{not json", b"", "not valid JSON"),
        (b"[1, 2]", b"", "not a JSON object"),
        (b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 8, "outside"),
        (b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}', b"\0" * 8, "need 16"),
        (b'{"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}', b"\0", "unknown dtype"),
        (b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', b"\0" * 4, "shape"),
        (
            b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},'
            b' "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
            b"\0" * 8,
            "overlaps",
        ),
    ],
)
def test_bad_safetensors_headers(tmp_path: Path, header: bytes, data: bytes, expected: str) -> None:
    scan = scan_checkpoint(str(_safetensors_with_header(tmp_path, header, data)))
    assert scan.tensors == ()
    assert scan.issues[0].kind == "bad_checkpoint"
    assert expected in scan.issues[0].message
    assert scan.issues[0].location.offset is not None


def test_safetensors_header_size_checked_against_file(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.ones(4)}, str(good))
    data = bytearray(good.read_bytes())
    struct.pack_into("<Q", data, 0, len(data))
    bad = tmp_path / "big.safetensors"
    bad.write_bytes(bytes(data))
    scan = scan_checkpoint(str(bad))
    assert "header claims" in scan.issues[0].message
    struct.pack_into("<Q", data, 0, 1 << 40)
    bad.write_bytes(bytes(data))
    assert "limit" in scan_checkpoint(str(bad)).issues[0].message


def test_sharded_index_refuses_paths_outside_its_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.safetensors"
    save_file({"w": torch.ones(2)}, str(outside))
    folder = tmp_path / "model"
    folder.mkdir()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "../outside.safetensors"}}))
    scan = scan_checkpoint(str(index))
    assert scan.tensors == ()
    assert "not a file name beside the index" in scan.issues[0].message


def test_not_a_checkpoint_and_empty_and_folder(tmp_path: Path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    assert scan_checkpoint(str(text)).issues[0].kind == "bad_checkpoint"
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert scan_checkpoint(str(empty)).issues[0].kind == "empty_file"
    assert scan_checkpoint(str(tmp_path)).issues[0].kind == "unreadable"
    missing = os.path.join(str(tmp_path), "missing.pt")
    assert scan_checkpoint(missing).issues[0].kind == "unreadable"


def test_scanning_writes_nothing_into_the_folder(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    scan_checkpoint(str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _fixture_bytes() -> dict[str, bytes]:
    import tempfile

    folder = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "a.pt")
    torch.save(model, folder / "b.pt")
    save_file({"a.w": torch.randn(8, 8), "b": torch.ones(3)}, str(folder / "c.safetensors"))
    blobs = {p.name: p.read_bytes() for p in folder.iterdir()}
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return blobs


BLOBS = _fixture_bytes()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(sorted(BLOBS)),
    st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), max_size=4),
    st.integers(0, 10**9),
)
def test_damaged_files_never_raise(
    tmp_path: Path, name: str, flips: list[tuple[int, int]], cut: int
) -> None:
    from analyzer.ingest.ckpt.scan import scan_file

    data = bytearray(BLOBS[name])
    for where, byte in flips:
        data[where % len(data)] = byte
    data = data[: max(1, cut % (len(data) + 1))]
    path = tmp_path / name
    path.write_bytes(bytes(data))
    scan = scan_file(str(path), trust_pickle=False)  # the inner reader: no last-resort guard
    assert scan.read_mode != "trusted"
    if bytes(data) != BLOBS[name]:
        assert scan.issues or scan.read_mode in ("weights_only", "header")
