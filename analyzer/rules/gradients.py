"""Gradients that grow without bound: the symptom, bad initialisation, recurrent nets,
and clipping that hides a design fault."""

from __future__ import annotations

import math
import re

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import Curve, RunEvidence, gradient_rose, rose
from analyzer.rules.evidence_scale import (
    INIT_EXCESS,
    UNNORMALIZED_RMS,
    InitScale,
    input_scale,
    oversized,
)
from analyzer.rules.signals import Growth, growth
from analyzer.wording import step_words

BAD_INIT_NORM = 1e5
"""A gradient norm above this in the first steps points at initialisation."""
EARLY_STEPS = 3
RECOVERED_NORM = 1e3
"""An early burst after which the norm falls below this did not doom the run."""
RATE_CEILING = 1.0
"""The highest learning rate any optimizer family is commonly run with (SGD's; adaptive
optimizers stay near 1e-2): a logged rate above it is a mistake whatever the optimizer."""
_RECURRENT = re.compile(r"(^|[._/])(rnn|lstm|gru|recurrent|cell)([._/\d]|$)", re.IGNORECASE)
"""A recurrent module's name, alone or inside a per-layer tag (``grad_norm/rnn.weight_hh_l0``)."""


def gradient_growth(ev: RunEvidence) -> tuple[Curve, Growth] | None:
    """Exponential growth of the total gradient norm (else the loss) before the failure."""
    for curve in (ev.grad_norm, ev.loss):
        if curve is None:
            continue
        before = curve.before(ev.failure_step)
        g = growth(before.steps, before.values)
        if g is not None and g.decades >= 2:
            return before, g
    return None


def overshooting_rate(ev: RunEvidence) -> float | None:
    """The first logged learning rate when it is above every optimizer's ceiling."""
    lr = ev.lr
    if lr is None or not len(lr) or not np.isfinite(lr.values[0]):
        return None
    first = float(lr.values[0])
    return first if first > RATE_CEILING else None


def growth_evidence(curve: Curve, g: Growth) -> list[Evidence]:
    return [
        Evidence(f"{curve.tag} grew {g.decades:.1f} orders of magnitude from step "
                 f"{g.onset_step} to {g.end_step}, doubling every {g.doubling_steps:.3g} steps "
                 f"(log-linear fit over {g.points} points, R² {g.r2:.2f})",
                 location=curve.location_at(g.onset_step), step=g.onset_step,
                 subject=curve.tag, onset=g.onset_step, value=g.doubling_steps,
                 ratio=g.factor),
    ]


@rule("NF201", "exploding-gradients", "exploding gradients", role="symptom",
      needs=("grad_norm", "loss"))
