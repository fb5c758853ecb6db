"""The dashboard in a real browser: `forensics app` serving on 127.0.0.1, driven by headless
Chromium over the DevTools protocol, on a copy of two sample runs.

Chromium is Debian's package, installed here when missing (the tests run as root). It is
driven through ``--remote-debugging-pipe``: DevTools messages on file descriptors 3 and 4,
so no driver and no Python package beyond the standard library are needed. Screenshots
of every page go to test-output/app_browser/.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.chromium import DevTools
from tests.chromium import install_chromium as _install_chromium
from tests.chromium import serve as _serve

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_runs"
SHOTS = ROOT / "test-output" / "app_browser"
FIRST_LOAD_S = 240.0
PAGE_LOAD_S = 90.0

pytestmark = pytest.mark.slow


def _scenarios(root: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/scenario.json"))}


def _pick(scenarios: dict[str, dict[str, Any]]) -> tuple[str, str]:
    failed = next((n for n, sc in scenarios.items() if sc.get("capture")
                   and sc["expected"]["verdict"] == "math-fault"), None)
    healthy = next((n for n, sc in scenarios.items()
                    if sc["expected"]["first_nonfinite_step"] is None), None)
    if failed is None or healthy is None:
        pytest.skip("sample_runs/ lacks a failed run with a capture or a healthy run")
    return failed, healthy


def _untrusted_copy(run: Path, copy: Path, marker: Path) -> None:
    """A copy of a failed run whose capture names a module shipped in the run folder, one
    that leaves ``marker`` when imported."""
    shutil.copytree(run, copy)
    (copy / "shipped.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                     "def make(**kwargs):\n    return None\n")
    meta = next((copy / "capture").glob("step_*/meta.json"))
    data = json.loads(meta.read_text())
    data["model"]["factory"] = "shipped:make"
    meta.write_text(json.dumps(data))


def _unaligned_run(run: Path) -> None:
    """An event file whose loss goes NaN at step 61 beside a Hugging Face Trainer log that
    shares no value with it: the log's records cannot be placed on the run's steps."""
    import math

    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run))
    for step in range(70):
        loss = float("nan") if step >= 61 else 2.0 * math.exp(-step / 40)
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    lines = ["{'loss': nan, 'epoch': 0.1}" if k == 2 else "{'loss': 9.5, 'epoch': 0.1}"
             for k in range(1, 6)]
    (run / "train.log").write_text("\n".join(lines) + "\n")


LIGHTNING_RUN = "lightning_restart"
"""A real Lightning run resumed into version_1, from the corpus: one run of two segments."""


def _has_lightning() -> bool:
    import importlib.util

    return importlib.util.find_spec("lightning") is not None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str, str]]:
    """The dashboard served by `launch` on a free port, over a copy of two sample runs."""
    failed, healthy = _pick(_scenarios(SAMPLES))
    root = tmp_path_factory.mktemp("browser") / "runs"
    for name in (failed, healthy):
        shutil.copytree(SAMPLES / name, root / name)
    _untrusted_copy(root / failed, root / "untrusted", root.parent / "marker")
    _unaligned_run(root / "unaligned")
    if _has_lightning():
        from tests.frameworks import corpus

        shutil.copytree(corpus.get(LIGHTNING_RUN, tmp_path_factory), root / LIGHTNING_RUN)
    with _serve(root) as base:
        yield base, root, failed, healthy


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    exe = _install_chromium()
    base = tmp_path_factory.mktemp("chromium")
    tools = DevTools(exe, base / "profile", base / "chromium.log")
    try:
        tools.call("Page.enable")
        tools.call("Runtime.enable")
        tools.call("Emulation.setDeviceMetricsOverride",
                   {"width": 1400, "height": 1800, "deviceScaleFactor": 1, "mobile": False})
        yield tools
    finally:
        tools.close()


def visit(browser: DevTools, url: str, expect: list[str], shot: str,
          timeout: float = PAGE_LOAD_S) -> str:
    """Open a page, wait until it shows every expected text and has finished running,
    save a screenshot, and fail on an exception or error box."""
    browser.navigate(url)
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    settled = 0
    while time.monotonic() < deadline:
        time.sleep(0.5)
        last = browser.state()
        if last["errors"]:
            break
        ready = (last["app"] and not last["running"] and not last["spinners"]
                 and last["plotted"] >= last["charts"]
                 and all(e in last["text"] for e in expect))
        settled = settled + 1 if ready else 0
        if settled >= 3:  # the same state three polls running: the page is done
            break
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(SHOTS / f"{shot}.png")
    assert not last.get("errors"), f"{url}: error box: {last['errors']}"
    missing = [e for e in expect if e not in last.get("text", "")]
    assert not missing, f"{url}: missing {missing}; page text:\n{last.get('text', '')[:3000]}"
    return str(last["text"])


def test_every_page_in_chromium(served: tuple[str, Path, str, str], browser: DevTools) -> None:
    base, root, failed, healthy = served
    sc = _scenarios(root)[failed]["expected"]
    step = sc["first_nonfinite_step"]
    run = quote(failed)
    # The table's cells are drawn on a canvas: its text is not in the page, its caption is.
    runs = "5 runs: 4 failed, 1 finite" if (root / LIGHTNING_RUN).exists() else \
        "4 runs: 3 failed, 1 finite"
    visit(browser, base, ["Runs", runs], "runs", timeout=FIRST_LOAD_S)
    visit(browser, f"{base}fleet", ["Fleet", "Causes", "First non-finite step"], "fleet_samples")
    visit(browser, f"{base}timeline?run={run}", ["Marked steps", f"step {step}"], "timeline")
    visit(browser, f"{base}layers?run={run}", ["Layers", "Checkpoints"], "layers")
    visit(browser, f"{base}findings?run={run}", [sc["cause"], "Evidence", "Fix"], "findings")
    visit(browser, f"{base}replay?run={run}", [f"Verdict: {sc['verdict']}",
                                                "Module frames around the producer"], "replay")
    visit(browser, f"{base}logs?run={run}", ["Logs", "in the other sources"], "logs")
    visit(browser, f"{base}findings?run={quote(healthy)}",
          [healthy, "every logged value is finite"], "findings_healthy")
    visit(browser, f"{base}replay?run=untrusted",
          ["replay not run: it would import shipped:make", "Trust this folder and replay",
           "Replay once, without trusting it"], "replay_untrusted")
    assert not (root.parent / "marker").exists()
    shots = sorted(p.name for p in SHOTS.glob("*.png"))
    assert {"runs.png", "timeline.png", "replay.png", "logs.png"} <= set(shots)


_AXIS_TITLES_JS = """JSON.stringify([...document.querySelectorAll(
  '[data-testid="stPlotlyChart"] text[class^="x"][class$="title"]')]
  .map((e) => e.textContent))"""
"""The x axis titles of the page's charts (``xtitle``, ``x2title``, ... by subplot)."""


