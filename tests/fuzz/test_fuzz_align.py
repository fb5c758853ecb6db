"""Fuzz target for the align stage's value matching: a log cut from a reference curve at a
known offset and stride, its values printed rounded, must be placed there or left undecided,
never placed elsewhere with an agreement that looks good."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.align import AMBIGUOUS, best_placement
from tests.fuzz.budget import fuzz_settings

pytestmark = pytest.mark.fuzz


@st.composite
def placed_log(draw: Any) -> tuple[Any, ...]:
    n = draw(st.integers(20, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = draw(st.sampled_from(["walk", "decay", "noisy", "steps"]))
    t = np.arange(n, dtype=np.float64)
    if shape == "walk":
        ref = 2.0 + np.cumsum(rng.normal(0, 0.05, n))
    elif shape == "decay":
        ref = 3.0 * np.exp(-t / draw(st.floats(50, 5000)))
    elif shape == "noisy":
        ref = 1.0 + rng.uniform(-0.05, 0.05, n)
    else:  # a schedule that holds for stretches: many placements fit parts of it
        ref = 1e-3 * 0.5 ** (t // draw(st.integers(5, 60)))
    first = draw(st.integers(-50, 1000))
    ref_steps = np.arange(first, first + n, dtype=np.int64)
    stride = draw(st.sampled_from([1, 1, 2, 5, 10]))
    base = draw(st.integers(0, 1))  # the log numbers its records from 0 or 1
    start = draw(st.integers(0, max(0, n // 2)))
    picked = np.arange(start, n, stride)
    if picked.size < 3:
        picked = np.arange(0, n, 1)
        stride = 1
        start = 0
    own = np.arange(base, base + picked.size, dtype=np.int64)
    places = draw(st.integers(2, 6))
    values = np.round(ref[picked], places)
    offset = int(ref_steps[picked[0]] - stride * own[0])
    telling = shape in ("walk", "noisy") and own.size >= 10 and places >= 3
    return own, values, ref_steps, ref, offset, stride, telling


@fuzz_settings(200)
@given(placed_log())
def test_value_matching_places_right_or_not_at_all(case: tuple[Any, ...]) -> None:
    own, values, ref_steps, ref_values, offset, stride, telling = case
    got = best_placement(own, values, ref_steps, ref_values)
    if telling:  # values that vary from step to step, printed to 3 places or more
        assert got == (offset, stride, 1.0, own.size) or (
            not isinstance(got, str) and got is not None and got[:2] == (offset, stride)), got
    if got is None or got == AMBIGUOUS:
        return
    assert not isinstance(got, str)
    found_offset, found_stride, agreement, compared = got
    # Another placement may fit the log's points equally well only where the values
    # repeat; then it maps every compared point onto a step of the same value.
    mapped = found_offset + found_stride * own
    truth = offset + stride * own
    if (found_offset, found_stride) != (offset, stride):
        inside = (mapped >= ref_steps[0]) & (mapped <= ref_steps[-1])
        same = np.isclose(ref_values[mapped[inside] - ref_steps[0]],
                          ref_values[truth[inside] - ref_steps[0]], rtol=1e-3)
        assert same.mean() >= 0.9, (found_offset, found_stride, offset, stride, agreement,
                                    compared)