def exploding_gradients(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    The gradient norm (or, without one, the loss) rising exponentially in the steps before
    the failure, until it overflows. Reported with the onset step and the doubling time from
    a least-squares fit of log10(norm) against the step.

    ## Why it produces NaN/Inf
    Backpropagation multiplies Jacobians layer by layer and step by step; when their
    spectral radius stays above 1 the product grows geometrically, passes float32's
    ~3.4e38 and becomes Inf, and Inf - Inf or 0·Inf then gives NaN.

    ## Evidence
    The total gradient-norm series (or the loss series) before the first non-finite step:
    at least two orders of magnitude of log-linear growth with R² >= 0.8.

    ## Fix
    Find the cause the growth is a symptom of (learning rate, initialisation, a recurrent
    net on long sequences); meanwhile clip the gradient norm and log it:
    ```python
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    writer.add_scalar("train/grad_norm", total, step)
    ```

    ## Known false positives
    Early training where the gradient norm legitimately rises from a tiny value for a few
    steps; the rule asks for two orders of magnitude before the failure.
    """
    if not ev.failed:
        return []
    found = gradient_growth(ev)
    if found is None:
        return []
    curve, g = found
    confidence = "high" if g.decades >= 4 and g.r2 >= 0.9 else "medium"
    return [r.finding(confidence, growth_evidence(curve, g), min(1.0, g.decades / 8))]


@rule("NF204", "bad-initialisation", "bad initialisation: huge gradients from the start",
      needs=("grad_norm", "layer_norms"))
def bad_initialisation(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    Weights drawn far larger than PyTorch's default init gives their shape, or a gradient
    norm above 1e5 within the first logged steps, before the optimizer has had time to do
    damage: the weights were too large (or too small) from the start.

    ## Why it produces NaN/Inf
    Weights drawn with too large a scale make activations and gradients grow by a constant
    factor per layer; the first updates are then huge, push the weights further out, and the
    run overflows within a few steps.

    ## Evidence
    - A weight norm at the first logged step, less the most the updates up to it could
      have added (``lr · max(‖∇W‖, 10 · sqrt(numel))`` each), at least 4 times
      ``sqrt(out / 3)``, the default init's norm for the weight's shape in a checkpoint
      (Kaiming-normal, Xavier and orthogonal init stay within 2.5 times it; embeddings,
      normalisation and recurrent layers are left out), in a run that blew up (gradients
      or the loss growing into the failure, or huge from the start). With a gradient norm
      above 1e5 at the first step too, high confidence; alone, medium, ranked above a
      learning rate.
    - Else the total gradient-norm series: a value above 1e5 at one of the first three
      logged steps, and no return below 1e3 between then and the failure. A first norm
      that was sane, blown up at the next steps under a logged learning rate above 1.0
      (more than any optimizer family runs at), is left to learning-rate-too-high. A huge
      first norm is as much unnormalized inputs: with the first layer's gradients logged,
      their quotient reads the inputs' scale (see unnormalized-inputs), and inputs far
      from unit scale leave this rule at low confidence; with nothing to read it from,
      the two are reported tied.

    ## Fix
    Use an initialisation scaled to the layer's fan-in and nonlinearity, and check the
    first step's gradient norm:
    ```python
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            torch.nn.init.zeros_(m.bias)
    ```

    ## Known false positives
    Losses summed (not averaged) over very large batches or sequences have large gradient
    norms by construction; compare with the loss's own scale. A deliberate init larger
    than 4 times the default (rare outside tests).
    """
    if not ev.failed:
        return []
    big = oversized(ev)
    if big and blew_up(ev) is not None:
        return [_oversized_finding(r, ev, big)]
    burst = early_burst(ev)
    if burst is None:
        return []
    curve, k, step, value = burst
    evidence = [Evidence(f"{curve.tag} = {value:.3g} at step {step}, the "
                         f"{_ordinal(k + 1)} logged step (threshold {BAD_INIT_NORM:.0e}), and "
                         f"it never fell below {RECOVERED_NORM:.0e} before the failure",
                         location=curve.location_at(step), step=step, subject=curve.tag,
                         value=value)]
    score = min(1.0, 0.6 + 0.1 * math.log10(value / BAD_INIT_NORM))
    scale = input_scale(ev)
    if scale is not None and scale.rms >= UNNORMALIZED_RMS:
        evidence.append(Evidence(scale.text() + ": the inputs' scale explains the norm",
                                 location=scale.location, step=scale.step,
                                 subject=scale.param, value=scale.rms))
        return [r.finding("low", evidence, 0.3)]
    if scale is None:
        # the inputs' scale makes the same early norms: tied with unnormalized-inputs
        evidence.append(Evidence(
            "not seen: the first layer's weight and bias gradient norms (per-layer tags) "
            "or its weights' shapes (a checkpoint), which tell initial weights too large "
            "from inputs too large", subject="weights"))
        return [r.finding("medium", evidence, TIED_SCORE)]
    evidence.append(Evidence(scale.text() + ": not the inputs", location=scale.location,
                             step=scale.step, subject=scale.param, value=scale.rms))
    return [r.finding("high" if k == 0 else "medium", evidence, score)]


def early_burst(ev: RunEvidence) -> tuple[Curve, int, int, float] | None:
    """A total gradient norm above BAD_INIT_NORM at one of the first EARLY_STEPS logged
    steps that never came back below RECOVERED_NORM before the failure, unless a sane first
    norm was blown up by a rate above every optimizer's ceiling: the curve, the index among
    the logged steps, the step and the value."""
    curve = ev.grad_norm
    if curve is None or not ev.failed:
        return None
    first = curve.before(ev.failure_step)
    head = first.values[:EARLY_STEPS]
    huge = np.flatnonzero(np.isfinite(head) & (head > BAD_INIT_NORM))
    if not huge.size:
        return None
    k = int(huge[0])
    later = first.values[k + 1:]
    if (np.isfinite(later) & (later < RECOVERED_NORM)).any():
        return None  # the norm came back to a sane scale: the early burst did not cause it
    if k > 0 and overshooting_rate(ev) is not None:
        return None  # a sane first norm blown up by a rate no optimizer runs at: the rate's
    return first, k, int(first.steps[k]), float(first.values[k])


def blew_up(ev: RunEvidence) -> Evidence | None:
    """How the run blew up, if it did: gradients growing into the failure, or huge from the
    start (a NaN out of a steady run is some other fault's)."""
    found = gradient_growth(ev)
    if found is not None:
        return growth_evidence(*found)[0]
    burst = early_burst(ev)
    if burst is not None:
        curve, _, step, value = burst
        return Evidence(f"{curve.tag} = {value:.3g} at step {step}, from the start",
                        location=curve.location_at(step), step=step, subject=curve.tag,
                        value=value)
    if ev.failure_step is not None and gradient_rose(ev, ev.failure_step):
        g = ev.grad_norm
        assert g is not None
        return Evidence(f"{g.tag} rose into the failure", subject=g.tag)
    onset = ev.onset
    if onset is not None and rose(onset.prior):
        return Evidence(f"the loss rose to {float(onset.prior[-1]):.3g} just before the "
                        "failure", subject="loss")
    return None


TIED_SCORE = 0.6
"""The score bad-initialisation and unnormalized-inputs both give a huge first gradient
norm that nothing else tells apart: equal, so the report says it is undetermined."""


def _oversized_finding(r: Rule, ev: RunEvidence, big: list[InitScale]) -> Finding:
    evidence = [Evidence(f"{b.param} (shape {'x'.join(map(str, b.shape))}): norm at least "
                         f"{b.norm:.3g} at step {b.step}, {b.ratio:.3g}x the {b.expected:.3g} "
                         "that PyTorch's default init gives this shape",
                         location=b.location, step=b.step, subject=b.param, value=b.norm,
                         ratio=b.ratio) for b in big[:3]]
    if len(big) > 3:
        more = len(big) - 3
        evidence.append(Evidence(f"{more} more weight{'s' if more != 1 else ''} likewise",
                                 subject="weights"))
    burst = early_burst(ev)
    huge = burst is not None and burst[1] == 0
    if burst is not None:
        curve, k, step, value = burst
        evidence.append(Evidence(f"{curve.tag} = {value:.3g} at step {step}, the "
                                 f"{_ordinal(k + 1)} logged step",
                                 location=curve.location_at(step), step=step,
                                 subject=curve.tag, value=value))
    worst = max(b.ratio for b in big)
    score = min(1.0, 0.75 + 0.1 * math.log10(worst / INIT_EXCESS) + 0.05 * huge)
    return r.finding("high" if huge else "medium", evidence, score)


@rule("NF206", "exploding-rnn", "exploding recurrent network on long sequences",
      needs=("layer_norms", "replay"))
def exploding_rnn(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A recurrent layer (RNN, LSTM, GRU) whose gradients or weights run away first, or that a
    replay names as the producer of the first non-finite value.

    ## Why it produces NaN/Inf
    Backpropagation through time multiplies the same recurrent Jacobian once per time step;
    with a spectral radius above 1 the gradient grows like radius^length, so long sequences
    overflow even at a modest learning rate.

    ## Evidence
    Per-layer gradient or weight norms where a recurrent layer grows fastest or goes
    non-finite first, or a replay whose producing module is recurrent.

    ## Fix
    Clip gradients every step, shorten the backpropagation window, or use gated cells:
    ```python
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    # truncated BPTT: detach the hidden state between chunks of the sequence
    hidden = hidden.detach()
    # prefer nn.LSTM/nn.GRU over nn.RNN(nonlinearity="relu")
    ```

    ## Known false positives
    A model whose only layer happens to be recurrent fails there whatever the cause; check
    the learning rate too. A captured batch that already holds NaN makes every recurrent
    gradient NaN at once: when the replay says the step started from non-finite values,
    the replay's module and the first non-finite layer tag are that NaN passed on and do not
    count, and what growth is left before it makes a low finding at most.
    """
    if not ev.failed:
        return []
    evidence: list[Evidence] = []
    replay = ev.replay
    # A replay whose step began from non-finite values (a NaN in the captured batch) has
    # named the fault: every layer's gradient at the failure is that NaN passed on, not a
    # recurrence that exploded, and only growth read before it is left to weigh.
    upstream = (replay.verdict.summary if replay is not None
                and replay.verdict.kind == "bad-input" else None)
    layer = replay.layer if replay is not None and upstream is None else None
    if layer and _RECURRENT.search(layer):
        evidence.append(Evidence(f"replay names recurrent module {layer} as the producer "
                                 f"({replay.phase})", step=replay.step, subject=layer))
    fastest = _fastest_layer(ev)
    if fastest is not None and _RECURRENT.search(fastest[0]):
        name, g, curve = fastest
        evidence.append(Evidence(f"{curve.tag} grows fastest of all layers: "
                                 f"{g.decades:.1f} orders of magnitude from step "
                                 f"{g.onset_step}", location=curve.location_at(g.onset_step),
                                 step=g.onset_step, subject=name, onset=g.onset_step,
                                 ratio=g.factor))
    inc = ev.result.layer_incident
    if inc is not None and inc.layer and _RECURRENT.search(inc.layer) and upstream is None:
        evidence.append(Evidence(f"first non-finite layer tag: {inc.tag} "
                                 f"{step_words(inc.step, inc.after, 'at')}",
                                 location=inc.location, step=inc.step, subject=inc.layer))
    if not evidence:
        return []
    if upstream is not None:
        step = replay.step if replay is not None else None
        evidence.append(Evidence(f"but the replayed step {step} did not start finite: "
                                 f"{upstream}", step=step))
        return [r.finding("low", evidence, 0.3)]
    return [r.finding("high" if len(evidence) >= 2 else "medium", evidence,
                      0.5 + 0.2 * len(evidence))]


def _fastest_layer(ev: RunEvidence) -> tuple[str, Growth, Curve] | None:
    best: tuple[str, Growth, Curve] | None = None
    for tag, curve in {**ev.layer_grad_norms, **ev.layer_weight_norms}.items():
        before = curve.before(ev.failure_step)
        g = growth(before.steps, before.values)
        if g is not None and (best is None or g.decades > best[1].decades):
            best = (tag, g, before)
    return best


@rule("NF205", "frequent-clipping", "gradient clipping on most steps", role="symptom",
      needs=("capture",))
def frequent_clipping(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A run that clips its gradient norm on most steps: the total norm before clipping is
    above `max_norm` more often than not.

    ## Why it produces NaN/Inf
    Clipping bounds the update, not the forward pass: a model whose raw gradients are
    always too large has a scale problem (initialisation, depth, learning rate) that
    clipping only hides until activations or the loss overflow.

    ## Evidence
    The `grad_clip` recorded in the capture and the total gradient-norm series (logged
    before clipping): the share of steps above the threshold.

    ## Fix
    Treat the cause rather than clipping harder: lower the learning rate, fix the
    initialisation, add normalisation layers or residual scaling:
    ```python
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    clipped += int(norm > max_norm)   # log the share of clipped steps
    ```

    ## Known false positives
    The first few hundred steps of large models often clip; the rule looks at the share
    over the whole run.
    """
    clip = ev.capture_meta.grad_clip if ev.capture_meta is not None else None
    curve = ev.grad_norm
    if clip is None or curve is None or len(curve) < 10:
        return []
    values = curve.before(ev.failure_step).values
    values = values[np.isfinite(values)]
    if values.shape[0] < 10:
        return []
    share = float((values > clip).mean())
    if share < 0.5:
        return []
    evidence = [Evidence(f"{curve.tag} was above max_norm={clip:g} on {share:.0%} of "
                         f"{values.shape[0]} logged steps", subject=curve.tag, value=clip,
                         ratio=share)]
    return [r.finding("medium" if share > 0.8 else "low", evidence, share)]


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


RULES = (exploding_gradients, bad_initialisation, exploding_rnn, frequent_clipping)
