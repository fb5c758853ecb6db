"""What the analysis finds in a run: incidents, findings and their evidence, refusals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from analyzer.model.issues import Location
from analyzer.model.jsonform import encode
from analyzer.model.runs import NonFiniteKind


@dataclass(frozen=True)
class Incident:
    """The first non-finite value of a tag, or of the whole run.

    ``last_finite_step`` is the last step before ``step`` at which the same tag was
    finite (None when it never was). ``decided_by`` says which rule picked this
    incident among others at the same step, for the run-level incident.
    """

    step: int | None
    """None only for a log line that reports a NaN/Inf before the log numbered any step
    (an autograd anomaly error at the first backward, say)."""
    tag: str
    kind: NonFiniteKind
    last_finite_step: int | None
    location: Location
    layer: str | None = None
    decided_by: str | None = None
    origin: str = "scalar"
    """Where the value was seen: ``scalar``, ``histogram``, ``log``, ``checkpoint`` or
    ``capture`` (the flight recorder's trigger)."""
    rank: int | None = None
    """The data-parallel rank whose log line it was, for rank-prefixed logs."""
    after: bool = False
    """True when the source names no step and ``step`` is the last step logged before it:
    the value went non-finite at some later step, not at ``step``."""
    aligned: bool = True
    """False when the source's steps could not be placed on the run's global step
    (``Run.alignments``): ``step`` is then the source's own number (its record, its
    counter), and the incident is never ordered before one on the global step."""

    @property
    def earliest_step(self) -> int | None:
        """The first step that can hold the failure: ``step``, or the one after it for a
        line placed after a step; None when unknown."""
        if self.step is None:
            return None
        return self.step + 1 if self.after else self.step


Confidence = Literal["low", "medium", "high"]
FindingRole = Literal["cause", "symptom", "warning"]
"""A root cause; a mechanism a cause explains; a risk in a run that did not fail."""
CONFIDENCE_ORDER: dict[str, int] = {"low": 0, "medium": 1, "high": 2}


@dataclass(frozen=True)
class Evidence:
    """One fact a finding rests on, where it was seen, and the values its sentence states, so
    that a reader takes them from the record instead of computing them again.

    A value is None where the fact has none, never a guess. ``text`` names every value the
    record carries, except the step of a fact the replay found: that is the replay's step.

        location  file, byte offset or line it was seen at: ``events.out.tfevents.X@154349``
        step      the step it was seen at (a logged value's, a replayed one's), a trend's first
        subject   what it is about, as the report links it: a tag, module, layer or
                  parameter: ``train/grad_norm``, ``fc3``, ``lr``
        onset     the step a trend began: a growth's first step, a learning-rate jump's: ``17``
        value     its own number: a norm, a learning rate, a loss scale, an eps, a growth's
                  doubling time in steps: ``0.127``
        ratio     a factor or a share: a trend's end over its start (a growth's ``10**9.3``,
                  a loss scale's fall), the share of steps above a clip (``0.93``)
        tensor    the tensor or parameter its sentence is about: a checkpoint tensor, an
                  Adam state's parameter, a replay's bad parameter: ``backbone.fc1.weight``
    """

    text: str
    location: Location | None = None
    step: int | None = None
    subject: str | None = None
    onset: int | None = None
    value: float | None = None
    ratio: float | None = None
    tensor: str | None = None


@dataclass(frozen=True)
class Finding:
    """A root cause (or a symptom of one) that a rule found in a run.

    ``role`` is ``cause`` for a root cause, ``symptom`` for a mechanism that a cause
    explains (exploding gradients, loss spikes) and ``warning`` for a risk in a run that
    did not fail. ``rank_note`` says, for every finding but the first, why it ranked lower.
    """

    code: str
    name: str
    title: str
    confidence: Confidence
    role: FindingRole
    evidence: tuple[Evidence, ...]
    fix: str
    score: float = 0.0
    rank_note: str | None = None

    @property
    def is_failure(self) -> bool:
        return self.role in ("cause", "symptom")


class _Ranked(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def confidence(self) -> str: ...
    @property
    def score(self) -> float: ...


R = TypeVar("R", bound=_Ranked)


def top_tie(findings: Sequence[R]) -> tuple[R, ...]:
    """The failure findings the evidence cannot tell apart from the top one, top first: the
    causes with its confidence and score, when it is a cause. One finding when nothing ties
    with it; none when there is no failure finding. Findings come ranked best first
    (:func:`analyzer.rules.rank`), so a tie is the first few."""
    failures = [f for f in findings if f.role in ("cause", "symptom")]
    if not failures:
        return ()
    top = failures[0]
    if top.role != "cause":
        return (top,)
    tied = [f for f in failures[1:] if f.role == "cause" and f.confidence == top.confidence
            and round(f.score, 6) == round(top.score, 6)]
    return (top, *tied)


@dataclass(frozen=True)
class SkippedRule:
    """A rule that could not run on a run, and the evidence it lacked."""

    code: str
    name: str
    reason: str


@dataclass(frozen=True)
class CodeRefusal:
    """A replay not run because it would import code nobody trusted (:mod:`analyzer.trust`).

    ``folder`` is where the code would come from and ``command`` the one that trusts it;
    both None when no trust allows the name (the standard library, say)."""

    target: str
    message: str
    folder: str | None = None
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return encode(self)  # type: ignore[no-any-return]
