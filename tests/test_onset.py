"""The locator against a brute-force oracle, and on files from the real writer."""

from __future__ import annotations

import math
import os

import eventgen
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.api import analyze
from analyzer.model import Event, Location, Run, Series
from analyzer.onset import locate


def _series(tag: str, values: list[float], steps: list[int] | None = None) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.asarray(steps if steps is not None else range(n), np.int64),
                  values=np.asarray(values, np.float64), wall_times=np.zeros(n),
                  source="f", positions=np.arange(n, dtype=np.int64) * 50)


TIE = {"train/loss": 0, "train/grad_norm": 1, "grad_norm/fc1.weight": 2, "lr": 3, "acc": 3}
"""What each tag of the oracle measures: loss, total gradient norm, per-layer, the rest."""


def _oracle(tags: dict[str, list[float]]) -> tuple[int, str, str, int | None] | None:
    """Brute force: walk every point; earliest step, then loss > total gradient norm >
    per-layer gradient > other, then name (all tags here are written at the same offsets,
    so the file order ties too)."""
    found = []
    for tag, values in tags.items():
        for i, v in enumerate(values):
            if not math.isfinite(v):
                kind = "nan" if math.isnan(v) else ("+inf" if v > 0 else "-inf")
                last = None
                for j in range(i - 1, -1, -1):
                    if math.isfinite(values[j]):
                        last = j
                        break
                found.append((i, TIE[tag], tag, kind, last))
                break
    if not found:
        return None
    step, _, tag, kind, last = min(found)
    return step, tag, kind, last


values_strategy = st.lists(
    st.sampled_from([0.0, 1.5, -2.0, 1e30, math.nan, math.inf, -math.inf]), min_size=1,
    max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(TIE)), values_strategy, min_size=1))
def test_run_incident_matches_oracle(tags: dict[str, list[float]]) -> None:
    run = Run(path="r", name="r", files=("f",),
              series=tuple(_series(t, v) for t, v in tags.items()))
    result = locate(run)
    expected = _oracle(tags)
    if expected is None:
        assert result.incident is None
        return
    assert result.incident is not None
    got = result.incident
    assert (got.step, got.tag, got.kind, got.last_finite_step) == expected
    assert got.location == Location("f", offset=50 * got.step)


def test_tie_prefers_loss_and_says_so() -> None:
    run = Run(path="r", name="r", files=("f",), series=(
        _series("grad_norm/fc1.weight", [1.0, math.inf]),
        _series("train/loss", [1.0, math.nan]),
    ))
    result = locate(run)
    assert result.incident is not None and result.incident.tag == "train/loss"
    assert "loss before total gradient norm" in (result.incident.decided_by or "")
    assert result.layer_incident is not None and result.layer_incident.layer == "fc1"


def test_same_tag_in_two_files_keeps_the_earliest_step() -> None:
    first = _series("loss", [1.0, 2.0, math.nan], steps=[10, 11, 12])
    again = _series("loss", [1.0, math.nan], steps=[8, 9])
    run = Run(path="r", name="r", files=("a", "b"), series=(first, again))
    inc = locate(run).incident
    assert inc is not None and inc.step == 9 and inc.last_finite_step == 8


def _loss_run(path: str, *, steps: int, nan_step: int) -> int:
    """The bytes of ``eventgen.write_run(path, steps=steps, tags=1, nan_step=nan_step)``,
    written without building a protobuf message per record (a million take 20 s that way):
    each record's Event is the same few fields, packed here around its wall time, step and
    value (the test below checks the bytes against eventgen's)."""
    tag = b"train/loss"
    value_head = bytes([0x0A, len(tag)]) + tag + b"\x15"  # Value.tag, then simple_value
    body_head = b"\x2a" + bytes([len(value_head) + 6, 0x0A, len(value_head) + 4]) + value_head
    values = np.random.default_rng(0).random(steps)  # as eventgen draws them, one a step
    values[nan_step] = np.nan
    floats = values.astype("<f4").tobytes()
    t0 = 1.7e9
    walls = (t0 + np.arange(steps, dtype=np.float64) * 0.01).astype("<f8").tobytes()
    chunk = [eventgen.version_record(t0)]
    size = 0
    with open(path, "wb") as fh:
        for step in range(steps):
            varint, n = bytearray(b"\x10" if step else b""), step  # step 0 is not written
            while n >= 0x80:
                varint.append(n & 0x7F | 0x80)
                n >>= 7
            if step:
                varint.append(n)
            chunk.append(eventgen.frame(b"\x09" + walls[8 * step:8 * step + 8] + varint
                                        + body_head + floats[4 * step:4 * step + 4]))
            if len(chunk) > 50_000:
                size += fh.write(b"".join(chunk))
                chunk.clear()
        size += fh.write(b"".join(chunk))
    return size


