"""What a rule is, and the helpers rules share.

A rule is a pure function from a run's evidence to findings, with a stable code that is
never reused, a name that states the pathology, the evidence it needs, and its user
documentation in its docstring, in fixed sections::

    ## What it detects
    ## Why it produces NaN/Inf
    ## Evidence
    ## Fix
    ## Known false positives
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from analyzer.model import CONFIDENCE_ORDER, Confidence, Evidence, Finding, FindingRole
from analyzer.rules.evidence import RunEvidence

SECTIONS = ("What it detects", "Why it produces NaN/Inf", "Evidence", "Fix",
            "Known false positives")

Check = Callable[["Rule", RunEvidence], list[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    title: str
    role: FindingRole
    needs: tuple[str, ...]
    """Evidence kinds of which at least one must be present (see RunEvidence.has)."""
    check: Check
    status: str = "stable"

    @property
    def docs(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")

    def section(self, heading: str) -> str:
        """The text of one documentation section."""
        text = self.docs
        marker = f"## {heading}"
        if marker not in text:
            return ""
        body = text.split(marker, 1)[1]
        return body.split("\n## ", 1)[0].strip()

    def finding(self, confidence: str, evidence: list[Evidence], score: float,
                title: str | None = None) -> Finding:
        if confidence not in CONFIDENCE_ORDER:
            raise ValueError(f"{self.code}: confidence {confidence!r} is not low/medium/high")
        return Finding(code=self.code, name=self.name, title=title or self.title,
                       confidence=cast(Confidence, confidence), role=self.role,
                       evidence=tuple(evidence), fix=self.section("Fix"),
                       score=round(min(max(score, 0.0), 1.0), 3))


def rule(code: str, name: str, title: str, *, role: FindingRole = "cause",
         needs: tuple[str, ...] = ()) -> Callable[[Check], Rule]:
    def wrap(check: Check) -> Rule:
        return Rule(code=code, name=name, title=title, role=role, needs=needs, check=check)

    return wrap