def test_an_unaligned_log_gets_a_panel_of_its_own(served: tuple[str, Path, str, str],
                                                  browser: DevTools) -> None:
    # Drawn by plotly in the page: one chart on the run's steps, and the log's own chart
    # whose x axis is its records.
    base = served[0]
    visit(browser, f"{base}timeline?run=unaligned",
          ["first non-finite at step 61", "train.log, by its own record numbers",
           "Its first non-finite value: record 2"], "timeline_unaligned",
          timeout=FIRST_LOAD_S)
    titles = json.loads(browser.evaluate(_AXIS_TITLES_JS))
    assert "step" in titles, titles
    assert "record (train.log's own numbering)" in titles, titles


def test_run_page_shows_a_lightning_runs_segments_and_settings(
        served: tuple[str, Path, str, str], browser: DevTools) -> None:
    base, root = served[0], served[1]
    if not (root / LIGHTNING_RUN).exists():
        pytest.skip("lightning is not installed: no real Lightning run to show")
    text = visit(browser, f"{base}run?run={LIGHTNING_RUN}",
                 ["Folders and files", "Layout recognised: lightning", "Segments",
                  "Training settings", "Metadata files read"], "run_lightning",
                 timeout=FIRST_LOAD_S)
    assert "first non-finite at step 35" in text


@pytest.fixture(scope="module")
def served_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard over a generated sweep of 20 real trainings."""
    pytest.importorskip("analyzer.scenarios.sweep")
    from analyzer.scenarios.sweep import generate

    base = tmp_path_factory.mktemp("browser_sweep")
    generate(str(base / "runs"), 20, 0, str(base / "manifest.json"))
    with _serve(base / "runs") as address:
        yield address


def test_fleet_page_in_chromium_names_the_separator(served_sweep: str,
                                                    browser: DevTools) -> None:
    # Streamlit's markdown sets ">=" as "≥": the sentence is looked for in its own words.
    text = visit(browser, f"{served_sweep}fleet",
                 ["Fleet", "Separating hyperparameters", "lr separates the failed runs from "
                  "the healthy", "lr by outcome"], "fleet", timeout=FIRST_LOAD_S)
    sentence = next(line for line in text.splitlines() if line.startswith("lr separates"))
    assert "lr ≥ " in sentence or "lr >= " in sentence, sentence
    state = browser.state()
    assert state["charts"] >= 3 and state["plotted"] == state["charts"], state["charts"]
    titles = json.loads(browser.evaluate(_AXIS_TITLES_JS))
    assert {"lr", "first non-finite step", "failed runs explained"} <= set(titles), titles
    assert "20 run(s). Pick a row" in text
    # A click on the causes chart's last (smallest) bar lists that cause's runs alone.
    bar = json.loads(browser.evaluate(_LAST_BAR_JS))
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", {"type": kind, "x": bar["x"], "y": bar["y"],
                                                  "button": "left", "clickCount": 1})
    deadline = time.monotonic() + PAGE_LOAD_S
    shown = None
    while time.monotonic() < deadline and shown is None:
        time.sleep(0.5)
        found = re.search(r"(\d+) run\(s\)\. Pick a row", browser.state()["text"])
        shown = int(found[1]) if found and int(found[1]) < 20 else None
    browser.screenshot(SHOTS / "fleet_cause_clicked.png")
    assert shown is not None and 0 < shown < 20, (shown, bar)


_LAST_BAR_JS = """JSON.stringify((() => {
  const chart = document.querySelectorAll('[data-testid="stPlotlyChart"]')[0];
  const bars = [...chart.querySelectorAll('g.point path')];
  const r = bars[bars.length - 1].getBoundingClientRect();
  return {x: r.x + r.width / 2, y: r.y + r.height / 2};
})())"""
"""The middle of the causes chart's last bar, in the page's coordinates."""
