"""Timeline: loss, gradient norm, learning rate and loss scale over steps, with the failure,
the growth onset, overflow skips, restarts and checkpoints marked."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analyzer.wording import incident_step
from app import charts, data, ui, views

sel, result = ui.run_page("Timeline")

run = result.run
roles = data.tag_roles(sel.ref.path, sel.ref.digest, tuple(run.tags()))
panels: dict[str, list[views.Curve]] = {
    role.value: views.curves(run, roles.tags(role)) for role in views.TIMELINE_ROLES}
others = [t for t in run.tags() if roles.roles.get(t) not in views.TIMELINE_ROLES]
extra = st.multiselect("More tags", others, key="timeline_more_tags",
                       help="Plot other logged tags in a panel of their own.")
if extra:
    panels["other tags"] = views.curves(run, extra)
own = views.own_panels(result, [t for r in views.TIMELINE_ROLES for t in roles.tags(r)]
                       + extra)
missing = [role.value for role in views.TIMELINE_ROLES if not roles.tags(role)]
if missing:
    st.caption(f"Not logged by this run: {', '.join(missing)}.")

placed = views.placements(run)
if placed:
    with st.expander("How each log's steps were placed on the run's steps"):
        for name, words in placed:
            st.markdown(f"`{name}`: {words}")

growth = data.growth_onset(sel.ref.path, sel.ref.digest, data.siblings_of(sel.ref, sel.refs))
marks = views.markers(result, growth)
focus = ui.int_param("step")
if any(panels.values()):
    st.plotly_chart(charts.timeline(panels, marks, focus), key="timeline_chart")
elif not own:
    st.info("This run logged no scalars to plot.")

for n, panel in enumerate(own):
    st.subheader(f"{panel.name}, by its own {panel.label} numbers")
    first = ("" if panel.first is None else
             f" Its first non-finite value: {incident_step(panel.first, run)} "
             f"(`{panel.first.tag}` = {panel.first.kind}).")
    st.caption(f"Not on the run's steps: {panel.placed}. Drawn apart, over its "
               f"{panel.label}s.{first}")
    st.plotly_chart(charts.own_axis(panel), key=f"timeline_own_{n}")

if marks:
    st.subheader("Marked steps")
    st.dataframe(pd.DataFrame([{"step": m.step, "mark": m.kind, "what": m.text} for m in marks])
                 .sort_values(["step", "mark"], kind="stable"), hide_index=True,
                 key="timeline_marks")

if focus is not None:
    st.subheader(f"Step {focus} in every source")
    ui.step_views(run, focus, key="timeline_focus")
