"""Fuzz target: the checkpoint scanner on damaged torch archives and pickles.

Inputs start from real ``torch.save`` files (a small state dict, a model with its Adam
state, a Lightning-like dict with callback and scaler state, a transposed view, a
half-precision dict, a legacy non-zip save, one that needs a class the allow-list lacks)
and are then damaged, one to three times over:

- a field of the zip structure set to an edge value (sizes, offsets, name and extra
  lengths, method and flags in local headers, the central directory and its end record);
- a storage record cut short or lengthened;
- an integer in ``data.pkl`` changed (storage element counts, offsets, sizes, strides),
  an opcode deleted or repeated;
- the calls of a pickle that would create a file spliced into ``data.pkl`` (or the bare
  pickle) between two opcodes;
- the file cut anywhere, or (first of all) a byte changed anywhere outside the storages.

Every float value the seeds store lies in [0.25, 0.75], and no damage writes a value
outside that range into a storage, so a tensor whose stats leave it was read from bytes
outside its storage. Properties:

- ``scan_file`` (the reader without its last-resort guard) never raises;
- nothing the pickle names runs: the file the spliced calls would create never appears,
  and nothing is written beside the scanned file;
- every tensor with stats holds only finite values in [0.25, 0.75];
- an undamaged seed gives, tensor by tensor, the stats a plain numpy reading of
  ``torch.load(weights_only=True)`` gives;
- text planted where a file holds a value, not a name (a text file named like a
  checkpoint, an argument of a pickle opcode, a field of a safetensors header, the
  ``byteorder`` record of an archive), is never quoted by a message, a note or the JSON
  (a string of capitals and digits in a dtype field reads as a dtype name, and may be).
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import pickletools
import string
import struct
import tempfile
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.ingest.ckpt.scan import scan_file
from analyzer.model.checkpoints import CheckpointScan
from analyzer.report.checkpoints import format_scan
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.make_corpus import corpus_files, flipped_and_cut

pytestmark = pytest.mark.fuzz

LOW, HIGH = 0.25, 0.75
"""Every float a seed stores lies in this range (exact in every float dtype)."""
VALUES = (0.25, 0.375, 0.5, 0.625, 0.75)


@dataclass
class Config:
    """A class no allow-list holds: a file that pickles it must be read statically."""

    lr: float = 0.5


def _values(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, len(VALUES), shape, generator=generator)
    return torch.tensor(VALUES)[index].to(dtype)


def _model_state() -> OrderedDict[str, torch.Tensor]:
    return OrderedDict(
        [("enc.weight", _values(6, 4, seed=1)), ("enc.bias", _values(6, seed=2)),
         ("head.weight", _values(2, 6, seed=3)), ("head.bias", _values(2, seed=4))]
    )


def _adam_state(model: OrderedDict[str, torch.Tensor]) -> dict[str, object]:
    state = {
        i: {"step": torch.tensor(0.5), "exp_avg": _values(*t.shape, seed=10 + i),
            "exp_avg_sq": _values(*t.shape, seed=20 + i)}
        for i, t in enumerate(model.values())
    }
    groups = [{"lr": 0.5, "betas": (0.5, 0.5), "eps": 0.25, "params": list(state)}]
    return {"state": state, "param_groups": groups}


SCALER = {"scale": 0.5, "growth_factor": 0.5, "backoff_factor": 0.5, "growth_interval": 20,
          "_growth_tracker": 3}


def _saved(obj: object, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


def seeds() -> dict[str, bytes]:
    """Small torch.save files, all their float values in [0.25, 0.75], and a sharded index."""
    from safetensors.torch import save

    model = _model_state()
    lightning = {
        "epoch": 1, "global_step": 12, "pytorch-lightning_version": "2.4.0",
        "state_dict": OrderedDict((f"model.{k}", v) for k, v in model.items()),
        "optimizer_states": [_adam_state(model)], "lr_schedulers": [{"last_epoch": 1}],
        "callbacks": {"ModelCheckpoint{'monitor': 'loss'}": {"best_model_score":
                                                            torch.tensor(0.5)}},
        "MixedPrecision": dict(SCALER),
    }
    out = {
        "state_dict.pt": _saved(model),
        "training.pt": _saved({"model": model, "optimizer": _adam_state(model),
                               "scaler": dict(SCALER), "step": 7}),
        "lightning-epoch=1-step=12.ckpt": _saved(lightning),
        "mp_rank_00_model_states.pt": _saved({
            "module": model, "buffer_names": [], "optimizer": None,
            "param_shapes": [OrderedDict((k, v.shape) for k, v in model.items())],
            "lr_scheduler": {"_last_lr": [0.5]}, "skipped_steps": 1, "global_steps": 12,
            "global_samples": 96, "dp_world_size": 2, "mp_world_size": 1,
            "ds_config": {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}},
            "ds_version": "0.16.4"}),
        "transposed.pt": _saved({"w": _values(5, 3, seed=5).t(), "row": _values(4, 4)[2]}),
        "half.pt": _saved({"h": _values(8, dtype=torch.float16),
                           "b": _values(8, dtype=torch.bfloat16),
                           "d": _values(3, dtype=torch.float64),
                           "i": torch.arange(4)}),
        "legacy.pt": _saved(dict(model), _use_new_zipfile_serialization=False),
        "needs_globals.pt": _saved({"model": model, "config": Config()}),
        "plain_pickle.pt": pickle.dumps({"lr": 0.5, "steps": [1, 2]}, protocol=2),
        "model-00001-of-00001.safetensors": save({"a.w": _values(3, 2)}),
        "model.safetensors.index.json": (
            b'{"metadata": {}, "weight_map": {"a.w": "model-00001-of-00001.safetensors"}}'),
        "self.safetensors.index.json": (
            b'{"weight_map": {"a.w": "model-00001-of-00001.safetensors",'
            b' "b.w": "self.safetensors.index.json"}}'),
    }
    state = out["state_dict.pt"]
    members = _members(state) or {}
    first = next(n for n in members if n.endswith("/data/0"))
    out["short-record.pt"] = _zipped({**members, first: members[first][:8]})
    outside = bytearray(state)
    struct.pack_into("<I", outside, outside.find(b"PK\x01\x02") + 42, len(state) + 100)
    out["directory-outside.pt"] = bytes(outside)
    out["cut-mid-save.pt"] = out["training.pt"][: len(out["training.pt"]) * 2 // 3]
    return out


# -- damage -----------------------------------------------------------------------------------

_CENTRAL = {"flags": (8, "H"), "method": (10, "H"), "csize": (20, "I"), "usize": (24, "I"),
            "nlen": (28, "H"), "xlen": (30, "H"), "clen": (32, "H"), "offset": (42, "I")}
_LOCAL = {"flags": (6, "H"), "method": (8, "H"), "csize": (18, "I"), "usize": (22, "I"),
          "nlen": (26, "H"), "xlen": (28, "H")}
_END = {"entries_disk": (8, "H"), "entries": (10, "H"), "size": (12, "I"), "offset": (16, "I"),
        "clen": (20, "H")}
_SIGNATURES = {b"PK\x01\x02": _CENTRAL, b"PK\x03\x04": _LOCAL, b"PK\x05\x06": _END}


def _edge(draw: Any, old: int, size: int, bits: int) -> int:
    limit = (1 << bits) - 1
    value = draw(st.sampled_from([0, 1, old - 1, old + 1, old + 64, old * 2, size - 1, size,
                                  size + 1, limit, limit - 1]) | st.integers(0, limit))
    return int(value) & limit


def _zip_field(draw: Any, data: bytearray) -> None:
    found = [(at, fields) for sig, fields in _SIGNATURES.items()
             for at in _all(bytes(data), sig)]
    if not found:
        return
    at, fields = draw(st.sampled_from(found))
    name = draw(st.sampled_from(sorted(fields)))
    where, code = fields[name]
    if at + where + struct.calcsize(code) > len(data):
        return
    (old,) = struct.unpack_from("<" + code, data, at + where)
    struct.pack_into("<" + code, data, at + where,
                     _edge(draw, old, len(data), 8 * struct.calcsize(code)))


def _all(data: bytes, needle: bytes) -> list[int]:
    out, at = [], data.find(needle)
    while at != -1:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


def _members(data: bytes) -> dict[str, bytes] | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return {n: archive.read(n) for n in archive.namelist()}
    except Exception:  # an earlier damage can leave nothing zipfile reads
        return None


def _zipped(members: dict[str, bytes]) -> bytes:
    """The members written again by zipfile, which does not align them: the alignment
    torch declared is dropped with them."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, body in members.items():
            if not name.endswith("/.storage_alignment"):
                archive.writestr(name, body)
    return buffer.getvalue()


