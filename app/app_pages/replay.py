"""Replay: the captured failing step run again under instrumentation, in memory."""

from __future__ import annotations

import os
from typing import Any

import streamlit as st

from analyzer.wording import place_words, replay_place
from app import data, tables, ui

sel, result = ui.run_page("Replay", replay=True)


def _stats(stats: Any) -> str:
    return "; ".join(s.brief() for s in stats) or "-"


def show_op(op: Any, key: str) -> None:
    st.markdown(f"Op **aten.{op.op}** (op #{op.ordinal} of {op.phase})"
                + (f" in module **{op.module}**" if op.module else "")
                + (f", autograd node `{op.autograd_node}`" if op.autograd_node else "")
                + (f", differentiating aten.{op.forward_op}" if op.forward_op else "")
                + (f", parameter `{op.parameter}`" if op.parameter else ""))
    if op.source:
        st.caption(f"source line `{op.source}`")
        if op.source_line:
            st.code(op.source_line.strip(), language="python")
    tables.show(tables.frame([{"": "in", "tensor": s.brief()} for s in op.inputs]
                              + [{"": "out", "tensor": s.brief()} for s in op.outputs]),
                key=key)
    if not op.inputs_finite:
        st.caption("No op turned finite inputs into a non-finite output: this is the first op "
                   "whose output was non-finite, so a non-finite input or constant came first.")


def show(r: Any) -> None:
    v = r.verdict
    st.info(f"**Verdict: {v.kind}**: {v.summary}")
    if v.hypothesis:
        st.markdown(f"**Why:** {v.hypothesis}")
    if v.next_check:
        st.markdown(f"**Next:** {v.next_check}")
    for note in r.notes:
        st.caption(note)
    place = replay_place(r)
    if place is None:
        st.markdown("Every phase stayed finite in the instrumented pass.")
    else:
        st.markdown(f"First non-finite value in **{r.phase}**, {place_words(place, mark='**')}.")
        if r.op is not None:
            show_op(r.op, "replay_op")
    fwd = r.forward
    st.subheader("Module frames around the producer")
    centre = fwd.producer or fwd.first_nonfinite
    if fwd.window:
        tables.show(tables.frame([{
            "": "▶" if centre is not None and f.index == centre.index else "",
            "#": f.index, "module": f.name, "type": f.type, "call": f.call, "role": f.role,
            "output": _stats(f.outputs), "non-finite params": ", ".join(f.bad_params)}
            for f in fwd.window]).pipe(tables.without_blank, ["", "non-finite params"]),
            key="replay_frames")
    else:
        st.markdown("No module of the forward pass produced a non-finite value.")
    st.caption(f"{fwd.frames} module calls in the forward pass; batch: {_stats(fwd.batch)}"
               + (f"; non-finite batch: {', '.join(fwd.bad_inputs)}" if fwd.bad_inputs else ""))
    bwd = r.backward
    st.subheader("Backward and update")
    if not bwd.ran:
        st.markdown("Backward did not complete.")
    elif bwd.finite:
        st.markdown("Backward: every gradient finite.")
    else:
        first = bwd.first_param
        st.markdown(f"Backward: {len(bwd.bad_params)} parameters with non-finite gradients"
                    + (f"; first `{first.name}` in {first.module or '?'}" if first else ""))
        if bwd.origin is not None and r.phase != "backward":
            show_op(bwd.origin, "replay_origin")
    u = r.update
    st.markdown(f"Update: {u.note or 'not run'}" if not u.ran else
                "Update: every parameter finite after the step" if u.finite else
                f"Update: {len(u.params)} parameters non-finite after the step")
    st.subheader("Differential passes")
    st.caption("Each pass runs the whole step plainly. The run's own configuration is run "
               "twice: passes that disagree make the verdict not-reproducible. The float64 "
               "pass tells a mathematical fault (non-finite in float64 too) from a range "
               "overflow or underflow of the run's dtype (finite in float64).")
    tables.show(tables.frame([{"pass": p.label, "runs": _runs(p, r), "device": p.device,
                                "dtype": p.dtype, "autocast": p.autocast or "off",
                                "loss": p.loss,
                                "first non-finite phase": p.phase or "finite",
                                "fingerprint": p.fingerprint, "error": p.error or ""}
                               for p in r.passes]).pipe(tables.without_blank, ["error"]),
                key="replay_passes")
    with st.expander("As text (forensics replay)"):
        st.code(data.format_replay(r), language=None)


