"""Mathematical faults a replay pins to one op: log of zero, division by zero, sqrt at zero.

Without a capture or an anomaly message each rule reads its signature in the logged curves
(:func:`analyzer.rules.evidence.onset`): what went non-finite first, its kind, and the loss's
course before it. Such a finding is never ``high``, and its evidence says what it lacks."""

from __future__ import annotations

from typing import Any

from analyzer.model import Evidence, Finding, Location
from analyzer.rules import evidence_sudden
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import (
    MIN_PRIOR,
    Onset,
    RunEvidence,
    gradient_rose,
    lacking,
    rose,
    saturated,
)
from analyzer.wording import step_words

_LOG_OPS = {"log", "log2", "log10", "log1p", "log_", "xlogy", "special_xlogy"}
_DIV_OPS = {"div", "div_", "true_divide", "reciprocal", "reciprocal_", "floor_divide",
            "remainder", "fmod"}
_ROOT_OPS = {"sqrt", "rsqrt", "pow", "norm", "linalg_vector_norm", "cdist", "frobenius_norm",
             "std", "var"}


def _op_names(op: Any) -> set[str]:
    """What the op computes: for a backward op, the forward op it differentiates (the div
    inside SqrtBackward is the derivative of a sqrt, not a division in the model)."""
    if op.phase == "backward" and op.forward_op:
        return {str(op.forward_op).split("::")[-1]}
    return {n.split("::")[-1] for n in op.names}


def _source(op: Any) -> Location | None:
    if not op.source:
        return None
    file, _, line = str(op.source).rpartition(":")
    return Location(file, line=int(line)) if line.isdigit() else Location(str(op.source))


def _op_evidence(ev: RunEvidence, op: Any) -> list[Evidence]:
    replay = ev.replay
    where = f" in {op.module}" if op.module else ""
    inputs = "; ".join(f"input {k}: {s.brief()}" for k, s in enumerate(op.inputs))
    out = [Evidence(f"replay of step {replay.step}: {op.phase} op {op.op}{where} turned finite "
                    f"inputs into {op.outputs[0].kind if op.outputs else 'non-finite'} output",
                    location=_source(op), step=replay.step, subject=op.module or op.op,
                    tensor=op.parameter)]
    if inputs:
        out.append(Evidence(inputs, step=replay.step, subject=op.op))
    if op.source_line:
        out.append(Evidence(f"source: {op.source_line.strip()}", location=_source(op)))
    out.append(Evidence(f"differential replay: {replay.verdict.summary}", step=replay.step))
    return out


def _anomaly(ev: RunEvidence, functions: tuple[str, ...]) -> list[Evidence]:
    out = []
    for e in ev.events("nonfinite"):
        fn = str(e.detail.get("function", ""))
        if fn and fn.startswith(functions):
            frames = e.detail.get("user_frames") or []
            where = f"; created at {frames[-1]}" if isinstance(frames, list) and frames else ""
            when = f" {step_words(e.step, form='at')}" if e.step is not None else ""
            out.append(Evidence(f"autograd anomaly{when}: {fn} returned non-finite "
                                f"values{where}", location=e.location, step=e.step,
                                subject=fn))
    return out


def _math_rule(r: Rule, ev: RunEvidence, ops: set[str], anomaly: tuple[str, ...],
               backward_only: bool = False) -> list[Finding]:
    replay = ev.replay
    op = replay.op if replay is not None else None
    if op is not None and _op_names(op) & ops and (not backward_only or op.phase == "backward"):
        math = replay.verdict.kind == "math-fault" or op.float64_finite is False
        touches_zero = any(s.absmin == 0 or (s.min is not None and s.min <= 0)
                           for s in op.inputs)
        confidence = "high" if math and op.inputs_finite else "medium"
        score = 0.6 + 0.2 * math + 0.2 * touches_zero
        return [r.finding(confidence, _op_evidence(ev, op), score)]
    found = _anomaly(ev, anomaly)
    if found and ev.failed:
        return [r.finding("medium", found, 0.5)]
    return _posthoc(r, ev)