def _storage_size(draw: Any, data: bytes) -> bytes:
    members = _members(data)
    keys = sorted(n for n in members or {} if "/data/" in n)
    if members is None or not keys:
        return data
    key = draw(st.sampled_from(keys))
    body = members[key]
    if draw(st.booleans()) or not body or len(body) % 8:
        members[key] = body[: draw(st.integers(0, max(0, len(body) - 1)))]
    else:
        # Lengthened by whole elements of its own, so that what it holds stays in range
        # whatever its dtype: a multiple of 8 bytes is whole elements of any dtype (a record
        # cut to another length is only cut further).
        more = 8 * draw(st.integers(1, 16))
        members[key] = body + (body * (more // len(body) + 1))[:more]
    return _zipped(members)


def _int_op(value: int) -> bytes:
    if -(1 << 31) <= value < (1 << 31):
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _ops(pkl: bytes) -> list[tuple[str, object, int, int]]:
    """(name, arg, start, end) of each opcode of the first pickle in ``pkl``."""
    ops: list[tuple[str, object, int, int]] = []
    try:
        stream = io.BytesIO(pkl)
        for op, arg, pos in pickletools.genops(stream):
            ops.append((op.name, arg, pos or 0, 0))
    except Exception:
        pass
    if not ops:
        return []
    ends = [start for _, _, start, _ in ops[1:]] + [len(pkl)]
    return [(name, arg, start, end) for (name, arg, start, _), end in zip(ops, ends, strict=True)]


_INTS = {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG4"}


def _pickle_op(draw: Any, pkl: bytes) -> bytes:
    ops = _ops(pkl)
    if len(ops) < 2:
        return pkl
    ints = [op for op in ops if op[0] in _INTS and isinstance(op[1], int)]
    how = draw(st.sampled_from(["int", "int", "delete", "repeat"]))
    if how == "int" and ints:
        _, old, start, end = draw(st.sampled_from(ints))
        assert isinstance(old, int)
        new = draw(st.sampled_from([0, -1, 1, old - 1, old + 1, old * 2, old + 64, 1 << 31,
                                    1 << 40, -(1 << 40)]) | st.integers(-(1 << 33), 1 << 33))
        return pkl[:start] + _int_op(int(new)) + pkl[end:]
    _, _, start, end = draw(st.sampled_from(ops[1:-1] or ops))
    if how == "delete":
        return pkl[:start] + pkl[end:]
    return pkl[:end] + pkl[start:end] + pkl[end:]


def _payload(target: str) -> bytes:
    """Opcodes that, run by a real unpickler, call open(target, "w") and drop the result."""
    args = pickletools.optimize(pickle.dumps((target, "w"), protocol=2))
    return b"cbuiltins\nopen\n" + args[2:-1] + b"R0"


def _splice(draw: Any, pkl: bytes, target: str) -> bytes:
    ops = _ops(pkl)
    at = draw(st.sampled_from([start for _, _, start, _ in ops[1:]] or [0]))
    return pkl[:at] + _payload(target) + pkl[at:]


def _with_pickle(draw: Any, data: bytes, change: Any) -> bytes:
    members = _members(data)
    name = next((n for n in members or {} if n.endswith("data.pkl")), None)
    if members is None or name is None:
        return data
    members[name] = change(members[name])
    return _zipped(members)


SEEDS = seeds()


def _pickles_end(data: bytes) -> int:
    """Where the pickles of a bare file end (five for a legacy save, one otherwise)."""
    end = 0
    for _ in range(5):
        try:
            ops = list(pickletools.genops(io.BytesIO(data[end:])))
        except Exception:
            break
        end += (ops[-1][2] or 0) + 1
    return end


_PICKLED_END = {data: _pickles_end(data) for data in SEEDS.values()}
_LAID_OUT_AS = {"cut-mid-save.pt": "training.pt"}
"""A seed with no directory left has the storages where the seed it was cut from has them."""
ARCHIVES = sorted(n for n, d in SEEDS.items() if d.startswith(b"PK\x03\x04"))
PICKLES = ["legacy.pt", "plain_pickle.pt"]


@st.composite
def damaged(draw: Any, target: str) -> tuple[str, bytes]:
    name = draw(st.sampled_from(ARCHIVES + PICKLES))
    data = SEEDS[name]
    archive = data.startswith(b"PK\x03\x04")
    # Changed bytes come first, while it is still known where the storages lie: a byte
    # changed inside one would be a value out of range read rightly from its storage.
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data) - 1))
        layout = SEEDS[_LAID_OUT_AS.get(name, name)]  # the seed's layout: flips move nothing
        if not _inside_a_storage(layout, at):
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["zip", "zip", "storage", "pickle", "pickle", "splice", "cut"]
                                   if archive else ["splice", "cut"]))
        if how == "zip":
            raw = bytearray(data)
            _zip_field(draw, raw)
            data = bytes(raw)
        elif how == "storage":
            data = _storage_size(draw, data)
        elif how == "pickle":
            data = _with_pickle(draw, data, lambda p: _pickle_op(draw, p))
        elif how == "splice":
            splice = lambda p: _splice(draw, p, target)  # noqa: E731
            data = _with_pickle(draw, data, splice) if archive else splice(data)
        else:
            data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    return name, data


