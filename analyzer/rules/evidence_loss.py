"""What the loss curve's first non-finite value says about the op that made it.

A loss that jumps from a modest finite value straight to +inf, while everything logged
beside it stays finite, was made non-finite by the last op of the forward pass: an
overflow, not a NaN carried in from the weights. The loss's own finite values also tell
the dtype it was computed in: float16 rounds every value to 11 significant bits, so a
float32 loss is almost never exactly representable in float16, and a float16 one always is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.rules.evidence import Curve, RunEvidence

MIN_FRACTIONAL = 3
"""Finite losses with a fractional part needed before the dtype is read from them (integers
and 0 are exact in every dtype)."""


@dataclass(frozen=True)
class InfJump:
    """The loss's first non-finite point, when it is +inf after finite points."""

    curve: Curve
    step: int
    last_step: int
    last_value: float
    """The last finite loss before the jump."""
    finite: np.ndarray
    """Every finite loss before the jump."""


def inf_jump(ev: RunEvidence) -> InfJump | None:
    curve = ev.loss
    if curve is None or not ev.failed:
        return None
    bad = np.flatnonzero(~np.isfinite(curve.values))
    if not bad.size or bad[0] < 1 or not np.isposinf(curve.values[bad[0]]):
        return None
    i = int(bad[0])
    return InfJump(curve, int(curve.steps[i]), int(curve.steps[i - 1]),
                   float(curve.values[i - 1]), curve.values[:i])


def float16_exact(values: np.ndarray) -> bool | None:
    """Whether the values are float16 numbers (None: too few fractional values to tell)."""
    v = values[np.isfinite(values) & (np.abs(values) < 65504.0)]
    if int(np.sum(v != np.round(v))) < MIN_FRACTIONAL:
        return None
    return bool(np.all(v.astype(np.float16).astype(np.float64) == v))


def finite_until(curve: Curve | None, step: int) -> bool | None:
    """Whether a curve is finite at every logged step before ``step`` (None: not logged)."""
    if curve is None:
        return None
    before = curve.before(step)
    if not len(before):
        return None
    return bool(np.all(np.isfinite(before.values)))
