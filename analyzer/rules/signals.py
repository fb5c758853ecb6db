"""Numbers rules compute from curves: exponential growth and robust spikes."""

from __future__ import annotations

import math
import warnings
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

    @property
    def factor(self) -> float:
        """How many times over the quantity rose from onset to end (10**decades); inf past
        float64's range, which float64 logs from text can span."""
        try:
            return float(10.0 ** self.decades)
        except OverflowError:
            return math.inf


def growth(steps: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> Growth | None:
    """Exponential growth at the end of a curve: where it began and how fast it rose.

    log10(values) is fitted with two straight lines, one before a breakpoint and one after
    it, the breakpoint chosen to minimise the total squared error (prefix sums make every
    candidate O(1)); a single line is kept when splitting gains little. The final segment is
    fitted by least squares (:func:`line_fit`) and counts as growth when it rises with
    R^2 >= 0.8.
    """
    keep = np.isfinite(values) & (values > 0)
    x = steps[keep].astype(np.float64)
    y = np.log10(values[keep])
    n = x.shape[0]
    if n < MIN_POINTS:
        return None
    start = _breakpoint(x, y)
    xs, ys = x[start:], y[start:]
    if np.ptp(xs) == 0:
        return None
    slope, r2 = line_fit(xs, ys)
    if slope <= 0 or r2 < 0.8:
        return None
    return Growth(onset_step=int(xs[0]), end_step=int(xs[-1]), slope=slope, r2=r2,
                  decades=float(ys[-1] - ys.min()), points=n - start)


def line_fit(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> tuple[float, float]:
    """The least-squares line through (x, y): its slope and R^2 (0 when x or y is
    constant), from centred sums, as scipy.stats.linregress gives them, without importing
    scipy (about a second per process)."""
    dx = x - x.mean()
    dy = y - y.mean()
    sxx, syy, sxy = float(dx @ dx), float(dy @ dy), float(dx @ dy)
    if sxx == 0.0:
        return 0.0, 0.0
    slope = sxy / sxx
    if syy == 0.0:
        return slope, 0.0
    r = max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))
    return slope, r * r


def _breakpoint(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> int:
    n = x.shape[0]
    c = [np.concatenate(([0.0], np.cumsum(v))) for v in (np.ones(n), x, y, x * x, x * y, y * y)]

    def sse(lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        k, sx, sy, sxx, sxy, syy = ((v[hi] - v[lo]) for v in c)
        vx = sxx - sx * sx / k
        cov = sxy - sx * sy / k
        vy = syy - sy * sy / k
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(vx > 0, cov * cov / vx, 0.0)
        return np.asarray(np.maximum(vy - fit, 0.0), dtype=np.float64)

    whole = float(sse(np.array([0]), np.array([n]))[0])
    cuts = np.arange(2, n - MIN_POINTS + 1)
    if not cuts.size:
        return 0
    total = sse(np.zeros_like(cuts), cuts) + sse(cuts, np.full_like(cuts, n))
    best = int(np.argmin(total))
    # Split only when it explains the curve clearly better than one line does.
    if total[best] >= 0.5 * whole:
        return 0
    return int(cuts[best])


def robust_z(values: npt.NDArray[np.float64], window: int = 50,
             min_history: int = 10) -> npt.NDArray[np.float64]:
    """Each value's distance from the median of the ``window`` values before it, in MADs
    (scaled to a standard deviation for normal data). Values with fewer than
    ``min_history`` finite predecessors, or a zero MAD, score 0."""
    n = values.shape[0]
    z = np.zeros(n)
    if n <= min_history:
        return z
    padded = np.concatenate((np.full(window, np.nan), values.astype(np.float64)))
    past = np.lib.stride_tricks.sliding_window_view(padded[:-1], window)[:n]
    past = np.where(np.isfinite(past), past, np.nan)
    enough = np.sum(np.isfinite(past), axis=1) >= min_history
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows score 0 below
        med = np.nanmedian(past, axis=1)
        mad = np.nanmedian(np.abs(past - med[:, None]), axis=1) * 1.4826
        score = (values - med) / mad
    ok = enough & np.isfinite(score) & (mad > 0)
    z[ok] = score[ok]
    return z
