"""The learning rate: too high from the start, or jumping up before the failure."""

from __future__ import annotations

import re

import numpy as np

from analyzer.model import Evidence, Finding, Location, RunMetadata
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import Curve, RunEvidence
from analyzer.rules.evidence_scale import UNNORMALIZED_RMS, input_scale, oversized
from analyzer.rules.gradients import (
    BAD_INIT_NORM,
    EARLY_STEPS,
    RATE_CEILING,
    gradient_growth,
    growth_evidence,
    overshooting_rate,
)
from analyzer.rules.signals import Growth

JUMP = 5.0
WARMUP_HORIZON = 2000
"""A run that fails later than this many steps in did not fail for lack of warmup."""
EARLY_SHARE = 0.2
"""Growth that starts within this share of the steps before the failure started early."""
FAST_DOUBLING = 10.0
"""Growth that doubles within this many steps is the optimizer overshooting, not drift."""
"""A learning rate that rises by this factor between two logged steps has jumped."""
ADAPTIVE_CEILING = 1e-2
"""The largest learning rate adaptive optimizers (Adam, AdamW, RMSprop, Adagrad, Lion,
Adafactor, ...) are commonly run with: ten times torch's Adam default (1e-3), two hundred
times the Hugging Face Trainer's (5e-5), and where practitioners' guides put "too high"."""
SGD_CEILING = 1.0
"""The same for SGD, whose step scales with the gradient: 0.1 is the classic ImageNet rate,
linear scaling with the batch takes it to a few units, and recurrent language models with
tight clipping run at tens (torch's word-language-model example uses 20)."""
ABSURD = 100.0
"""A configured rate this many times its optimizer's ceiling is a mistake, not a choice:
for Adam 1.0, a step of about one per weight, more than the scale a fan-in initialisation
gives any weight."""
_ADAPTIVE = re.compile(r"adam|adafactor|adagrad|adadelta|rmsprop|lion|lamb|sophia|shampoo|"
                       r"ademamix|lomo|grokadam|schedule_free|apollo|galore",
                       re.IGNORECASE)


@rule("NF202", "learning-rate-too-high", "learning rate too high",
      needs=("grad_norm", "loss"))