def _posthoc(r: Rule, ev: RunEvidence) -> list[Finding]:
    """The rule's signature in the logged curves alone, when no op names the fault; a NaN
    out of a steady run is left open among the causes it fits (rules.evidence_sudden)."""
    o = ev.onset
    if o is None or ev.replay is not None:
        return []
    signature = _SIGNATURES.get(r.name)
    said = signature(ev, o) if signature is not None else None
    if said is None:
        return evidence_sudden.findings(r, ev)
    op = {"log-of-zero": "a log", "division-by-zero": "a division",
          "sqrt-at-zero-backward": "a sqrt or norm's backward"}[r.name]
    evidence = [Evidence(said, location=ev.loss.location_at(o.step) if ev.loss else None,
                         step=o.step, subject=o.tag),
                Evidence(lacking(o.step, op, ev.unit), step=o.step)]
    return [r.finding("medium" if r.name != "sqrt-at-zero-backward" else "low", evidence, 0.5)]


def _when(o: Onset, unit: str = "step") -> str:
    return step_words(o.step, form="at", unit=unit)


def _saturated_log(ev: RunEvidence, o: Onset) -> str | None:
    """Probabilities saturated (loss near 0) just before the failure: log(0) is next."""
    if not saturated(o):
        return None
    low = float(o.prior[-MIN_PRIOR:].min())
    what = f"{o.tag} became {o.loss_kind}" if o.loss_kind else f"{o.tag} went non-finite"
    return (f"the loss had fallen to {low:.2g} (probabilities saturated at 0 or 1) when "
            f"{what} {_when(o, ev.unit)}: the signature of a log of a probability that reached 0")


def _sudden_inf(ev: RunEvidence, o: Onset) -> str | None:
    """The loss jumps to +inf at once from a finite value that was not growing: x/0."""
    if (o.phase != "forward" or o.loss_kind != "+inf" or o.prior.size < MIN_PRIOR
            or rose(o.prior) or gradient_rose(ev, o.step) or saturated(o) or ev.float16):
        return None
    return (f"the loss became +inf {_when(o, ev.unit)} at once from {o.prior[-1]:.4g}, after "
            f"{o.prior.size} finite values that were not growing, nor was the gradient "
            "norm: a value divided by zero "
            "(x/0), not a growth that overflowed")


_SIGNATURES = {"log-of-zero": _saturated_log, "division-by-zero": _sudden_inf}


@rule("NF101", "log-of-zero", "log of zero (or of a negative number)",
      needs=("replay", "anomaly_log", "loss"))
