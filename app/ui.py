"""Pieces of UI every page shares: the run picker, the run's headline, links between pages.

The chosen run lives in the session (the sidebar picker's key) and in the URL's ``run``
query parameter, so that a link such as ``/timeline?run=NAME&step=24`` opens that run at
that step, and the address bar can be shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from analyzer.model import Run, RunResult
from analyzer.wording import (
    cause_words,
    failing_place,
    incident_step,
    incident_unit,
    place_words,
    step_words,
)
from app import data, health, runinfo, tables, views

PAGES: list[tuple[str, str, str]] = [
    ("app_pages/runs.py", "Runs", ":material/table_rows:"),
    ("app_pages/fleet.py", "Fleet", ":material/query_stats:"),
    ("app_pages/run.py", "Run", ":material/folder_open:"),
    ("app_pages/timeline.py", "Timeline", ":material/timeline:"),
    ("app_pages/compare.py", "Compare", ":material/compare_arrows:"),
    ("app_pages/layers.py", "Layers", ":material/stacks:"),
    ("app_pages/findings.py", "Findings", ":material/fact_check:"),
    ("app_pages/replay.py", "Replay", ":material/replay:"),
    ("app_pages/logs.py", "Logs", ":material/article:"),
]
PAGE = {title.lower(): path for path, title, _ in PAGES}
RUN_PAGES = [title for _, title, _ in PAGES[2:]]
"""The pages about one run (the first two are about every run below the root)."""
RUN_KEY = "run"
"""The URL's query parameter that names the chosen run."""
CHOSEN = "chosen_run"
"""The session's chosen run: the one place every page and the sidebar read it from."""
_PICKER = "run_picker"
"""The sidebar selectbox's own key, set from :data:`CHOSEN` before it is drawn."""


@dataclass(frozen=True)
class Selected:
    ref: data.RunRef
    refs: list[data.RunRef]


def _refs() -> list[data.RunRef] | str:
    return data.list_runs(data.root())


def open_run(name: str) -> None:
    """Make ``name`` the chosen run for every page, the sidebar and the address bar.

    A page that picks a run (a row of the Runs table, a point of the Fleet page) calls this
    and then ``st.rerun()``, so that the sidebar, drawn before the page, shows it too."""
    st.session_state[CHOSEN] = name
    st.query_params[RUN_KEY] = name


def picked_row(event: Any, table: pd.DataFrame, key: str) -> str | None:
    """The run of the row picked in ``table`` (a single-row ``st.dataframe`` selection
    ``event``), which a newly picked row makes the chosen run of every page and of the
    sidebar (the page reruns). Only a change of the table's selection counts, remembered
    under ``key``: a run picked later in the sidebar is not taken back by a row still
    selected here."""
    rows = list(event.selection.rows) if event is not None else []
    picked = [str(table.iloc[r]["run"]) for r in rows if r < len(table)]
    if picked != st.session_state.get(key):
        st.session_state[key] = picked
        if picked and picked[0] != st.session_state.get(CHOSEN):
            open_run(picked[0])
            st.rerun()
    return picked[0] if picked else None


def _picked() -> None:
    open_run(st.session_state[_PICKER])


def chosen(names: list[str]) -> str:
    """The chosen run among ``names``: a run named in the URL wins when it differs from the
    session's (a shared link, a page link), else the session's, else the first."""
    wanted = st.query_params.get(RUN_KEY)
    if wanted in names and wanted != st.session_state.get(CHOSEN):
        st.session_state[CHOSEN] = wanted
    if st.session_state.get(CHOSEN) not in names:
        st.session_state[CHOSEN] = names[0]
    return str(st.session_state[CHOSEN])