def learning_rate_too_high(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    Divergence with a steady learning rate: the loss and the gradient norm grow
    exponentially from early in training, every layer's weights grow with them, and
    nothing else (initialisation, a recurrent layer, a log or a division) explains it.

    ## Why it produces NaN/Inf
    With a step size beyond 2/λmax of the loss's curvature, each update overshoots the
    minimum by more than it corrects, so the error grows geometrically; the weights and the
    gradients overflow float32 within tens of steps.

    ## Evidence
    Fast exponential growth of the gradient norm (or loss) before the failure, doubling
    within ten steps; a learning-rate series that did not jump (else learning-rate-jump
    applies); a first gradient norm below the bad-initialisation threshold and no weight
    drawn 4 times above the default init for its shape (both that rule's); weight norms
    growing in several layers; the optimizer's learning rate from the capture, else the
    logged rate at the failure (and the range a schedule moved it in before). The rate the
    run's metadata says it was configured with (training_args.bin, hparams.yaml, a
    checkpoint's hyperparameters, a scheduler's base rate), against the ceiling of its
    optimizer's family: 1e-2 for adaptive optimizers (Adam, AdamW, RMSprop, Lion, ...; ten
    times torch's Adam default), 1.0 for SGD or an optimizer not named. A rate above the
    ceiling strengthens the growth; one 100 times above it (1.0 for Adam) is a cause by
    itself, with high confidence, even when the gradients were huge from the second logged
    step (what such a rate does at once, and not a sign of the initialisation), unless a
    replay of the failing step finds a mathematical fault or a non-finite batch, which no
    rate makes (medium confidence then). A configuration whose warm-up settings are all
    zero is quoted. With too few points for a growth fit: a logged rate above 1.0 (every
    optimizer family's ceiling) and a gradient norm sane at the first logged step that is
    above 1e5 or non-finite within the next two (medium); or, with no gradient norm, a
    configured rate above its ceiling and a loss that each of its last updates multiplied
    by 10 or more, a million-fold from a sane first value, before it went non-finite
    (medium). Where the first layer's
    gradients read inputs far from unit scale (see unnormalized-inputs) and no configured
    rate is above its ceiling, the growth is the inputs' and this rule stays low.

    ## Fix
    Lower the learning rate (by 3-10x), add a warmup, and clip gradients while tuning:
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=lr / 10, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01,
                                                  total_iters=500)
    ```

    ## Known false positives
    A bad initialisation or an exploding recurrent layer shows the same growth; those rules
    rank above this one when their evidence is present.
    """
    if not ev.failed:
        return []
    configured = _configured(ev)
    found = gradient_growth(ev)
    if configured is not None and configured.absurd:
        return [_absurd(r, ev, configured, found)]
    if found is None:
        return _early_overshoot(r, ev) or _loss_overshoot(r, ev, configured)
    curve, g = found
    evidence = growth_evidence(curve, g)
    fast = g.doubling_steps <= FAST_DOUBLING
    grad = ev.grad_norm
    head = grad.values[:3] if grad is not None else np.zeros(0)
    if head.size and float(np.nanmax(np.where(np.isfinite(head), head, 0))) > BAD_INIT_NORM:
        return []  # huge from the first step: initialisation, not the step size
    if oversized(ev):
        return []  # weights drawn far above the default init: bad-initialisation's
    if ev.lr is not None and _jump(ev) is not None:
        return []
    if configured is not None and configured.high:
        evidence += configured.evidence()
    said = _lr_evidence(ev)
    if said is not None:
        evidence.append(said)
    grow = _weights_growing(ev)
    if grow:
        evidence.append(Evidence(f"weight norms of {grow} layers grew before the failure",
                                 subject="weights"))
    confidence = "medium" if fast else "low"
    high = configured is not None and configured.high
    scale = input_scale(ev)
    if scale is not None and scale.rms >= UNNORMALIZED_RMS and not high:
        # a rate that suits standardized inputs overshoots on these: unnormalized-inputs'
        evidence.append(Evidence(scale.text() + ": the inputs, not the rate, are off scale",
                                 location=scale.location, step=scale.step,
                                 subject=scale.param, value=scale.rms))
        confidence = "low"
    return [r.finding(confidence, evidence, 0.4 + 0.1 * min(g.decades, 4) / 4 + 0.1 * bool(grow)
                      + 0.1 * high)]


def _early_overshoot(r: Rule, ev: RunEvidence) -> list[Finding]:
    """Too few points for a growth fit: a logged rate above every optimizer's ceiling and a
    gradient norm that was sane at the first step and huge (or non-finite) within the next
    few, the overshoot of the first updates."""
    rate = overshooting_rate(ev)
    grad = ev.grad_norm
    if rate is None or grad is None or not len(grad):
        return []
    head = grad.values[:EARLY_STEPS]
    if not np.isfinite(head[0]) or head[0] > BAD_INIT_NORM:
        return []
    later = head[1:]
    blown = np.flatnonzero(~np.isfinite(later) | (later > BAD_INIT_NORM))
    if not blown.size:
        return []
    k = int(blown[0]) + 1
    step, value = int(grad.steps[k]), float(grad.values[k])
    curve = ev.lr
    assert curve is not None
    evidence = [Evidence(f"{curve.tag} = {rate:g} from the first logged step, above "
                         f"{RATE_CEILING:g}, the ceiling of every optimizer family",
                         location=curve.location_at(int(curve.steps[0])),
                         step=int(curve.steps[0]), subject=curve.tag, value=rate),
                 Evidence(f"{grad.tag} went from {float(head[0]):.3g} at step "
                          f"{int(grad.steps[0])} to {value:.3g} at step {step}: the first "
                          "updates overshot (a sane first norm: not the initialisation)",
                          location=grad.location_at(step), step=step, subject=grad.tag)]
    return [r.finding("medium", evidence, 0.6)]


LOSS_BLOWUP = 1e6
"""How much the loss grows, from a sane first value, within its last few finite points for
the growth alone to say the updates overshot."""
LOSS_STEP_GROWTH = 10.0
"""The least growth of each of those steps: every update multiplied the loss."""


def _loss_overshoot(r: Rule, ev: RunEvidence, configured: _Configured | None
                    ) -> list[Finding]:
    """Too few points for a growth fit and no gradient norm logged: a configured rate above
    its optimizer's ceiling, and a loss that every update multiplied (by 10 or more) from a
    sane first value to a million times it, then non-finite. Each update overshooting by
    more than the last is what a step size past the curvature does; a bad initialisation
    starts huge, a bad batch does not grow over steps."""
    if configured is None or not configured.high:
        return []
    loss = ev.loss
    if loss is None or len(loss) < 3:
        return []
    values = np.asarray(loss.values, dtype=float)
    bad = np.flatnonzero(~np.isfinite(values))
    end = int(bad[0]) if bad.size else len(values)
    head = values[:end]
    if end < 3 or bad.size == 0 or not 0 < head[0] < 1e4:
        return []
    last = head[-EARLY_STEPS:] if len(head) > EARLY_STEPS else head
    growth = last[1:] / np.maximum(last[:-1], np.finfo(float).tiny)
    if not (np.all(growth >= LOSS_STEP_GROWTH) and head[-1] >= LOSS_BLOWUP * head[0]):
        return []
    first, top = int(loss.steps[0]), int(loss.steps[end - 1])
    evidence = [
        *configured.evidence(),
        Evidence(f"{loss.tag} went from {head[0]:.3g} at step {first} to {head[-1]:.3g} at "
                 f"step {top}, every update multiplying it by {float(growth.min()):.3g} or "
                 "more, then non-finite: the updates overshot",
                 location=loss.location_at(top), step=top, subject=loss.tag,
                 value=float(head[-1]))]
    return [r.finding("medium", evidence, 0.55)]


class _Configured:
    """The learning rate the run's metadata says it was configured with, against the
    ceiling of its optimizer's family."""

    def __init__(self, meta: RunMetadata, lr: float) -> None:
        self.meta = meta
        self.lr = lr
        found = meta.setting("learning_rate")
        self.source = found.source if found is not None else ""
        self.key = found.key if found is not None else "learning_rate"
        optimizer = meta.text("optimizer")
        if optimizer is None and meta.setting("learning_rate") is not None and any(
                f.kind == "training_args" and f.path == self.source for f in meta.files):
            optimizer = "adamw"  # the Trainer's default optimizer
        self.optimizer = optimizer
        adaptive = optimizer is not None and bool(_ADAPTIVE.search(optimizer))
        self.ceiling = ADAPTIVE_CEILING if adaptive else SGD_CEILING
        self.family = ("adaptive optimizers like Adam" if adaptive else "SGD"
                       if optimizer is not None and "sgd" in optimizer.lower()
                       else "SGD (the optimizer is not named)")

    @property
    def high(self) -> bool:
        return self.lr > self.ceiling

    @property
    def absurd(self) -> bool:
        return self.lr >= ABSURD * self.ceiling

    def evidence(self) -> list[Evidence]:
        name = self.source.rsplit("/", 1)[-1]
        named = f", optimizer {self.optimizer}" if self.optimizer else ""
        out = [Evidence(f"configured learning rate {self.lr:g} ({self.key} in {name}{named}): "
                        f"{self.lr / self.ceiling:.3g}x the usual ceiling of {self.ceiling:g} "
                        f"for {self.family}", location=Location(self.source),
                        subject="learning_rate", value=self.lr,
                        ratio=self.lr / self.ceiling)]
        none = _no_warmup(self.meta)
        if none is not None:
            out.append(none)
        return out


def _configured(ev: RunEvidence) -> _Configured | None:
    meta = ev.result.run.metadata
    lr = meta.learning_rate if meta is not None else None
    if meta is None or lr is None or not lr > 0:
        return None
    return _Configured(meta, lr)


def _no_warmup(meta: RunMetadata) -> Evidence | None:
    """Evidence that the configuration asks for no warm-up: every warm-up setting it gives
    is zero (a run that says nothing about warm-up is not taken to have none)."""
    given = [meta.setting(n) for n in ("warmup_steps", "warmup_ratio")]
    found = [s for s in given if s is not None]
    if not found or any(meta.number(n) != 0 for n in ("warmup_steps", "warmup_ratio")
                        if meta.setting(n) is not None):
        return None
    first = found[0]
    words = ", ".join(f"{s.key}={s.value}" for s in found)
    return Evidence(f"no warm-up configured ({words} in {first.source.rsplit('/', 1)[-1]}): "
                    "the full rate from the first step", location=Location(first.source),
                    subject="warmup", value=0.0)


def _absurd(r: Rule, ev: RunEvidence, configured: _Configured,
            found: tuple[Curve, Growth] | None) -> Finding:
    """A configured rate two orders of magnitude past its optimizer's ceiling explains a
    divergence by itself: huge gradients from the second step on are what it does, not a
    sign of the initialisation."""
    evidence = configured.evidence()
    if found is not None:
        evidence += growth_evidence(*found)
    grow = _weights_growing(ev)
    if grow:
        evidence.append(Evidence(f"weight norms of {grow} layers grew before the failure",
                                 subject="weights"))
    replay = ev.replay
    if replay is not None and replay.verdict.kind in _NOT_THE_RATE:
        # The replayed step failed for a reason of its own: the rate is a second fault.
        evidence.append(Evidence(f"the replay of step {replay.step} found "
                                 f"{_NOT_THE_RATE[replay.verdict.kind]}, which no learning "
                                 "rate makes", step=replay.step, subject="replay"))
        return r.finding("medium", evidence, 0.5)
    return r.finding("high", evidence, 1.0)


_NOT_THE_RATE = {"math-fault": "a mathematical fault (non-finite in float64 too)",
                 "bad-input": "a non-finite input batch"}


@rule("NF203", "learning-rate-jump", "learning-rate jump or missing warmup", needs=("lr",))
def learning_rate_jump(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A learning rate that rises sharply (5x or more between two logged steps) shortly before
    the failure: a scheduler restart, a misconfigured warmup that ends in a jump, or a
    resumed run that forgot its schedule.

    ## Why it produces NaN/Inf
    The curvature the model has settled into tolerates the old step size, not one several
    times larger: the next updates overshoot and the loss diverges.

    ## Evidence
    The learning-rate series: the largest rise between consecutive logged values in the
    window before the first non-finite step. Without a jump, a missing warmup: a rate at its
    peak from the first logged step, in a run whose gradients grew exponentially from its
    first fifth and that failed within 2,000 steps (low confidence: the learning rate may
    simply be too high, which that rule reports), unless the run's metadata configures a
    warm-up.

    ## Fix
    Make the schedule continuous and warm up after restarts:
    ```python
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=1000)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[1000])
    # on resume, load the scheduler's state_dict too
    ```

    ## Known false positives
    Cyclical schedules jump by design; they fail this way only when the peak is too high.
    """
    if not ev.failed:
        return []
    found = _jump(ev)
    if found is None:
        return _missing_warmup(r, ev)
    step, before, after = found
    curve = ev.lr
    assert curve is not None and ev.failure_step is not None
    evidence = [Evidence(f"{curve.tag} rose from {before:.3g} to {after:.3g} at step {step} "
                         f"(x{after / before:.3g}), {ev.failure_step - step} steps before "
                         f"the failure", location=curve.location_at(step), step=step,
                         subject=curve.tag, onset=step, value=after, ratio=after / before)]
    return [r.finding("medium", evidence, min(1.0, 0.5 + 0.05 * after / before))]


def _missing_warmup(r: Rule, ev: RunEvidence) -> list[Finding]:
    """A schedule that starts at its peak in a run that diverged from its first steps."""
    curve = ev.lr
    if curve is None or ev.failure_step is None:
        return []
    meta = ev.result.run.metadata
    if meta is not None and any((meta.number(n) or 0) > 0 for n in ("warmup_steps",
                                                                     "warmup_ratio")):
        return []  # the configuration has a warm-up: a flat start is not its absence
    lr = curve.before(ev.failure_step + 1).values
    lr = lr[np.isfinite(lr)]
    start = int(curve.steps[0]) if len(curve) else 0
    span = ev.failure_step - start
    if lr.shape[0] < 3 or span > WARMUP_HORIZON or lr[0] < 0.9 * float(lr.max()):
        return []
    found = gradient_growth(ev)
    if found is None or found[1].onset_step - start > EARLY_SHARE * span:
        return []
    curve_g, g = found
    evidence = [Evidence(f"{curve.tag} was {lr[0]:.3g} from the first logged step (step "
                         f"{start}): no warmup", location=curve.location_at(start), step=start,
                         subject=curve.tag, value=float(lr[0])),
                *growth_evidence(curve_g, g)]
    return [r.finding("low", evidence, 0.3,
                      title="missing learning-rate warmup: divergence from the first steps")]


def _jump(ev: RunEvidence) -> tuple[int, float, float] | None:
    curve = ev.lr
    if curve is None or ev.failure_step is None:
        return None
    before = curve.before(ev.failure_step + 1)
    v = before.values
    if v.shape[0] < 2:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(v[:-1] > 0, v[1:] / v[:-1], 1.0)
    window = max(0, ratio.shape[0] - 50)
    k = int(np.argmax(ratio[window:])) + window
    if not np.isfinite(ratio[k]) or ratio[k] < JUMP:
        return None
    return int(before.steps[k + 1]), float(v[k]), float(v[k + 1])


STEADY = 1.1
"""A logged rate whose largest and smallest values before the failure are within this
factor of each other was steady."""


def _lr_evidence(ev: RunEvidence) -> Evidence | None:
    """The learning rate the failing steps ran at: the capture's, else the logged rate's
    last value before the failure (a schedule that moved is said to have)."""
    meta = ev.capture_meta
    if meta is not None and meta.lr is not None:
        return Evidence(f"learning rate {meta.lr:g}, steady until the failure", subject="lr",
                        value=meta.lr)
    if ev.lr is None or ev.failure_step is None:
        return None
    before = ev.lr.before(ev.failure_step + 1)
    keep = np.isfinite(before.values) & (before.values > 0)
    values, steps = before.values[keep], before.steps[keep]
    if not values.size:
        return None
    last, low, high = float(values[-1]), float(values.min()), float(values.max())
    if high <= STEADY * low:
        return Evidence(f"learning rate {last:g}, steady until the failure", subject="lr",
                        value=last)
    step = int(steps[-1])
    return Evidence(f"learning rate {last:g} at step {step}, the last logged up to the "
                    f"failure (it went from {low:g} to {high:g} before)",
                    location=ev.lr.location_at(step), step=step, subject="lr", value=last)


def _weights_growing(ev: RunEvidence) -> int:
    count = 0
    for curve in ev.layer_weight_norms.values():
        v = curve.before(ev.failure_step).values
        v = v[np.isfinite(v)]
        if v.shape[0] >= 2 and v[0] > 0 and v[-1] / v[0] > 10:
            count += 1
    return count


RULES = (learning_rate_too_high, learning_rate_jump)
