"""The compact series of an event file: tags that log at the same steps share one read-only
steps array (copied only where a tag's steps diverge), and record offsets are int32 in a
file under 2 GiB. Every series must still be, word for word, what an independent decoding
with the ``Event`` protobuf gives (steps, values bit for bit, wall times, offsets), on
files from the real writers whose tags diverge mid-file, start late, stop early and step
back after a restart, read whole and by small windows.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analyzer.ingest import tfwindow
from analyzer.ingest.tb import EventFile, read_event_file
from analyzer.ingest.tbpoints import Points


def _only_file(folder: Path) -> str:
    (name,) = [n for n in os.listdir(folder) if "tfevents" in n]
    return str(folder / name)


def _log(writer: Any, steps: dict[str, list[int]]) -> None:
    """Log each tag at its steps, in the order a training loop would: step by step, the
    tags of a step by name (a step seen again after a restart is logged where it comes
    back)."""
    rng = np.random.default_rng(3)
    order = sorted((when, tag, k) for tag, seq in steps.items()
                   for k, when in enumerate(_times(seq)))
    for _, tag, k in order:
        step = steps[tag][k]
        value = float("nan") if (tag, step) == ("every", 450) else float(rng.random())
        writer.add_scalar(tag, value, step)


def _times(seq: list[int]) -> list[int]:
    """When each point of a tag is logged: in the order of the run's steps, where a restart
    (a step going back) starts a second pass that comes after the first."""
    out, offset, last = [], 0, None
    for s in seq:
        if last is not None and s < last:
            offset += 10_000
        out.append(offset + s)
        last = s
    return out


# Every tag's steps in the files below.
_STEPS: dict[str, list[int]] = {
    # logged first at each step: where it diverges, the tags it leaves share one copy
    "a_third": list(range(300)) + list(range(300, 600, 3)),
    "every": list(range(600)) + list(range(500, 700)),  # a restart at step 500
    "same": list(range(600)) + list(range(500, 700)),  # the same steps: shares them
    "half": list(range(300)) + list(range(300, 600, 2)) + list(range(500, 700, 2)),
    "second": list(range(0, 600, 2)),  # every 2nd step from the start
    "late": list(range(250, 600)),  # starts late
    "short": list(range(120)),  # stops early: a prefix of "every"
}


def _torch(folder: Path) -> str:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    _log(writer, _STEPS)
    writer.close()
    return _only_file(folder)


def _tbx(folder: Path) -> str:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder))
    _log(writer, _STEPS)
    writer.close()
    return _only_file(folder)


_WRITERS: dict[str, Callable[[Path], str]] = {"torch": _torch, "tensorboardX": _tbx}


@pytest.fixture(scope="module", params=list(_WRITERS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _WRITERS[request.param](tmp_path_factory.mktemp(request.param))


def _protobuf_series(path: str) -> dict[str, list[tuple[int, int, float, int]]]:
    """Each tag's (step, value bits, wall time, record offset), decoded record by record
    with the ``Event`` protobuf, independently of the reader."""
    from tensorboard.compat.proto import event_pb2

    data = Path(path).read_bytes()
    out: dict[str, list[tuple[int, int, float, int]]] = {}
    pos = 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        event = event_pb2.Event.FromString(data[pos + 12: pos + 12 + n])
        for v in event.summary.value:
            if v.WhichOneof("value") == "simple_value":
                bits = struct.unpack("<Q", struct.pack("<d", v.simple_value))[0]
                out.setdefault(v.tag, []).append((event.step, bits, event.wall_time, pos))
        pos += 16 + n
    return out


def _as_points(result: EventFile) -> dict[str, list[tuple[int, int, float, int]]]:
    return {s.tag: list(zip(s.steps.tolist(), s.values.view(np.uint64).tolist(),
                            s.wall_times.tolist(), s.positions.astype(np.int64).tolist(),
                            strict=True))
            for s in result.series}


@pytest.mark.parametrize("window", [None, 4096 + 13, 1024])
def test_series_equal_an_independent_protobuf_decoding(written: str, window: int | None
                                                       ) -> None:
    expected = _protobuf_series(written)
    assert {t: [p[0] for p in pts] for t, pts in expected.items()} == _STEPS  # not vacuous
    saved = tfwindow.WINDOW
    try:
        if window is not None:
            tfwindow.WINDOW = window
        result = read_event_file(written)
    finally:
        tfwindow.WINDOW = saved
    assert not result.issues
    assert _as_points(result) == expected
    assert [e.step for e in result.events if e.kind == "restart"] == [500]


def test_tags_at_the_same_steps_share_one_read_only_array(written: str) -> None:
    for window in (None, 1024):
        saved = tfwindow.WINDOW
        try:
            if window is not None:
                tfwindow.WINDOW = window
            series = {s.tag: s for s in read_event_file(written).series}
        finally:
            tfwindow.WINDOW = saved
        assert series["every"].steps is series["same"].steps, window
        # a prefix of others' steps shares the memory of one of them (which one depends
        # on how windows fall); those that diverged from "every" have their own copy
        assert any(np.shares_memory(series["short"].steps, s.steps)
                   for tag, s in series.items() if tag != "short")
        for tag in ("a_third", "half", "second", "late"):
            assert not np.shares_memory(series[tag].steps, series["every"].steps), tag
        for s in series.values():
            assert not s.steps.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                s.steps[0] = 7
        assert series["every"].steps.tolist() == _STEPS["every"]


def test_offsets_are_int32_in_a_small_file_and_int64_in_the_frame(written: str) -> None:
    from analyzer.api import scalars

    result = read_event_file(written)
    assert {s.positions.dtype for s in result.series} == {np.dtype(np.int32)}
    frame = scalars(os.path.dirname(written))
    assert frame["position"].dtype == np.int64 and frame["step"].dtype == np.int64
    every = frame[frame["tag"] == "every"]
    assert every["position"].tolist() == next(
        s for s in result.series if s.tag == "every").positions.tolist()


def test_offsets_are_int64_from_2_gib_on() -> None:
    points = Points(size=1 << 31)
    points.add(np.array([(1 << 31) - 100], dtype=np.int64), np.array([points.tag_id("a")]),
               np.array([5], dtype=np.int64), np.array([1.0], dtype=np.float32),
               np.array([1.5]))
    (s,) = points.series("f")
    assert s.positions.dtype == np.int64 and s.positions.tolist() == [(1 << 31) - 100]


def _random_tags(rng: np.random.Generator) -> dict[str, np.ndarray]:
    base = np.arange(int(rng.integers(1, 300))) * int(rng.integers(1, 4))
    out: dict[str, np.ndarray] = {}
    for t in range(int(rng.integers(1, 7))):
        kind = int(rng.integers(0, 6))
        cut = int(rng.integers(0, base.shape[0]))
        if kind == 0:
            seq = base
        elif kind == 1:  # stops early
            seq = base[: cut + 1]
        elif kind == 2:  # every 2nd step from somewhere on
            seq = np.concatenate([base[:cut], base[cut::2]])
        elif kind == 3:  # starts late
            seq = base[cut:]
        elif kind == 4:  # a restart
            seq = np.concatenate([base, base[cut:]])
        else:  # one step differs
            seq = base.copy()
            seq[cut] += 1
        out[f"t{t}"] = seq
    return out


def test_points_give_each_tag_its_own_steps_whatever_it_shared() -> None:
    """Random tags (equal, prefixes, diverging, late, restarted, one step off) fed by
    random windows, in the interleaved order a writer logs them: each series is its tag's
    points in file order, and every steps array is read-only."""
    rng = np.random.default_rng(20)
    for case in range(300):
        tags = _random_tags(rng)
        order = sorted((i, name, k) for name, seq in tags.items()
                       for k, i in enumerate(_times(seq.tolist())))
        n = len(order)
        position = np.arange(n, dtype=np.int64) * 61 + 7
        value = rng.standard_normal(n)
        wall = 1.7e9 + np.arange(n, dtype=np.float64)
        points = Points(size=n * 61 + 7)
        ids = np.array([points.tag_id(name) for _, name, _ in order], dtype=np.int64)
        step = np.array([int(tags[name][k]) for _, name, k in order], dtype=np.int64)
        cuts = np.union1d(rng.choice(np.arange(1, n + 1), size=min(n, int(rng.integers(0, 6))),
                                     replace=False), [n])
        lo = 0
        for hi in cuts.tolist():
            # within a window, records come in any order of lengths (the fast path's groups)
            part = rng.permutation(np.arange(lo, hi))
            for piece in np.array_split(part, int(rng.integers(1, 3))):
                points.add(position[piece], ids[piece], step[piece],
                           value[piece].astype(np.float32) if case % 2 else value[piece],
                           wall[piece])
            points.flush(int(position[hi - 1]))
            lo = hi
        got = {s.tag: s for s in points.series("f")}
        assert sorted(got) == sorted(tags)
        for name, seq in tags.items():
            mine = ids == points.names[name]
            s = got[name]
            assert s.steps.tolist() == seq.tolist(), (case, name)
            assert s.positions.tolist() == position[mine].tolist()
            assert s.wall_times.tolist() == wall[mine].tolist()
            want = value[mine].astype(np.float32) if case % 2 else value[mine]
            assert s.values.tolist() == want.astype(np.float64).tolist()
            assert not s.steps.flags.writeable
