"""Where a run's first non-finite value was made, from what the run logged alone.

Pure numpy over the records of :mod:`analyzer.model`; no file access. A replay of a capture
names the producing op and is the stronger witness; this reading is what a run without one
still says, and it names a tie as a tie rather than the first tag in file order.

The phase signature at the run's first non-finite step ``s``:

- an input-data tag non-finite at ``s``: the input data;
- the training loss non-finite at ``s``: the forward pass or the loss;
- the loss finite at ``s`` but gradients non-finite: the backward pass;
- the loss and the gradients finite at ``s`` but weights non-finite (weight norms, a
  checkpoint): the optimizer update.

Within the forward or backward pass, the candidate layers are those whose per-layer values
went non-finite at ``s`` (the backward pass), or every logged layer and the loss function (the
forward pass: gradients and updated weights at ``s`` follow the loss, so they cannot tell the
layers apart). Ties are broken, strongest first, by growth before the failure (a layer whose
weight norm rose at least ``MIN_DECADES`` orders of magnitude, and ``RATIO`` times as many as
any other candidate's); then by checkpoints (the only candidate non-finite in the first
non-finite save while others are finite, or the only one near float16's limit in the last
finite save); then, in the forward pass, by an infinite loss with no layer out-growing the
others: a loss of +inf or -inf from finite weights is made in the loss itself (a log of 0, a
division by 0, a squared error overflowing). Otherwise the place is undetermined, and the
reading says what would decide.
"""

from __future__ import annotations

import math
import re

import numpy as np

from analyzer.model import Incident, Run, Series
from analyzer.model.results import Phase, PlaceReading
from analyzer.tags import TagRole, is_validation, layer_from_tag, role

LOSS_FUNCTION = "loss function"
ANY_LAYER = "any layer"
"""The candidate that stands for the model's layers when none is logged on its own."""
MIN_DECADES = 0.5
"""Orders of magnitude a layer's weight norm must rise before the failure to count (chosen
on the sample runs: float16 runs overflow after a rise of well under one decade)."""
RATIO = 1.5
"""How many times more orders of magnitude than any other candidate it must rise: when
every layer runs away together (a learning rate too high, inputs unnormalised), the fastest
of them is no more the producer than the rest."""
_INPUT = re.compile(r"(^|[/_\-. ])(input|inputs|batch|data|features)([/_\-. ]|$)",
                    re.IGNORECASE)

CAPTURE = "a capture of the failing step (the flight recorder), whose replay names the op"
HELD = "the replay of the capture this run holds, which names the op"


def _capture(run: Run) -> str:
    """What would decide, capture-wise: one to record, or the replay of the one the run
    holds (its code not trusted, or not found)."""
    return HELD if run.captures else CAPTURE
PER_LAYER = "per-layer gradient and weight norms logged at every step"
CHECKPOINT = "a checkpoint saved nearer the failure"


def _is_input(tag: str) -> bool:
    return role(tag) is TagRole.OTHER and bool(_INPUT.search(tag))


def _at(series: Series, step: int) -> float | None:
    """The value a series logged at ``step`` (the last one, if several); None if none."""
    hit = np.flatnonzero(series.steps == step)
    return float(series.values[hit[-1]]) if hit.size else None


class _Signature:
    """Which measures were finite, non-finite or not logged at one step."""

    def __init__(self, run: Run, incidents: list[Incident], step: int) -> None:
        self.bad: dict[str, set[str]] = {"loss": set(), "grad": set(), "weight": set(),
                                         "input": set()}
        self.good: dict[str, set[str]] = {k: set() for k in self.bad}
        self.bad_layers: dict[str, set[str]] = {"grad": set(), "weight": set()}
        self.good_layers: dict[str, set[str]] = {"grad": set(), "weight": set()}
        self.loss_kinds: set[str] = set()
        for s in run.global_series:
            v = _at(s, step)
            if v is None:
                continue
            self._note(s.tag, math.isfinite(v))
        for inc in incidents:
            if inc.aligned and inc.earliest_step == step:
                self._note(inc.tag, False)
                if self._measure(inc.tag) == "loss":
                    self.loss_kinds.add(inc.kind)

    @staticmethod
    def _measure(tag: str) -> str | None:
        r = role(tag)
        if r is TagRole.LOSS:
            return None if is_validation(tag) else "loss"
        if r.is_gradient:
            return "grad"
        if r is TagRole.LAYER_WEIGHT or tag.startswith("checkpoint/"):
            return "weight"
        return "input" if _is_input(tag) else None

    def _note(self, tag: str, finite: bool) -> None:
        measure = self._measure(tag)
        if measure is None:
            return
        (self.good if finite else self.bad)[measure].add(tag)
        layer = layer_from_tag(tag)
        if layer is not None and measure in ("grad", "weight"):
            (self.good_layers if finite else self.bad_layers)[measure].add(layer)

    def state(self, measure: str) -> str:
        if self.bad[measure]:
            return "non-finite"
        return "finite" if self.good[measure] else "not logged"

    def phase(self) -> Phase | None:
        loss, grad, weight = self.state("loss"), self.state("grad"), self.state("weight")
        if self.bad["input"]:
            return "input"
        if loss == "non-finite":
            return "forward"
        if loss == "finite" and grad == "non-finite":
            return "backward"
        if loss == "finite" and grad == "finite" and weight == "non-finite":
            return "update"
        return None


