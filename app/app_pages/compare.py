"""Compare: the chosen run beside other runs, its siblings by default, on the global step."""

from __future__ import annotations

import streamlit as st

from analyzer.pipeline import same_folder
from analyzer.tags import TagRole
from app import charts, data, ui, views

sel, result = ui.run_page("Compare")
others = [r.name for r in sel.refs if r.name != sel.ref.name]
siblings = [r.name for r in sel.refs
            if r.name != sel.ref.name and same_folder(r.path) == same_folder(sel.ref.path)]
picked = st.multiselect("Compare with", others, default=siblings[:3], key="compare_with")
panels: dict[str, list[views.Curve]] = {}
for name in [sel.ref.name, *picked]:
    ref = next(r for r in sel.refs if r.name == name)
    loaded = data.load(ref, sel.refs)
    if loaded.result is None:
        st.warning(f"{name}: {loaded.error}")
        continue
    run = loaded.result.run
    roles = data.tag_roles(ref.path, ref.digest, tuple(run.tags()))
    for curve in views.curves(run, roles.tags(TagRole.LOSS)):
        panels.setdefault("loss", []).append(
            views.Curve(f"{name}: {curve.label}", curve.tag, curve.source, curve.steps,
                        curve.values))
if panels:
    st.plotly_chart(charts.timeline(panels, views.markers(result, None)), key="compare_chart")
else:
    st.info("None of these runs logged a loss.")