def sidebar() -> str | None:
    """The folder being browsed and the run picker, on every page; the chosen run's name
    (None when the folder holds no run)."""
    root = data.runs_root()
    refs = _refs()
    if isinstance(refs, str):
        st.sidebar.caption(f"Runs below `{root}`")
        st.sidebar.warning(refs)
        return None
    names = [r.name for r in refs]
    st.sidebar.caption(f"{tables.plural(len(names), 'run')} below `{root}`")
    name = chosen(names)
    st.session_state[_PICKER] = name  # before the widget is drawn: it shows the chosen run
    st.sidebar.selectbox("Run", names, key=_PICKER, on_change=_picked)
    st.query_params[RUN_KEY] = name
    return name


APP_NAME = "NaN Forensics"


def tab_title(page: str, run: str | None) -> str:
    """The browser tab's title: ``Timeline · nan_in_batch · NaN Forensics`` on a run's page,
    ``Runs · NaN Forensics`` on the pages about every run."""
    about_one = page in RUN_PAGES and run is not None
    return " · ".join([page, *([run] if about_one else []), APP_NAME])


def analysing_bar(count: int) -> tuple[Any, Callable[[int, int], None]]:
    """A progress bar over ``count`` runs and the callback that moves it (runs done of
    all), for the pages that analyse every run; ``.empty()`` the bar when done."""
    bar = st.progress(0.0, text=f"Analysing {tables.plural(count, 'run')}")

    def moved(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Analysed {done} of {tables.plural(total, 'run')}")

    return bar, moved


def all_refs() -> list[data.RunRef]:
    refs = _refs()
    if isinstance(refs, str):
        st.info(refs)
        st.stop()
    return refs


def selected() -> Selected:
    refs = all_refs()
    name = chosen([r.name for r in refs])
    ref = next((r for r in refs if r.name == name), refs[0])
    return Selected(ref, refs)


def load_selected(replay: bool = False) -> tuple[Selected, RunResult]:
    """The chosen run, analysed: with its replay when ``replay`` (the Replay page waits for
    it), else as far as it goes without waiting (the replay is queued and the page reruns
    when it is done); the page stops with the reason when it cannot be analysed."""
    sel = selected()
    what = "replaying its capture, " if replay else ""
    with st.spinner(f"Analysing {sel.ref.name}: reading its files, {what}running the rules",
                    show_time=True):
        loaded = (data.load if replay else data.load_fast)(sel.ref, sel.refs)
    if loaded.result is None:
        st.error(f"{sel.ref.name}: {loaded.error}")
        st.stop()
    if loaded.error:
        st.warning(loaded.error)
    return sel, loaded.result


def replay_pending(sel: Selected) -> None:
    """Queue the chosen run's replay; until it is done, say so and look again every 2 s,
    then rerun the page, which then shows the replayed analysis."""
    if data.start_replay(sel.ref) != "pending":
        return

    @st.fragment(run_every=2)
    def poll() -> None:
        if data.replay_state(sel.ref) == "done":
            st.rerun()
        st.caption("Replaying the captured step in the background; the page shows what it "
                   "found when it is done.")

    poll()


def int_param(name: str) -> int | None:
    raw = st.query_params.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def link(page: str, label: str, run: str, **params: object) -> None:
    query = {RUN_KEY: run} | {k: str(v) for k, v in params.items() if v is not None}
    st.page_link(PAGE[page], label=label, query_params=query)


def headline_text(name: str, result: RunResult, h: health.Health) -> str:
    """The run's verdict in one line: step, tag, layer, cause, and whether its record is
    whole; the same on every page. A run whose only non-finite values were the loss
    scaler's overflow skips says so (the charts mark them), a damaged run says where its
    record ends, an unreadable one that nothing was read."""
    inc = result.incident
    parts = [f"**{name}**"]
    if h.status == "unreadable":
        n = tables.plural(len(h.issues), "read issue")
        parts.append(f"**unreadable**: nothing could be read from its files ({n}, below)"
                     if h.issues else f"**unreadable**: {h.ends_early}")
    elif inc is None:
        skips = health.skip_words(result)
        if h.status == "damaged":
            parts.append("**damaged**: the values read are finite, but "
                         + (f"the record ends early: {h.ends_early}" if h.ends_early else
                            f"{tables.plural(len(h.costly), 'read issue')} cost data"))
        if skips is not None:
            parts.append(skips)
        elif h.status == "finite":
            parts.append("every logged value is finite")
    else:
        unit = incident_unit(inc, result.run)
        last = ("none" if inc.last_finite_step is None
                else step_words(inc.last_finite_step, unit=unit))
        where = incident_step(inc, result.run, "at", mark="**")
        parts.append(f"first non-finite {where} (`{inc.tag}` = {inc.kind}, "
                     f"last finite {last})")
    place = failing_place(result)
    if place is not None:
        parts.append(place_words(place, mark="**"))
    if result.findings:
        top = result.findings[0]
        what = "cause" if top.is_failure else "warning"
        name_ = cause_words(result.findings) if top.is_failure else top.name
        parts.append(f"{what} **{name_}** ({top.confidence} confidence)")
    elif inc is not None:
        parts.append("no ranked cause")
    if inc is not None:
        if (skips := health.skip_words(result)) is not None:
            parts.append(skips)
        if h.ends_early:
            parts.append(f"the record ends early: {h.ends_early}")
    if h.issues and h.status != "unreadable":
        parts.append(tables.plural(len(h.issues), "read issue"))
    return " · ".join(p for p in parts if p)


def issue_lines(h: health.Health, run_path: str) -> list[str]:
    """One line per read issue: the file, where in it, the kind and the message."""
    return [f"`{runinfo.rel(i.location.file, run_path)}` at {health.where_words(i)}: "
            f"{i.kind}: {i.message}" for i in h.issues]


def issue_box(h: health.Health, run_path: str) -> None:
    """The run's read issues under the headline: a warning when they cost data (the run
    is damaged or unreadable, or failed with a damaged file), else a closed expander."""
    if not h.issues:
        return
    lines = "\n".join(f"- {line}" for line in issue_lines(h, run_path))
    n = tables.plural(len(h.issues), "read issue")
    if h.costly:
        head = {"unreadable": "Nothing of this run could be read",
                "damaged": "This run's record is damaged: what follows could not be read"}
        st.warning(f"**{head.get(h.status, 'Some of this run could not be read')}** "
                   f"({n}):\n{lines}", icon=":material/report:")
    else:
        with st.expander(f"{n}, none of which lost data"):
            st.markdown(lines)


def headline(sel: Selected, result: RunResult) -> None:
    h = health.health(result)
    st.markdown(headline_text(sel.ref.name, result, h))
    issue_box(h, result.run.path)


def run_page(title: str, replay: bool = False) -> tuple[Selected, RunResult]:
    """The head of every run page: its title, the chosen run analysed (without waiting for
    its replay unless ``replay``), the run's verdict in one line with its read issues, and
    links to the other pages."""
    st.title(title)
    sel, result = load_selected(replay)
    headline(sel, result)
    if not replay:
        replay_pending(sel)
    page_links(sel.ref.name, title.lower())
    return sel, result


def stop_if_unreadable(result: RunResult) -> None:
    """End a page that draws what a run logged when nothing of it could be read: 'not
    logged by this run: loss, ...' and 'no per-layer norms' would say what is unknown."""
    if result.status == "unreadable":
        st.info("Nothing of this run could be read (see the read issues above), so there "
                "is nothing to draw here.")
        st.stop()


def page_links(run: str, here: str) -> None:
    # the other pages side by side, without a blank slot where this page's link would be
    others = [title for title in RUN_PAGES if title.lower() != here]
    for col, title in zip(st.columns(len(others)), others, strict=True):
        with col:
            link(title.lower(), title, run)


def step_views(run: Run, step: int, key: str) -> None:
    """A table of every source's value at ``step``, or a line saying there is none."""
    seen = views.views_at(run, step)
    if seen:
        tables.show(tables.frame(views.view_rows(seen, run.path, step)), key=key)
    else:
        st.caption(f"No source logged a value at step {step}.")
