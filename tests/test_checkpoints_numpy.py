"""The numpy reading of checkpoints against the torch reading it replaces.

Every case is scanned three times: as it is, with numpy's reductions (torch-zip archives
whose pickle torch's weights_only reading is known to accept, and safetensors files, read
with numpy without torch); the same with torch's reductions (taken once torch is
imported); and with the shortcuts turned off (``torch.load`` on the meta device decides,
values read as torch tensors and reduced by torch). The three scans must be equal, word
for word: records, statistics to the last bit, Adam findings, issues, read modes.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.ingest.ckpt import leaves, npstats, safetensors_file, scan
from analyzer.ingest.ckpt.npdtypes import float8_table
from analyzer.ingest.ckpt.npsum import torch_sum
from analyzer.model.checkpoints import CheckpointScan

FLOAT8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]


def _torch_scan(path: Path, monkeypatch: pytest.MonkeyPatch) -> CheckpointScan:
    with monkeypatch.context() as patch:
        patch.setattr(scan, "agrees_without_torch", lambda *args: False)
        patch.setattr(leaves, "np_type", lambda name: None)
        patch.setattr(safetensors_file, "np_type", lambda name: None)
        return scan_checkpoint(str(path))


def _same(path: Path, monkeypatch: pytest.MonkeyPatch) -> CheckpointScan:
    with monkeypatch.context() as patch:
        patch.setattr(npstats, "PREFER_TORCH", False)  # numpy's reductions, not torch's
        fast = scan_checkpoint(str(path))
    slow = _torch_scan(path, monkeypatch)
    assert repr(fast) == repr(slow)
    # torch imported (here it is): numpy's reading, torch's reductions
    assert repr(scan_checkpoint(str(path))) == repr(slow)
    return fast


def _values(dtype: torch.dtype, count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(count, generator=generator, dtype=torch.float64) * 300
    if dtype.is_complex:
        return torch.complex(base, base.flip(0)).to(dtype)
    if dtype.is_floating_point:
        values = base.to(torch.float32).to(dtype) if dtype.itemsize == 1 else base.to(dtype)
        if count > 8:
            values[3] = float("nan")
            if dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz,
                             torch.float8_e5m2fnuz, torch.float8_e8m0fnu):
                values[5], values[7] = float("inf"), float("-inf")
        return values
    if dtype == torch.bool:
        return base > 0
    return base.to(torch.int64).clamp(0, 100).to(dtype)


DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.bool, *(getattr(torch, name) for name in FLOAT8 if hasattr(torch, name)),
]


@pytest.mark.parametrize("name", [n for n in FLOAT8 if hasattr(torch, n)])
def test_float8_tables_match_torch(name: str) -> None:
    codes = torch.arange(256, dtype=torch.uint8).view(getattr(torch, name)).float().numpy()
    np.testing.assert_array_equal(float8_table(name), codes)


@pytest.mark.parametrize("count", [*range(0, 70), 127, 128, 129, 4095, 4096, 4097, 16385,
                                   65536, 65539, 262147, 1 << 20])
def test_sum_is_torch_sum_bit_for_bit(count: int) -> None:
    torch.set_num_threads(1)
    values = (np.random.default_rng(count).standard_normal(count) * 57).astype(np.float32) ** 2
    assert torch_sum(values) == float(torch.from_numpy(values).sum())


@pytest.mark.parametrize("dtypes", [DTYPES[:12], DTYPES])
def test_every_dtype_with_nan_and_inf(
    dtypes: list[torch.dtype], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {f"t{i}.{str(d).removeprefix('torch.')}": _values(d, 300, i)
             for i, d in enumerate(dtypes)}
    state["scalar"] = torch.tensor(3.5)
    state["empty"] = torch.zeros(0, 4)
    path = tmp_path / "dtypes.pt"
    torch.save(state, path)
    result = _same(path, monkeypatch)
    # Some float8 storages are outside this torch's weights_only allow-list: read
    # statically then, by both paths.
    if len(dtypes) == 12:
        assert result.read_mode == "weights_only"
    assert sum(r.stats is not None and r.stats.nan > 0 for r in result.tensors) >= 4


def test_views_offsets_and_shared_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.randn(600, 700)
    base[10, 20] = float("inf")
    state = {
        "whole": base,
        "transposed": base.t(),
        "rows": base[100:300],
        "columns": base[:, 5:600:3],
        "strided": base[::7, ::2].t(),
        "shared": base.view(-1)[1000:5000],
        "big": torch.randn(3, 700_000),  # crosses chunks
        "big_t": torch.randn(1500, 1100).t(),
    }
    path = tmp_path / "views.pt"
    torch.save(state, path)
    _same(path, monkeypatch)


def test_training_checkpoint_with_adam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.LayerNorm(30),
                                torch.nn.Linear(30, 5)).to(torch.bfloat16)
    optimizer = torch.optim.Adam(model.parameters(), eps=1e-6)
    for _ in range(3):
        model(torch.randn(8, 40, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.step()
    state = optimizer.state_dict()
    state["state"][0]["exp_avg_sq"][0, :5] = 0
    state["state"][1]["exp_avg"][2] = float("nan")
    with torch.no_grad():
        model[0].weight[1, 1] = float("inf")
    path = tmp_path / "step_30.pt"
    torch.save({"model": model.state_dict(), "optimizer": state, "step": 30,
                "scaler": {"scale": 1024.0, "growth_factor": 2.0, "_growth_tracker": 3}}, path)
    result = _same(path, monkeypatch)
    assert result.adam and result.nonfinite_tensors


def _patched_pickle(path: Path, edit: bytes, at: int) -> Path:
    """A copy of ``path`` with ``edit`` written into its data.pkl at ``at`` and both of the
    record's CRC fields fixed, so that only the pickle differs."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
        start = info.header_offset + 30 + len(info.filename) + struct.unpack_from(
            "<H", data, info.header_offset + 28)[0]
        pickle_bytes = bytearray(data[start : start + info.compress_size])
    pickle_bytes[at : at + len(edit)] = edit
    data[start : start + len(pickle_bytes)] = pickle_bytes
    crc = zlib.crc32(bytes(pickle_bytes))
    struct.pack_into("<I", data, info.header_offset + 14, crc)
    central = data.find(b"PK\x01\x02" + data[info.header_offset + 4 : info.header_offset + 6])
    while central != -1:
        name_len = struct.unpack_from("<H", data, central + 28)[0]
        if data[central + 46 : central + 46 + name_len] == info.filename.encode():
            struct.pack_into("<I", data, central + 16, crc)
            break
        central = data.find(b"PK\x01\x02", central + 4)
    out = path.with_name(f"patched_{at}_{edit.hex()}.pt")
    out.write_bytes(bytes(data))
    return out


