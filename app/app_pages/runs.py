"""Runs: every run below the folder, its status, first non-finite step and top cause."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analyzer.wording import step_words
from app import data, tables, ui

# Widths in pixels: the table's first columns fit the page at 1440 px beside the sidebar
# (about 980 px, the row picker's column too); the others come with "Every column".
COLUMNS = {
    "run": st.column_config.TextColumn("run", pinned=True, width=140),
    "status": st.column_config.TextColumn("status", width=80),
    "first_step": None,
    "first_when": st.column_config.TextColumn(
        "first non-finite", width=90,
        help="The first non-finite step. '>N': after step N (a log line that names no "
             "step); '#N': a log's own record or iteration N, for a log not placed on the "
             "run's steps"),
    "tag": st.column_config.TextColumn("tag", width=140),
    "kind": st.column_config.TextColumn("value", width=55),
    "last_finite": None,
    "last_when": st.column_config.TextColumn("last finite", width=80),
    "layer": st.column_config.TextColumn("layer", width=120),
    "cause": st.column_config.TextColumn("top cause", width=150),
    "confidence": st.column_config.TextColumn("confidence"),
    "replay": st.column_config.TextColumn("replay"),
    "sources": st.column_config.TextColumn("sources found"),
    "issues": st.column_config.NumberColumn("read issues", format="%d", width=70),
    "first_issue": st.column_config.TextColumn("first read issue"),
    "first_after": None,
    "first_unit": None,
    "placement": st.column_config.TextColumn(
        "steps placed", help="how each log's steps were placed on the run's global step"),
    "grouping": st.column_config.TextColumn(
        "layout", help="the framework layout that made these folders one training, and its "
                       "segments (one per restart)"),
}
ORDER = ["run", "status", "first_when", "tag", "kind", "last_when", "layer", "cause",
         "confidence", "replay", "sources", "grouping", "placement", "issues", "first_issue"]
# The columns shown by default: what fits the page (a bare string here would be shown).
SHORT = ["run", "status", "first_when", "tag", "kind", "last_when", "layer", "cause", "issues"]

# Each status a run can have, in the filter's order (rows.run_row sets them). A bare
# string here would be shown: Streamlit's magic writes a page's top-level expressions.
STATUSES = ["failed", "damaged", "finite", "unreadable"]

st.title("Runs")
refs = ui.all_refs()
bar, moved = ui.analysing_bar(len(refs))
filling = st.empty()


def _partial(rows: pd.DataFrame, done: int) -> None:
    # The table being filled: filters and row picks come once it is complete.
    with filling.container():
        st.caption(f"Reading the runs: {done} of {len(refs)} read; a top cause may change "
                   "once the runs beside it are read too.")
        tables.show(rows, key="runs_partial", column_config=COLUMNS, column_order=SHORT)


table = data.runs_table(refs, moved, _partial)
bar.empty()
filling.empty()

counts = {s: int((table["status"] == s).sum()) for s in STATUSES}
st.caption(f"{tables.plural(len(table), 'run')}: {counts['failed']} failed, "
           f"{counts['finite']} finite, {counts['damaged']} damaged, "
           f"{counts['unreadable']} unreadable; "
           f"{tables.plural(int(table['issues'].sum()), 'read issue')}. Pick a row to open "
           "the run.")

skipped = data.passed_over(data.root())
if skipped:
    with st.expander(f"{tables.plural(len(skipped), 'folder')} passed over while looking "
                     "for runs"):
        st.code("\n".join(skipped), language=None)

left, mid, right, far, wide = st.columns([3, 5, 3, 3, 3])  # room for four status chips
needle = left.text_input("Run name contains", key="runs_filter_name")
known = [s for s in STATUSES if s in set(table["status"])] or STATUSES[:2]
statuses = mid.multiselect("Status", known, default=known, key="runs_filter_status")
causes = sorted(c for c in table["cause"].dropna().unique())
picked_causes = right.multiselect("Top cause", causes, key="runs_filter_cause")
only_issues = far.toggle("With read issues", key="runs_filter_issues")
every = wide.toggle("All columns", key="runs_every_column",
                    help="Confidence, replay, sources, layout, how steps were placed and the "
                         "first read issue too (scroll the table sideways).")

shown = table[table["status"].isin(statuses)]
if needle:
    shown = shown[shown["run"].str.contains(needle, case=False, regex=False)]
if picked_causes:
    shown = shown[shown["cause"].isin(picked_causes)]
if only_issues:
    shown = shown[shown["issues"] > 0]

event = tables.show(shown, key="runs_table", column_config=COLUMNS,
                    column_order=ORDER if every else SHORT, on_select="rerun",
                    selection_mode="single-row")
name = ui.picked_row(event, shown, "_runs_picked")
if name is not None:
    st.subheader(name)
    row = shown[shown["run"] == name].iloc[0]
    if row["status"] == "failed":
        step = None if pd.isna(row["first_step"]) else int(row["first_step"])
        where = step_words(step, bool(row["first_after"]), "at", mark="**",
                           unit=str(row["first_unit"]))
        cause = "none ranked" if pd.isna(row["cause"]) else row["cause"]
        st.markdown(f"First non-finite {where} in `{row['tag']}`; top cause **{cause}**.")
    if row["grouping"]:
        st.caption(f"Layout: {row['grouping']}.")
    if row["placement"]:
        st.caption(f"Steps placed: {row['placement']}.")
    pages = ["run", "timeline", "compare", "layers", "findings", "replay", "logs"]
    cols = st.columns(len(pages))
    for col, page in zip(cols, pages, strict=True):
        with col:
            ui.link(page, page.capitalize(), name)
