"""A :class:`Report` as terminal text: one block per run, then the summary table.

Numbers and words come from the records; this module only lays them out. A replay's line is
:func:`analyzer.report.replay.brief_replay`, the one the ``replay`` command's report opens
with.
"""

from __future__ import annotations

import os

from analyzer.ingest.tb import is_event_file
from analyzer.model import (
    Finding,
    Location,
    Report,
    Run,
    RunResult,
    top_tie,
)
from analyzer.report.replay import brief_replay
from analyzer.wording import (
    alignment_words,
    cause_words,
    failing_place,
    incident_step,
    incident_unit,
    place_words,
    reading_place,
    replay_place,
    step_words,
)

_MAX_LISTED = 8
_PLACEMENTS = ("the line names no step", "the save names no step")
"""How an incident's ``decided_by`` begins when it explains where a stepless value was
placed, rather than how a tie between tags was broken."""


def format_text(report: Report) -> str:
    """The terminal report: one block per run, then a summary table."""
    blocks = [_run_block(r) for r in report.results]
    return "\n\n".join([*blocks, _summary(report)]) + "\n"


def _run_block(result: RunResult) -> str:
    run = result.run
    points = run.scalar_points
    n_events = sum(1 for f in run.files if is_event_file(f))
    sources = [_count(n_events, "event file"), f"{len(run.tags())} scalar tags",
               f"{points:,} points"]
    if run.checkpoints is not None:
        sources.append(_count(len(run.checkpoints.saves), "checkpoint"))
    if run.captures:
        sources.append(_count(len(run.captures), "capture"))
    lines = [f"== {run.name}  ({', '.join(sources)})", *_file_lines(run)]
    inc = result.incident
    if result.status == "unreadable":
        lines.append("   nothing readable: no value, event or checkpoint tensor could be read "
                     f"({_count(len(run.issues), 'read issue')})")
    elif inc is None:
        lines.append("   every logged value is finite")
    else:
        unit = incident_unit(inc, run)
        last = "none" if inc.last_finite_step is None else str(inc.last_finite_step)
        rank = f" on rank {inc.rank}" if inc.rank is not None else ""
        step = incident_step(inc, run)
        lines.append(f"   FIRST NON-FINITE  {step}  {inc.tag} = {inc.kind}{rank}  "
                     f"(last finite {unit} {last})")
        lines.append(f"     at {_shown(inc.location)}")
        if inc.decided_by and inc.decided_by.startswith(_PLACEMENTS):
            lines.append(f"     {inc.decided_by}")
        elif inc.decided_by and inc.decided_by != "earliest step":
            lines.append(f"     tie: {inc.decided_by}")
    lines += _place_lines(result)
    others = [i for i in result.tag_incidents if inc is None or i.tag != inc.tag]
    if others:
        shown = ", ".join(f"{i.tag}@{incident_step(i, run, 'cell')}"
                          + (f" on rank {i.rank}" if i.rank is not None else "")
                          for i in others[:_MAX_LISTED])
        more = f" and {len(others) - _MAX_LISTED} more" if len(others) > _MAX_LISTED else ""
        lines.append(f"   also non-finite: {shown}{more}")
    if result.overflow_skips:
        after = "then a failure" if inc else "training recovered: normal for mixed precision"
        lines.append(f"   overflow skips: {_skips(result.overflow_skips)} ({after})")
    guarded = sorted(result.scale.guarded) if result.scale is not None else []
    if guarded:
        lines.append(f"   guard skips: {_skips(tuple(guarded), 'the guard')} (updates refused "
                     "on non-finite gradients; training went on)")
    lines += _checkpoint_lines(run)
    lines += _metadata_lines(run)
    lines += _log_lines(run)
    lines += _replay_lines(result)
    lines += _finding_lines(result)
    restarts = [e for e in run.events if e.kind == "restart"]
    for e in restarts[:_MAX_LISTED]:
        lines.append(f"   restart: {e.message} at {e.location}")
    for issue in run.issues[:_MAX_LISTED]:
        lines.append(f"   read issue: {issue}")
    if len(run.issues) > _MAX_LISTED:
        lines.append(f"   ... and {len(run.issues) - _MAX_LISTED} more read issues (see --json)")
    return "\n".join(lines)


