"""Timeline: loss, gradient norm, learning rate and loss scale over steps, with the failure,
the growth onset, overflow skips, restarts, checkpoints and damaged files' ends marked.

Controls: the steps shown (the y axes fit the points in them), smoothing, a log or linear
y axis per panel; a click on a point selects its step (``?step=``) for the table below."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analyzer.wording import incident_step
from app import charts, data, tables, ui, views

CHART = "timeline_chart"
# The step of the last click applied: a selection the chart keeps is applied once, so a
# later ``?step=`` link is not taken back by it.
CLICKED = "timeline_clicked"

clicked = views.step_of_click(st.session_state.get(CHART))
if clicked is not None and clicked != st.session_state.get(CLICKED):
    st.session_state[CLICKED] = clicked
    st.query_params["step"] = str(clicked)

sel, result = ui.run_page("Timeline")
ui.stop_if_unreadable(result)

run = result.run
roles = data.tag_roles(sel.ref.path, sel.ref.digest, tuple(run.tags()))
panels = views.timeline_panels(result, roles)
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
panels, flat = views.collapse_constant(panels)
if flat:
    st.caption(f"Constant, not drawn: {'; '.join(flat)}.")

placed = views.placements(run)
if placed:
    with st.expander("How each log's steps were placed on the run's steps"):
        for name, words in placed:
            st.markdown(f"`{name}`: {words}")

growth = data.growth_onset(sel.ref.path, sel.ref.digest, data.siblings_of(sel.ref, sel.refs))
marks = views.markers(result, growth)
marks += views.issue_marks(run)[0]  # every issue is listed under the headline already
focus = ui.int_param("step")
span = views.step_span(panels, marks)
inc = result.incident
failed_at = inc.step if inc is not None and inc.aligned else None

drawn = {n: cs for n, cs in panels.items() if cs}
if drawn and span is not None:
    steps_key = f"timeline_steps_{run.name}"

    def _show(window: tuple[int, int]) -> None:
        st.session_state[steps_key] = window

    held = st.session_state.get(steps_key)
    if not (isinstance(held, tuple | list) and len(held) == 2
            and span[0] <= held[0] <= held[1] <= span[1]):
        st.session_state[steps_key] = span  # first visit, or the run's steps changed
    left, mid, right = st.columns([3, 2, 2])
    with left:
        window = (st.slider("Steps shown", span[0], span[1], key=steps_key,
                            help="The y axes fit the points in these steps.")
                  if span[1] > span[0] else span)
    with mid:
        st.button("All steps", key="timeline_all", on_click=_show, args=(span,),
                  disabled=span[1] <= span[0])
        st.button("Around the failure", key="timeline_around", on_click=_show,
                  args=(views.around(span, failed_at if failed_at is not None else span[1]),),
                  disabled=failed_at is None or span[1] <= span[0])
    with right:
        smooth = st.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key="timeline_smooth",
                           help="TensorBoard's exponential moving average; 0 draws the raw "
                           "values. The raw line stays faint beneath the smoothed one.")
    toggles = st.columns(len(drawn))
    log: dict[str, bool] = {}
    for col, (name, cs) in zip(toggles, drawn.items(), strict=True):
        with col:
            log[name] = st.toggle(f"log y: {name}", value=views.log_scale(cs),
                                  key=f"timeline_log_{run.name}_{name}",
                                  help="Zeros and negative values cannot sit on a log axis: "
                                  "they are marked at the panel's bottom edge.")
    st.plotly_chart(charts.timeline(drawn, marks, focus, log=log, smooth=smooth,
                                    window=(int(window[0]), int(window[1])),
                                    skipped=result.overflow_skips),
                    key=CHART, on_select="rerun", selection_mode="points")
    st.caption("Click a point to see that step in every source below. Non-finite values "
               "are pinned at the top edge of their panel: they have no height to read.")
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
    tables.show(pd.DataFrame([{"step": m.step, "mark": m.kind, "what": m.text} for m in marks])
                .sort_values(["step", "mark"], kind="stable"), key="timeline_marks")

if focus is not None:
    st.subheader(f"Step {focus} in every source")
    ui.step_views(run, focus, key="timeline_focus")
