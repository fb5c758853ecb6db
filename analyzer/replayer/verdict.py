"""The differential verdict: what the float64 pass and the repeated passes say.

    bad-input         the batch, the parameters or the optimizer state were already
                      non-finite when the step began: the fault lies upstream
    not-reproducible  the same configuration, run again, does not fail the same way
                      (the repeated passes disagree, or the run's own configuration stays
                      finite in replay although the run failed there)
    math-fault        the producing op is non-finite on its inputs in float64 too:
                      log(0), x/0, sqrt(<0), 0*inf
    range-overflow    only the run's dtype goes non-finite: overflow or underflow; also a
                      replay cast to a wider dtype (``--dtype float64``) that stays finite
    finite            nothing went non-finite and the run did not say it should
    undecided         the run's configuration fails but the float64 pass could not run, or
                      a replay cast to a dtype no wider than the run's stays finite

The first judge is the producing op itself, run again on its very inputs
widened to float64: an op that is still non-finite is undefined there (a math
fault, even when an earlier underflow made the 0 it fails on: the verdict then says
both, the op undefined at the values it received and the step that, run in float64
from the start, never makes them); one that turns finite overflowed the dtype.
Without such an op (the first non-finite value came from a non-finite constant), the
whole step in float64 decides: non-finite in the same or an earlier phase is a math
fault, otherwise a range overflow. A mask's -inf
is no fault (:mod:`analyzer.replayer.ops`): the op judged is the one that made NaN of it,
a softmax over a row masked entirely, which float64 cannot rescue.

A replay cast to another dtype (``cast``) is not the run's configuration: a step that
stays finite there did not fail to reproduce; if the cast dtype is wider than the run's,
the run's failure is one of its dtype's range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from analyzer.model.replays import PHASES, OpFault, PassOutcome, Phase, Verdict

_MASK_HINT = ("a row every entry of which the mask set to -inf: a softmax of it is "
              "exp(-inf - (-inf)) = NaN (a padded query that sees no key, a causal mask "
              "combined with a padding mask); keep one key visible per row, or zero the "
              "weights of rows masked entirely")

# Hints by aten op for a fault that float64 reproduces.
_MATH_HINTS = (
    ("softmax", "a softmax over a row whose every entry is -inf"),
    ("log_softmax", "a log-softmax over a row whose every entry is -inf"),
    ("log", "log of 0 or of a negative number: use log_softmax / a log-sum-exp form, "
            "or clamp the argument above a small positive value"),
    ("addcdiv", "a division by zero in the optimizer step: its denominator (for Adam "
                "sqrt(exp_avg_sq) + eps) is 0, e.g. a second moment that underflowed and an "
                "eps below the dtype's smallest number; keep float32 master weights or raise "
                "eps"),
    ("div", "division by zero: add a small positive epsilon to the denominator or mask "
            "the zero entries"),
    ("rsqrt", "1/sqrt of 0 or of a negative number: add eps inside the square root"),
    ("sqrt", "sqrt of a negative number, or its gradient 1/(2*sqrt(x)) at x = 0: clamp "
             "the argument above a small positive value"),
    ("pow", "a power of 0 or of a negative number with a negative or fractional exponent"),
    ("mul", "0 * inf: an infinite factor met a zero"),
    ("reciprocal", "1/x at x = 0"),
    ("exp", "exp of a large argument: subtract the maximum first (log-sum-exp)"),
)


def _rank(phase: Phase | None) -> int:
    return PHASES.index(phase) if phase is not None else len(PHASES)


def _hint(op: OpFault | None) -> str:
    if op is None:
        return "an operation undefined in exact arithmetic"
    if op.mask is not None:
        return _MASK_HINT
    # a backward op is best explained by the forward op it differentiates
    name = (op.forward_op or op.op.split(".")[0]).lstrip("_")
    for key, hint in _MATH_HINTS:
        if name.startswith(key) or name.startswith(f"foreach_{key}"):
            return hint
    return f"{op.op} is undefined for the values it received"


# Bits of exponent decide the range; bfloat16 has float32's range but float16's width
# for the purpose here (a wider cast means more mantissa and at least as much range).
_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def _narrowest(dtype: str | None) -> int | None:
    widths = [_WIDTH[d] for d in (dtype or "").split("+") if d in _WIDTH]
    return min(widths) if widths else None


def wider(cast: str, than: str | None) -> bool:
    """Whether ``cast`` holds every value of ``than`` (the run's dtype, "a+b" for a mix)
    with more precision: float64 over float32, float32 over float16."""
    mine, theirs = _narrowest(cast), _narrowest(than)
    return mine is not None and theirs is not None and mine > theirs


Float64 = PassOutcome | None | Callable[[], PassOutcome | None]
"""The float64 pass, or what runs it: it is run only when the verdict rests on it."""


def decide(own: Sequence[PassOutcome], instrumented: Phase | None, phase: Phase | None,
           float64: Float64, op: OpFault | None, dtype: str,
           bad_start: Sequence[str], expected: bool, *, cast: str | None = None,
           run_dtype: str | None = None) -> Verdict:
    """Judge one replay.

    ``own``: the plain passes in the run's configuration; ``instrumented``: the
    first phase whose loss, gradients or parameters the instrumented pass saw
    non-finite (comparable with ``own``); ``phase``: the first phase in which an
    op made a non-finite value (may be earlier, when the value was masked);
    ``op``: that op; ``expected``: whether the run is known to have gone
    non-finite at this step (a capture always is); ``cast``: the dtype the replay
    cast the step to, None for the run's own configuration; ``run_dtype``: the dtype
    the run computed in (its autocast dtype, else its parameters'). ``float64`` may be a
    function that runs that pass: it is called only when the verdict rests on it (not for
    bad input, a step that does not reproduce or a finite one).
    """
    if bad_start:
        return Verdict(
            "bad-input",
            "the step started from non-finite values: " + ", ".join(bad_start[:4]),
            "the fault happened before this step: a bad sample in the data, or an earlier "
            "step that wrote non-finite parameters or optimizer state",
            "check the data pipeline for the batch (NaN/Inf in the input files, a "
            "normalisation dividing by a zero std), or capture an earlier step")
    phases = [p.phase for p in own] + [instrumented]
    # A pass that raised after it went non-finite (the step's own check stopping on a NaN
    # loss) failed where it says; only an error with no non-finite value before it is noise.
    errors = [p.error for p in own if p.error and p.phase is None]
    where = ", ".join(f"{p.label}: {p.phase or 'finite'}" for p in own)
    config = f"{cast} (cast)" if cast is not None else "the run's own"
    if errors or len(set(phases)) > 1:
        return Verdict(
            "not-reproducible",
            f"the same configuration ({config}) run again does not fail the same way "
            f"({where}, instrumented: {instrumented or 'finite'})",
            "non-determinism (atomic adds, cuDNN autotuning, thread scheduling) or a "
            "hardware fault flipping bits",
            "replay again with torch.use_deterministic_algorithms(True) and "
            "torch.backends.cudnn.benchmark = False; if it still varies, run the step on "
            "another device and test the GPU's memory")
    if phases[0] is None or phase is None:
        if not expected:
            return Verdict("finite", "the step stays finite in every pass", "", "")
        if cast is not None:
            return _cast_finite(cast, run_dtype)
        return Verdict(
            "not-reproducible",
            "the step stays finite in replay although the run went non-finite here",
            "the replay differs from the run (device, kernels, library versions) or the "
            "run met non-determinism or a hardware fault",
            "replay on the run's own device with --device, compare the recorded "
            "environment with this one, and check the GPU for faults")
    verdict = _judge(phase, dtype, float64, op)
    prints = {p.fingerprint for p in own}
    if len(prints) > 1:
        verdict = dataclasses.replace(verdict, summary=verdict.summary + (
            "; the repeated passes agree on where but differ bit for bit, so some kernel "
            "is not deterministic"))
    return verdict


def _cast_finite(cast: str, run_dtype: str | None) -> Verdict:
    """A replay in another dtype stays finite where the run failed: not the same
    configuration, so nothing about reproducibility; a wider one points at the range."""
    run = run_dtype or "the run's dtype"
    if wider(cast, run_dtype):
        return Verdict(
            "range-overflow",
            f"the step stays finite in {cast} where the run went non-finite in {run}: the "
            f"failure is one of {run}'s range or precision, which {cast} does not share",
            "overflow past the dtype's maximum, or underflow to 0 that a later op divides by "
            "or takes the log of",
            f"replay as-run (the run's own dtype) to name the op that leaves the range of "
            f"{run}; keep the values inside it (autocast with a GradScaler or bfloat16, "
            "scaled inputs, an eps representable in the dtype, a stable formulation)")
    return Verdict(
        "undecided",
        f"the step stays finite in {cast}, which is not the run's configuration ({run}) "
        "and no wider than it: this replay says nothing about the failure",
        "the run failed in its own configuration, which this replay did not run",
        "replay as-run to reproduce the failure, and with --dtype float64 to tell a "
        "mathematical fault from a range overflow")


def _judge(phase: Phase, dtype: str, wide: Float64, op: OpFault | None) -> Verdict:
    float64 = wide() if callable(wide) else wide
    f64 = float64.phase if float64 is not None and float64.error is None else None
    whole = "finite" if float64 is not None and float64.error is None and f64 is None else (
        f"non-finite in {f64}" if f64 is not None else "not run")
    if op is not None and op.inputs_finite and op.float64_finite is not None:
        return _by_op(op, phase, dtype, whole)
    return _by_step(phase, dtype, float64, f64, op)


def _by_op(op: OpFault, phase: Phase, dtype: str, whole: str) -> Verdict:
    """Judge by the producing op run again in float64 on its very inputs."""
    name = f"aten.{op.op}"
    # Under autocast the op's own dtype (float16) is the one whose range failed.
    dtype = op.outputs[0].dtype if op.outputs else dtype
    if not op.float64_finite:
        check = "guard the operation named above (clamp, epsilon, a stable formulation)"
        if whole == "finite":
            # Both hold and must not read as a contradiction: the op is undefined at the
            # values it was given, and a step run in float64 from the start never makes them.
            summary = (f"{name} in {phase} is undefined at the values {dtype} gave it (on "
                       f"those very values it is non-finite in float64 as well), but the "
                       f"limited range of {dtype} made those values: run in float64 from the "
                       f"start, the whole step stays finite. An underflow of {dtype} "
                       f"upstream fed an op that cannot take its result")
            check += f", or keep the values upstream inside {dtype}'s range"
        else:
            summary = (f"{name} in {phase} is undefined at the values it received: on those "
                       f"very values it is non-finite in float64 as well, and the whole step "
                       f"run in float64 from the start is {whole} too")
        return Verdict("math-fault", summary, _hint(op), check)
    if whole == "finite":
        step = "the whole step run in float64 stays finite"
    elif whole == "not run":
        step = "the whole step in float64 could not be run"
    else:
        step = (f"float64 holds this op's result but not the rest of the step: run in "
                f"float64 from the start, the whole step is {whole} as well")
    return Verdict(
        "range-overflow",
        f"{name} in {phase} is finite on the same inputs widened to float64 but not in "
        f"{dtype}: the result leaves the range of {dtype}; {step}",
        "overflow past the dtype's maximum: activations, logits or gradients grown too "
        "large (learning rate, initialisation, input scale), or a bare .half() model",
        "compare the op's input abs-max with the dtype's maximum (65504 for float16); "
        "use autocast with a GradScaler or bfloat16, scale the inputs, lower the learning "
        "rate or clip gradients")


def _by_step(phase: Phase, dtype: str, float64: PassOutcome | None, f64: Phase | None,
             op: OpFault | None) -> Verdict:
    """Judge by the whole step in float64, when no single op can be run again."""
    if float64 is None or float64.error is not None:
        why = float64.error if float64 is not None else "it was not run"
        return Verdict(
            "undecided",
            f"non-finite in {phase} in {dtype}; the float64 pass did not complete ({why})",
            "a mathematical fault or a range overflow: only the float64 pass can tell",
            "replay with --dtype float64 and look at the error it gives")
    if f64 is not None and _rank(f64) <= _rank(phase):
        return Verdict(
            "math-fault",
            f"non-finite in {phase} in float64 too: the values are not a matter of precision",
            _hint(op),
            "guard the operation named above (clamp, epsilon, a stable formulation)")
    later = f" (float64 goes non-finite only in {f64})" if f64 is not None else ""
    return Verdict(
        "range-overflow",
        f"non-finite in {phase} in {dtype} but finite in float64{later}: the values "
        f"leave the range or precision of {dtype}",
        "overflow past the dtype's maximum, or underflow to 0 that a later op divides by "
        "or takes the log of",
        "compare the op's input abs-max with the dtype's maximum (65504 for float16); "
        "use autocast with a GradScaler instead of a bare .half(), scale the inputs, "
        "and keep eps representable in the dtype")
