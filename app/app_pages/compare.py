"""Compare: the chosen run beside other runs (its siblings by default, healthy ones first):
their curves overlaid on one step axis, the keys whose values differ, and the findings one
side has that the other has not."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analyzer.model import RunResult
from analyzer.pipeline import same_folder
from app import compare, data, ui

sel, result = ui.run_page("Compare")
here = sel.ref.name
by_name = {r.name: r for r in sel.refs}
chosen = compare.Candidate(here, sel.ref.path, result.status == "finite")
home = same_folder(sel.ref.path)


def _loaded(name: str) -> data.Loaded:
    return data.load(by_name[name], sel.refs)


# The siblings were read to rank the chosen run: their health costs their rules only.
candidates = [compare.Candidate(r.name, r.path,
                                (loaded := _loaded(r.name)).result is not None
                                and loaded.result.status == "finite")
              if same_folder(r.path) == home else compare.Candidate(r.name, r.path)
              for r in sel.refs if r.name != here]
options = [c.name for c in compare.ordered(chosen, candidates)]
if not options:
    st.info("There is no other run below this folder to compare with.")
    st.stop()
picked = st.multiselect(
    "Compare with", options, default=compare.default_picks(chosen, candidates),
    key="compare_with",
    help="The runs in the same folder come first, healthy ones first; runs elsewhere below "
         "the root are listed after them.")
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
    f"**{name}**: " + (f"first non-finite at step {failures[name]}"
                       if failures[name] is not None else r.status)
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
    st.plotly_chart(compare.figure(drawn, names, mode, failures), key="compare_chart")
    if mode == compare.ALIGN_FAILURE:
        st.caption(
            "x is the step minus the run's own first non-finite step for a failed run, so "
            "that the failures of every failed run lie at 0 and their run-ups over each "
            "other; a healthy run has no failure and is counted from "
            + (f"the chosen run's (step {reference}), so it stays beside it as on the global "
               "step" if failures[here] is not None else
               f"the earliest failure compared (step {reference})") + ".")
    else:
        st.caption("x is each run's global step. The bold line is the chosen run; a red "
                   "cross at a panel's top edge is a non-finite value at that step.")
else:
    st.info("None of these runs logged a loss, gradient norm, learning rate or loss scale "
            "on its global step.")

st.subheader("Settings, environment and checkpoints")
show_all = st.toggle("Show every key, the equal ones too", key="compare_all_keys")
diff = compare.key_diff(runs, show_all)
st.caption(f"{diff.same} key{'' if diff.same == 1 else 's'} the same in all "
           f"{len(runs)} runs" + ("" if show_all else " (hidden)") + "; a blank cell: the "
           "run does not have the key.")
if diff.rows:
    st.dataframe(pd.DataFrame(diff.rows, columns=diff.columns), hide_index=True,
                 key="compare_keys")
else:
    st.caption("No key differs between these runs.")

st.subheader("Findings")
only_mine, only_theirs, shared = compare.finding_diff(result, others)
st.caption(f"{shared} rule{'' if shared == 1 else 's'} fired on {here} and on some run "
           "beside it.")
st.markdown(f"**On {here} and on none of the others**")
if only_mine:
    st.dataframe(pd.DataFrame(only_mine), hide_index=True, key="compare_only_mine")
else:
    st.caption("None.")
st.markdown(f"**On another run and not on {here}**")
if only_theirs:
    st.dataframe(pd.DataFrame(only_theirs), hide_index=True, key="compare_only_theirs")
else:
    st.caption("None.")