def test_the_fast_loss_run_is_eventgens_byte_for_byte(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Past 16,384 steps, a step takes three bytes: every length of a step up to 2**21.
    for steps, nan_step in ((1, 0), (200, 128), (20_000, 16_385)):
        mine, theirs = tmp_path / f"mine{steps}", tmp_path / f"theirs{steps}"
        size = _loss_run(str(mine), steps=steps, nan_step=nan_step)
        assert size == eventgen.write_run(str(theirs), steps=steps, tags=1, nan_step=nan_step)
        assert mine.read_bytes() == theirs.read_bytes()


def test_one_nan_among_a_million_values(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "big"
    run.mkdir()
    k = 777_777
    _loss_run(str(run / "events.out.tfevents.1.host"), steps=1_000_000, nan_step=k)
    result = analyze(str(run)).results[0]
    assert result.incident is not None
    assert (result.incident.step, result.incident.tag) == (k, "train/loss")
    assert result.incident.last_finite_step == k - 1
    assert sum(len(s) for s in result.run.series) == 1_000_000


def test_summary_writer_nan_at_step_k(summary_run) -> None:  # type: ignore[no-untyped-def]
    k = 37
    loss = [1.0 / (i + 1) for i in range(60)]
    loss[k] = float("nan")
    grads = [float(i) for i in range(60)]
    grads[k + 2] = float("inf")
    path = summary_run({"train/loss": loss, "grad_norm/fc2.weight": grads})
    result = analyze(os.path.dirname(path)).results[0]
    inc = result.incident
    assert inc is not None
    assert (inc.step, inc.tag, inc.kind, inc.last_finite_step) == (k, "train/loss", "nan", k - 1)
    assert inc.location.file == path and inc.location.offset is not None
    assert result.layer_incident is not None
    assert (result.layer_incident.layer, result.layer_incident.step) == ("fc2", k + 2)


def test_total_gradient_norm_before_per_layer_and_scalars_before_histograms() -> None:
    from analyzer.model import Histogram

    nan = math.nan
    hist = Histogram(tag="weights/fc1.weight", steps=np.array([0, 1]), wall_times=np.zeros(2),
                     mins=np.array([0.0, nan]), maxs=np.array([1.0, nan]), sums=np.zeros(2),
                     counts=np.ones(2), sum_squares=np.zeros(2), source="f",
                     positions=np.array([0, 99]))
    run = Run(path="r", name="r", files=("f",), histograms=(hist,), series=(
        _series("grad_norm/fc1.weight", [1.0, nan]),
        _series("train/grad_norm", [1.0, nan]),
        _series("weight_norm/fc1.weight", [1.0, nan]),
    ))
    result = locate(run)
    assert result.incident is not None and result.incident.tag == "train/grad_norm"
    rest = [i for i in result.tag_incidents if i.tag.startswith("weight")]
    assert [i.tag for i in rest] == ["weight_norm/fc1.weight", "weights/fc1.weight"]


def test_overflow_skips_are_not_incidents() -> None:
    inf = math.inf
    scale = _series("amp/loss_scale", [65536.0, 32768.0, 16384.0, 16384.0, 16384.0, 16384.0])
    grads = _series("train/grad_norm", [inf, inf, 3.0, 2.0, 2.5, 2.0])
    loss = _series("train/loss", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    result = locate(Run(path="r", name="r", files=("f",), series=(scale, grads, loss)))
    assert result.incident is None
    assert result.overflow_skips == (0, 1)
    # A gradient overflow the scaler did not answer with a lower scale is a real incident.
    late = _series("train/grad_norm", [inf, inf, 3.0, 2.0, inf, 2.0])
    result = locate(Run(path="r", name="r", files=("f",), series=(scale, late, loss)))
    assert result.incident is not None and result.incident.step == 4


def test_the_rank_that_went_first_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "train.log"
    log.write_text("[rank0]: step 1 loss 2.0\n[rank1]: step 1 loss 2.1\n"
                   "[rank1]: step 2 loss nan\n[rank0]: step 2 loss 1.9\n"
                   "[rank0]: step 3 loss nan\n")
    result = analyze(str(tmp_path), replay=False).results[0]
    inc = result.incident
    assert inc is not None and (inc.step, inc.rank, inc.location.line) == (2, 1, 3)


def _stop_line(after: int | None) -> Event:
    detail: dict[str, object] = {"tag": "loss", "kind": "nan"}
    if after is not None:
        detail["after_step"] = after
    return Event("nonfinite", None, Location("train.log", line=9),
                 "Loss is nan, stopping training", detail)


@pytest.mark.parametrize(
    ("loss_steps", "expected"),
    [
        # The scalar at step 11 agrees with a line that follows step 10, and is precise.
        ([9, 10, 11], (11, "train/loss", False)),
        # Scalars logged every 10 steps see the NaN at 20; the line shows it came sooner.
        ([0, 10, 20], (10, "loss", True)),
        # A scalar already non-finite at step 10 comes before a line that follows step 10.
        ([8, 9, 10], (10, "train/loss", False)),
    ],
)
def test_a_line_placed_after_a_step_counts_as_the_next_step(
    loss_steps: list[int], expected: tuple[int, str, bool]
) -> None:
    loss = _series("train/loss", [1.0, 0.9, math.nan], steps=loss_steps)
    run = Run(path="r", name="r", files=("f",), series=(loss,), events=(_stop_line(10),))
    inc = locate(run).incident
    assert inc is not None and (inc.step, inc.tag, inc.after) == expected


def test_a_line_placed_after_a_step_is_reported_so() -> None:
    from analyzer.model import Report
    from analyzer.report import format_text

    run = Run(path="r", name="r", files=(), events=(_stop_line(10),))
    result = locate(run)
    inc = result.incident
    assert inc is not None and (inc.step, inc.after) == (10, True)
    text = format_text(Report(results=(result,)))
    assert "FIRST NON-FINITE  after step 10  loss = nan" in text
    assert "the last step logged before it is 10" in text


def test_a_log_line_incident_takes_the_last_finite_step_of_its_tag() -> None:
    loss = _series("loss", [2.0, 1.5, 1.2], steps=[0, 10, 20])
    run = Run(path="r", name="r", files=("f",), series=(loss,), events=(_stop_line(20),))
    inc = locate(run).incident
    assert inc is not None and (inc.step, inc.after, inc.last_finite_step) == (20, True, 20)