def _runs(p: Any, r: Any) -> str:
    """What configuration a pass ran, in words: its label alone is a short name."""
    if p.label.startswith("as-run"):
        return "the run's own configuration"
    if p.label.endswith("(cpu)"):
        return "float64 reference, autocast off"
    return f"cast to {p.dtype}, autocast off"


def refused(refusal: Any, device: str, dtype: str) -> None:
    """A replay not run for lack of trust: say what it would import, and ask."""
    st.warning(refusal.message)
    if refusal.folder is None:
        st.caption("No trust makes this name importable: the capture is not replayed.")
        return
    st.markdown(f"Replaying runs `{refusal.target}` from `{refusal.folder}`. Run it only if "
                "you trust the code in that folder.")
    left, right = st.columns(2)
    if left.button("Trust this folder and replay", key="replay_trust_folder",
                   help=f"Records the folder as `{refusal.command}` would, in your "
                        "configuration; nothing is written into the run."):
        data.trust_folder(refusal.folder)
        st.rerun()
    if right.button("Replay once, without trusting it", key="replay_trust_once"):
        once[sel.ref.path] = (device, dtype)
        st.rerun()


capture = data.capture_of(result)
if capture is None:
    st.info("This run has no capture of its failing step (capture/step_<N>/), so there is "
            "nothing to replay. The flight recorder in analyzer.capture saves one.")
    st.stop()

st.caption(f"Capture: `{os.path.relpath(capture, sel.ref.path)}`")
left, mid, right = st.columns([2, 2, 3])
device = left.selectbox("Device", data.replay_devices(), key="replay_device")
dtype = mid.selectbox("Precision", data.dtype_choices(), key="replay_dtype",
                      help="as-run replays in the run's own dtype and autocast; another "
                           "dtype casts the model and the batch and turns autocast off.")
done: dict[str, tuple[str, str]] = st.session_state.setdefault("replays_run", {})
once: dict[str, tuple[str, str]] = st.session_state.setdefault("replays_trusted_once", {})
right.write("")
if right.button("Replay the captured step", type="primary", key="replay_button"):
    with st.status(f"Replaying {sel.ref.name} on {device} in {dtype}", expanded=True) as status:
        st.write("Loading the capture and rebuilding the model, then three passes: "
                 "instrumented, plain, and float64.")
        outcome = data.replay(capture, sel.ref.digest, device, dtype,
                              sel.ref.path in once)
        ok = outcome.error is None and outcome.refused is None
        status.update(label=f"Replay finished in {outcome.seconds:.1f} s" if ok else
                      "Replay not run" if outcome.refused else "Replay failed",
                      state="complete" if ok else "error", expanded=False)
    done[sel.ref.path] = (device, dtype)

trusted_once = once.get(sel.ref.path)
chosen = trusted_once or done.get(sel.ref.path)
if chosen is not None:
    outcome = data.replay(capture, sel.ref.digest, *chosen, trusted_once is not None)
    st.header(f"Replay on {chosen[0]}, {chosen[1]}")
    if outcome.refused is not None:
        refused(outcome.refused, *chosen)
    elif outcome.error:
        st.error(outcome.error)
    else:
        show(outcome.result)
elif result.replay is not None:
    st.header("Replay made by the analysis (cpu, as-run)")
    show(result.replay)
elif result.replay_refused is not None:
    st.header("Replay not run")
    refused(result.replay_refused, device, dtype)
elif result.replay_error:
    st.warning(f"The analysis could not replay this capture: {result.replay_error}")
