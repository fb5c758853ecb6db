"""Fuzz target: a capture's meta.json, read by analyzer.capture.folder.

The inputs start from a meta.json the real recorder wrote and damage it three ways: a key
(top level or nested) given any JSON value (an integer of 5,000 digits among them), the
text cut anywhere, or bytes flipped.

Properties:

- ``read_capture_meta`` returns a record whose fields have their declared types, or raises
  MetaError with a kind of the issue list; never anything else;
- reading a run's captures never raises, and a capture whose meta is refused is still
  listed, with one issue naming its meta.json;
- a cut before the object's closing brace is always ``bad_json``, with the line it ends on.
"""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from analyzer.capture import FlightRecorder
from analyzer.capture.folder import MetaError, read_capture_meta, read_run_captures
from analyzer.model import CAPTURE_DTYPES, CAPTURE_MODES, CaptureMeta, IssueKind
from analyzer.scenarios import models
from tests.fuzz.budget import fuzz_settings

pytestmark = pytest.mark.fuzz

MLP_KW = {"in_features": 2, "hidden": 3, "out_features": 1, "depth": 2, "seed": 0}
KINDS = set(typing.get_args(IssueKind))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6)
BIG = "\u0000big"
"""Stands for a literal JSON allows and Python's json refuses: an integer of 5,000 digits."""


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("fuzzmeta") / "run"
    model = models.mlp(**MLP_KW)  # type: ignore[arg-type]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rec = FlightRecorder(run, model, opt, model_factory="analyzer.scenarios.models:mlp",
                         model_kwargs=MLP_KW, loss_factory="analyzer.scenarios.losses:mse")
    with rec.step(0, torch.randn(2, 2), torch.randn(2, 1)) as r:
        r.loss(torch.tensor(float("nan")))
    assert rec.capture_path is not None, rec.errors
    return Path(rec.capture_path)


def _scratch(capture: Path) -> Path:
    """A copy of the run to damage, made once per test (examples overwrite meta.json)."""
    run = capture.parent.parent.parent / f"scratch_{id(capture)}"
    if not run.exists():
        shutil.copytree(capture.parent.parent, run)
    return run / "capture" / capture.name


def _check_record(meta: CaptureMeta) -> None:
    assert isinstance(meta.step, int) and not isinstance(meta.step, bool)
    assert meta.dtype in CAPTURE_DTYPES and meta.mode in CAPTURE_MODES
    assert isinstance(meta.model.factory, str) and isinstance(meta.loss.factory, str)
    assert isinstance(dict(meta.model.kwargs), dict) and isinstance(meta.optimizer.cls, str)
    assert isinstance(dict(meta.optimizer.hyperparameters), dict)
    assert meta.amp.autocast_dtype in (None, *CAPTURE_DTYPES)
    assert isinstance(meta.amp.grad_scaler, bool) and isinstance(meta.device, str)
    for value in (meta.lr, meta.grad_clip):
        assert value is None or isinstance(value, float)
    assert meta.env is None or isinstance(meta.env, dict)
    assert all(isinstance(s, int) for s in meta.history_steps)
    assert all(isinstance(f, str) for f in meta.files)


def _read(folder: Path) -> CaptureMeta | MetaError:
    try:
        meta = read_capture_meta(str(folder))
    except MetaError as exc:
        assert exc.kind in KINDS and exc.reason and exc.path == str(folder / "meta.json")
        return exc
    _check_record(meta)
    return meta


def _both(folder: Path) -> CaptureMeta | MetaError:
    got = _read(folder)
    found = read_run_captures(str(folder.parent.parent), [str(folder)])
    assert found.captures == (str(folder),)
    mine = [i for i in found.issues if i.location.file == str(folder / "meta.json")]
    assert len(mine) == (1 if isinstance(got, MetaError) else 0)
    return got


@st.composite
def _paths(draw: st.DrawFn, meta: dict[str, Any]) -> list[str]:
    """A key path into ``meta``: a top-level key, or one inside an object below it."""
    key = draw(st.sampled_from(sorted(meta)))
    inner = meta[key]
    if isinstance(inner, dict) and inner and draw(st.booleans()):
        return [key, draw(st.sampled_from(sorted(inner)))]
    return [key]


@fuzz_settings(ci_examples=150)
@given(data=st.data(), value=JSON | st.just(BIG))
def test_any_value_at_any_key(capture: Path, data: st.DataObject, value: Any) -> None:
    folder = _scratch(capture)
    meta = json.loads((capture / "meta.json").read_text())
    path = data.draw(_paths(meta))
    target = meta
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    (folder / "meta.json").write_text(json.dumps(meta).replace(json.dumps(BIG), "7" * 5000))
    _both(folder)


@fuzz_settings(ci_examples=100)
@given(cut=st.integers(0, 1 << 16))
def test_a_cut_anywhere(capture: Path, cut: int) -> None:
    folder = _scratch(capture)
    text = (capture / "meta.json").read_text()
    cut = cut % len(text)
    (folder / "meta.json").write_text(text[:cut])
    got = _both(folder)
    if cut < text.rindex("}") + 1:
        assert isinstance(got, MetaError) and got.kind == "bad_json"
        assert got.line == text[:cut].count("\n") + 1


@fuzz_settings(ci_examples=100)
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)), min_size=1,
                      max_size=4))
def test_flipped_bytes(capture: Path, flips: list[tuple[int, int]]) -> None:
    folder = _scratch(capture)
    raw = bytearray((capture / "meta.json").read_bytes())
    for at, mask in flips:
        raw[at % len(raw)] ^= mask
    (folder / "meta.json").write_bytes(bytes(raw))
    _both(folder)
