"""The corpus as a test sees it: ``get(name, tmp_path_factory)`` gives the folder of one
run, generated once per test session in a fresh interpreter (``generate``) whose console
is the run's ``train.log``.

Runs of one family are generated together (one interpreter start, one framework import):
asking for ``lightning_nan`` also makes the other Lightning runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.frameworks._common import OFFLINE

FAMILIES: dict[str, tuple[str, ...]] = {
    "lightning": ("lightning_nan", "lightning_anomaly", "lightning_healthy",
                  "lightning_restart"),
    "hf": ("hf_nan", "hf_healthy"),
    "plain": ("tbx_nan", "amp_benign"),
    "ddp": ("ddp_gloo",),
}
NAMES = tuple(name for names in FAMILIES.values() for name in names)
FAILING = ("lightning_nan", "lightning_anomaly", "lightning_restart", "hf_nan", "tbx_nan",
           "ddp_gloo")
HEALTHY = ("lightning_healthy", "hf_healthy", "amp_benign")
INTENDED: dict[str, str] = {
    "lightning_nan": "learning-rate-too-high",      # SGD at lr=1.0 diverges
    "lightning_anomaly": "division-by-zero",        # x / |x| of an all-zero sample: 0/0
    "lightning_restart": "learning-rate-too-high",  # a LambdaLR growing 6x per epoch
    "hf_nan": "learning-rate-too-high",             # SGD warming up to lr=30
    "tbx_nan": "log-of-zero",                       # hand-written BCE: 0 * log(0)
    "ddp_gloo": "division-by-zero",                 # a zero batch divided by its norm
    **{name: "healthy" for name in HEALTHY},
}
"""The cause each run was built to show (a rule name), from the mechanism its generator
builds; ``bench/evaluate.py --frameworks`` scores the analysis against it."""
REPO = Path(__file__).resolve().parents[2]

_made: dict[str, Path] = {}


def generate(out: Path, names: tuple[str, ...]) -> None:
    """Write each named run into ``out/<name>`` (a fresh interpreter, console captured)."""
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "tests.frameworks.generate", str(out), *names],
                          cwd=REPO, env=env, timeout=300, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"generating {names} failed:\n{done.stderr[-4000:]}")


def family(name: str) -> str:
    return next(f for f, names in FAMILIES.items() if name in names)


def get(name: str, tmp_path_factory: Any) -> Path:
    """The folder of run ``name``, made once per session (with the rest of its family)."""
    if name not in NAMES:
        raise KeyError(f"no corpus run {name!r}; known: {', '.join(NAMES)}")
    if name not in _made:
        fam = family(name)
        out = Path(tmp_path_factory.mktemp(f"corpus_{fam}"))
        generate(out, FAMILIES[fam])
        for member in FAMILIES[fam]:
            _made[member] = out / member
    return _made[name]
