"""A replay result as terminal text: the ``forensics replay`` report, and the one line
``forensics analyze`` gives a replay.
"""

from __future__ import annotations

import math
import os

from analyzer.model import ModuleFrame, OpFault, PassOutcome, ReplayResult
from analyzer.wording import place_words, replay_place


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def _where(path: str | None) -> str:
    if path is None:
        return "?"
    file, _, line = path.rpartition(":")
    try:
        rel = os.path.relpath(file)
    except ValueError:
        rel = file
    return f"{rel if not rel.startswith('..') else file}:{line}"


def _op_lines(op: OpFault, indent: str = "  ") -> list[str]:
    lines = [f"{indent}op      aten.{op.op} (op #{op.ordinal} of {op.phase})"]
    if op.module:
        lines.append(f"{indent}module  {op.module}")
    if op.autograd_node:
        lines.append(f"{indent}node    {op.autograd_node}")
    if op.parameter:
        lines.append(f"{indent}param   {op.parameter}")
    if op.source:
        text = f"   {op.source_line}" if op.source_line else ""
        lines.append(f"{indent}line    {_where(op.source)}{text}")
    for stat in op.inputs:
        lines.append(f"{indent}in      {stat.brief()}")
    for stat in op.outputs:
        lines.append(f"{indent}out     {stat.brief()}")
    if not op.inputs_finite:
        lines.append(f"{indent}(no op turned finite inputs into a non-finite output: "
                     "this is the first op whose output was non-finite)")
    if op.mask is not None:
        mask = op.mask
        where = f" at {_where(mask.source)}" if mask.source else ""
        out = f": {mask.outputs[0].brief()}" if mask.outputs else ""
        lines.append(f"{indent}mask    aten.{mask.op} (op #{mask.ordinal}){where} wrote the "
                     f"-inf on purpose{out}")
    return lines


def _frame(frame: ModuleFrame, mark: bool) -> str:
    out = frame.outputs[0].brief() if frame.outputs else "no tensor output"
    call = f" (call {frame.call})" if frame.call > 1 else ""
    params = f" non-finite params: {', '.join(frame.bad_params)}" if frame.bad_params else ""
    return (f"  {'>' if mark else ' '} #{frame.index:<3} {frame.name}{call} [{frame.type}] "
            f"{frame.role}: out {out}{params}")


def _pass(p: PassOutcome) -> str:
    amp = f" autocast {p.autocast or 'off'}"
    state = f"error: {p.error}" if p.error else (
        f"non-finite in {p.phase}" if p.phase else "finite")
    mark = f"  [{p.fingerprint}]" if p.fingerprint is not None else ""
    return f"  {p.label:<14} {p.device} {p.dtype}{amp}  loss {_num(p.loss)}  {state}{mark}"


def format_replay(result: ReplayResult, *, label: str | None = None) -> str:
    """The terminal report of one replay: verdict first, then the evidence. ``label`` heads
    a replay that is not of a captured step (one from a checkpoint on a supplied batch)."""
    r = result
    step = f" step {r.step}" if r.step is not None else ""
    amp = f", autocast {r.autocast}" if r.autocast else ""
    if label is not None:
        lines = [label, f"  on {r.device}, {r.dtype}{amp}"]
    else:
        lines = [f"replay of {r.source}{step} on {r.device}, {r.dtype}{amp}"]
    lines += [f"  note: {n}" for n in r.notes if n != label]
    v = r.verdict
    lines.append(f"verdict: {v.kind}: {v.summary}")
    if v.hypothesis:
        lines.append(f"  why:  {v.hypothesis}")
    if v.next_check:
        lines.append(f"  next: {v.next_check}")
    place = replay_place(r)
    if place is None:
        lines.append("every phase stayed finite in the instrumented pass")
    else:
        lines.append(f"first non-finite value: {r.phase}, {place_words(place)}")
        if r.op is not None:
            lines += _op_lines(r.op)
    fwd = r.forward
    lines.append(f"forward: {fwd.frames} module calls, loss {_num(fwd.loss)}")
    if fwd.bad_inputs:
        lines.append(f"  non-finite batch: {', '.join(fwd.bad_inputs)}")
    for stat in fwd.batch:
        lines.append(f"  batch   {stat.brief()}")
    centre = fwd.producer or fwd.first_nonfinite
    lines += [_frame(f, centre is not None and f.index == centre.index) for f in fwd.window]
    bwd = r.backward
    if not bwd.ran:
        lines.append("backward: did not complete")
    elif bwd.finite:
        masked = (" (a non-finite value arose and was masked)"
                  if bwd.origin is not None and bwd.origin.inputs_finite else "")
        lines.append(f"backward: every gradient finite{masked}")
    else:
        lines.append(f"backward: {len(bwd.bad_params)} parameters with non-finite gradients")
        if bwd.origin is not None and bwd.origin.inputs_finite and r.phase != "backward":
            lines += _op_lines(bwd.origin)
        fp = bwd.first_param
        if fp is not None:
            src = f", created at {_where(fp.forward_source)}" if fp.forward_source else ""
            lines.append(f"  first: {fp.name} ({fp.grad.kind}) from "
                         f"{', '.join(fp.nodes) or '?'} in {fp.module or '?'}{src}")
    u = r.update
    if not u.ran:
        lines.append(f"update: {u.note or 'not run'}")
    elif u.finite:
        lines.append("update: every parameter finite after the step")
    else:
        lines.append(f"update: {len(u.params)} parameters non-finite after the step")
        lines += [f"  {p.name} ({p.kind}): {p.reason}" for p in u.params[:8]]
    lines.append("passes:")
    lines += [_pass(p) for p in r.passes]
    return "\n".join(lines)


def brief_replay(result: ReplayResult) -> str:
    """One line for the ``analyze`` report: phase, layer, op and line, verdict."""
    r = result
    place = replay_place(r)
    if place is None:
        return f"replay: every phase finite; verdict {r.verdict.kind}"
    parts = [f"replay: {r.phase}", place_words(place)]
    if r.op is not None:
        node = f" in {r.op.autograd_node}" if r.op.autograd_node else ""
        where = f" at {_where(r.op.source)}" if r.op.source else ""
        parts.append(f"aten.{r.op.op}{node}{where}")
    parts.append(f"verdict {r.verdict.kind}")
    return ", ".join(parts)
