"""Layers: per-layer gradient and weight norms over steps, and the checkpoints' view."""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from analyzer.tags import TagRole
from analyzer.wording import (
    failing_place,
    incident_step,
    incident_unit,
    place_words,
    reading_place,
    replay_place,
    step_words,
)
from app import charts, data, runinfo, ui, views

sel, result = ui.run_page("Layers")

run = result.run
roles = data.tag_roles(sel.ref.path, sel.ref.digest, tuple(run.tags()))
lay = result.layer_incident
made = replay_place(result.replay) if result.replay is not None else None
if lay is not None:
    st.markdown(f"First layer whose logged values went non-finite: **{lay.layer}** "
                f"(`{lay.tag}` = {lay.kind} {incident_step(lay, run, 'at')}).")
    if lay.decided_by and lay.decided_by != "earliest step":
        st.caption(lay.decided_by)
if made is not None and made.named:
    st.markdown(f"Where the replay saw the first non-finite value made: "
                f"{place_words(made, mark='**')}.")
elif result.place is not None:
    st.markdown(f"Where the logged values place the first non-finite value: "
                f"{place_words(reading_place(result.place), mark='**')}.")
    st.caption(result.place.decided_by)
place = failing_place(result)
highlight = st.query_params.get("layer") or (place.layer if place is not None else None)
first_step = result.incident.step if result.incident and result.incident.aligned else None

families = [(TagRole.LAYER_GRAD, "Gradient norm per parameter"),
            (TagRole.LAYER_WEIGHT, "Weight norm per parameter")]
drawn = False
for role, title in families:
    grid = views.layer_grid(run, roles.tags(role), roles.layers)
    if grid.empty:
        continue
    drawn = True
    st.plotly_chart(charts.layer_heatmap(grid, f"{title} (log10)", highlight, first_step),
                    key=f"heatmap_{role}")
if not drawn:
    st.info("This run logged no per-layer norms (tags such as grad_norm/<param> or "
            "weight_norm/<param>).")

firsts = [i for i in result.tag_incidents if i.layer is not None]
if firsts:
    st.subheader("First non-finite step of each per-layer tag")
    st.dataframe(pd.DataFrame([{"layer": i.layer, "tag": i.tag,
                                "step": incident_step(i, run, "cell"), "value": i.kind,
                                "last finite": step_words(i.last_finite_step, form="cell",
                                                          unit=incident_unit(i, run)),
                                "where": views.where(i.location, run.path)} for i in firsts]),
                 hide_index=True, key="layers_firsts")

st.header("Checkpoints")
history = run.checkpoints
if history is None or not history.saves:
    st.info("This run has no checkpoints.")
else:
    bad = history.first_nonfinite
    if bad is None:
        st.markdown(f"{len(history.saves)} saves; every tensor of evidence (weights, "
                    "optimizer, loss scaler) is finite.")
    else:
        save = history.saves[bad]
        st.markdown(f"First non-finite save: **{step_words(save.step)}** "
                    f"(`{os.path.basename(save.path)}`, {save.nonfinite_tensors} non-finite "
                    f"tensors); layers: {', '.join(history.nonfinite_layers) or '-'}.")
    steps = [s.step for s in history.saves]
    labels = views.save_labels(history.saves)
    counts: dict[str, dict[str, int]] = {}
    for label, scan in zip(labels, history.scans, strict=False):
        for layer_stats in scan.layers:
            counts.setdefault(layer_stats.layer, {})[label] = layer_stats.stats.nonfinite
    if counts:
        st.subheader("Non-finite values per layer and save")
        st.dataframe(pd.DataFrame.from_dict(counts, orient="index", columns=labels)
                     .rename_axis("layer"), key="ckpt_counts")
    if history.layers:
        st.subheader("Weight-norm growth per layer")
        st.plotly_chart(charts.checkpoint_norms(steps, {g.layer: list(g.norms)
                                                        for g in history.layers}, bad),
                        key="ckpt_norms")
        st.dataframe(pd.DataFrame([{"layer": g.layer, "growth over finite saves": g.growth,
                                    "growth over the last interval": g.last_growth}
                                   for g in history.layers]), hide_index=True,
                     key="ckpt_growth")
    st.subheader("Saves")
    st.dataframe(pd.DataFrame(runinfo.save_rows(history, labels, run)), hide_index=True,
                 key="ckpt_saves")
    st.subheader("Bookkeeping (not evidence)")
    odd = runinfo.nonfinite_bookkeeping(history)
    if odd:
        names = "; ".join(f"`{name}`" for name in odd[:6]) + ("; ..." if len(odd) > 6 else "")
        holds = "entry holds" if len(odd) == 1 else "entries hold"
        st.info(f"{len(odd)} bookkeeping {holds} Inf or NaN: the trainer's own state, as it "
                "starts (ModelCheckpoint keeps kth_value = inf until its top k fill; "
                "EarlyStopping's best_score starts at inf). Not a failure, and not counted "
                f"above: {names}")
    states = runinfo.bookkeeping_rows(history, labels)
    if states:
        st.dataframe(pd.DataFrame(states), hide_index=True, key="ckpt_bookkeeping")
    elif not odd:
        st.caption("The saves hold no callback state.")