def _inside_a_storage(data: bytes, at: int) -> bool:
    if not data.startswith(b"PK"):  # a legacy save keeps its storages after its pickles
        return at >= _PICKLED_END[data]
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
    for info in infos:
        if "/data/" in info.filename and info.header_offset + 30 <= len(data):
            nlen, xlen = struct.unpack_from("<HH", data, info.header_offset + 26)
            start = info.header_offset + 30 + nlen + xlen
            if start <= at < start + info.compress_size:
                return True
    return False


# -- properties -------------------------------------------------------------------------------


def _check_ranges(scan: CheckpointScan) -> None:
    for tensor in scan.tensors:
        stats = tensor.stats
        if stats is None or stats.numel == 0:
            continue
        assert stats.nonfinite == 0, (tensor, "values from outside its storage")
        assert stats.abs_max <= HIGH, (tensor, "values from outside its storage")
        values = stats.numel // (2 if tensor.dtype.startswith("complex") else 1)
        assert stats.sum_squares >= values * LOW * LOW * (1 - 1e-6), (tensor, "zeros read")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The file the spliced calls would create: one path for the whole run, so that the
    inputs drawn do not depend on where a test case runs."""
    return str(tmp_path_factory.mktemp("outside") / "created-by-the-pickle")


@fuzz_settings(300)
@given(data=st.data())
def test_damaged_checkpoints_never_raise_run_nothing_and_read_only_their_storages(
    tmp_path_factory: pytest.TempPathFactory, target: str, data: Any
) -> None:
    folder = tmp_path_factory.mktemp("scan")
    name, raw = data.draw(damaged(target))
    path = folder / name
    path.write_bytes(raw)
    scan = scan_file(str(path), trust_pickle=False)
    assert not os.path.exists(target), "the pickle ran"
    assert sorted(os.listdir(folder)) == [name], "something was written beside the file"
    assert scan.read_mode != "trusted"
    assert all(i.location.file == str(path) for i in scan.issues)
    json.dumps(scan.to_dict(), allow_nan=False)  # the metadata read too, however damaged
    if name != "plain_pickle.pt":
        _check_ranges(scan)


def _oracle(tensor: torch.Tensor) -> tuple[int, float, float]:
    values = tensor.detach().to(torch.float64).numpy().reshape(-1)
    finite = values[np.isfinite(values)]
    top = float(np.abs(finite).max()) if finite.size else 0.0
    return int((~np.isfinite(values)).sum()), top, float((finite**2).sum())


def _flat(value: object, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items: list[tuple[object, object]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(enumerate(value))
    out: dict[str, torch.Tensor] = {}
    for key, item in items:
        out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


@fuzz_settings(20)
@given(name=st.sampled_from(["state_dict.pt", "training.pt", "lightning-epoch=1-step=12.ckpt",
                              "mp_rank_00_model_states.pt", "transposed.pt", "half.pt",
                              "legacy.pt", "plain_pickle.pt"]))
def test_undamaged_seeds_agree_with_torch_load(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    path = tmp_path_factory.mktemp("oracle") / name
    path.write_bytes(SEEDS[name])
    scan = scan_checkpoint(str(path))
    assert scan.read_mode in ("weights_only", "static"), scan.issues
    loaded = _flat(torch.load(path, weights_only=True) if name != "plain_pickle.pt" else {})
    floats = {k: v for k, v in loaded.items() if v.is_floating_point()}
    by_name = {t.name: t for t in scan.tensors if t.stats is not None}
    for key, tensor in floats.items():
        record = by_name.get(key) or next(
            (r for n, r in by_name.items() if key.endswith("." + n) or n.endswith("." + key)),
            None)
        assert record is not None and record.stats is not None, key
        nonfinite, top, squares = _oracle(tensor)
        assert record.stats.nonfinite == nonfinite
        assert record.stats.abs_max == top
        assert math.isclose(record.stats.sum_squares, squares, rel_tol=1e-6)


CORPUS = corpus_files("checkpoints")


@fuzz_settings(60)
@given(data=st.data())
def test_damaged_corpus_files_never_raise(
    tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    if not CORPUS:
        pytest.skip("no corpus")
    source = data.draw(st.sampled_from(CORPUS))
    raw = flipped_and_cut(data, Path(source).read_bytes())
    path = tmp_path_factory.mktemp("corpus") / os.path.basename(source)
    path.write_bytes(raw)
    if path.name.endswith(".index.json"):
        scan = scan_checkpoint(str(path))
    else:
        scan = scan_file(str(path), trust_pickle=False)
    assert scan.read_mode != "trusted"


FOUND = [f for f in CORPUS if os.path.basename(f).startswith("found-")]


@pytest.mark.parametrize("source", FOUND, ids=os.path.basename)
def test_inputs_fuzzing_found_stay_fixed(tmp_path: Path, source: str) -> None:
    """Each input a fuzz run found, undamaged: the properties it once broke hold."""
    path = tmp_path / os.path.basename(source).removeprefix("found-")
    path.write_bytes(Path(source).read_bytes())
    scan = scan_file(str(path), trust_pickle=False)
    assert sorted(os.listdir(tmp_path)) == [path.name]
    _check_ranges(scan)


def test_the_payload_is_live() -> None:
    # The spliced calls really create their file when a real unpickler runs them, so the
    # "the pickle ran" check above can fail.
    with tempfile.TemporaryDirectory() as folder:
        target = os.path.join(folder, "made")
        pickle.loads(_payload(target)[:-1] + b".").close()
        assert os.path.exists(target)


# -- nothing of a file is quoted ---------------------------------------------------------------

_TEXT_STARTS = ["", "(", "c", "}", "]", "(dp0\n", "(I", "(S'", "{", "[", "#!", "PK", "I", "V"]
_VALUE_OPS = [b"I", b"F", b"L", b"S", b"P", b"g", b"V"]
_HEADER_FIELDS = ["dtype", "shape", "data_offsets"]


@st.composite
def planted(draw: Any) -> tuple[str, bytes, str]:
    """(file name, its bytes, the text planted in it where no name is)."""
    # A lower-case letter: a string of capitals and digits reads as a dtype name, and is
    # quoted as one.
    secret = draw(st.sampled_from(string.ascii_lowercase)) + draw(
        st.text(string.ascii_letters + string.digits, min_size=11, max_size=40))
    kind = draw(st.sampled_from(["text", "pickle", "safetensors", "byteorder"]))
    name = draw(st.sampled_from(["model.pt", "model.safetensors", "weights.bin", "last.ckpt"]))
    filler = st.text(string.printable, max_size=40)
    if kind == "text":
        body = (draw(st.sampled_from(_TEXT_STARTS)) + draw(filler) + secret + draw(filler)).encode()
    elif kind == "pickle":
        head = b"\x80" + bytes([draw(st.integers(2, 5))])
        if draw(st.booleans()):
            head += b"}q\x00(X\x01\x00\x00\x00wq\x01"
        tail = draw(st.binary(max_size=16))
        body = head + draw(st.sampled_from(_VALUE_OPS)) + secret.encode() + b"\n" + tail
    elif kind == "safetensors":
        spec: dict[str, object] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
        field = draw(st.sampled_from(_HEADER_FIELDS))
        spec[field] = draw(st.sampled_from([secret, [secret], {secret: 1}, [1, secret]]))
        header = json.dumps({"w": spec}).encode()
        body = struct.pack("<Q", len(header)) + header + b"\x00" * 4
    else:
        members = _members(_saved({"w": _values(3)})) or {}
        order = next(n for n in members if n.endswith("/byteorder"))
        body = _zipped({**members, order: secret.encode()})
    return name, body, secret


def _said(path: Path, body: bytes) -> str:
    path.write_bytes(body)
    scan = scan_checkpoint(str(path))
    return "\n".join([format_scan(scan), json.dumps(scan.to_dict()),
                      *(i.message for i in scan.issues), *(t.note or "" for t in scan.tensors)])


@fuzz_settings(80)
@given(case=planted())
def test_messages_never_quote_what_a_file_holds(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, bytes, str]
) -> None:
    name, body, secret = case
    path = tmp_path_factory.mktemp("planted") / name
    # A piece of the secret may also be a piece of the file's names or of the tool's own
    # words ("FloatSto", "eckpoint"): those said just as well with the secret blanked out
    # are not quotes of it.
    control = _said(path, body.replace(secret.encode(), b"~" * len(secret)))
    said = _said(path, body)
    pieces = {secret[i : i + 8] for i in range(len(secret) - 7)}
    assert sorted(p for p in pieces if p in said and p not in control) == [], said
