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
    replay_place,
    step_words,
)
from app import charts, data, runinfo, tables, ui, views

sel, result = ui.run_page("Layers")
ui.stop_if_unreadable(result)

run = result.run
roles = data.tag_roles(sel.ref.path, sel.ref.digest, tuple(run.tags()))
lay = result.layer_incident
place = failing_place(result)
made = replay_place(result.replay) if result.replay is not None else None
for line in views.layer_lines(result, place, made is not None and made.named):
    st.markdown(line)
if result.place is not None and not (made is not None and made.named):
    st.caption(result.place.decided_by)
if lay is not None and lay.decided_by and lay.decided_by != "earliest step":
    st.caption(lay.decided_by)
highlight = st.query_params.get("layer") or (place.layer if place is not None else None)
first_step = result.incident.step if result.incident and result.incident.aligned else None

families = [(TagRole.LAYER_GRAD, "Gradient norm per parameter"),
            (TagRole.LAYER_WEIGHT, "Weight norm per parameter")]
grids = [(role, title, views.layer_grid(run, roles.tags(role), roles.layers))
         for role, title in families]
grids = [(role, title, grid) for role, title, grid in grids if not grid.empty]
if grids:
    shared = st.toggle("One colour scale for every row", value=False, key="layers_shared",
                       help="Off: each row spans its own range of log10 values, so a layer "
                       "at 1e20 does not flatten the others. On: one log10 scale for all.")
    st.caption("Grey cells: logged as exactly 0. Blank cells: not logged at that step. "
               "Red ✕: non-finite; purple ✕: non-finite at a step the loss scaler skipped "
               "(its overflow, benign). Hover a cell for its value.")
for role, title, grid in grids:
    scale = "log10" if shared else "log10, each row its own range"
    st.plotly_chart(charts.layer_heatmap(grid, f"{title} ({scale})", highlight, first_step,
                                         shared=shared, skipped=result.overflow_skips),
                    key=f"heatmap_{role}")
if not grids:
    st.info("This run logged no per-layer norms (tags such as grad_norm/<param> or "
            "weight_norm/<param>).")

firsts = [i for i in result.tag_incidents if i.layer is not None]
if firsts:
    st.subheader("First non-finite step of each per-layer tag")
    tables.show(pd.DataFrame([{"layer": i.layer, "tag": i.tag,
                               "step": incident_step(i, run, "cell"), "value": i.kind,
                               "last finite": step_words(i.last_finite_step, form="cell",
                                                         unit=incident_unit(i, run)),
                               "where": views.where(i.location, run.path)} for i in firsts]),
                key="layers_firsts")

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
        # a save that holds no layer's tensors (an optimizer.pt beside model.safetensors)
        # has no column here: a column of blanks, or of NaN read as values, says nothing
        held = [label for label in labels if any(label in c for c in counts.values())]
        tables.show(tables.frame([{"layer": layer, **{label: by.get(label) for label in held}}
                                  for layer, by in counts.items()]), key="ckpt_counts")
    if history.layers:
        st.subheader("Weight-norm growth per layer")
        st.plotly_chart(charts.checkpoint_norms(steps, {g.layer: list(g.norms)
                                                        for g in history.layers}, bad),
                        key="ckpt_norms")
        if any(g.growth is not None or g.last_growth is not None for g in history.layers):
            tables.show(tables.frame([{"layer": g.layer, "growth over finite saves": g.growth,
                                       "growth over the last interval": g.last_growth}
                                      for g in history.layers]), key="ckpt_growth")
        else:
            st.caption("No growth to show: it needs two saves whose weights are finite.")
    st.subheader("Saves")
    # what no save says (no loss scale, no epoch) is left out: the table then fits the page
    tables.show(tables.without_blank(tables.frame(runinfo.save_rows(history, labels, run)),
                                     runinfo.SAVE_OPTIONAL), key="ckpt_saves")
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
        tables.show(tables.frame(states), key="ckpt_bookkeeping")
    elif not odd:
        st.caption("The saves hold no callback state.")