def _growth(run: Run, layer: str, step: int) -> tuple[float, str] | None:
    """The most orders of magnitude one of the layer's weight norms rose before ``step``.

    Gradient norms are left out: when the loss runs away, every layer's gradient grows with
    it, and the fastest is not the producer (on the sample runs it named an upstream layer
    each time); a weight norm that runs away is the layer's own."""
    from analyzer.rules.signals import growth

    best: tuple[float, str] | None = None
    for s in run.global_series:
        if layer_from_tag(s.tag) != layer or role(s.tag) is not TagRole.LAYER_WEIGHT:
            continue
        keep = s.steps < step
        g = growth(s.steps[keep], s.values[keep].astype(np.float64))
        if g is not None and (best is None or g.decades > best[0]):
            best = (g.decades, f"{s.tag} rose {g.decades:.1f} orders of magnitude from step "
                               f"{g.onset_step} to {g.end_step}")
    return best


_LIMITS = {"float16": 65504.0, "torch.float16": 65504.0, "half": 65504.0}
NEAR_LIMIT = 0.1
"""A weight within a tenth of its dtype's largest finite value is close to overflowing."""


def _from_checkpoints(run: Run, step: int, layers: list[str]) -> tuple[str, str] | None:
    """The one candidate layer a save singles out: the only one non-finite in the first
    non-finite save (at the failure or the step after it) while the others are finite, or
    the only one whose weights in the last finite save were near their dtype's limit."""
    history = run.checkpoints
    if history is None or len(layers) < 2:
        return None
    first = history.first_nonfinite
    if first is not None and first < len(history.scans):
        scan = history.scans[first]
        if scan.step is not None and step <= scan.step <= step + 1:
            bad = {ls.layer for ls in scan.layers if ls.stats.nonfinite} & set(layers)
            good = {ls.layer for ls in scan.layers if not ls.stats.nonfinite} & set(layers)
            if len(bad) == 1 and good:
                (layer,) = bad
                return layer, (f"the first non-finite save (step {scan.step}) holds NaN or "
                               f"Inf in {layer} only; {', '.join(sorted(good)[:3])} finite")
    last = history.last_finite
    if last is None or last >= len(history.scans):
        return None
    scan = history.scans[last]
    dtypes = {t.name: t.dtype for t in scan.tensors}
    near = []
    for ls in scan.layers:
        limit = min((_LIMITS.get(dtypes.get(n, ""), math.inf) for n in ls.tensors),
                    default=math.inf)
        if ls.layer in layers and ls.stats.abs_max >= NEAR_LIMIT * limit:
            near.append((ls.layer, ls.stats.abs_max, limit))
    if len(near) == 1:
        layer, top, limit = near[0]
        return layer, (f"in the last finite save (step {scan.step}) {layer} reaches "
                       f"{top:.3g}, {top / limit:.0%} of its dtype's largest value")
    return None


def _logged_layers(run: Run) -> set[str]:
    return {layer for s in run.global_series
            if role(s.tag) in (TagRole.LAYER_GRAD, TagRole.LAYER_WEIGHT)
            and (layer := layer_from_tag(s.tag)) is not None}


def _would_decide(run: Run, step: int) -> tuple[str, ...]:
    wanted = [_capture(run)]
    if not _logged_layers(run):
        wanted.append(PER_LAYER)
    saves = run.checkpoints.saves if run.checkpoints is not None else ()
    finite = [sv.step for sv in saves
              if sv.step is not None and sv.step < step and not sv.nonfinite_tensors]
    if not finite or step - max(finite) > 1:
        last = f" (the last one before it is at step {max(finite)})" if finite else ""
        wanted.append(CHECKPOINT + last)
    return tuple(wanted)


def _names(places: list[str]) -> str:
    return ", ".join(places[:-1]) + f" and {places[-1]}" if len(places) > 1 else places[0]


