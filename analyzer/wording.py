"""A step and the failing place, in words: one wording for the text report, the replay text
and the dashboard.

    step_words(step, after, form)  a failure's step: ``step 12``, ``after step 12`` (a log
                                   line that names no step, placed after the last one
                                   logged), ``no step``; as a phrase that follows a verb
                                   (``at step 12``) or in a table cell (``12``, ``>12``)
    failing_place(result)          where the run's first non-finite value was made: what the
                                   replay names (a layer, the loss function), else what the
                                   logged values say (``RunResult.place``: a layer, the loss
                                   function, the optimizer update, the input data, or a tie)
    replay_place(replay)           what a replay alone names
    place_words(place, form)       ``layer fc1``, ``in the loss function``, ``layer unknown``,
                                   ``undetermined between fc1 and fc2``; in a table cell
                                   ``fc1``, ``(loss function)``, ``?``, ``undetermined (fc1,
                                   fc2)``

``mark`` wraps the words that matter (``**`` for Markdown).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from analyzer.model import Alignment, Finding, Incident, ReplayResult, Run, RunResult, top_tie
from analyzer.model.replays import LOSS_NAME
from analyzer.model.results import PlaceReading

StepForm = Literal["noun", "at", "cell"]
PlaceForm = Literal["prose", "cell"]


def step_words(step: int | None, after: bool = False, form: StepForm = "noun",
               mark: str = "", unit: str = "step") -> str:
    """``noun``: ``step 12``, ``after step 12``, ``no step``; ``at``: ``at step 12``,
    ``after step 12``, ``with no step``; ``cell``: ``12``, ``>12``, ``?``. ``unit`` names a
    number that is not a global step (``record 12`` of a log not placed on the run's steps,
    ``#12`` in a cell)."""
    if form == "cell":
        if step is None:
            return "?"
        number = str(step) if unit == "step" else f"#{step}"
        return f">{number}" if after else number
    if step is None:
        words = f"{mark}no step{mark}"
        return f"with {words}" if form == "at" else words
    words = f"{mark}{unit} {step}{mark}"
    if after:
        return f"after {words}"
    return f"at {words}" if form == "at" else words


@dataclass(frozen=True)
class Place:
    """Where a non-finite value was made: a layer of the model, the loss function, another
    part of the step (``other``: ``optimizer update``, ``input data``), places that tie
    (``tied``), or a place that could not be named (all empty)."""

    layer: str | None = None
    loss_fn: bool = False
    other: str | None = None
    tied: tuple[str, ...] = ()

    @property
    def named(self) -> bool:
        return self.layer is not None or self.loss_fn or self.other is not None


_SHOWN_TIED = 3
_OTHER = {"optimizer_update": "optimizer update", "input_data": "input data"}


def reading_place(reading: PlaceReading) -> Place:
    """The place a post-hoc reading names, or its tie."""
    if reading.kind == "loss_function":
        return Place(loss_fn=True)
    if reading.kind in _OTHER:
        return Place(other=_OTHER[reading.kind])
    return Place(layer=reading.layer, tied=reading.candidates)


def replay_place(replay: ReplayResult) -> Place | None:
    """What the replay names; None when every phase stayed finite."""
    if replay.phase is None:
        return None
    if replay.layer:
        return Place(layer=str(replay.layer))
    op = replay.op
    return Place(loss_fn=op is not None and (op.module or "").startswith(LOSS_NAME))


def failing_place(result: RunResult) -> Place | None:
    """The replay's place when it names one (it saw the op), else what the logged values
    say (:mod:`analyzer.place`, a tie when they cannot tell), else None."""
    place = replay_place(result.replay) if result.replay is not None else None
    if place is not None and place.named:
        return place
    if result.place is not None:
        return reading_place(result.place)
    return place


def place_words(place: Place, form: PlaceForm = "prose", mark: str = "") -> str:
    """``prose``: ``layer fc1``, ``in the loss function``, ``in the optimizer update``,
    ``undetermined between fc1 and fc2``, ``layer unknown``; ``cell``: ``fc1``, ``(loss
    function)``, ``(optimizer update)``, ``undetermined (fc1, fc2)``, ``?``. A tie names a few
    of its places, then how many more."""
    if place.loss_fn:
        return "(loss function)" if form == "cell" else f"in the {mark}loss function{mark}"
    if place.other is not None:
        return f"({place.other})" if form == "cell" else f"in the {mark}{place.other}{mark}"
    if place.layer is None and place.tied:
        shown = ", ".join(place.tied[:_SHOWN_TIED])
        more = len(place.tied) - _SHOWN_TIED
        if form == "cell":
            return f"undetermined ({shown}{f' and {more} more' if more > 0 else ''})"
        if more > 0:
            return f"undetermined between {mark}{shown}{mark} and {more} more"
        head, last = ", ".join(place.tied[:-1]), place.tied[-1]
        return f"undetermined between {mark}{head}{mark} and {mark}{last}{mark}"
    name = place.layer or ("?" if form == "cell" else "unknown")
    return name if form == "cell" else f"layer {mark}{name}{mark}"


def incident_unit(incident: Incident, run: Run) -> str:
    """What an incident's number counts: ``step`` on the global step, else its source's own
    word (``record``, ``iteration``)."""
    if incident.aligned:
        return "step"
    found = next((a for a in run.alignments
                  if a.source == incident.location.file and not a.aligned), None)
    return "step" if found is None else found.axis.label


def incident_step(incident: Incident, run: Run, form: StepForm = "noun", mark: str = "") -> str:
    """An incident's step in words, in its source's own numbering when it is not placed on
    the run's global step."""
    return step_words(incident.step, incident.after, form, mark, incident_unit(incident, run))


def alignment_words(alignment: Alignment) -> str:
    """How a source was placed on the global step, e.g. ``inferred: step = record - 1, by
    matching loss with the event files' train/loss (40 of 40 agree)`` or ``exact: step =
    iteration - 1, by Megatron's iteration counter (from 1), ...``; a global step placed at
    itself needs no equation."""
    label = alignment.axis.label
    if not alignment.aligned:
        return f"unaligned: its {label}s are its own ({alignment.method})"
    scaled = label if alignment.stride == 1 else f"{alignment.stride} x {label}"
    if alignment.divisor > 1:
        shifted = scaled if not alignment.offset else (
            f"({scaled} {'+' if alignment.offset > 0 else '-'} {abs(alignment.offset)})")
        mapping = f"step = {shifted} // {alignment.divisor}, "
    elif not alignment.offset:
        same = scaled == "step" or (alignment.axis.kind == "global" and alignment.stride == 1)
        mapping = "" if same else f"step = {scaled}, "
    else:
        sign = "+" if alignment.offset > 0 else "-"
        mapping = f"step = {scaled} {sign} {abs(alignment.offset)}, "
    how = f"by {alignment.method}"
    if alignment.agreement is not None and alignment.points:
        agree = round(alignment.agreement * alignment.points)
        how += f" ({agree} of {alignment.points} agree)"
    return f"{alignment.confidence}: {mapping}{how}"


def cause_words(findings: Sequence[Finding]) -> str | None:
    """The run's cause as a cell says it: the top failure finding's name, or
    ``undetermined (a, b)`` (``and N more``) for causes the evidence cannot tell apart;
    None without a failure finding."""
    tie = top_tie(findings)
    if not tie:
        return None
    if len(tie) == 1:
        return tie[0].name
    more = f" and {len(tie) - 2} more" if len(tie) > 2 else ""
    return f"undetermined ({', '.join(f.name for f in tie[:2])}{more})"


def relative_path(path: str, root: str) -> str:
    """``path`` as seen from ``root`` (a run's folder), or as given when it lies outside."""
    try:
        rel = os.path.relpath(path, root)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel

