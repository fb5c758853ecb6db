"""The static pickle reader: any damage to the bytes is reported, never raised."""

from __future__ import annotations

import io
import pickle
import zipfile

import pytest
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




@pytest.mark.timeout(120)
def test_values_that_double_at_each_level_are_read_in_bounded_time() -> None:
    # A list of itself twice, forty levels deep, called as a function, given to NEWOBJ and
    # named by STACK_GLOBAL; a tuple of itself twice as a dict key. Each is a few hundred
    # bytes through the memo: nothing of the file may be rendered or hashed whole.
    # each level memoized and popped: the stack holds the last one only
    lists = b"]\x940" + b"".join(b"(h%ch%cl\x940" % (i, i) for i in range(40)) + b"h\x28"
    tuples = b")\x940" + b"".join(b"h%ch%c\x86\x940" % (i, i) for i in range(40)) + b"h\x28"
    cases = {
        "call": b"\x80\x04" + lists + b")R.",
        "newobj": b"\x80\x04" + lists + b")\x81.",
        "stack_global": b"\x80\x04" + lists + b"h\x28\x93.",
        "key": b"\x80\x04}" + tuples + b"Ns.",
    }
    for name, data in cases.items():
        result = read_pickle(data)
        assert result.error is None, (name, result.error)
    assert read_pickle(cases["call"]).unlike_torch is not None
    assert read_pickle(cases["stack_global"]).unlike_torch is not None
    keyed = read_pickle(cases["key"])
    assert keyed.unlike_torch is None  # a tuple of tuples is a key torch takes
    assert type(keyed.root) is dict  # (a failed assert must not render the tuple either)
    assert list(keyed.root) == ["<tuple>"]
