"""Numbers rules compute from curves: exponential growth and robust spikes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MIN_POINTS = 5


@dataclass(frozen=True)
class Growth:
    """Exponential growth of a positive quantity over a stretch of steps."""

    onset_step: int
    end_step: int
    slope: float
    """log10 units per step."""
    r2: float
    decades: float
    """How many orders of magnitude the quantity rose from onset to end."""
    points: int

    @property
    def doubling_steps(self) -> float:
        return math.log10(2) / self.slope if self.slope > 0 else math.inf


def growth(steps: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> Growth | None:
    """The longest final stretch over which log10(values) rises along a straight line.

    The fit is an ordinary least squares line of log10 against step (scipy's linregress);
    the onset is the earliest start that still fits with R^2 >= 0.8, so growth that began
    long before the failure is dated from where it began.
    """
    from scipy.stats import linregress

    keep = np.isfinite(values) & (values > 0)
    x = steps[keep].astype(np.float64)
    y = np.log10(values[keep])
    n = x.shape[0]
    if n < MIN_POINTS:
        return None
    best: Growth | None = None
    for start in _starts(n):
        xs, ys = x[start:], y[start:]
        if np.ptp(xs) == 0:
            continue
        fit = linregress(xs, ys)
        r2 = float(fit.rvalue) ** 2
        if fit.slope <= 0 or r2 < 0.8:
            if best is not None:
                break
            continue
        decades = float(ys[-1] - ys.min())
        best = Growth(onset_step=int(xs[0]), end_step=int(xs[-1]), slope=float(fit.slope),
                      r2=r2, decades=decades, points=n - start)
    return best


def _starts(n: int) -> list[int]:
    """Candidate onsets from the last few points backwards to the first."""
    last = n - MIN_POINTS
    stride = max(1, n // 200)
    return list(range(last, -1, -stride)) + ([0] if last % stride else [])


def robust_z(values: npt.NDArray[np.float64], window: int = 50) -> npt.NDArray[np.float64]:
    """Each value's distance from the median of the ``window`` values before it, in MADs."""
    z = np.zeros(values.shape[0])
    for i in range(values.shape[0]):
        past = values[max(0, i - window): i]
        past = past[np.isfinite(past)]
        if past.shape[0] < 10 or not math.isfinite(values[i]):
            continue
        med = float(np.median(past))
        mad = float(np.median(np.abs(past - med))) * 1.4826
        if mad > 0:
            z[i] = (values[i] - med) / mad
    return z