def _place_lines(result: RunResult) -> list[str]:
    """The first layer: as the logged values order it when a replay names the place (the
    replay's lines say where), else the post-hoc place, its tie and what would decide it."""
    lay, reading = result.layer_incident, result.place
    replayed = result.replay is not None and (p := replay_place(result.replay)) is not None \
        and p.named
    if replayed or reading is None:
        if lay is None:
            return []
        where = step_words(lay.step, lay.after, "at")
        lines = [f"   FIRST LAYER  {lay.layer}  ({lay.tag} = {lay.kind} {where})"]
        if lay.decided_by and lay.decided_by != "earliest step" \
                and not lay.decided_by.startswith(_PLACEMENTS):
            lines.append(f"     tie: {lay.decided_by}")
        return lines
    cell = place_words(reading_place(reading), "cell")
    phase = f"{reading.phase} pass" if reading.phase in ("forward", "backward") else \
        reading.phase or "phase unknown"
    head = "FIRST LAYER" if reading.kind in ("layer", "undetermined") else "PLACE"
    lines = [f"   {head}  {cell}  ({phase}, {step_words(reading.step, form='noun')})"]
    lines.append(f"     {'tie' if reading.kind == 'undetermined' else 'decided by'}: "
                 f"{reading.decided_by}")
    lines += [f"     evidence: {e}" for e in reading.evidence]
    if reading.would_decide:
        lines.append(f"     would decide: {'; '.join(reading.would_decide)}")
    return lines


_BRIEF_SETTINGS = ("learning_rate", "warmup_steps", "warmup_ratio", "optimizer", "precision",
                   "fp16", "bf16", "max_grad_norm", "logging_steps",
                   "gradient_accumulation_steps", "seed", "adam_epsilon")


def _metadata_lines(run: Run) -> list[str]:
    """The metadata files by name, and the settings the rules and the alignment use, each
    with the file it came from."""
    meta = run.metadata
    if meta is None:
        return []
    names: dict[str, list[str]] = {}
    for f in meta.files:
        names.setdefault(os.path.basename(f.path), []).append(f.status)
    shown = [name + (f" x{len(states)}" if len(states) > 1 else "") +
             "".join(f" ({s})" for s in sorted(set(states)) if s != "read")
             for name, states in names.items()]
    lines = [f"   metadata: {', '.join(shown)}"]
    by_source: dict[str, list[str]] = {}
    for name in _BRIEF_SETTINGS:
        found = meta.settings.get(name)
        if found is not None:
            by_source.setdefault(found.source, []).append(f"{name}={found.value}")
    lines += [f"     from {os.path.basename(source)}: {', '.join(shown)}"
              for source, shown in by_source.items()]
    return lines


def _log_lines(run: Run) -> list[str]:
    out = []
    for g in run.logs:
        framework = f"{g.framework} ({g.confidence:.0%})" if g.framework else "unknown format"
        out.append(f"   log: {g.path}: {framework}")
        # One line per numbering the log's lines are on (a Trainer's records beside
        # DeepSpeed's counter), the one with the most points first.
        for placed in [a for a in run.alignments if a.source == g.path]:
            out.append(f"     steps: {alignment_words(placed)}")
        out += [f"     note: {n}" for n in g.notes]
    return out


def _replay_lines(result: RunResult) -> list[str]:
    if result.replay is not None:
        return [f"   {brief_replay(result.replay)}"]
    if result.replay_refused is not None:
        return [f"   {result.replay_refused.message}"]
    if result.replay_error:
        return [f"   replay failed: {result.replay_error}"]
    return []


def _finding_lines(result: RunResult) -> list[str]:
    if not result.findings:
        return ["   no root cause found (see the skipped rules in --json)"] if result.failed \
            else []
    top, rest = result.findings[0], result.findings[1:]
    label = "CAUSE" if top.role == "cause" else top.role.upper()
    lines = []
    tie = top_tie(result.findings)
    if len(tie) > 1:
        names = [f"{f.code} {f.name}" for f in tie]
        lines.append(f"   UNDETERMINED between {', '.join(names[:-1])} and {names[-1]} "
                     f"({top.confidence}): the evidence fits each equally; the first is "
                     "shown, each finding says what would decide")
        label = "CAUSE?"
    lines.append(f"   {label}  {top.code} {top.name} ({top.confidence}): {top.title}")
    lines += [f"     - {e.text}" + (f"  [{_shown(e.location)}]" if e.location else "")
              for e in top.evidence]
    lines += _fix_lines(top)
    for f in rest:
        lines.append(f"   also {f.code} {f.name} ({f.confidence}, {f.role}): {f.rank_note}")
    return lines


def _fix_lines(top: Finding) -> list[str]:
    """The fix's first sentence and its code snippet, indented under the cause."""
    prose, _, rest = top.fix.partition("```")
    first = " ".join(prose.split()).split(". ")[0].rstrip(":.")
    lines = [f"     fix: {first}  (forensics explain {top.code})"]
    code = rest.split("```")[0].split("\n", 1)[-1] if rest else ""
    lines += [f"       {line}" for line in code.rstrip().splitlines()]
    return lines


