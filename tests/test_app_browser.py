"""The dashboard in a real browser: `forensics app` serving on 127.0.0.1, driven by headless
Chromium over the DevTools protocol, on a copy of two sample runs.

Chromium is Debian's package, installed here when missing (the tests run as root). It is
driven through ``--remote-debugging-pipe``: DevTools messages on file descriptors 3 and 4,
so no driver and no Python package beyond the standard library are needed. Screenshots
of every page go to test-output/app_browser/.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
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
    # A healthy run whose loss scaler skipped steps says its non-finite values were those
    # benign skips (issue 19: not "every logged value is finite" above red marks).
    benign = _scenarios(root)[healthy].get("benign_skips")
    visit(browser, f"{base}findings?run={quote(healthy)}",
          [healthy, "the loss scaler's overflow skips, benign" if benign else
           "every logged value is finite"], "findings_healthy")
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
def served_sweep(sweep_of: Callable[[int, str], tuple[Path, dict[str, Any]]]) -> Iterator[str]:
    """The dashboard over the session's generated sweep (tests/conftest.py), its first 20
    trials: real trainings, made once for every module that needs them."""
    root, _ = sweep_of(20, "browser_sweep")
    with _serve(root) as address:
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
    assert "20 runs. Pick a row" in text
    # A click on the causes chart's last (smallest) bar lists that cause's runs alone.
    bar = json.loads(browser.evaluate(_LAST_BAR_JS))
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", {"type": kind, "x": bar["x"], "y": bar["y"],
                                                  "button": "left", "clickCount": 1})
    deadline = time.monotonic() + PAGE_LOAD_S
    shown = None
    while time.monotonic() < deadline and shown is None:
        time.sleep(0.5)
        found = re.search(r"(\d+) runs?\. Pick a row", browser.state()["text"])
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


# --- The flows of issue 19, at the width an engineer's screen gives (1440x1000) -----------
#
# One dashboard over a copy of sample runs, a folder holding only random bytes named as an
# event file and a run whose event file is cut in half before its NaN. Each step is asserted
# on what the page shows (its text, the tables' cells, plotly's drawn traces, computed
# colours) and saved as a screenshot under test-output/app_browser/flow_*.png.

GARBAGE = "garbage"
"""A folder holding only ``events.out.tfevents.1.host`` of random bytes."""
CUT = "cut_short"
"""A run whose event file, written by torch's SummaryWriter (loss NaN from step 61 of 70),
is cut in half: what can be read is finite, and the record ends early."""
RUN_PAGES = ["Run", "Timeline", "Compare", "Layers", "Findings", "Replay", "Logs"]
"""The pages about one run (app.ui.RUN_PAGES), each linked from the others."""
WIDE = {"width": 1440, "height": 1000, "deviceScaleFactor": 1, "mobile": False}


def _damaged_runs(root: Path) -> None:
    import math
    import random

    from torch.utils.tensorboard import SummaryWriter

    (root / GARBAGE).mkdir(parents=True)
    (root / GARBAGE / "events.out.tfevents.1.host").write_bytes(
        random.Random(19).randbytes(4096))
    writer = SummaryWriter(str(root / CUT))
    for step in range(70):
        writer.add_scalar("train/loss", float("nan") if step >= 61 else
                          2.0 * math.exp(-step / 40), step)
    writer.close()
    event = next((root / CUT).glob("events.out.tfevents.*"))
    whole = event.read_bytes()
    event.write_bytes(whole[:len(whole) // 2])


@dataclasses.dataclass(frozen=True)
class Flows:
    base: str
    root: Path
    failed: str
    """A failed sample run with a capture: compared, clicked, its replay's button looked at."""
    fresh: str
    """Another failed run with a capture, opened by the first-paint test only (its replay is
    not done before that test opens it)."""
    healthy: str
    """A healthy sample run, picked on the Runs table."""


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flows]:
    scenarios = _scenarios(SAMPLES)
    failed, _ = _pick(scenarios)
    healthy = "healthy_control" if "healthy_control" in scenarios else _pick(scenarios)[1]
    fresh = next((n for n, sc in scenarios.items() if n != failed and sc.get("capture")
                  and sc["expected"]["first_nonfinite_step"] is not None), None)
    if fresh is None:
        pytest.skip("sample_runs/ lacks a second failed run with a capture")
    root = tmp_path_factory.mktemp("browser_flows") / "runs"
    for name in (failed, fresh, healthy):
        shutil.copytree(SAMPLES / name, root / name)
    _damaged_runs(root)
    with _serve(root) as base:
        yield Flows(base, root, failed, fresh, healthy)


