"""A :class:`Report` as versioned JSON: the machine contract.

``schema_version`` changes whenever a field changes meaning or disappears. The document
holds no wall-clock values of the analysis itself, so two analyses of the same folder give
the same document.
"""

from __future__ import annotations

import json
from typing import Any

from analyzer.model import (
    Event,
    Finding,
    Incident,
    Report,
    Run,
    RunResult,
    encode,
)


def to_dict(report: Report) -> dict[str, Any]:
    return {
        "schema_version": report.schema_version,
        "tool_version": report.tool_version,
        "failed": report.failed,
        "runs": [_run_dict(r) for r in report.results],
        "issues": [i.to_dict() for i in report.issues],
    }


def to_json(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, allow_nan=False)


def _run_dict(result: RunResult) -> dict[str, Any]:
    run = result.run
    return {
        "name": run.name,
        "path": run.path,
        "status": result.status,
        "files": list(run.files),
        "incident": _incident_dict(result.incident),
        "layer_incident": _incident_dict(result.layer_incident),
        "tag_incidents": [_incident_dict(i) for i in result.tag_incidents],
        "overflow_skips": list(result.overflow_skips),
        "tags": _tag_counts(run),
        "events": [_event_dict(e) for e in run.events],
        "findings": [_finding_dict(f) for f in result.findings],
        "skipped_rules": [{"code": k.code, "name": k.name, "reason": k.reason}
                          for k in result.skipped_rules],
        "replay": result.replay.to_dict() if result.replay is not None else None,
        "replay_error": result.replay_error,
        "replay_refused": (result.replay_refused.to_dict()
                           if result.replay_refused is not None else None),
        "logs": [{"path": g.path, "framework": g.framework, "confidence": g.confidence,
                  "notes": list(g.notes)} for g in run.logs],
        "checkpoints": run.checkpoints.to_dict() if run.checkpoints is not None else None,
        "captures": list(run.captures),
        "issues": [i.to_dict() for i in run.issues],
    }


def _tag_counts(run: Run) -> dict[str, int]:
    """Points per tag over every series and histogram of it: a restarted writer, several
    ranks or a tag in both a log and an event file each add their points."""
    counts: dict[str, int] = {}
    for tag, points in [(s.tag, len(s)) for s in run.series] + \
            [(h.tag, len(h)) for h in run.histograms]:
        counts[tag] = counts.get(tag, 0) + points
    return counts


def _incident_dict(inc: Incident | None) -> dict[str, Any] | None:
    if inc is None:
        return None
    return {
        "step": inc.step,
        "tag": inc.tag,
        "kind": inc.kind,
        "last_finite_step": inc.last_finite_step,
        "layer": inc.layer,
        "location": inc.location.to_dict(),
        "decided_by": inc.decided_by,
        "origin": inc.origin,
        "rank": inc.rank,
        "after": inc.after,
    }


def _finding_dict(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code, "name": f.name, "title": f.title, "confidence": f.confidence,
        "role": f.role, "score": f.score, "rank_note": f.rank_note, "fix": f.fix,
        "evidence": [{"text": e.text, "step": e.step, "subject": e.subject,
                      "location": e.location.to_dict() if e.location else None}
                     for e in f.evidence],
    }


def _event_dict(event: Event) -> dict[str, Any]:
    return {"kind": event.kind, "step": event.step, "message": event.message,
            "location": event.location.to_dict(), "detail": encode(event.detail)}
