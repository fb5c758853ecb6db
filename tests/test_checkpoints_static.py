"""The static pickle reader: any damage to the bytes is reported, never raised."""

from __future__ import annotations

import io
import pickle
import zipfile

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest.ckpt.staticpickle import Obj, TensorRef, read_pickle


def _data_pkl() -> bytes:
    buffer = io.BytesIO()
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    torch.save({"model": model.state_dict(), "step": 7, "names": ["a", "b"]}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        return archive.read(name)


DATA = _data_pkl()


def test_reads_tensors_without_importing() -> None:
    result = read_pickle(DATA)
    assert result.error is None
    assert isinstance(result.root, dict)
    weight = result.root["model"]["0.weight"]
    assert isinstance(weight, TensorRef)
    assert weight.shape == (4, 3) and weight.storage is not None
    assert weight.storage.dtype == "float32"
    assert result.root["step"] == 7 and result.root["names"] == ["a", "b"]


class _Thing:
    def __init__(self) -> None:
        self.value = 3


def test_objects_become_stand_ins() -> None:
    result = read_pickle(pickle.dumps({"thing": _Thing()}, protocol=4))
    assert isinstance(result.root, dict)
    thing = result.root["thing"]
    assert isinstance(thing, Obj) and thing.cls.endswith("_Thing")
    assert thing.state == {"value": 3}
    assert any(g.endswith("_Thing") for g in result.globals_seen)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(DATA)), st.integers(0, 255), st.integers(0, len(DATA) - 1))
def test_any_cut_or_byte_flip_is_reported_not_raised(cut: int, byte: int, where: int) -> None:
    flipped = bytearray(DATA)
    flipped[where] = byte
    for data in (DATA[:cut], bytes(flipped)):
        result = read_pickle(data)
        assert result.error is None or result.error_offset is not None


def test_shared_references_are_walked_once() -> None:
    # 40 levels of a list holding the previous list twice: 2**40 paths, 40 containers.
    from analyzer.ingest.ckpt.leaves import StaticLeaves
    from analyzer.ingest.ckpt.tree import walk

    buffer = io.BytesIO()
    nested: list[object] = [torch.ones(1)]
    for _ in range(40):
        nested = [nested, nested]
    torch.save(nested, buffer)
    with zipfile.ZipFile(buffer) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    result = read_pickle(data)
    listed = list(walk(result.root, "", StaticLeaves(None, None, order="little")))
    assert len(listed) == 1
