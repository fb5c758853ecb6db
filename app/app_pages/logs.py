"""Logs: the first line that reports a non-finite value, in its context, beside what the
other sources logged at the same step; the lines the analysis marked (overflow skips,
restarts, errors); and the log itself, by first or last lines, a line number or a filter.

The page is never a dead end: a log with no non-finite line can still be read, and the
lines the log reader recognised as events can be jumped to.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import streamlit as st

from analyzer.model import Event, Run
from analyzer.wording import step_words
from app import data, runinfo, tables, ui, views

sel, result = ui.run_page("Logs")

# The event kinds a log line can carry, as the table names them (a bare string here would
# be shown on the page: Streamlit's magic).
_MARKED = {"overflow_skip": "overflow skip", "loss_scale": "loss scale changed",
           "min_loss_scale": "loss scale at its floor", "restart": "restart",
           "error": "error", "nonfinite": "non-finite", "checkpoint_save": "checkpoint saved",
           "model_description": "model description"}
_SHORT = {"overflow_skip": "skip", "loss_scale": "scale", "min_loss_scale": "scale floor",
          "nonfinite": "non-finite", "checkpoint_save": "save",
          "model_description": "model"}
_FILTER_LIMIT = 200  # lines a text filter lists at most


@st.cache_data(max_entries=64, show_spinner=False)
def line_count(path: str, digest: str) -> tuple[int, bool]:
    """How many lines the log has (a last line without its newline counts), and whether
    its last line lacks its newline (the log stops mid-line)."""
    count, cut = 0, False
    try:
        for number, piece in data.text_lines(path):
            count, cut = number, not piece.endswith("\n")
    except OSError:
        return 0, False
    return count, cut


@st.cache_data(max_entries=64, show_spinner=False)
def matching(path: str, digest: str, needle: str) -> tuple[list[int], bool]:
    """Numbers of the lines holding ``needle`` (case-insensitive), the first
    _FILTER_LIMIT of them, and whether there were more."""
    low, found, more = needle.lower(), [], False
    try:
        for number, piece in data.text_lines(path):
            if low in piece.lower() and (not found or found[-1] != number):
                if len(found) == _FILTER_LIMIT:
                    more = True
                    break
                found.append(number)
    except OSError:
        return [], False
    return found, more


def marked(run: Run, path: str) -> list[Event]:
    """The events the log reader found on lines of ``path``, in line order."""
    return sorted((e for e in run.events if e.location is not None
                   and e.location.file == path and e.location.line is not None),
                  key=lambda e: e.location.line or 0)


def _jump(path: str, line: int) -> None:
    """Show ``line`` of ``path`` in the viewer (a button's callback, before the widgets)."""
    st.session_state["logs_file"] = path
    st.session_state["logs_mode"] = "Around a line"
    st.session_state["logs_goto"] = line
    st.session_state["logs_filter"] = ""


def _numbered(lines: list[tuple[int, str]], focus: int | None, flag: Callable[[int], str]
              ) -> str:
    """Lines as a terminal shows them (:func:`views.frames`), each row after its flag and
    number; the frames of one line after the first under a blank number."""
    rows = []
    for n, text in lines:
        for k, frame in enumerate(views.frames(text, n == focus)):
            rows.append(f"{flag(n)} {n if k == 0 else '':>6} | {frame}")
    return "\n".join(rows)


def _text(path: str, first: int, last: int, marks: dict[int, str], focus: int | None) -> str:
    # not ">": that marks the excerpt around the non-finite line above
    return _numbered(data.log_lines(path, first, last, sel.ref.digest), focus,
                     lambda n: "→" if n == focus else "*" if n in marks else " ")


def _step(e: Event) -> str:
    step = views.event_step(e)
    return "" if step is None else step_words(step, e.step is None)


def show_marked(path: str, events: list[Event]) -> None:
    """The lines of ``path`` the analysis marked, each with a button that shows it."""
    name = os.path.basename(path)
    st.subheader(f"Lines the analysis marked in {name}")
    counts: dict[str, int] = {}
    for e in events:
        counts[_MARKED.get(e.kind, e.kind)] = counts.get(_MARKED.get(e.kind, e.kind), 0) + 1
    st.caption(", ".join(f"{k}: {n}" for k, n in counts.items())
               + ". Marked * in the log below; a button shows the line there.")
    tables.show(tables.frame([{
        "line": e.location.line, "event": _MARKED.get(e.kind, e.kind), "step": _step(e),
        "message": e.message} for e in events]), key=f"logs_marked_{name}")
    shown = events[:24]
    columns = st.columns(min(len(shown), 6) or 1)
    for i, e in enumerate(shown):
        line = e.location.line or 1
        columns[i % len(columns)].button(
            f"Line {line} ({_SHORT.get(e.kind, e.kind)})", key=f"logs_jump_{name}_{line}_{i}",
            on_click=_jump, args=(path, line))
    if len(events) > len(shown):
        st.caption(f"{len(events) - len(shown)} more marked lines: type a line number in "
                   "“Go to line” below.")


def show_viewer(run: Run, focus: tuple[str, int] | None) -> None:
    """The log itself: first or last lines, around a line, or the lines matching a text."""
    st.subheader("The log")
    paths = [log.path for log in run.logs]
    if focus is not None and st.session_state.get("logs_focus") != focus:
        # a line newly pointed at (the page opened, a link followed): the viewer goes there
        st.session_state["logs_focus"] = focus
        _jump(*focus)
    if st.session_state.get("logs_file") not in paths:
        st.session_state["logs_file"] = paths[0]
    path = st.selectbox("Log", paths, key="logs_file", format_func=lambda p: runinfo.rel(
        p, run.path), disabled=len(paths) == 1)
    total, cut = line_count(path, sel.ref.digest)
    if not 1 <= st.session_state.get("logs_goto", 1) <= max(total, 1):
        st.session_state["logs_goto"] = max(total, 1)
    modes = ["First lines", "Last lines", "Around a line"]
    st.session_state.setdefault("logs_mode", "Around a line" if focus else "First lines")
    left, mid, right = st.columns([3, 2, 3])
    mode = left.radio("Show", modes, key="logs_mode", horizontal=True)
    count = mid.number_input("Lines", 5, 500, 40, step=5, key="logs_count")
    goto = right.number_input("Go to line", 1, max(total, 1), key="logs_goto",
                              help="The line shown in the middle under “Around a line”.",
                              on_change=lambda: st.session_state.update(
                                  logs_mode="Around a line"))
    needle = st.text_input("Filter", key="logs_filter",
                           placeholder="show only lines holding this text (case-insensitive)")
    marks = {e.location.line or 0: e.kind for e in marked(run, path)}
    st.caption(f"{total} lines in `{runinfo.rel(path, run.path)}`")
    if cut:
        st.warning(f"The last line ({total}) of `{runinfo.rel(path, run.path)}` has no line "
                   "end: the log stops mid-line, as a process killed while writing leaves "
                   "it (or one still writing). What it logged after that line is not here.")
    if needle:
        found, more = matching(path, sel.ref.digest, needle)
        st.caption(f"{len(found)}{'+' if more else ''} lines hold “{needle}”"
                   + (f" (the first {len(found)} shown)" if more else ""))
        rows = [_text(path, n, n, marks, None) for n in found]
        st.code("\n".join(rows) or f"(no line holds “{needle}”)", language=None)
        return
    count = int(count)
    if mode == "First lines":
        first, last, at = 1, count, None
    elif mode == "Last lines":
        first, last, at = max(1, total - count + 1), total, None
    else:
        at = int(goto)
        first = max(1, at - count // 2)
        last = first + count - 1
    st.code(_text(path, first, last, marks, at) or "(the log could not be read)",
            language=None)
    st.caption(f"Lines {first}–{min(last, total)} of {total}; → the line gone to, * a line "
               "the analysis marked.")


def other_sources(target: views.LogHit) -> None:
    """What the run's other sources hold at the step of the target line."""
    if not target.aligned:
        placed = run.alignment_of(target.file)
        st.caption(f"This log's {target.unit}s are not placed on the run's steps"
                   + (f" ({placed.method})" if placed is not None else "")
                   + ", so the other sources cannot be lined up with this line.")
        return
    step = target.step
    if (step is None and result.incident is not None and result.incident.step is not None
            and result.incident.aligned):
        step = result.incident.step
        st.caption(f"The line names no step the log reader recognised; below is the run's "
                   f"first non-finite {step_words(step, result.incident.after)}.")
    elif target.after:
        st.caption(f"The line names no step: it follows step {step}, shown below.")
    if step is None:
        st.caption("The line names no step, so the other sources cannot be lined up with it.")
        return
    st.subheader(f"Step {step} in the other sources")
    ui.step_views(run, step, key="logs_views")
    at_step = [e for e in run.events if views.event_step(e) == step]
    if at_step:
        tables.show(tables.frame([{"event": e.kind, "message": e.message,
                                    "where": views.where(e.location, run.path)}
                                   for e in at_step]), key="logs_events")
    history = run.checkpoints
    if history is not None:
        saves = [s for s in history.saves if s.step is not None and s.step <= step]
        if saves:
            s = saves[-1]
            st.markdown(f"Checkpoint: the last save at or before step {step} is step "
                        f"{s.step} (`{os.path.basename(s.path)}`), {s.nonfinite_tensors} "
                        "non-finite tensors.")
    if result.replay is not None and result.replay.step is not None:
        r = result.replay
        st.markdown(f"Replay of step {r.step}: verdict **{r.verdict.kind}**, "
                    f"{r.phase or 'every phase finite'}"
                    + (f", layer {r.layer}" if r.layer else ""))
    ui.link("timeline", f"Step {step} on the timeline", sel.ref.name, step=step)


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

if st.session_state.get("logs_run") != sel.ref.path:
    # the viewer's place belongs to the run it was set on
    for key in ("logs_file", "logs_mode", "logs_goto", "logs_filter", "logs_focus"):
        st.session_state.pop(key, None)
    st.session_state["logs_run"] = sel.ref.path
events = {path: marked(run, path) for path in logs}
if target is None:
    count = sum(len(e) for e in events.values())
    st.info(f"No line of {', '.join(os.path.basename(p) for p in logs)} reports a non-finite "
            "value. " + (f"The analysis marked {count} lines (listed below); the log "
                         "itself is below them." if count else "The log itself is below."))
else:
    if len(hits) > 1:
        st.caption("First non-finite line of each log: " + "; ".join(
            h.heading for h in hits))
    radius = st.slider("Lines of context", 2, 60, 8, key="logs_radius")
    first = max(1, target.line - radius)
    lines = data.log_lines(target.file, first, target.line + radius, sel.ref.digest)
    st.subheader(target.heading)
    st.caption(target.what)
    excerpt = _numbered(lines, target.line, lambda n: ">" if n == target.line else " ")
    st.code(excerpt or "(the line could not be read)", language=None)
    other_sources(target)

for path, found in events.items():
    if found:
        show_marked(path, found)
show_viewer(run, (target.file, target.line) if target is not None else None)


