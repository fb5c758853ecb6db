"""Fleet: the sweep summary of every run below the folder: how many failed, of what, at
which step, and which hyperparameters separate the failed runs from the healthy ones."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analyzer.report.summary import effect
from app import charts, data, fleetviews, tables, ui

CAUSE_KEY = "fleet_cause"
_CLICKED = "_fleet_cause_clicked"

st.title("Fleet")
refs = ui.all_refs()
bar, moved = ui.analysing_bar(len(refs))
data.runs_table(refs, moved)
bar.empty()
with st.spinner("Replaying the runs' captured steps: a replay can settle which cause "
                "comes first", show_time=True):
    fleet = data.fleet(refs)
summary = fleet.summary

failed, finite, unreadable = st.columns(3)
failed.metric("failed", summary.failed)
finite.metric("finite", summary.finite)
unreadable.metric("unreadable", summary.unreadable + len(fleet.unanalysed),
                  help="nothing could be read, or the analysis of the run failed")
if fleet.unanalysed:
    with st.expander(f"{tables.plural(len(fleet.unanalysed), 'run')} could not be "
                     "analysed"):
        tables.show(pd.DataFrame(fleet.unanalysed, columns=["run", "why"]),
                    key="fleet_unanalysed")

st.header("Causes")
causes = fleetviews.cause_rows(summary)
labels = [str(c["cause"]) for c in causes]
if not causes:
    st.caption("No run failed." if not summary.failed else "No cause was named.")
else:
    st.caption("The top finding of each failed run; a run whose top causes tie counts for "
               "each. Click a bar, or choose a cause below, to list its runs.")
    left, right = st.columns([3, 2])
    with left:
        clicked = st.plotly_chart(charts.cause_bars(labels, [int(str(c["runs"]))
                                                             for c in causes]),
                                  on_select="rerun", selection_mode="points",
                                  key="fleet_causes_chart")
    points = clicked.selection.points if clicked is not None else []
    picked = str(points[0]["y"]) if points else None
    if picked != st.session_state.get(_CLICKED):  # a new click, not one already applied
        st.session_state[_CLICKED] = picked
        if picked in labels:
            st.session_state[CAUSE_KEY] = picked
    with right:
        tables.show(pd.DataFrame(causes), key="fleet_causes",
                    column_config={"share of failed": st.column_config.ProgressColumn(
                        "share of failed", format="percent", min_value=0.0, max_value=1.0)})

st.header("First non-finite step")
steps = summary.steps
if not steps.runs:
    st.caption("No failed run names a step.")
else:
    st.caption(f"{steps.runs} failed runs: min {steps.minimum}, median {steps.median:g}, "
               f"max {steps.maximum} (quartiles {steps.q1:g} and {steps.q3:g})"
               + (f"; {steps.without_step} failed before any numbered step"
                  if steps.without_step else "") + ".")
    st.plotly_chart(charts.step_histogram([b.low for b in steps.bins],
                                          [b.high for b in steps.bins],
                                          [b.runs for b in steps.bins]), key="fleet_steps")

st.header("Separating hyperparameters")
keys = fleetviews.separating_keys(summary)
if not summary.separators:
    st.caption("No key could be tested: a key needs runs of both outcomes "
               f"({summary.min_runs} or more of each) that have it.")
else:
    st.caption(f"Each key tested for association with failure (Mann-Whitney U for numbers, "
               f"Fisher's exact test for categories), p adjusted by Holm's method over the "
               f"keys; a key separates below {summary.alpha:g}. An association in these "
               "runs, not proof of cause: a key may stand for another that varied with it.")
    for s in summary.separators:
        if s.significant:
            st.markdown(f"**{s.key}** separates the failed runs from the healthy "
                        f"(p = {fleetviews.p_text(s.p_adjusted)} after Holm, {s.runs} runs): "
                        f"{effect(s)}")
    tables.show(tables.frame(fleetviews.separator_rows(summary)), key="fleet_separators")
    top = fleetviews.top_numeric(summary)
    if top is not None:
        shown = fleetviews.strip(summary, top)
        st.subheader(f"{top.key} by outcome")
        st.plotly_chart(charts.separator_strip(shown.key, shown.values, shown.names,
                                               shown.cut, shown.log), key="fleet_strip")
if summary.skipped:
    st.caption(f"{tables.plural(len(summary.skipped), 'key')} not tested: "
               + ", ".join(f"{k.key} ({k.reason.replace('_', ' ')})"
                           for k in summary.skipped[:12])
               + (", ..." if len(summary.skipped) > 12 else "") + ".")

st.header("Runs")
if st.session_state.get(CAUSE_KEY) not in [fleetviews.EVERY_CAUSE, *labels]:
    st.session_state.pop(CAUSE_KEY, None)  # a cause gone since the files changed
choice = st.selectbox("Cause", [fleetviews.EVERY_CAUSE, *labels], key=CAUSE_KEY)
cause = choice if choice == fleetviews.EVERY_CAUSE else fleetviews.cause_code(summary, choice)
table = fleetviews.fleet_runs(fleet.frames["runs"], summary, keys, cause, fleet.ties)
st.caption(f"{tables.plural(len(table), 'run')}. Pick a row to open the run.")
# the first step as text: a finite run has none, which a number column draws "None"
event = tables.show(table, key="fleet_runs", on_select="rerun", selection_mode="single-row",
                    column_config={
                        "run": st.column_config.TextColumn("run", pinned=True),
                        "first_step": st.column_config.TextColumn("first non-finite step")})
name = ui.picked_row(event, table, "_fleet_picked")
if name is not None:
    pages = [title.lower() for title in ui.RUN_PAGES]
    for col, page in zip(st.columns(len(pages)), pages, strict=True):
        with col:
            ui.link(page, page.capitalize() if page != "run" else f"Run {name}", name)
