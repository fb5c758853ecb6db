"""The catalogue of root causes and the engine that ranks them.

Rules are registered here by explicit import, one module per family. Codes are stable and
never reused: NF1xx mathematical faults, NF2xx gradients and optimisation, NF3xx reduced
precision, NF4xx data, NF5xx the system around the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from analyzer.model import CONFIDENCE_ORDER, Finding, RunResult, SkippedRule
from analyzer.rules import (
    clipping,
    data,
    gradients,
    inputs,
    loss,
    masking,
    normalisation,
    numerics,
    optimizer,
    overflow,
    precision,
    resume,
    schedule,
    system,
    temperature,
)
from analyzer.rules.base import SECTIONS, Rule
from analyzer.rules.evidence import RunEvidence

RULES: tuple[Rule, ...] = (
    *numerics.RULES,
    *gradients.RULES,
    *schedule.RULES,
    *optimizer.RULES,
    *loss.RULES,
    *precision.RULES,
    *data.RULES,
    *inputs.RULES,
    *system.RULES,
    *overflow.RULES,
    *normalisation.RULES,
    *masking.RULES,
    *temperature.RULES,
    *clipping.RULES,
    *resume.RULES,
)
RULES = tuple(sorted(RULES, key=lambda r: r.code))
BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}
BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
_ROLE_ORDER = {"cause": 0, "symptom": 1, "warning": 2}

SIBLING_RULES: tuple[Rule, ...] = tuple(r for r in RULES if "siblings" in r.needs)
"""The rules that compare a run with the healthy runs beside it: all a streamed analysis
evaluates again once a folder's runs are done (:func:`evaluate_siblings`). They read only
what a slim run keeps (its ``env``, not its series)."""

__all__ = ["BY_CODE", "RULES", "SECTIONS", "SIBLING_RULES", "Rule", "RunEvidence", "evaluate",
           "evaluate_siblings", "explain", "find_rule"]


def find_rule(code_or_name: str) -> Rule | None:
    return BY_CODE.get(code_or_name.upper()) or BY_NAME.get(code_or_name.lower())


def explain(code_or_name: str) -> str | None:
    """A rule's documentation, as ``forensics explain`` prints it."""
    r = find_rule(code_or_name)
    if r is None:
        return None
    return f"{r.code} {r.name}: {r.title}  [{r.role}, {r.status}]\n\n{r.docs}\n"


def evaluate(result: RunResult, siblings: Mapping[str, Mapping[str, Any]] | None = None
             ) -> tuple[tuple[Finding, ...], tuple[SkippedRule, ...]]:
    """Every rule over one run: ranked findings, and the rules skipped for lack of evidence."""
    findings, skipped = _run(RULES, RunEvidence(result, siblings or {}))
    return rank(findings), tuple(skipped)


def evaluate_siblings(result: RunResult, siblings: Mapping[str, Mapping[str, Any]]
                      ) -> tuple[tuple[Finding, ...], tuple[SkippedRule, ...]]:
    """``result``'s findings and skipped rules, ranked by :func:`evaluate` without
    siblings, completed with the rules that need them: what ``evaluate(result, siblings)``
    gives on the full run, computed from a slim one. The sibling rules' earlier entries
    (skipped for want of siblings) are replaced, the skipped list stays in catalogue order,
    and every finding is ranked again (a new one may outrank the top)."""
    mine = {r.code for r in SIBLING_RULES}
    added, again = _run(SIBLING_RULES, RunEvidence(result, siblings))
    kept = [replace(f, rank_note=None) for f in result.findings if f.code not in mine]
    order = {r.code: k for k, r in enumerate(RULES)}
    skipped = sorted([s for s in result.skipped_rules if s.code not in mine] + again,
                     key=lambda s: order.get(s.code, len(order)))
    return rank(kept + added), tuple(skipped)


def _run(rules: tuple[Rule, ...], ev: RunEvidence) -> tuple[list[Finding], list[SkippedRule]]:
    findings: list[Finding] = []
    skipped: list[SkippedRule] = []
    for r in rules:
        if r.needs and not any(ev.has(n) for n in r.needs):
            skipped.append(SkippedRule(r.code, r.name, ev.missing_reason(r.needs)))
            continue
        try:
            findings.extend(r.check(r, ev))
        except Exception as exc:  # a rule's bug must not hide the other rules' findings
            skipped.append(SkippedRule(r.code, r.name,
                                       f"the rule failed: {type(exc).__name__}: {exc}"))
    return findings, skipped


def _key(f: Finding) -> tuple[int, int, float, str]:
    return (_ROLE_ORDER.get(f.role, 9), -CONFIDENCE_ORDER[f.confidence], -f.score, f.code)


def rank(findings: list[Finding]) -> tuple[Finding, ...]:
    """Causes before symptoms before warnings, then by confidence and score; every finding
    after the first says why it ranked lower."""
    ordered = sorted(findings, key=_key)
    if not ordered:
        return ()
    top = ordered[0]
    out = [top]
    for f in ordered[1:]:
        out.append(replace(f, rank_note=_why_lower(f, top)))
    return tuple(out)


def _why_lower(f: Finding, top: Finding) -> str:
    if f.role != top.role:
        return f"a {f.role}, not a root cause: {top.name} explains it"
    if f.confidence != top.confidence:
        return f"lower confidence ({f.confidence} against {top.confidence})"
    if f.score < top.score:
        return f"same confidence, weaker evidence (score {f.score:.2f} against {top.score:.2f})"
    if f.role == "cause":
        return (f"undetermined between {top.name} and {f.name} on this evidence (listed "
                f"after it by code); {top.name}'s evidence says what would decide")
    return f"as likely as {top.name} on this evidence; listed after it by code"
