"""A NaN out of a steady run, read once for the rules that can explain it.

A run whose loss and gradient norm were finite and not growing, with no AMP overflow skips
and no change of learning rate, and then at one step a NaN loss (or a NaN gradient under a
finite loss), was not driven there by a growth: one op met an input it is undefined at.
The curves alone say which phase it was in, not which op. What is left open is a short
list, which the model's make-up narrows:

- forward, a NaN loss: a NaN already in the batch (nan-in-batch), a 0/0 such as a mean over
  an empty selection (division-by-zero), a log of a negative number or a 0·log(0) term
  (log-of-zero), a normalisation of a zero-variance feature
  (needs a normalisation layer), a softmax over a row masked entirely to -inf (needs
  attention, when the masked row reaches the loss);
- backward, a NaN gradient under a finite loss: a sqrt or norm at exactly 0
  (sqrt-at-zero-backward), a fully masked softmax row that the loss ignores (needs
  attention: the forward NaN stays on positions the loss skips, and softmax's backward
  multiplies it in).

A cause that needs a kind of module is ruled out when the run named all its modules
(per-layer tags, checkpoint tensors, a printed model down to torch.nn's leaf modules, a
framework configuration) and none is of that kind. When nothing named them it
stays open but ranks below the causes that need no module: it rests on a layer nobody saw.
Presence alone does not raise a cause above the others (an attention model can as well be
fed a NaN), so the causes a model allows stay tied; a normalisation recorded with eps 0
decides for it. What would decide a tie is named by :meth:`Sudden.decide`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.anatomy import described_whole
from analyzer.rules.base import Rule
from analyzer.rules.evidence import (
    ANOMALY,
    MIN_PRIOR,
    RECORD_ONE,
    Onset,
    RunEvidence,
    gradient_rose,
    rose,
    saturated,
)
from analyzer.rules.evidence_precision import precision

LR_CHANGE = 2.0
"""A learning rate this many times higher or lower at the failure than the median before it
changed the dynamics: a schedule's doing, not a sudden fault (learning-rate-jump's case)."""

NEEDS = {"zero-variance-normalisation": "normalisation", "softmax-all-masked": "attention"}
"""The module kind without which a candidate cannot have happened."""

_FORWARD = ("nan-in-batch", "division-by-zero", "log-of-zero", "zero-variance-normalisation",
            "softmax-all-masked")
_BACKWARD = ("sqrt-at-zero-backward", "softmax-all-masked")

_DECIDE = {
    "nan-in-batch": "`assert torch.isfinite(x).all() and torch.isfinite(y).all()` on each "
                    "batch before the forward",
    "division-by-zero": "the divisor's value at that step (a count such as `mask.sum()`, "
                        "a norm or a std that can be 0)",
    "log-of-zero": "the smallest input of each log at that step (a probability of 0 in an "
                   "x·log(x) term, or 1 - p below 0)",
    "zero-variance-normalisation": "the variance the norm saw (`x.var(-1).min()`) and its "
                                   "eps",
    "softmax-all-masked": "the number of fully masked rows, `mask.all(-1).sum()` (True = "
                          "masked)",
    "sqrt-at-zero-backward": "an anomaly traceback naming SqrtBackward0/NormBackward",
}


@dataclass(frozen=True)
class Sudden:
    """The signature of a sudden fault and the causes it leaves open."""

    onset: Onset
    candidates: tuple[str, ...]
    """Rule names the signature and the model's make-up leave, in a fixed order."""
    ruled_out: tuple[str, ...]
    """Why each cause that needs a kind of module was ruled out, in words."""
    eps_zero: str | None
    """A normalisation component recorded with eps 0, in words: it decides the case."""
    unseen: tuple[str, ...] = ()
    """Candidates left open only because the run did not name its modules."""
    logged: tuple[str, ...] = ()
    """Which of ``grad_norm`` and ``lr`` the run logged (what its steadiness rests on)."""
    unit: str = "step"
    """What the onset's number counts (:attr:`RunEvidence.unit`)."""

    @property
    def step(self) -> int:
        return self.onset.step

    def describe(self) -> str:
        o = self.onset
        went = ("the loss became NaN" if o.phase == "forward"
                else f"{o.tag} went non-finite under a finite loss")
        grad = ", nor was the gradient norm" if "grad_norm" in self.logged else ""
        lr = " and no change of learning rate" if "lr" in self.logged else ""
        return (f"{went} at {self.unit} {o.step} at once, after {o.prior.size} finite loss values "
                f"that were not growing{grad}, with no AMP overflow skip{lr}: a sudden fault "
                f"in the {o.phase} pass, not a growth")

    def decide(self) -> str:
        """What would tell the open candidates apart, in words."""
        others = "; ".join(f"{name}: {_DECIDE[name]}" for name in self.candidates)
        best = [n for n in self.candidates if n not in self.unseen] or list(self.candidates)
        head = (f"undetermined between {' and '.join(best)} on the curves alone"
                if len(best) > 1 else f"{best[0]} fits best")
        rest = [n for n in self.candidates if n not in best]
        if rest:
            head += (f" ({' and '.join(rest)} would fit as well if the model has the layers "
                     "they need: the run names none of its modules)")
        return (f"{head}; a capture of {self.unit} {self.step} (analyzer.capture's FlightRecorder) "
                f"would name the op, else check {others}")