@pytest.fixture
def wide(browser: DevTools) -> Iterator[DevTools]:
    """The module's browser at 1440x1000 for one test, back at its own size after it."""
    browser.call("Emulation.setDeviceMetricsOverride", WIDE)
    try:
        yield browser
    finally:
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": 1400, "height": 1800, "deviceScaleFactor": 1, "mobile": False})


def _js(browser: DevTools, expression: str) -> Any:
    """The JSON value ``expression`` gives in the page; a JavaScript exception fails."""
    out = browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
    if "exceptionDetails" in out:
        raise AssertionError(out["exceptionDetails"].get("exception", {}).get("description"))
    return json.loads(out["result"]["value"])


def _click(browser: DevTools, x: float, y: float) -> None:
    """A real left click at (x, y) of the page: moved there, pressed, released."""
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                  "button": "left", "clickCount": 1})


def _settle(browser: DevTools, done: Callable[[dict[str, Any]], bool],
            timeout: float = PAGE_LOAD_S) -> dict[str, Any]:
    """The page's state once ``done`` holds three polls running with the page finished
    (no script running, no spinner, every chart drawn); fails when it never does."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    settled = 0
    while time.monotonic() < deadline and settled < 3:
        time.sleep(0.5)
        last = browser.state()
        if last["errors"]:
            break
        ready = (last["app"] and not last["running"] and not last["spinners"]
                 and last["plotted"] >= last["charts"] and done(last))
        settled = settled + 1 if ready else 0
    assert not last.get("errors"), f"error box: {last['errors']}"
    assert settled >= 3, f"the page never showed what was waited for in {timeout:.0f} s; " \
        f"page text:\n{last.get('text', '')[:3000]}"
    return last


def _shot(browser: DevTools, name: str, selector: str | None = None,
          heading: str | None = None) -> None:
    """A screenshot of the viewport, scrolled first to put at its top ``selector``'s first
    element or the last heading whose text starts with ``heading``, when given (Streamlit
    scrolls its main block, not the document)."""
    if selector is not None or heading is not None:
        browser.evaluate(f"""(() => {{
          const e = {json.dumps(selector)} ? document.querySelector({json.dumps(selector)})
            : [...document.querySelectorAll('h1, h2, h3')]
              .filter((h) => h.textContent.startsWith({json.dumps(heading)})).pop();
          if (e) e.scrollIntoView({{block: 'start'}}); }})()""")
        time.sleep(0.3)
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(SHOTS / f"flow_{name}.png")


_MAIN_JS = """JSON.stringify(document.querySelector('[data-testid="stMain"]').innerText)"""
_SIDEBAR_RUN_JS = """JSON.stringify(document.querySelector(
  '[data-testid="stSidebar"] [data-testid="stSelectbox"] input').value)"""
_TABLES_JS = """JSON.stringify([...document.querySelectorAll('[data-testid="stDataFrame"]')]
  .map((g) => [...g.querySelectorAll('table tr')]
    .map((r) => [...r.querySelectorAll('th, td')].map((c) => c.textContent))))"""
"""The cells of every st.dataframe: drawn on a canvas, they are also in the grid's
accessibility table (the rows in view)."""


def _headline(browser: DevTools, title: str) -> str:
    """The line under the page's title: the run's headline."""
    lines = [line for line in _js(browser, _MAIN_JS).splitlines() if line.strip()]
    assert title in lines, lines[:5]
    return lines[lines.index(title) + 1]


def _main_has(*words: str) -> Callable[[dict[str, Any]], bool]:
    return lambda state: all(w in state["text"] for w in words)


def test_flow_first_paint_shows_the_headline_before_the_replay(flows: Flows,
                                                               wide: DevTools) -> None:
    # Order, not times: the headline is on screen while the replay is still said to be
    # running, and the replay's caption goes later while the headline stays.
    wide.navigate(f"{flows.base}run?run={quote(flows.fresh)}")
    head = f"{flows.fresh} · first non-finite"
    replaying = "Replaying the captured step"
    seen: list[tuple[bool, bool]] = []
    deadline = time.monotonic() + FIRST_LOAD_S
    done = 0  # polls running with the page finished, its headline shown and no replay said
    while time.monotonic() < deadline and done < 3:
        state = wide.state()
        assert not state["errors"], state["errors"]
        now = (head in state["text"], replaying in state["text"])
        if now != (seen[-1] if seen else None):
            seen.append(now)
            if now == (True, True):
                _shot(wide, "1_first_paint_replaying")
        done = done + 1 if now == (True, False) and not state["running"] else 0
        time.sleep(0.25)
    _settle(wide, _main_has("Folders and files"))
    _shot(wide, "1_first_paint_replayed")
    # The page drawn again with the replay: its links to the other pages once, none stale.
    links = _js(wide, """JSON.stringify([...document.querySelectorAll(
      '[data-testid="stMain"] [data-testid="stPageLink"]')].map((e) => e.innerText))""")
    assert sorted(links) == sorted(p for p in RUN_PAGES if p != "Run"), links
    assert (True, True) in seen, f"the headline never showed beside the replay's caption: {seen}"
    assert seen[-1] == (True, False), f"the replay's caption never went: {seen}"
    first_head = next(i for i, (h, _) in enumerate(seen) if h)
    assert all(not r for _, r in seen[:first_head]), seen  # no replay caption before it


_ROW_JS = """JSON.stringify((() => {
  const grid = document.querySelector('[data-testid="stDataFrame"]');
  const box = grid.getBoundingClientRect();
  const rows = [...grid.querySelectorAll('table tr')].map((r) => ({
    index: Number(r.getAttribute('aria-rowindex')),
    run: (r.querySelector('td') || {}).textContent}));
  return {x: box.x, y: box.y, height: box.height, rows};
})())"""
"""The Runs table's box and, for each row in its accessibility table, its row index (1 is
the header) and run name."""
ROW_PX = 35
"""The height of a glide-data-grid row (and of its header) in st.dataframe."""
_NAV_JS = """JSON.stringify([...document.querySelectorAll('[data-testid="stSidebarNav"] a')]
  .map((a) => { const r = a.getBoundingClientRect();
    return {label: a.innerText.split('\\n').pop(),
            x: r.x + r.width / 2, y: r.y + r.height / 2}; }))"""


def test_flow_pick_a_row_then_open_timeline_in_the_sidebar(flows: Flows,
                                                          wide: DevTools) -> None:
    wide.navigate(flows.base)
    _settle(wide, lambda s: "Pick a row to open the run" in s["text"] and any(_cells(wide)),
            FIRST_LOAD_S)
    assert wide.evaluate("document.title") == "Runs · NaN Forensics"
    before = _js(wide, _SIDEBAR_RUN_JS)
    assert before != flows.healthy, "the sidebar shows the run to pick already"
    grid = _js(wide, _ROW_JS)
    index = next(r["index"] for r in grid["rows"] if r.get("run") == flows.healthy)
    # The row-marker column, in the middle of that row of the canvas.
    _click(wide, grid["x"] + 18, grid["y"] + ROW_PX * (index - 1) + ROW_PX / 2)
    _settle(wide, lambda s: f"\n{flows.healthy}\n" in s["text"]
            and _js(wide, _SIDEBAR_RUN_JS) == flows.healthy)
    _shot(wide, "2_runs_row_picked")
    low = [m for m in _js(wide, _CONTRAST_JS)["captions"] if m["ratio"] < 4.5]
    assert not low, low
    assert _js(wide, _SIDEBAR_RUN_JS) == flows.healthy
    nav = {item["label"]: item for item in _js(wide, _NAV_JS)}
    _click(wide, nav["Timeline"]["x"], nav["Timeline"]["y"])
    _settle(wide, _main_has("Click a point"))
    _shot(wide, "2_sidebar_timeline")
    assert _headline(wide, "Timeline").startswith(f"{flows.healthy} · "), \
        _headline(wide, "Timeline")
    assert _js(wide, _SIDEBAR_RUN_JS) == flows.healthy
    assert f"run={flows.healthy}" in wide.evaluate("location.href")
    assert wide.evaluate("document.title") == f"Timeline · {flows.healthy} · NaN Forensics"


def _cells(browser: DevTools) -> list[list[list[str]]]:
    return list(_js(browser, _TABLES_JS))


def test_flow_damaged_runs_are_said_damaged_with_their_issue(flows: Flows,
                                                             wide: DevTools) -> None:
    wide.navigate(flows.base)
    state = _settle(wide, lambda s: "Pick a row to open the run" in s["text"]
                    and any(_cells(wide)), FIRST_LOAD_S)
    caption = next(line for line in state["text"].splitlines() if "Pick a row" in line)
    assert "1 damaged, 1 unreadable" in caption, caption
    status = {row[0]: row[1] for row in _cells(wide)[0][1:] if len(row) > 1}
    assert status[GARBAGE] == "unreadable" and status[CUT] == "damaged", status
    _shot(wide, "3_runs_damaged")

    wide.navigate(f"{flows.base}run?run={GARBAGE}")
    _settle(wide, _main_has("Folders and files"))
    head = _headline(wide, "Run")
    assert head.startswith(f"{GARBAGE} · unreadable"), head
    main = _js(wide, _MAIN_JS)
    assert "Nothing of this run could be read" in main, main[:1500]
    assert re.search(r"events\.out\.tfevents\.1\.host at byte 0: \w+: .*not an event file",
                     main), main[:1500]
    _shot(wide, "3_run_unreadable")

    wide.navigate(f"{flows.base}run?run={CUT}")
    _settle(wide, _main_has("Folders and files"))
    head = _headline(wide, "Run")
    assert head.startswith(f"{CUT} · damaged"), head
    ends = re.search(r"is cut at byte (\d+): its record ends at step (\d+)", head)
    assert ends is not None, head
    byte, last = ends[1], int(ends[2])
    assert 0 < last < 61, head  # cut before its NaN
    main = _js(wide, _MAIN_JS)
    assert re.search(rf"events\.out\.tfevents\.\S+ at byte {byte}: truncated: ", main), \
        main[:1500]
    _shot(wide, "3_run_damaged")

    wide.navigate(f"{flows.base}timeline?run={CUT}")
    _settle(wide, lambda s: "Marked steps" in s["text"] and any(_cells(wide)))
    traces = _js(wide, _TRACES_JS)
    ends_at = [t["x"] for t in traces[0] if t["name"] == "file ends"]
    assert ends_at == [[last]], traces[0]
    marked = [row for table in _cells(wide) for row in table if "file ends" in row]
    assert marked and marked[0][0] == str(last) and f"cut at byte {byte}" in marked[0][2], \
        marked
    _shot(wide, "3_timeline_file_ends", '[data-testid="stPlotlyChart"]')


_TRACES_JS = """JSON.stringify([...document.querySelectorAll('.js-plotly-plot')]
  .map((gd) => gd._fullData.map((t) => ({name: t.name, x: t.x ? Array.from(t.x) : [],
    xaxis: t.xaxis, yaxis: t.yaxis}))))"""
"""Each plotly chart's traces as drawn (``_fullData``: x decoded from plotly's base64)."""


def test_flow_compare_a_failed_run(flows: Flows, wide: DevTools) -> None:
    cause = _scenarios(flows.root)[flows.failed]["expected"]["cause"]
    wide.navigate(f"{flows.base}compare?run={quote(flows.failed)}")
    words = _main_has("Compare with", "Curves", "Settings, environment and checkpoints",
                      f"On {flows.failed} and on none")
    # The grids' cells reach their accessibility tables a moment after the page is done.
    state = _settle(wide, lambda s: words(s) and len(_cells(wide)) >= 2
                    and all(_cells(wide)), FIRST_LOAD_S)
    _shot(wide, "4_compare")
    assert state["charts"] == 1, state["charts"]
    runs = {t["name"] for t in _js(wide, _TRACES_JS)[0]}
    others = runs & (set(_scenarios(flows.root)) | {GARBAGE, CUT}) - {flows.failed}
    assert flows.failed in runs and others, runs
    assert flows.healthy in others, others  # a healthy sibling is among the defaults
    tables = _cells(wide)
    keys = tables[0]
    assert keys[0][:2] == ["group", "key"] and flows.failed in keys[0], keys[:2]
    assert len(keys) > 1, keys  # at least one key differs
    mine = next(t for t in tables[1:] if t and "rule" in t[0])
    assert any(cause in row for row in mine[1:]), mine
    _shot(wide, "4_compare_keys", heading="Settings, environment and checkpoints")
    _shot(wide, "4_compare_findings", heading="Findings")


_POINT_JS = """JSON.stringify((() => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  gd.scrollIntoView({block: 'center'});
  const full = gd._fullLayout;
  const i = gd._fullData.findIndex((t) => t.mode && t.mode.includes('markers')
    && t.x && t.x.length > 20 && t.visible === true);
  const t = gd._fullData[i];
  const k = Math.floor(t.x.length / 4);
  const xa = full[t.xaxis.replace('x', 'xaxis')], ya = full[t.yaxis.replace('y', 'yaxis')];
  const box = gd.getBoundingClientRect();
  return {trace: t.name, step: t.x[k],
          x: box.left + xa._offset + xa.l2p(xa.d2l(t.x[k])),
          y: box.top + ya._offset + ya.l2p(ya.d2l(t.y[k]))};
})())"""
"""The pixel of a data point a quarter along the first curve of the Timeline's chart, from
plotly's own axes (``l2p`` inside the plot area, offset by the area's place in the div)."""

_CONTRAST_JS = """JSON.stringify((() => {
  const rgba = (s) => { const m = /rgba?\\(([^)]+)\\)/.exec(s || ''); if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (fg, bg) => [0, 1, 2].map((i) => fg[i] * fg[3] + bg[i] * (1 - fg[3]))
    .concat([1]);
  const lum = (c) => { const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const ratio = (a, b) => { const [hi, lo] = [lum(a), lum(b)].sort((p, q) => q - p);
    return (hi + 0.05) / (lo + 0.05); };
  const background = (el) => { const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let bg = [255, 255, 255, 1];
    for (const c of layers.reverse()) bg = over(c, bg);
    return bg; };
  const opacity = (el) => { let o = 1;
    for (let e = el; e; e = e.parentElement) o *= Number(getComputedStyle(e).opacity);
    return o; };
  const measure = (el, prop) => { const s = getComputedStyle(el); const c = rgba(s[prop]);
    let a = c[3] * opacity(el) * (prop === 'fill' ? Number(s.fillOpacity) : 1);
    const bg = background(el);
    return {text: el.textContent.slice(0, 60), color: s[prop],
            ratio: ratio(over([c[0], c[1], c[2], a], bg), bg)}; };
  const shown = (e) => e.getClientRects().length > 0;
  const caps = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
    .filter(shown).flatMap((e) => [e, ...e.querySelectorAll('p')])
    .map((e) => measure(e, 'color'));
  const ticks = [...document.querySelectorAll(
      'g[class^="x"][class$="tick"] text, g[class^="y"][class$="tick"] text')].filter(shown)
    .map((e) => measure(e, 'fill'));
  return {captions: caps, ticks};
})())"""
"""The WCAG contrast ratio of each caption (and its paragraphs) and each plotly tick label
(``xtick``, ``x2tick``, ..., ``ytick``, ...: a shared x axis labels the bottom row only)
against what lies under it: the text colour (``fill`` for plotly's SVG text) with its alpha
and the opacity of its ancestors, over the nearest backgrounds up to an opaque one."""


def test_flow_click_a_point_selects_its_step_and_text_is_legible(flows: Flows,
                                                                 wide: DevTools) -> None:
    wide.navigate(f"{flows.base}timeline?run={quote(flows.failed)}")
    _settle(wide, _main_has("Marked steps"), FIRST_LOAD_S)
    assert wide.evaluate("document.title") == f"Timeline · {flows.failed} · NaN Forensics"
    _js(wide, _POINT_JS)
    time.sleep(0.5)  # scrolled: the point's pixel is read again where it now is
    point = _js(wide, _POINT_JS)
    _click(wide, point["x"], point["y"])
    step = int(point["step"])
    _settle(wide, _main_has(f"Step {step} in every source"))
    assert f"step={step}" in wide.evaluate("location.href"), (point, wide.evaluate(
        "location.href"))
    _shot(wide, "5_timeline_point_clicked", '[data-testid="stPlotlyChart"]')
    _shot(wide, "5_timeline_step_table", heading=f"Step {step} in every source")

    # Small text legible (WCAG AA, 4.5:1): the captions (the sidebar's too) and the tick
    # labels on this page and on the Replay page.
    measured = _js(wide, _CONTRAST_JS)
    assert measured["captions"] and measured["ticks"], measured
    low = [m for m in measured["captions"] + measured["ticks"] if m["ratio"] < 4.5]
    assert not low, low

    wide.navigate(f"{flows.base}replay?run={quote(flows.failed)}")
    _settle(wide, _main_has("Replay the captured step"), FIRST_LOAD_S)
    assert wide.evaluate("document.title") == f"Replay · {flows.failed} · NaN Forensics"
    colour = _js(wide, """JSON.stringify(getComputedStyle(document.querySelector(
      '[data-testid="stBaseButton-primary"]')).backgroundColor)""")
    r, g, b = (int(v) for v in re.findall(r"\d+", colour)[:3])
    assert not (r > 150 and r > g + 60 and r > b + 60), f"the primary button is red: {colour}"
    _shot(wide, "6_replay_primary_button")
    measured = _js(wide, _CONTRAST_JS)
    low = [m for m in measured["captions"] + measured["ticks"] if m["ratio"] < 4.5]
    assert not low, low
