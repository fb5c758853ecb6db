"""Fuzz target: safetensors headers.

Inputs are structure-aware: a header of up to eight entries with random dtypes (every
dtype safetensors knows, and unknown ones), shapes (empty, zero-sized, huge, negative,
not integers), data offsets laid out one after the other or with holes, overlaps,
reversed or huge numbers, extra keys, ``__metadata__`` of any JSON, over random data
bytes (NaN and Inf patterns included); sometimes the JSON is nested thousands deep, is
thousands of entries wide, holds bytes that are not UTF-8, is padded with spaces, or the
length field lies. The committed corpus is damaged by cuts and byte changes.

Properties:

- ``scan_file`` never raises, and a refused header yields no tensors;
- every tensor with stats has the stats of its declared bytes as torch decodes them
  (an obvious oracle: the whole byte span converted to float64);
- whenever safetensors' own loader accepts the file, the scan lists the same tensors
  with the same shapes and dtypes, refuses nothing, and its stats equal those of the
  tensors that loader returns.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import _TYPES as REFERENCE_DTYPES
from safetensors.torch import load, save

from analyzer.ingest.ckpt.safetensors_file import DTYPES
from analyzer.ingest.ckpt.scan import scan_file
from analyzer.model.checkpoints import CheckpointScan, TensorStats
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.make_corpus import corpus_files, flipped_and_cut

pytestmark = pytest.mark.fuzz

NAME = "model.safetensors"
ITEMSIZE = {name: size for name, (_, size) in DTYPES.items()}
DTYPE_NAMES = sorted(set(DTYPES) | set(REFERENCE_DTYPES))
SPECIAL = [struct.pack("<f", v) for v in (math.nan, math.inf, -math.inf, 7e4, -0.0)]


@st.composite
def entry(draw: Any, offset: int, bent: bool) -> tuple[dict[str, object], int]:
    """One tensor's entry starting at ``offset`` (a ``bent`` one has something odd about
    its dtype, shape or offsets), and where the next would start."""
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    shape: object = draw(st.lists(st.integers(0, 5), max_size=3))
    what = draw(st.sampled_from(["dtype", "shape", "offsets", "extra"])) if bent else None
    if what == "dtype":
        dtype = draw(st.sampled_from(["Q7", "f32", "", "F32 "]) | st.text(max_size=4))
    if what == "shape":
        shape = draw(st.sampled_from([[-1], [1.5], ["2"], [True], 3, [2**64], [2**40, 2**40]]))
    numel = math.prod(shape) if isinstance(shape, list) and all(
        type(d) is int for d in shape) else 1
    size = numel * ITEMSIZE.get(dtype, 1)
    layout = "next"
    if what == "offsets":
        layout = draw(st.sampled_from(["hole", "overlap", "short", "long", "reversed", "huge",
                                       "negative", "float", "missing"]))
    begin, end = offset, offset + size
    if layout == "hole":
        begin, end = begin + 4, end + 4
    elif layout == "overlap" and offset:
        begin, end = begin - 2, end - 2
    elif layout == "short":
        end = max(begin, end - 1)
    elif layout == "long":
        end += 2
    elif layout == "reversed":
        begin, end = end + 1, begin
    offsets: object = [begin, end]
    if layout == "huge":
        offsets = [begin, 2**64 + end]
    elif layout == "negative":
        offsets = [-4, end]
    elif layout == "float":
        offsets = [float(begin), end]
    spec: dict[str, object] = {"dtype": dtype, "shape": shape}
    if layout != "missing":
        spec["data_offsets"] = offsets
    if what == "extra":
        spec["extra"] = draw(st.integers() | st.text(max_size=3))
    return spec, max(offset, end)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


@st.composite
def files(draw: Any) -> bytes:
    """A safetensors file as its writer would lay it out, then bent in one or two ways."""
    shape = draw(st.sampled_from(["entries"] * 8 + ["deep", "wide", "not_object"]))
    header: dict[str, object] = {}
    offset = 0
    if shape == "entries":
        count = draw(st.integers(0, 8))
        bent = draw(st.none() | st.integers(0, max(0, count - 1)))
        for i in range(count):
            name = draw(st.sampled_from([f"layer.{i}.weight", f"t{i}", f"{i}"])
                        | st.text(max_size=6))
            header[name], offset = draw(entry(offset, bent == i))
        if draw(st.booleans()):
            header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4),
                                                          st.text(max_size=4)) | JSON)
        raw = json.dumps(header).encode()
    elif shape == "deep":
        depth = draw(st.integers(500, 100_000))
        raw = (b'{"a":' * depth + b"1" + b"}" * depth) if draw(st.booleans()) else (
            b"[" * depth + b"]" * depth)
    elif shape == "wide":
        count = draw(st.integers(1000, 3000))
        raw = json.dumps({f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
                          for i in range(count)}).encode()
        offset = count
    else:
        raw = json.dumps(draw(JSON)).encode()
    bend = draw(st.sampled_from(["none"] * 10 + ["pad", "not_utf8", "cut", "length",
                                                 "trailing"]))
    if bend == "pad":
        raw += b" " * draw(st.integers(1, 7))
    elif bend == "not_utf8" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + b"\xff\xfe" + raw[at:]
    elif bend == "cut" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    offset = min(offset, 1 << 14)  # a huge shape's bytes are not written: it must not fit
    data = b"".join(draw(st.lists(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=8),
                                  max_size=offset // 4 + 2)))
    data = (data + bytes(offset))[:offset]
    if bend == "trailing":
        data += b"\x00" * draw(st.integers(1, 9))
    length = len(raw)
    if bend == "length":
        length = draw(st.sampled_from([0, 1, length - 1, length + 1, 2**63, 2**64 - 1]))
        length = max(0, min(length, 2**64 - 1))
    return struct.pack("<Q", length) + raw + data


def _oracle(values: torch.Tensor) -> TensorStats:
    if values.is_complex():
        values = torch.view_as_real(values)
    wide = values.to(torch.float64).reshape(-1)
    finite = wide[torch.isfinite(wide)]
    return TensorStats(
        numel=wide.numel(),
        nan=int(torch.isnan(wide).sum()),
        pos_inf=int(torch.isposinf(wide).sum()),
        neg_inf=int(torch.isneginf(wide).sum()),
        abs_max=float(finite.abs().max()) if finite.numel() else 0.0,
        sum_squares=float((finite * finite).sum()),
        beyond_fp16=int((finite.abs() > 65504).sum()),
    )


def _same(got: TensorStats, want: TensorStats, what: str) -> None:
    counts = ("numel", "nan", "pos_inf", "neg_inf", "beyond_fp16")
    assert [getattr(got, c) for c in counts] == [getattr(want, c) for c in counts], what
    assert got.abs_max == want.abs_max, what
    assert math.isclose(got.sum_squares, want.sum_squares, rel_tol=1e-5, abs_tol=1e-30), what


def _declared(raw: bytes, name: str) -> tuple[int, int, str] | None:
    """(begin, end, dtype) of a tensor as the header declares it, absolute in the file."""
    length = struct.unpack_from("<Q", raw)[0]
    spec = json.loads(raw[8 : 8 + length].decode("utf-8"))[name]
    begin, end = spec["data_offsets"]
    return 8 + length + begin, 8 + length + end, spec["dtype"]


def _check(raw: bytes, scan: CheckpointScan) -> None:
    refused = any(i.kind in ("bad_checkpoint", "too_large") and i.location.offset in (0, 8)
                  for i in scan.issues)
    assert not (refused and scan.tensors), "a refused header kept tensors"
    for tensor in scan.tensors:
        if tensor.stats is None:
            continue
        declared = _declared(raw, tensor.name)
        assert declared is not None
        begin, end, dtype = declared
        kind = getattr(torch, DTYPES[dtype][0])
        values = torch.frombuffer(bytearray(raw[begin:end]), dtype=kind) if end > begin else (
            torch.empty(0, dtype=kind))
        _same(tensor.stats, _oracle(values), tensor.name)
    try:
        reference = load(raw)
    except Exception:
        return  # the reference refuses it; the scan may keep what it can
    listed = {t.name: t for t in scan.tensors}
    assert set(listed) == set(reference), "the reference loader lists other tensors"
    assert not refused, scan.issues
    for name, tensor in reference.items():
        record = listed[name]
        assert record.shape == tuple(tensor.shape)
        assert record.dtype == str(tensor.dtype).removeprefix("torch.")
        if record.stats is not None:
            _same(record.stats, _oracle(tensor), name)
        else:
            assert not (tensor.is_floating_point() or tensor.is_complex()), name


@fuzz_settings(300)
@given(raw=files())
def test_headers_never_raise_and_agree_with_the_reference_loader(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    folder = tmp_path_factory.mktemp("safetensors")
    path = folder / NAME
    path.write_bytes(raw)
    scan = scan_file(str(path), trust_pickle=False)
    assert sorted(os.listdir(folder)) == [NAME]
    assert all(i.location.file == str(path) for i in scan.issues)
    _check(raw, scan)


CORPUS = corpus_files("safetensors")


@fuzz_settings(60)
@given(data=st.data())
def test_damaged_corpus_files_never_raise(
    tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    if not CORPUS:
        pytest.skip("no corpus")
    raw = flipped_and_cut(data, Path(data.draw(st.sampled_from(CORPUS))).read_bytes())
    path = tmp_path_factory.mktemp("corpus") / NAME
    path.write_bytes(raw)
    scan = scan_file(str(path), trust_pickle=False)
    _check(raw, scan)


# -- the seed corpus ------------------------------------------------------------------------


def seeds() -> dict[str, bytes]:
    """Small files from safetensors' own writer, and a few damaged copies."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(4, 3, generator=generator)
    weights[1, 2] = float("nan")
    plain = save({"enc.weight": weights, "enc.bias": torch.zeros(4),
                  "head.weight": torch.randn(2, 4, generator=generator).to(torch.bfloat16),
                  "ids": torch.arange(5), "mask": torch.tensor([True, False]),
                  "empty": torch.zeros(0, 3)}, metadata={"format": "pt"})
    mixed = save({"h": torch.tensor([1.0, 7e4, -float("inf")], dtype=torch.float16),
                  "d": torch.tensor([1e300, -2.0], dtype=torch.float64),
                  "c": torch.tensor([1 + 2j, float("nan")], dtype=torch.complex64),
                  "f8": torch.tensor([0.5, 448.0]).to(torch.float8_e4m3fn)})
    length = struct.unpack_from("<Q", plain)[0]
    header = json.loads(plain[8 : 8 + length])
    spec = header["enc.bias"]
    spec["data_offsets"] = [spec["data_offsets"][0] + 4, spec["data_offsets"][1] + 4]
    holed = json.dumps(header).encode()
    return {
        "plain.safetensors": plain,
        "mixed.safetensors": mixed,
        "cut.safetensors": plain[: len(plain) - 5],
        "length-lies.safetensors": struct.pack("<Q", length + 9) + plain[8:],
        "hole.safetensors": struct.pack("<Q", len(holed)) + holed + plain[8 + length:] + b"\0" * 4,
        "not-utf8.safetensors": plain[:20] + b"\xff" + plain[21:],
    }