def log_of_zero(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A `log` whose input reached 0 (or went negative) at the failing step, most often a
    `torch.log` applied to the output of `softmax` or `sigmoid` once a probability
    underflows to exactly 0.

    ## Why it produces NaN/Inf
    log(0) is -inf and log(x < 0) is NaN. Softmax of logits that differ by more than ~104
    (float32) gives probabilities that underflow to 0, so `log(softmax(x))` returns -inf, and
    the loss or its gradient (1/x in LogBackward) becomes Inf, then NaN.

    ## Evidence
    The replay's first non-finite op is a log (forward, or LogBackward in backward) with an
    input whose smallest magnitude is 0; float64 replay stays non-finite (a mathematical
    fault, not a precision problem). Without a capture: an autograd anomaly message naming
    `LogBackward0` in the logs; else, from the curves alone (medium), a loss that had fallen
    below 1e-3 over its last five values (saturated probabilities) before it or a gradient
    went non-finite. A NaN loss at once out of a steady, unsaturated loss fits too (a log of
    a negative number, or 0·log(0) in a hand-written entropy or BCE): low, and tied with the
    other causes of such a NaN (rules.evidence_sudden).

    ## Fix
    Compute log-probabilities in one fused, stable op instead of log of probabilities:
    ```python
    logp = torch.log_softmax(logits, dim=-1)        # not torch.log(torch.softmax(...))
    loss = torch.nn.functional.nll_loss(logp, target)
    # or simply: loss = torch.nn.functional.cross_entropy(logits, target)
    # if a log of a probability is unavoidable: torch.log(p.clamp_min(1e-12))
    ```

    ## Known false positives
    A log of a quantity that is legitimately zero on padding positions that a later mask
    removes from the loss: the replay still sees the -inf, though the run may never have
    failed there.
    """
    return _math_rule(r, ev, _LOG_OPS, ("LogBackward", "Log1PBackward", "Log2Backward",
                                        "Log10Backward", "XlogyBackward"))


@rule("NF102", "division-by-zero", "division by zero or near zero",
      needs=("replay", "anomaly_log", "loss"))
def division_by_zero(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A division whose divisor reached zero (0/0 gives NaN, x/0 gives Inf) at the failing
    step: a custom loss or normalisation that divides by a count, a norm, a sum or a
    standard deviation that can vanish.

    ## Why it produces NaN/Inf
    x/0 is ±Inf and 0/0 is NaN in IEEE arithmetic; the gradient of x/y is -x/y², which
    overflows even before y reaches exactly 0.

    ## Evidence
    The replay's first non-finite op is a division (`div`, `reciprocal`, DivBackward) whose
    divisor's smallest magnitude is 0 or tiny; float64 replay fails too. Without a capture:
    an autograd anomaly message naming `DivBackward0`; else, from the curves alone (medium),
    a loss that becomes +inf at once from a finite value, after at least five values of a
    loss and a gradient norm that were not growing, in a run not computing in float16. A
    NaN out of such a steady loss (0/0, a mean over an empty selection) is low and tied with
    nan-in-batch and log-of-zero (0 · log 0), and with zero-variance-normalisation and
    softmax-all-masked where the model may have those layers: their curves are the same
    (rules.evidence_sudden says what would tell them apart).

    ## Fix
    Keep the divisor away from zero, or guard the empty case:
    ```python
    denom = mask.sum().clamp_min(1)            # counts: at least 1
    x = x / (x.norm(dim=-1, keepdim=True) + 1e-6)   # norms: add an epsilon
    x = torch.nn.functional.normalize(x, dim=-1, eps=1e-6)
    ```

    ## Known false positives
    A division by a value that is zero only for masked-out elements: the replay reports
    the Inf even though a later `where` discards it (the backward may still turn it NaN).
    """
    return _math_rule(r, ev, _DIV_OPS, ("DivBackward", "ReciprocalBackward"))


@rule("NF103", "sqrt-at-zero-backward", "sqrt, pow or norm at zero in backward",
      needs=("replay", "anomaly_log", "loss"))
def sqrt_at_zero(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A forward pass that stays finite while its backward produces Inf or NaN at a `sqrt`,
    fractional `pow` or `norm` evaluated at exactly zero (a distance between identical
    points, the norm of a zero vector, the std of a constant).

    ## Why it produces NaN/Inf
    d/dx sqrt(x) = 1/(2·sqrt(x)) is Inf at 0, and the norm's gradient x/‖x‖ is 0/0 = NaN for
    a zero vector. The forward value (0) is fine, so logged losses stay finite until the
    update writes NaN into the weights.

    ## Evidence
    The replay's forward is finite and the first non-finite op is in backward, with an
    autograd node whose forward op is sqrt/pow/norm and an input of exactly 0. Without a
    capture: an autograd anomaly message naming `SqrtBackward0`, `PowBackward` or
    `NormBackward`; else, from the curves alone (low: other backward faults look alike), a
    gradient norm non-finite at a step whose loss is finite, after a loss that moved, was
    neither growing nor saturated, with no AMP overflow skips, no float16 model and no change
    of learning rate. In a model whose attention the run names it is tied with
    softmax-all-masked (fully masked rows that the loss ignores leave the same curve).

    ## Fix
    Add an epsilon inside the root, not outside it:
    ```python
    dist = torch.sqrt(((a - b) ** 2).sum(-1) + 1e-12)   # not torch.norm(a - b, dim=-1)
    std = torch.sqrt(x.var(dim=0) + 1e-5)
    ```

    ## Known false positives
    Norms of vectors that are zero only on padding that is masked later: the non-finite
    gradient can still leak through the mask's multiplication (0·Inf = NaN), so this is
    rarely a false alarm.
    """
    return _math_rule(r, ev, _ROOT_OPS, ("SqrtBackward", "PowBackward", "NormBackward",
                                         "LinalgVectorNormBackward", "RsqrtBackward",
                                         "StdBackward", "VarBackward"), backward_only=True)


RULES = (log_of_zero, division_by_zero, sqrt_at_zero)