def _steady(ev: RunEvidence, o: Onset) -> bool:
    if o.prior.size < MIN_PRIOR or rose(o.prior) or gradient_rose(ev, o.step) or saturated(o):
        return False
    reading = precision(ev)
    if reading.scaler.skips or reading.half_model:
        return False
    lr = ev.lr
    if lr is not None:
        before = lr.before(o.step + 1).values
        before = before[np.isfinite(before) & (before > 0)]
        if before.size >= 2:
            ratio = float(before[-1]) / float(np.median(before[:-1]))
            if not 1 / LR_CHANGE <= ratio <= LR_CHANGE:
                return False
    return True


def names_known(ev: RunEvidence) -> bool:
    """Whether the run named all its modules (so a kind's absence means something):
    per-layer tags, a checkpoint's model tensors, a model description in its logs that goes
    down to torch.nn's leaf modules, or a framework configuration (whose model type fixes
    the architecture). A summary that stops at the user's own classes names too little."""
    if ev.layer_grad_norms or ev.layer_weight_norms:
        return True
    if any(c.source.startswith("config") for c in ev.anatomy.components):
        return True  # a framework's model type fixes its architecture
    if described_whole(ev.result):
        return True
    history = ev.result.run.checkpoints
    return history is not None and any(t.group == "model" for s in history.scans
                                       for t in s.tensors)


def _eps_zero(ev: RunEvidence) -> str | None:
    zero = ev.anatomy.eps_zero()
    if zero:
        return zero[0].brief()
    return None


def sudden(ev: RunEvidence) -> Sudden | None:
    """The sudden-fault reading of a run without a replay; None when the run was not
    steady before its failure, or failed another way (+inf, -inf, an update first)."""
    o = ev.onset
    if o is None or ev.replay is not None or o.prior.size < MIN_PRIOR:
        return None
    if o.phase == "forward" and o.loss_kind == "nan":
        open_: tuple[str, ...] = _FORWARD
    elif o.phase == "backward" and float(np.ptp(o.prior[-3:])) > 0.0:
        open_ = _BACKWARD  # a loss stuck at one value is saturation, another story
    else:
        return None
    if not _steady(ev, o):
        return None
    known = names_known(ev)
    keep: list[str] = []
    out: list[str] = []
    unseen: list[str] = []
    for name in open_:
        kind = NEEDS.get(name)
        if kind is not None and not ev.anatomy.has(kind):
            if known:
                out.append(f"{name}: the run names its modules and none is of kind {kind}")
                continue
            unseen.append(name)
        keep.append(name)
    logged = tuple(n for n, c in (("grad_norm", ev.grad_norm), ("lr", ev.lr)) if c is not None)
    return Sudden(o, tuple(keep), tuple(out), _eps_zero(ev) if o.phase == "forward" else None,
                  tuple(unseen), logged, ev.unit)


def weight(s: Sudden, name: str) -> tuple[str, float] | None:
    """A candidate's confidence and score. Every candidate the curve and the model allow
    scores the same, so that the report leaves them tied; one that needs a module the run
    did not show (it named none) rests on a piece of evidence the others do not need, and
    scores lower. An eps-0 normalisation decides the case."""
    if name not in s.candidates:
        return None
    if s.eps_zero is not None:
        return ("medium", 0.7) if name == "zero-variance-normalisation" else ("low", 0.3)
    return ("low", 0.4) if name in s.unseen else ("low", 0.5)


def evidence(ev: RunEvidence, s: Sudden, name: str) -> list[Evidence]:
    """What a candidate's finding rests on, what it lacks and what would decide it."""
    o = s.onset
    loss = ev.loss
    out = [Evidence(s.describe(), location=loss.location_at(o.step) if loss else None,
                    step=o.step, subject=o.tag)]
    kind = NEEDS.get(name)
    if kind is not None:
        parts = ev.anatomy.of(kind)
        out.append(Evidence(f"the model has {kind}: {parts[0].brief()}" if parts else
                            f"the run does not name its modules: {kind} is possible, not seen",
                            subject=parts[0].name if parts else None))
    if s.eps_zero is not None:
        out.append(Evidence(f"a normalisation with eps 0: {s.eps_zero}"))
    out.extend(Evidence(f"ruled out: {why}") for why in s.ruled_out)
    out.append(Evidence(f"not seen: the op that made the first NaN; {s.decide()}. "
                        f"{RECORD_ONE}, or {ANOMALY}", step=o.step))
    return out


def findings(r: Rule, ev: RunEvidence) -> list[Finding]:
    """The rule's finding when the sudden reading leaves it open, else none."""
    s = sudden(ev)
    if s is None:
        return []
    w = weight(s, r.name)
    if w is None:
        return []
    return [r.finding(w[0], evidence(ev, s, r.name), w[1])]
