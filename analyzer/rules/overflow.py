"""Overflow in the forward pass seen from the loss alone: exp of a large value in float32,
and a float16 reduction whose terms are finite but whose sum is not."""

from __future__ import annotations

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence, lacking
from analyzer.rules.evidence_loss import finite_until, float16_exact, inf_jump
from analyzer.rules.evidence_precision import precision

JUMP_FROM = 1e6
"""The largest last finite loss that counts as a jump to +inf: a runaway that climbs
through 1e6, 1e12, 1e20 before overflowing is an optimisation failure (the learning-rate and
initialisation rules), not one op. Chosen on the tune half (the exp overflows' last finite
losses are 3.4 and 1.1e5; runaways leave 4e8 and more)."""
BIG_GRADIENT = 10.0
"""A total gradient norm above this just before the jump: the exponent's input was large."""
GRADIENT_RUNAWAY = 1e6
"""A gradient norm past this before the jump is a runaway that the gradient and
learning-rate rules explain; the exp then only finishes it (tune: the exp overflows' last
gradient norms are 33 and 6,580)."""
FP16_MAX = 65504.0
EXP_OPS = {"exp", "exp_", "exp2", "expm1", "cosh", "sinh", "pow", "softplus", "logsumexp"}
REDUCTION_OPS = {"sum", "mean", "norm", "linalg_vector_norm", "frobenius_norm", "var", "std",
                 "var_mean", "std_mean", "mse_loss", "cumsum", "nansum", "prod", "dot"}


def _replayed_op(ev: RunEvidence) -> set[str] | None:
    """The forward op a capture's replay found non-finite first (None: no replay op)."""
    replay = ev.replay
    op = replay.op if replay is not None else None
    if op is None:
        return None
    names = {str(op.forward_op)} if op.phase == "backward" and op.forward_op else set(op.names)
    return {n.split("::")[-1] for n in names}


def _others_finite(ev: RunEvidence, step: int) -> tuple[bool, list[Evidence]]:
    """Whether what is logged beside the loss stayed finite before ``step`` (the loss went
    first), with the facts that say so."""
    facts = []
    grads = finite_until(ev.grad_norm, step)
    if grads is False:
        return False, []
    if grads:
        assert ev.grad_norm is not None
        facts.append(Evidence(f"the total gradient norm is finite at every logged step "
                              f"before {step}: the loss went non-finite first",
                              subject=ev.grad_norm.tag))
    weights = [finite_until(c, step) for c in ev.layer_weight_norms.values()]
    if False in weights:
        return False, []
    if weights:
        facts.append(Evidence(f"every per-layer weight norm is finite before step {step}: "
                              "the weights did not carry the non-finite value in",
                              subject="weight norms"))
    return True, facts


@rule("NF104", "exp-overflow", "exp of a large value overflows float32 to +inf",
      needs=("loss",))