def read_place(run: Run, incidents: list[Incident],
               incident: Incident | None) -> PlaceReading | None:
    """The place of the run's first non-finite value, or None when nothing went
    non-finite."""
    if incident is None:
        return None
    if incident.step is None or not incident.aligned:
        return PlaceReading(kind="undetermined", step=incident.step,
                            candidates=(LOSS_FUNCTION, ANY_LAYER),
                            decided_by="the first non-finite value is not placed on the "
                                       "run's global step", would_decide=(_capture(run),))
    step = incident.earliest_step
    assert step is not None
    sig = _Signature(run, incidents, step)
    phase = sig.phase()
    evidence = [f"at step {step}: loss {sig.state('loss')}, gradients {sig.state('grad')}, "
                f"weights {sig.state('weight')}"]
    if phase == "input":
        tags = sorted(sig.bad["input"])
        return PlaceReading(kind="input_data", phase=phase, step=step,
                            decided_by=f"input-data tags non-finite: {', '.join(tags[:3])}",
                            evidence=tuple(evidence))
    if phase == "update":
        layers = sorted(sig.bad_layers["weight"])
        return PlaceReading(
            kind="optimizer_update", layer=layers[0] if len(layers) == 1 else None,
            phase=phase, step=step, evidence=tuple(evidence),
            decided_by="loss and gradients finite at the step, weights non-finite after "
                       f"the update ({', '.join(layers[:6]) or 'a checkpoint'})")
    if phase == "backward":
        # A gradient made non-finite in one layer's backward spreads to the layers before
        # it; with no layer's gradient finite, the loss's own backward fits as well.
        candidates = sorted(sig.bad_layers["grad"])
        if not candidates or not sig.good_layers["grad"] - sig.bad_layers["grad"]:
            candidates.insert(0, LOSS_FUNCTION)
    else:
        candidates = [LOSS_FUNCTION, *sorted(_logged_layers(run) | sig.bad_layers["grad"]
                                             | sig.bad_layers["weight"])]
    if len(candidates) == 1 and candidates[0] == LOSS_FUNCTION:
        candidates.append(ANY_LAYER)  # no layer is logged on its own
    return _break_tie(run, step, phase, candidates, sig, evidence)


def _break_tie(run: Run, step: int, phase: Phase | None, candidates: list[str],
               sig: _Signature, evidence: list[str]) -> PlaceReading:
    layers = [c for c in candidates if c not in (LOSS_FUNCTION, ANY_LAYER)]
    if len(candidates) == 1 and layers:
        return PlaceReading(kind="layer", layer=layers[0], phase=phase, step=step,
                            evidence=tuple(evidence),
                            decided_by=f"the only layer non-finite at step {step}; the "
                                       "others logged finite values")
    grown = sorted(((g, layer) for layer in layers if (g := _growth(run, layer, step))),
                   key=lambda t: -t[0][0])
    if grown:
        (top, why), layer = grown[0]
        rest = grown[1][0][0] if len(grown) > 1 else 0.0
        if top >= MIN_DECADES:
            evidence.append(why)
        if top >= MIN_DECADES and top >= RATIO * rest:
            more = f"{top / rest:.1f} times as many as" if rest > 0 else "while"
            return PlaceReading(kind="layer", layer=layer, phase=phase, step=step,
                                evidence=tuple(evidence),
                                decided_by=f"growth before the failure: {why}, {more} "
                                           "any other layer's")
    saved = _from_checkpoints(run, step, layers)
    if saved is not None:
        layer, why = saved
        evidence.append(why)
        return PlaceReading(kind="layer", layer=layer, phase=phase, step=step,
                            evidence=tuple(evidence), decided_by=f"checkpoints: {why}")
    if phase == "forward" and sig.loss_kinds & {"+inf", "-inf"}:
        kind = "/".join(sorted(sig.loss_kinds & {"+inf", "-inf"}))
        return PlaceReading(kind="loss_function", phase=phase, step=step,
                            evidence=tuple(evidence),
                            decided_by=f"the loss is {kind}, not nan, and no layer's weight "
                                       "norm out-grew the others' before it: made in the "
                                       "loss itself")
    where = {"forward": "the forward pass or the loss", "backward": "the backward pass"}
    said = where.get(phase or "", "the step")
    return PlaceReading(kind="undetermined", candidates=tuple(candidates), phase=phase,
                        step=step, evidence=tuple(evidence), would_decide=_would_decide(run,
                                                                                      step),
                        decided_by=f"{_names(candidates)} fit equally: the values logged at "
                                   f"step {step} point to {said}, and no layer's weight norm "
                                   "out-grew the others' before it")
