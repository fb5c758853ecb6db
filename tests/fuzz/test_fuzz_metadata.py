"""Fuzz target: the static reader of ``training_args.bin`` (and of scheduler states).

The inputs start from a real ``torch.save(TrainingArguments(...))`` file, as the Trainer
writes it, and are damaged one to three times over:

- the file cut anywhere;
- a byte changed anywhere (the zip's headers, the pickle's opcodes and values);
- an opcode of ``data.pkl`` deleted or repeated (the archive's sizes kept right);
- the opcodes of a call to ``os.system`` (creating a marker file) spliced into
  ``data.pkl`` between two opcodes.

Properties:

- ``read_training_args`` and ``read_scheduler`` never raise, and every issue names the file;
- nothing the pickle names runs (the marker never appears) and nothing is written beside
  the file;
- every field read is a plain value (bool, int, float, str or None);
- a file that is only cut keeps, of the fields it reads, the values the whole file has.
"""

from __future__ import annotations

import io
import os
import pickletools
import struct
import zipfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest.metadata.torchsaved import read_scheduler, read_training_args
from tests.fuzz.budget import fuzz_settings

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, object]]:
    """The real file's bytes, and the fields read from it whole."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import TrainingArguments

    folder = tmp_path_factory.mktemp("fuzz_args")
    args = TrainingArguments(output_dir=str(folder / "out"), learning_rate=5.0, warmup_steps=3,
                             logging_steps=2, seed=11, report_to=["tensorboard"])
    path = folder / "training_args.bin"
    torch.save(args, path)
    whole = read_training_args(str(path))
    assert whole.complete and whole.fields["learning_rate"] == 5.0
    return path.read_bytes(), dict(whole.fields)


def _splice_system(data: bytes, at: int, marker: str) -> bytes:
    """``data.pkl`` with a GLOBAL os.system, its argument and a REDUCE inserted before the
    opcode at ``at``-th position, then popped: a pickle a real unpickler would run."""
    command = f"touch {marker}".encode()
    call = (b"cos\nsystem\n" + b"X" + struct.pack("<I", len(command)) + command
            + b"\x85R0")  # GLOBAL, BINUNICODE, TUPLE1, REDUCE, POP
    return _rewrite_pickle(data, lambda pkl: _insert(pkl, at, call))


def _offsets(pkl: bytes) -> list[int]:
    try:
        return [pos for _, _, pos in pickletools.genops(pkl) if pos is not None]
    except Exception:
        return [0]


def _insert(pkl: bytes, at: int, blob: bytes) -> bytes:
    starts = _offsets(pkl)
    cut = starts[at % len(starts)]
    return pkl[:cut] + blob + pkl[cut:]


def _drop_or_repeat(pkl: bytes, at: int, repeat: bool) -> bytes:
    starts = [*_offsets(pkl), len(pkl)]
    k = at % max(1, len(starts) - 1)
    piece = pkl[starts[k]:starts[k + 1]]
    return pkl[:starts[k]] + (piece * 2 if repeat else b"") + pkl[starts[k + 1]:]


def _rewrite_pickle(data: bytes, change: object) -> bytes:
    """The archive rebuilt by zipfile with ``data.pkl`` changed (sizes and CRC kept right)."""
    assert callable(change)
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in source.infolist():
            body = source.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                body = change(body)
            z.writestr(info.filename, body)
    return out.getvalue()


@st.composite
def damaged(draw: st.DrawFn, data: bytes, marker: str) -> tuple[bytes, bool]:
    """Damaged bytes, and whether the only damage was a cut."""
    cut_only = True
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cut", "flip", "drop", "repeat", "system"]))
        at = draw(st.integers(0, 1 << 20))
        if kind == "cut":
            data = data[: at % (len(data) + 1)]
            continue
        cut_only = False
        if kind == "flip" and data:
            i = at % len(data)
            data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        elif kind in ("drop", "repeat", "system"):
            try:
                if kind == "system":
                    data = _splice_system(data, at, marker)
                else:
                    repeat = kind == "repeat"
                    data = _rewrite_pickle(
                        data, lambda pkl, at=at, repeat=repeat: _drop_or_repeat(pkl, at, repeat))
            except Exception:  # zipfile on an archive damaged before: keep it as it is
                pass
    return data, cut_only


def _plain(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


@fuzz_settings(ci_examples=300)
@given(data=st.data())
def test_training_args_reader_survives_damage(
        seed_file: tuple[bytes, dict[str, object]], tmp_path_factory: pytest.TempPathFactory,
        data: st.DataObject) -> None:
    seed, full = seed_file
    folder = tmp_path_factory.mktemp("case")
    marker = folder / "pwned"
    blob, cut_only = data.draw(damaged(seed, str(marker)))
    path = folder / "training_args.bin"
    path.write_bytes(blob)
    names_before = sorted(os.listdir(folder))
    got = read_training_args(str(path))
    sched = read_scheduler(str(path))
    assert not marker.exists()
    assert sorted(os.listdir(folder)) == names_before
    assert path.read_bytes() == blob
    for read in (got, sched):
        assert all(_plain(v) for v in read.fields.values())
        assert all(i.location.file == str(path) for i in read.issues)
        assert read.complete or read.issues  # an incomplete read always says why
    if cut_only:
        for name, value in got.fields.items():
            assert full[name] == value, name



HPARAMS = {"lr": 0.02, "betas": (0.9, 0.95), "warmup_steps": 100, "batch_size": 64,
           "optimizer": {"name": "AdamW", "eps": 1e-7}, "precision": "16-mixed"}
TAGS = ["!!python/object/apply:os.system ['touch {marker}']", "!!python/name:os.system ''",
        "!!python/tuple [1, 2]", "!custom 3", "&a [1, *a]", "*nowhere", "{{lr: 5e-3}}", "9" * 5000]


@fuzz_settings(ci_examples=200)
@given(cut=st.integers(0, 400), at=st.integers(0, 400), tag=st.sampled_from(TAGS),
       noise=st.text(max_size=20))
def test_hparams_reader_survives_damage(tmp_path_factory: pytest.TempPathFactory, cut: int,
                                        at: int, tag: str, noise: str) -> None:
    """hparams.yaml as Lightning writes it (``yaml.dump``), cut, with a tag or noise
    spliced in: never raises, never constructs a tagged object, keeps plain values only."""
    import yaml

    from analyzer.ingest.metadata.hparams import read_hparams

    folder = tmp_path_factory.mktemp("hp")
    marker = folder / "pwned"
    text = yaml.dump(HPARAMS)
    text = text[: max(cut, len(text) // 2)]
    i = at % (len(text) + 1)
    text = text[:i] + f"\nx: {tag.format(marker=marker)}\n" + noise + text[i:]
    path = folder / "hparams.yaml"
    path.write_text(text)
    got = read_hparams(str(path))
    assert not marker.exists()
    assert sorted(os.listdir(folder)) == ["hparams.yaml"]
    assert all(_plain(v) for v in got.fields.values())
    assert all(_plain(v) for _, v in got.settings.values())
    assert all(i.location.file == str(path) for i in got.issues)