def exp_overflow(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A loss that jumps from a moderate finite value straight to +inf in a float32 run while
    the gradients and weights logged before it stay finite: the signature of `torch.exp`
    (or a naive softplus `log(1 + exp(x))`, a naive log-sum-exp `log(exp(x).sum())`,
    `cosh`, `sinh`, a `pow` with a large exponent) applied to a value that grew too large.

    ## Why it produces NaN/Inf
    exp(x) exceeds float32's largest value (3.4e38) once x passes ~88.7 (float16: ~11.1),
    and returns +inf. The loss is +inf at once, with no runaway before it; its gradient
    (inf * 0, inf - inf) is NaN and the update writes NaN into every weight. A Poisson or
    exponential likelihood whose rate is `exp(output)` often pushes the loss far below zero
    first, which drives the log-rate up until it overflows.

    ## Evidence
    The training loss's first non-finite value is +inf, its last finite value is below 1e6
    (a jump, not a climb), its finite values are not float16 numbers (the run computes the
    loss in float32), and the gradient norm and weight norms, where logged, are finite
    before it, and a precursor says the exponent's input grew: the loss running negative, or
    a gradient norm above 10 just before (a bare jump is as much a division by zero; a
    gradient norm past 1e6 is a runaway, left to the gradient and learning-rate rules).
    Without a capture the op itself is not seen (medium); a capture's replay whose first
    non-finite op is exp, cosh, sinh, pow or softplus makes it high, and one that names
    another op rules this cause out.

    ## Fix
    Stay in log space, or subtract the maximum before exponentiating:
    ```python
    loss = torch.nn.functional.poisson_nll_loss(log_rate, counts, log_input=True)
    lse = torch.logsumexp(scores, dim=1)                 # not torch.log(torch.exp(s).sum(1))
    y = torch.nn.functional.softplus(x)                  # not torch.log(1 + torch.exp(x))
    rate = torch.exp(log_rate.clamp(max=20.0))           # when exp itself is needed
    ```

    ## Known false positives
    A division by exactly zero with nothing else logged gives the same jump to +inf; a
    log of zero in the loss (-log(0) = +inf) does too, when the gradients were also large;
    a capture's replay names the op.
    """
    jump = inf_jump(ev)
    if jump is None or abs(jump.last_value) >= JUMP_FROM or len(jump.finite) < 2:
        return []
    if float16_exact(jump.finite):
        return []
    replayed = _replayed_op(ev)
    if replayed is not None and not replayed & EXP_OPS:
        return []  # the capture saw another op fail first: its rule names it
    ok, facts = _others_finite(ev, jump.step)
    if not ok:
        return []
    curve = jump.curve
    evidence = [Evidence(f"the loss jumps from {jump.last_value:.4g} at step {jump.last_step} "
                         f"to +inf at step {jump.step}, with no climb before it",
                         location=curve.location_at(jump.step), step=jump.step,
                         subject=curve.tag, value=jump.last_value), *facts]
    lowest = float(np.min(jump.finite))
    negative = lowest < -1.0
    if negative:
        evidence.append(Evidence(f"the loss ran negative before the jump (down to "
                                 f"{lowest:.4g}): a likelihood with an exp(.) rate is "
                                 "unbounded below as the rate's exponent grows",
                                 subject=curve.tag, value=lowest))
    big_grad = False
    if ev.grad_norm is not None:
        before = ev.grad_norm.before(jump.step)
        if len(before) and float(np.max(before.values)) > GRADIENT_RUNAWAY:
            return []
        if len(before) and float(before.values[-1]) > BIG_GRADIENT:
            big_grad = True
            evidence.append(Evidence(f"the gradient norm before the jump is "
                                     f"{before.values[-1]:.4g}: the exponent's input was "
                                     "moving fast", step=int(before.steps[-1]),
                                     subject=ev.grad_norm.tag,
                                     value=float(before.values[-1])))
    if not (negative or big_grad or replayed):
        return []  # a bare jump to +inf is as much a division by zero as an exp
    confidence = "medium"
    if replayed:
        confidence = "high"
        evidence.append(Evidence(f"the capture's replay: {'/'.join(sorted(replayed & EXP_OPS))} "
                                 "is the first op to turn finite inputs non-finite",
                                 step=ev.replay.step, subject="replay"))
    else:
        evidence.append(Evidence(lacking(jump.step, "the exp, or the division that ties with "
                                         "it", ev.unit), step=jump.step))
    return [r.finding(confidence, evidence, 0.5 + 0.2 * negative + 0.2 * big_grad
                      + 0.1 * bool(replayed))]


@rule("NF304", "fp16-reduction-overflow",
      "a float16 sum, mean or norm overflows though its terms are finite", needs=("loss",))
def fp16_reduction_overflow(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A loss computed in float16 (its logged values are all float16 numbers) that jumps to
    +inf from a value far below 65504, with the gradients and weights finite before it:
    a reduction (`sum`, a `mean` written as sum / n, `norm`, a variance) over many finite
    terms whose total passes float16's largest value.

    ## Why it produces NaN/Inf
    float16's largest finite value is 65504. A sum of 256 squared errors of 250 each is
    64,000; one more batch a little worse overflows to +inf though every term, and the mean
    the code meant, is small. The backward of the +inf is NaN and the update writes it into
    the weights. Autocast runs reductions in float32; a bare `.half()` model does not.

    ## Evidence
    The training loss's finite values are all exactly representable in float16; its first
    non-finite value is +inf; its last finite value is below 65504 (the elements are
    finite); the gradient and weight norms, where logged, are finite before the jump
    (medium; checkpoints whose weights are float16 agree, though the loss's own values are
    what show the reduction ran in float16). A capture's replay whose first non-finite op
    is a sum, mean, norm, variance or mse_loss makes it high; one that names another op rules
    this cause out.

    ## Fix
    Reduce in float32, or divide before summing:
    ```python
    loss = (out.float() - y.float()).pow(2).mean()       # accumulate in float32
    loss = torch.nn.functional.mse_loss(out, y)          # a fused mean, not sum() / n
    norm = torch.linalg.vector_norm(x, dtype=torch.float32)
    # better: keep float32 parameters and use torch.autocast with a GradScaler
    ```

    ## Known false positives
    A float16 activation that overflows by itself (an unscaled attention score, a large
    matmul) can also end in a +inf loss; the fp16-overflow rule names it from a capture.
    """
    jump = inf_jump(ev)
    if jump is None or abs(jump.last_value) >= FP16_MAX or len(jump.finite) < 5:
        return []
    if not float16_exact(jump.finite):
        return []
    replayed = _replayed_op(ev)
    if replayed is not None and not replayed & REDUCTION_OPS:
        return []  # the capture saw another op overflow first: fp16-overflow names it
    ok, facts = _others_finite(ev, jump.step)
    if not ok:
        return []
    curve = jump.curve
    peak = float(np.max(np.abs(jump.finite)))
    evidence = [Evidence(f"every finite loss ({len(jump.finite)} points) is a float16 "
                         "number: the loss is computed in float16", subject=curve.tag),
                Evidence(f"the loss jumps from {jump.last_value:.4g} at step {jump.last_step} "
                         f"to +inf at step {jump.step}, far below float16's largest value "
                         f"{FP16_MAX:g}: a reduction over many finite terms overflowed",
                         location=curve.location_at(jump.step), step=jump.step,
                         subject=curve.tag, value=jump.last_value, ratio=peak / FP16_MAX),
                *facts]
    if replayed:
        evidence.append(Evidence(f"the capture's replay: "
                                 f"{'/'.join(sorted(replayed & REDUCTION_OPS))} is the first op "
                                 "to turn finite inputs non-finite", step=ev.replay.step,
                                 subject="replay"))
        return [r.finding("high", evidence, 0.9)]
    weights = precision(ev).weights
    if weights is not None:
        evidence.append(weights.evidence())
    evidence.append(Evidence(lacking(jump.step, "the reduction that overflowed", ev.unit),
                             step=jump.step))
    return [r.finding("medium", evidence, 0.7)]


RULES = (exp_overflow, fp16_reduction_overflow)
