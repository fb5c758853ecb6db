"""The runs table's rows: one line per run, in plain values (no Streamlit), made from the
analyzer's records."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

from analyzer.ingest.tb import is_event_file
from analyzer.model import Run, RunResult
from analyzer.wording import (
    cause_words,
    failing_place,
    incident_step,
    incident_unit,
    place_words,
    step_words,
)
from app.health import health
from app.runinfo import layout_text
from app.views import placement_text


@dataclass(frozen=True)
class RunRow:
    """One line of the runs table."""

    run: str
    status: str
    first_step: int | None
    tag: str | None
    kind: str | None
    last_finite: int | None
    layer: str | None
    cause: str | None
    confidence: str | None
    replay: str | None
    sources: str
    issues: int
    first_issue: str | None
    first_after: bool = False
    """The failure comes after ``first_step``: a log line that names no step of its own."""
    first_unit: str = "step"
    """What ``first_step`` counts: ``step`` on the run's global step, else the word of a
    source not placed on it (``record``)."""
    last_when: str | None = None
    """``last_finite`` in a table cell's words, in the same numbering as ``first_when``."""
    first_when: str | None = None
    """The first step in a table cell's words: ``28``, ``>20``, ``#13`` (a source's own
    record 13)."""
    placement: str = ""
    """How each log's steps were placed on the run's global step."""
    grouping: str = ""
    """The framework layout discovery recognised and the run's segments."""
    ends_early: str | None = None
    """Where a damaged run's readable record stops (:attr:`app.health.Health.ends_early`)."""

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def sources_text(run: Run) -> str:
    """What a run offered the analysis, in a few words."""
    events = sum(1 for f in run.files if is_event_file(f))
    parts = [_plural(events, "event file")] if events else []
    for log in run.logs:
        kind = f" ({log.framework})" if log.framework else ""
        parts.append(f"{os.path.basename(log.path)}{kind}")
    if run.checkpoints is not None and run.checkpoints.saves:
        parts.append(_plural(len(run.checkpoints.saves), "checkpoint"))
    if run.captures:
        parts.append(_plural(len(run.captures), "capture"))
    return ", ".join(parts) or "nothing readable"


def replay_brief(result: RunResult) -> str | None:
    r = result.replay
    if r is None and result.replay_refused is not None:
        return "not run: its code is not trusted (Replay page)"
    if r is None:
        return f"failed: {result.replay_error}" if result.replay_error else None
    if r.phase is None:
        return f"all finite ({r.verdict.kind})"
    op = f" {r.op.op}" if r.op is not None else ""
    where = f" in {r.op.module}" if r.op is not None and r.op.module else ""
    return f"{r.phase}{op}{where}: {r.verdict.kind}"


def run_row(name: str, result: RunResult | None, error: str | None) -> RunRow:
    """The run's line; ``status`` is :func:`app.health.health`'s: failed, finite, damaged
    (read issues cost data) or unreadable."""
    if result is None:
        return RunRow(name, "unreadable", None, None, None, None, None, None, None, None,
                      "", 0, error)
    well = health(result, error)
    inc = result.incident
    top = result.findings[0] if result.findings else None
    issues = result.run.issues
    return RunRow(
        run=name,
        status=well.status,
        first_step=inc.step if inc else None,
        tag=inc.tag if inc else None,
        kind=inc.kind if inc else None,
        last_finite=inc.last_finite_step if inc else None,
        layer=place_words(place, "cell") if (place := failing_place(result)) else None,
        cause=(cause_words(result.findings) if top.is_failure else f"warning: {top.name}")
        if top else None,
        confidence=top.confidence if top else None,
        replay=replay_brief(result),
        sources=sources_text(result.run),
        issues=len(issues),
        first_issue=str(issues[0]) if issues else error,
        first_after=inc.after if inc else False,
        first_unit=incident_unit(inc, result.run) if inc else "step",
        first_when=incident_step(inc, result.run, "cell") if inc else None,
        last_when=step_words(inc.last_finite_step, form="cell",
                             unit=incident_unit(inc, result.run)) if inc else None,
        placement=placement_text(result.run),
        grouping=layout_text(result.run),
        ends_early=well.ends_early,
    )
