"""Compare: the chosen run beside other runs (its siblings by default, healthy ones first):
their curves overlaid on one step axis, the keys whose values differ, and the findings one
side has that the other has not."""

from __future__ import annotations

import streamlit as st

from analyzer.model import RunResult
from analyzer.wording import incident_step
from app import compare, data, tables, ui
from app.health import health

sel, result = ui.run_page("Compare")
here = sel.ref.name
by_name = {r.name: r for r in sel.refs}


def _loaded(name: str) -> data.Loaded:
    """Another run as far as it is analysed without waiting for its replay: what is
    compared here (curves, keys, findings) is there before it."""
    return data.load_fast(by_name[name], sel.refs)


def _healthy(candidate: compare.Candidate) -> bool:
    # the run's health as its read gives it: no copy of its analysis, no ranking
    return data.status_of(by_name[candidate.name], sel.refs) == "finite"


# A damaged run (a file cut short) is no healthy baseline. The health of a few siblings is
# looked at, not of every run of a folder of hundreds.
chosen = compare.Candidate(here, sel.ref.path, compare.healthy(result))
candidates = compare.with_health(
    chosen, [compare.Candidate(r.name, r.path) for r in sel.refs if r.name != here], _healthy)
options = [c.name for c in compare.ordered(chosen, candidates)]
if not options:
    st.info("There is no other run below this folder to compare with.")
    st.stop()
# Streamlit forgets a widget's state once it is not drawn: the picks made for each run are
# kept apart, so that coming back to a run finds them.
kept: dict[str, list[str]] = st.session_state.setdefault(compare.PICKS, {})
picker = compare.picker_key(here)


def _keep() -> None:
    kept[here] = list(st.session_state[picker])


default = [n for n in kept.get(here, compare.default_picks(chosen, candidates)) if n in options]
picked = st.multiselect(
    "Compare with", options, default=default, key=picker, on_change=_keep,
    help="The runs in the same folder come first, the healthy ones found among them first; "
         "runs elsewhere below the root are listed after them.")
others: dict[str, RunResult] = {}
for name in picked:
    loaded = _loaded(name)
    if loaded.result is None:
        st.warning(f"{name} cannot be compared: {loaded.error}")
    else:
        others[name] = loaded.result
if not others:
    st.info("Pick one or more runs to set beside this one.")
    st.stop()

runs = {here: result, **others}
names = list(runs)
failures = {name: compare.failure_step(r) for name, r in runs.items()}
st.caption(" · ".join(
    f"**{name}**: " + (f"first non-finite {incident_step(r.incident, r.run, 'at')}"
                       if r.incident is not None else health(r).status)
    for name, r in runs.items()))

st.subheader("Curves")
modes = [compare.ALIGN_START, compare.ALIGN_FAILURE]
reference = compare.reference_step(runs)
mode = st.radio("Steps", modes, horizontal=True, key="compare_align",
                disabled=reference is None,
                help="Step 0 keeps every run on its own global step.")
if reference is None:
    mode = compare.ALIGN_START
roles = {name: data.tag_roles(by_name[name].path, by_name[name].digest, tuple(r.run.tags()))
         for name, r in runs.items()}
drawn = compare.panels(runs, roles, mode)
if drawn:
    log: dict[str, bool] = {}
    for col, title in zip(st.columns(len(drawn)), drawn, strict=True):
        log[title] = col.toggle(f"log y: {title}", value=compare.log_default(drawn[title]),
                                key=f"compare_log_{here}_{title}",
                                help="Zeros and negative values are not drawn on a log axis.")
    st.plotly_chart(compare.figure(drawn, names, mode, failures, log), key="compare_chart")
    if mode == compare.ALIGN_FAILURE:
        st.caption(
            "x is the step minus the run's own first non-finite step for a failed run, so "
            "that the failures of every failed run lie at 0 and their run-ups over each "
            "other; a healthy run has no failure and is counted from "
            + (f"the chosen run's (step {reference}), so it stays beside it as on the global "
               "step" if failures[here] is not None else
               f"the earliest failure compared (step {reference})") + ".")
    else:
        st.caption("x is each run's global step.")
    bold = (f"The bold line is {here}." if compare.has_curves(drawn, here) else
            f"{here} has no curve here: it logged none of these on its global step.")
    st.caption(f"{bold} A red cross at a panel's top edge is a non-finite value at that "
               "step (a dashed line, another failed run's first); a purple cross below it, a "
               "loss scaler's overflow skip, which is benign.")
else:
    st.info("None of these runs logged a loss, gradient norm, learning rate or loss scale "
            "on its global step.")

st.subheader("Settings, environment and checkpoints")
show_all = st.toggle("Show every key, the equal ones too", key="compare_all_keys")
diff = compare.key_diff(runs, show_all)
st.caption(f"{tables.plural(diff.same, 'key')} the same in all "
           f"{tables.plural(len(runs), 'run')}" + ("" if show_all else " (hidden)")
           + "; a blank cell: the run does not have the key.")
if diff.rows:
    # the runs share what the key columns leave of a page about 1000 px wide (1440 px
    # with the sidebar open): a long value (a platform string) is cut in its cell, not the
    # runs after it off the page
    tables.show(tables.frame(diff.rows), key="compare_keys", column_order=diff.columns,
                widths={"group": 120, "key": 220}
                | dict.fromkeys(names, max(120, 620 // len(names))))
else:
    st.caption("No key differs between these runs.")

st.subheader("Findings")
only_mine, only_theirs, shared = compare.finding_diff(result, others)
st.caption(f"{tables.plural(shared, 'rule')} fired both on {here} and on a run beside it.")
st.markdown(f"**On {here} and on none of the others**")
if only_mine:
    tables.show(tables.frame(only_mine), key="compare_only_mine")
else:
    st.caption("None.")
st.markdown(f"**On another run and not on {here}**")
if only_theirs:
    tables.show(tables.frame(only_theirs), key="compare_only_theirs")
else:
    st.caption("None.")
