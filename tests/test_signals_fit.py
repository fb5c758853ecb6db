"""The growth fit of the rules: a least-squares line in numpy, as scipy's linregress gives it,
and no scipy import on the analysis path (it costs about a second per process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyzer.rules.signals import growth, line_fit

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("seed", range(20))
def test_line_fit_matches_linregress(seed: int) -> None:
    from scipy.stats import linregress

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 400))
    x = np.sort(rng.choice(1_000_000, n, replace=False)).astype(np.float64)
    y = rng.normal(size=n) * rng.uniform(0.01, 3) + x * rng.normal() * 1e-4
    fit = linregress(x, y)
    slope, r2 = line_fit(x, y)
    assert slope == pytest.approx(float(fit.slope), rel=1e-9, abs=1e-15)
    assert r2 == pytest.approx(float(fit.rvalue) ** 2, rel=1e-9, abs=1e-12)


def test_line_fit_of_constant_values() -> None:
    assert line_fit(np.arange(6.0), np.full(6, 2.5)) == (0.0, 0.0)
    assert line_fit(np.full(6, 3.0), np.arange(6.0)) == (0.0, 0.0)


def test_growth_of_an_exploding_curve() -> None:
    steps = np.arange(60, dtype=np.int64)
    values = np.where(steps < 30, 1.0, 2.0 ** ((steps - 30) / 3.0)) * (1 + 0.01 * np.sin(steps))
    found = growth(steps, values)
    assert found is not None
    assert 28 <= found.onset_step <= 31
    assert found.doubling_steps == pytest.approx(3.0, rel=0.05)
    assert found.r2 > 0.99


def test_analysing_a_run_does_not_import_scipy() -> None:
    code = ("import sys; from analyzer import api; "
            "r = api.analyze('sample_runs/sgd_lr_too_high', replay=False); "
            "assert r.results[0].findings, 'no finding'; "
            "print('scipy' in {m.split('.')[0] for m in sys.modules})")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
