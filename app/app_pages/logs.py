"""Logs: the first line that reports a non-finite value, in its context, beside what the
other sources logged at the same step."""

from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from analyzer.wording import step_words
from app import data, runinfo, ui, views

sel, result = ui.run_page("Logs")

run = result.run
if not run.logs:
    st.info("This run has no text logs.")
    st.stop()

hits = views.log_hits(result)
logs = [log.path for log in run.logs]
wanted_file = st.query_params.get("file")
wanted_line = ui.int_param("line")
target: views.LogHit | None
if wanted_file in logs and wanted_line is not None:
    target = views.log_hit(run, wanted_file, wanted_line,
                           views.step_at_line(run, wanted_file, wanted_line),
                           "the line the link points at")
elif hits:
    target = hits[0]
else:
    target = None
    for path in logs:
        line = data.first_mention(path, sel.ref.digest)
        if line is not None:
            target = views.log_hit(run, path, line, views.step_at_line(run, path, line),
                                   "the log reader recognised no non-finite value in this "
                                   "log; this is the first line that mentions NaN or Inf, "
                                   "found by a text search")
            break

for log in run.logs:
    kind = f"{log.framework} format" if log.framework else "format not recognised"
    # Every numbering of the file (a Trainer's records beside DeepSpeed's counter), not
    # only the one with the most points.
    numberings = runinfo.placement_lines(run, log.path)
    steps = "".join(f"; {line}" for line in numberings)
    st.caption(f"`{runinfo.rel(log.path, run.path)}`: {kind}{steps}"
               + (f"; {'; '.join(log.notes)}" if log.notes else ""))

if target is None:
    st.info(f"No line of {', '.join(os.path.basename(p) for p in logs)} reports a non-finite "
            "value.")
    st.stop()

if len(hits) > 1:
    st.caption("First non-finite line of each log: " + "; ".join(
        h.heading for h in hits))
radius = st.slider("Lines of context", 2, 60, 8, key="logs_radius")
first = max(1, target.line - radius)
lines = data.log_lines(target.file, first, target.line + radius, sel.ref.digest)
st.subheader(target.heading)
st.caption(target.what)
rows = []
for n, text in lines:
    for k, frame in enumerate(views.frames(text, n == target.line)):
        mark = ">" if n == target.line else " "
        rows.append(f"{mark} {n:>6} | {frame}" if k == 0 else f"{mark} {'':>6} | {frame}")
st.code("\n".join(rows) or "(the line could not be read)", language=None)

if not target.aligned:
    placed = run.alignment_of(target.file)
    st.caption(f"This log's {target.unit}s are not placed on the run's steps"
               + (f" ({placed.method})" if placed is not None else "")
               + ", so the other sources cannot be lined up with this line.")
    st.stop()
step = target.step
if (step is None and result.incident is not None and result.incident.step is not None
        and result.incident.aligned):
    step = result.incident.step
    st.caption(f"The line names no step the log reader recognised; below is the run's first "
               f"non-finite {step_words(step, result.incident.after)}.")
elif target.after:
    st.caption(f"The line names no step: it follows step {step}, shown below.")
if step is None:
    st.caption("The line names no step, so the other sources cannot be lined up with it.")
    st.stop()

st.subheader(f"Step {step} in the other sources")
ui.step_views(run, step, key="logs_views")
events = [e for e in run.events if views.event_step(e) == step]
if events:
    st.dataframe(pd.DataFrame([{"event": e.kind, "message": e.message,
                                "where": views.where(e.location, run.path)} for e in events]),
                 hide_index=True, key="logs_events")
history = run.checkpoints
if history is not None:
    saves = [s for s in history.saves if s.step is not None and s.step <= step]
    if saves:
        s = saves[-1]
        st.markdown(f"Checkpoint: the last save at or before step {step} is step {s.step} "
                    f"(`{os.path.basename(s.path)}`), {s.nonfinite_tensors} non-finite tensors.")
if result.replay is not None and result.replay.step is not None:
    r = result.replay
    st.markdown(f"Replay of step {r.step}: verdict **{r.verdict.kind}**, "
                f"{r.phase or 'every phase finite'}"
                + (f", layer {r.layer}" if r.layer else ""))
ui.link("timeline", f"Step {step} on the timeline", sel.ref.name, step=step)