def _shown(loc: Location) -> str:
    """A location as the terminal shows it: relative to the working folder when inside it."""
    rel = os.path.relpath(loc.file)
    return str(Location(loc.file if rel.startswith("..") else rel, loc.offset, loc.line))


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _checkpoint_lines(run: Run) -> list[str]:
    history = run.checkpoints
    if history is None or not history.saves:
        return []
    steps = [s.step for s in history.saves if s.step is not None]
    span = f", steps {min(steps)}..{max(steps)}" if steps else ""
    stepless = len(history.saves) - len(steps)
    if stepless:
        span += f", {stepless} with no step"
    lines = [f"   checkpoints: {_count(len(history.saves), 'save')}{span}"]
    if history.first_nonfinite is not None:
        bad = history.saves[history.first_nonfinite]
        layers = ", ".join(history.nonfinite_layers[:_MAX_LISTED]) or "-"
        lines.append(f"     first non-finite save: {step_words(bad.step)} "
                     f"({bad.nonfinite_tensors} tensors) at {bad.path}; layers {layers}")
    else:
        lines.append("     every saved tensor is finite")
    growing = [g for g in history.layers if g.growth is not None and g.growth > 10]
    if growing:
        top = growing[0]
        lines.append(f"     fastest-growing layer: {top.layer}, weight norm x{top.growth:.3g} "
                     f"over the finite saves")
    return lines


def _skips(steps: tuple[int, ...], by: str = "the loss scaler") -> str:
    shown = ", ".join(str(s) for s in steps[:_MAX_LISTED])
    more = f", ... ({len(steps)} in all)" if len(steps) > _MAX_LISTED else ""
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''} skipped by {by} " \
           f"at {shown}{more}"


def _summary(report: Report) -> str:
    rows = [("run", "status", "first step", "tag", "kind", "last finite", "layer", "cause")]
    for r in report.results:
        inc = r.incident
        if inc is None:
            rows.append((r.run.name, r.status, "-", "-", "-", "-", "-", "-"))
        else:
            unit = incident_unit(inc, r.run)
            last = "-" if inc.last_finite_step is None else \
                step_words(inc.last_finite_step, form="cell", unit=unit)
            place = failing_place(r)
            words = cause_words(r.findings)
            cause = f"{words} ({top_tie(r.findings)[0].confidence})" if words else "-"
            step = incident_step(inc, r.run, "cell")
            layer = place_words(place, "cell") if place is not None else "-"
            rows.append((r.run.name, "FAILED", step, inc.tag, inc.kind, last, layer, cause))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    failed = sum(r.failed for r in report.results)
    unreadable = sum(r.status == "unreadable" for r in report.results)
    issues = sum(len(r.run.issues) for r in report.results)
    nothing = f", {unreadable} with nothing readable" if unreadable else ""
    table.append(f"{len(report.results)} run{'s' if len(report.results) != 1 else ''}: "
                 f"{failed} with non-finite values, "
                 f"{len(report.results) - failed - unreadable} finite{nothing}; "
                 f"{issues} read issue{'s' if issues != 1 else ''}")
    table += [f"passed over: {issue}" for issue in report.issues[:_MAX_LISTED]]
    if len(report.issues) > _MAX_LISTED:
        table.append(f"... and {len(report.issues) - _MAX_LISTED} more passed over (see --json)")
    return "\n".join(table)


def _file_lines(run: Run) -> list[str]:
    """The run's files by role, relative to its root, where discovery grouped more than
    one folder's run files (a layout, segments, events or logs below the root): a run of
    one folder with its save and capture folders says nothing more than its header."""
    lay = run.layout
    if lay is None or not (lay.layouts or lay.segments or any(
            f.role in ("events", "log") and os.path.dirname(f.path) != lay.root
            for f in lay.files)):
        return []
    head = ", ".join(lay.layouts) or "plain folders"
    if lay.segments:
        labels = [s.label for s in lay.segments]
        more = f" and {len(labels) - _MAX_LISTED} more" if len(labels) > _MAX_LISTED else ""
        head += f"; segments {', '.join(labels[:_MAX_LISTED])}{more}"
    by_role: dict[str, list[str]] = {}
    for f in lay.files:
        by_role.setdefault(f.role, []).append(os.path.relpath(f.path, lay.root))
    lines = [f"   files: {head}"]
    for role, paths in by_role.items():
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        lines.append(f"     {role}: {', '.join(paths[:3])}{more}")
    return lines