def test_damaged_archives_read_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
    path = tmp_path / "model.pt"
    torch.save({"model": model.state_dict(), "step": 3, "names": ["a", "b"]}, path)
    data = path.read_bytes()
    pickle_len = len(zipfile.ZipFile(path).read("model/data.pkl"))
    rng = np.random.default_rng(5)
    cases = []
    for cut in (*rng.integers(1, len(data), 12), len(data) - 22, len(data) - 1):
        cut_path = tmp_path / f"cut_{cut}.pt"
        cut_path.write_bytes(data[: int(cut)])
        cases.append(cut_path)
    for offset in rng.integers(0, len(data), 25):
        flipped = bytearray(data)
        flipped[int(offset)] ^= 0x5A
        flip_path = tmp_path / f"flip_{offset}.pt"
        flip_path.write_bytes(bytes(flipped))
        cases.append(flip_path)
    for at in range(2, pickle_len - 1, max(1, pickle_len // 40)):
        for edit in (b"\x00", b"\xff", b"b", b"c", b"t", b"e"):
            cases.append(_patched_pickle(path, edit, at))
    for case in cases:
        _same(case, monkeypatch)


def test_storages_out_of_torchs_order_go_to_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch derives the offset of every storage after the first from its writer's layout;
    # records written in another order (by torch's own writer) are placed elsewhere by
    # torch, which the scan reports. The numpy shortcut must not hide that.
    torch.save({"a": torch.ones(3), "b": torch.zeros(4)}, tmp_path / "src.pt")
    with zipfile.ZipFile(tmp_path / "src.pt") as archive:
        records = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    path = tmp_path / "swapped.pt"
    writer = torch._C.PyTorchFileWriter(str(path))
    for name in ("data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/1",
                 "data/0", "version"):
        writer.write_record(name, records[name], len(records[name]))
    writer.write_end_of_file()
    result = _same(path, monkeypatch)
    assert any("no storage record" in issue.message for issue in result.issues)


def test_torch_save_layouts_are_judged_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many storages of several sizes and key lengths: the offsets torch would compute
    # are those of the file, so torch.load is never needed.
    monkeypatch.setattr(scan, "_torch_load", lambda *args, **kwargs: 1 / 0)
    for count in (1, 2, 9, 12, 120):
        state = {f"p{i}": torch.randn(i % 7, 3).to(DTYPES[i % 12]) for i in range(count)}
        path = tmp_path / f"{count}.pt"
        torch.save({"model": state, "step": count}, path)
        result = scan_checkpoint(str(path))
        assert (result.read_mode, result.issues) == ("weights_only", ()), count


@pytest.mark.parametrize("dtype", ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8",
                                   "BOOL", "F8_E5M2", "F8_E4M3", "C64"])
def test_safetensors_every_dtype(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = safetensors_file.DTYPES[dtype][0]
    tensor = _values(getattr(torch, name), 1000, 3)
    path = tmp_path / "model.safetensors"
    save_file({"x": tensor.reshape(10, 100), "y": tensor[:7].clone()}, str(path))
    assert _same(path, monkeypatch).read_mode == "header"


def test_safetensors_cut_and_flipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(300, 20), "b": torch.randn(20).to(torch.bfloat16)}, str(path))
    data = path.read_bytes()
    for cut in (9, 40, 200, len(data) // 2, len(data) - 3):
        (tmp_path / "cut.safetensors").write_bytes(data[:cut])
        _same(tmp_path / "cut.safetensors", monkeypatch)
    for offset in (1, 30, 90, 150, len(data) - 10):
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        (tmp_path / "flip.safetensors").write_bytes(bytes(flipped))
        _same(tmp_path / "flip.safetensors", monkeypatch)


def test_cuda_map_locations_read_as_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint saved from a GPU names "cuda:0" as each storage's location; its bytes
    # are laid out as any other's.
    state = {"w": torch.randn(30, 20), "b": torch.full((20,), float("inf"))}
    path = tmp_path / "gpu.pt"
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, path)
    assert b"cuda:0" in zipfile.ZipFile(path).read("gpu/data.pkl")
    result = _same(path, monkeypatch)
    assert result.read_mode == "weights_only" and result.nonfinite_tensors


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_sparse_and_quantized_tensors_go_to_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {
        "dense": torch.randn(4, 4),
        "sparse": torch.eye(5).to_sparse(),
        "quantized": torch.quantize_per_tensor(torch.randn(6), 0.1, 0, torch.qint8),
    }
    path = tmp_path / "odd.pt"
    torch.save(state, path)
    _same(path, monkeypatch)
