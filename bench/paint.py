"""First paint of the dashboard: how long `forensics app` keeps an engineer waiting.

Two folders: one sample run copied into a temporary folder, and a fleet of N generated runs
(:mod:`fleetgen`: real tiny trainings copied under new names; kept between rounds under
``--cache``, as ``fleet-N`` beside the trainings it copies). For each, the dashboard is
served by ``forensics app`` (``tests/chromium.py``: a fresh server on a free port) and a
headless Chromium opens it, as a user opening the printed address would:

* ``runs: title``: from the navigation until the page shows its title (what Streamlit and
  the browser cost before the page's script reads anything);
* ``runs: first row``: until the Runs table shows (the table being filled appears with
  every run named, before any is read; its cells are drawn on a canvas, so its element is
  what is looked for);
* ``runs: first analysed``: until the table holds the first run read (its caption says
  ``Reading the runs: 1 of N``, or the table is complete);
* ``runs: complete``: until the final caption (``N runs: ...``) shows and the script has
  stopped running;
* ``run page: headline``: on a server of its own (cold caches), until a run page shows the
  run's headline (``**name** · ...``), and ``run page: replayed`` until it shows the
  replay's verdict where the run has a capture (``replay``, in the headline or the page).

Then ``forensics analyze --no-replay`` is timed on the same folder, in the same round (its
default ``-j``: one process per CPU from 16 runs up), and each figure is given as a ratio to
it. Server start-up (until Streamlit's health check answers) is shown apart: it is the same
for every folder and happens before the address is printed.

The machine is shared: figures move by tens of percent from one round to the next. With
``--rounds N`` each is measured N times and the fastest kept.

Usage: ``python bench/paint.py [--runs 200] [--rounds 1] [--cache bench/out/paint]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.chromium import DevTools, install_chromium, serve  # noqa: E402

SAMPLE = "nan_in_batch"
"""The one-run folder: a failed sample run with checkpoints and a capture."""
LIMIT_S = 900.0
POLL_S = 0.05

_PAGE_JS = """JSON.stringify((() => {
  const q = (s) => [...document.querySelectorAll(s)];
  return {
    app: q('[data-testid="stApp"]').length > 0,
    running: q('[data-testid^="stStatusWidgetRunning"]').length > 0,
    tables: q('[data-testid="stDataFrame"]').length,
    errors: q('[data-testid="stException"]').map((e) => e.innerText),
    text: document.body ? document.body.innerText : "",
  };
})())"""


def _state(browser: DevTools) -> dict[str, Any]:
    return dict(json.loads(browser.evaluate(_PAGE_JS)))


def _until(browser: DevTools, start: float, done: Callable[[dict[str, Any]], bool],
           what: str) -> float:
    """Seconds from ``start`` until ``done`` holds of the page."""
    deadline = start + LIMIT_S
    while time.monotonic() < deadline:
        state = _state(browser)
        if state["errors"]:
            raise RuntimeError(f"{what}: error on the page: {state['errors'][0][:500]}")
        if done(state):
            return time.monotonic() - start
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not seen in {LIMIT_S:.0f} s")


@contextlib.contextmanager
def _served(root: Path) -> Iterator[tuple[str, float]]:
    start = time.monotonic()
    with serve(root) as base:
        yield base, time.monotonic() - start


def _runs_page(browser: DevTools, root: Path, runs: int) -> dict[str, float]:
    with _served(root) as (base, up):
        browser.navigate("about:blank")
        start = time.monotonic()
        browser.navigate(base)
        title = _until(browser, start, lambda s: "Runs" in s["text"], "runs: title")
        first = _until(browser, start, lambda s: s["tables"] > 0, "runs: first row")
        read = re.compile(r"Reading the runs: [1-9]\d* of|\b\d+ runs?: \d+ failed")
        analysed = _until(browser, start, lambda s: bool(read.search(s["text"])),
                          "runs: first analysed")
        caption = re.compile(rf"\b{runs} runs?: \d+ failed")
        complete = _until(browser, start,
                          lambda s: bool(caption.search(s["text"])) and not s["running"],
                          "runs: complete")
    return {"server up": up, "runs: title": title, "runs: first row": first,
            "runs: first analysed": analysed, "runs: complete": complete}


def _run_page(browser: DevTools, root: Path, name: str, captured: bool) -> dict[str, float]:
    with _served(root) as (base, _):
        browser.navigate("about:blank")
        start = time.monotonic()
        browser.navigate(f"{base}run?run={quote(name)}")
        out = {"run page: headline": _until(
            browser, start, lambda s: f"{name} · " in s["text"], "run page: headline")}
        if captured:  # the page says "Replaying ..." until the replay is shown
            out["run page: replayed"] = _until(
                browser, start, lambda s: f"{name} · " in s["text"]
                and "Replaying" not in s["text"] and not s["running"], "run page: replayed")
    return out


def _analyze(root: Path) -> float:
    start = time.monotonic()
    code = "import sys; from analyzer.cli import entry; sys.exit(entry())"
    done = subprocess.run([sys.executable, "-c", code, "analyze", "--no-replay", "-q",
                           str(root)], cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - start
    if done.returncode not in (0, 1):  # 1: some run failed, which is what they are for
        raise RuntimeError(f"forensics analyze failed: {done.stderr[-2000:]}")
    return took


def _fleet(cache: Path, runs: int, seed: int) -> Path:
    """The generated fleet of ``runs`` runs, made once into ``cache`` (a marker beside it,
    not in it, says it was made whole: the dashboard must find exactly the runs)."""
    out, marker = cache / f"fleet-{runs}", cache / f"fleet-{runs}.complete"
    if marker.exists() and out.is_dir():
        return out
    shutil.rmtree(out, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "bench" / "fleetgen.py"), str(out), "--runs",
                    str(runs), "--seed", str(seed), "--trainings", str(cache / "trainings")],
                   check=True, stdout=subprocess.DEVNULL)
    marker.touch()
    return out


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def measure(folders: dict[str, tuple[Path, str, bool, int]], rounds: int,
            browser: DevTools) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for label, (root, name, captured, runs) in folders.items():
            before = _snapshot(root)
            got = _runs_page(browser, root, runs)
            got |= _run_page(browser, root, name, captured)
            got["analyze --no-replay"] = _analyze(root)
            if _snapshot(root) != before:
                raise RuntimeError(f"{root}: the folder changed while it was measured")
            kept = best.setdefault(label, {})
            for key, value in got.items():
                kept[key] = min(value, kept.get(key, value))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=str(ROOT / "bench" / "out" / "paint"))
    args = parser.parse_args()
    cache = Path(args.cache)
    fleet = _fleet(cache, args.runs, args.seed)
    with tempfile.TemporaryDirectory(prefix="paint-") as tmp:
        one = Path(tmp) / "runs"
        shutil.copytree(ROOT / "sample_runs" / SAMPLE, one / SAMPLE)
        first = sorted(p.name for p in fleet.iterdir() if p.is_dir())[0]
        folders = {"1 run": (one, SAMPLE, True, 1),
                   f"{args.runs} runs": (fleet, first, False, args.runs)}
        exe = install_chromium()
        browser = DevTools(exe, Path(tmp) / "profile", Path(tmp) / "chromium.log")
        try:
            browser.call("Page.enable")
            browser.call("Runtime.enable")
            browser.call("Emulation.setDeviceMetricsOverride",
                         {"width": 1440, "height": 1000, "deviceScaleFactor": 1,
                          "mobile": False})
            best = measure(folders, args.rounds, browser)
        finally:
            browser.close()
    print(f"{'folder':<10} {'measure':<22} {'seconds':>8} {'x analyze':>10}")
    for label, figures in best.items():
        base = figures["analyze --no-replay"]
        for key, value in figures.items():
            print(f"{label:<10} {key:<22} {value:8.2f} {value / base:10.2f}")
    print(json.dumps({"cpus": os.cpu_count(), "figures": best}))


if __name__ == "__main__":
    main()
