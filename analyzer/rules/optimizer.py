"""The optimizer's own arithmetic: Adam's epsilon lost in low precision."""

from __future__ import annotations

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence, lacking
from analyzer.rules.evidence_ckpt import TINY, half_adam, half_weights, update_wrote
from analyzer.rules.evidence_precision import float16_model

_HALF_TINY = {dtype: tiny / 2 for dtype, tiny in TINY.items()}
"""Half the smallest positive (subnormal) value of each dtype: an eps below it rounds to 0
(one above it rounds up to the subnormal)."""


@rule("NF207", "adam-eps-too-small", "Adam's eps too small for the parameters' dtype",
      needs=("replay", "checkpoints", "loss"))
def adam_eps_too_small(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    An Adam-family update that divides by sqrt(v) + eps where eps rounds to zero in the
    parameters' dtype (1e-8 in float16, whose smallest positive value is ~6e-8) and the
    second moment v is zero or tiny for some elements.

    ## Why it produces NaN/Inf
    The update is lr·m/(sqrt(v)+eps). With eps = 0 in float16 and v = 0 for a parameter
    whose gradient was 0 (or underflowed), the step is m/0: Inf, or 0/0 = NaN, written
    straight into the weights while the forward and backward passes look healthy.

    ## Evidence
    A replay whose forward and backward stay finite and whose optimizer step makes
    parameters non-finite, with the reason (eps rounding to 0, zeros in exp_avg_sq); the
    optimizer's eps and the dtype from the capture; Adam state in checkpoints with
    exp_avg_sq at or below eps². Without a capture: a model shown to compute in float16
    (its logged values, its configuration, or its checkpoints' float16 weights) whose weight
    norms went non-finite while the loss and gradients were still finite (the update wrote
    the first Inf), with the configured eps where the run's metadata gives it (medium). A
    checkpoint whose Adam moments are float16 (or bfloat16) with an eps below half that
    dtype's smallest number shows the division itself: `sqrt(exp_avg_sq) + eps` is computed
    with eps = 0, and every element whose exp_avg_sq underflowed to 0 divides by 0 (high,
    with the count of such zeros in the save). The update phase may come from a checkpoint
    instead of the curves: a first non-finite save whose weights hold NaN or Inf beside
    finite Adam moments (Adam folds the gradient into its moments before it steps, so a
    non-finite gradient would show there too).

    ## Fix
    Keep optimizer state and master weights in float32 (use autocast instead of a half
    model), or raise eps to something the dtype can hold:
    ```python
    model = model.float()                       # master weights in float32
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    # a pure-fp16 model needs eps >= 1e-4 (and care)
    ```

    ## Known false positives
    Parameters that never receive gradient (frozen by accident) also have v = 0; in
    float32 that is harmless because eps survives.
    """
    replay = ev.replay
    if replay is None:
        return _posthoc(r, ev)
    if not ev.failed:
        return []
    update = replay.update
    params = tuple(update.params)
    meta = ev.capture_meta
    opt_class = meta.optimizer.cls if meta is not None else "optimizer"
    eps = meta.optimizer.hyperparameters.get("eps") if meta is not None else None
    dtype: str = meta.dtype if meta is not None else ""
    adam = meta is not None and "adam" in opt_class.lower()
    eps_reasons = [p for p in params if "eps" in p.reason or "exp_avg_sq" in p.reason]
    if replay.phase != "update" or not (eps_reasons or adam):
        return []
    evidence = [Evidence(f"replay of step {replay.step}: forward and backward finite; the "
                         f"optimizer step made {len(params)} parameter(s) non-finite",
                         step=replay.step, subject=params[0].name if params else None)]
    for p in (eps_reasons or list(params))[:3]:
        evidence.append(Evidence(f"{p.name}: {p.reason}", step=replay.step, subject=p.name,
                                 tensor=p.name))
    tiny = _HALF_TINY.get(dtype)
    rounds = isinstance(eps, int | float) and tiny is not None and eps < tiny
    if isinstance(eps, int | float):
        evidence.append(Evidence(f"{opt_class} eps={eps:g} with {dtype} "
                                 "parameters" + (" (rounds to 0)" if rounds else ""),
                                 subject="optimizer", value=float(eps)))
    confidence = "high" if eps_reasons and (rounds or dtype in _HALF_TINY) else "medium"
    return [r.finding(confidence, evidence, 0.6 + 0.2 * bool(eps_reasons) + 0.2 * rounds)]


def _posthoc(r: Rule, ev: RunEvidence) -> list[Finding]:
    """The update phase in the logged curves, in a float16 model; high where a checkpoint
    shows Adam's moments held in a half dtype whose eps rounds to 0."""
    o = ev.onset
    wrote = update_wrote(ev)
    if o is None or (o.phase != "update" and wrote is None):
        return []
    why = float16_model(ev)
    weights = half_weights(ev)
    adam = half_adam(ev)
    if why is None and weights is None and adam is None:
        return []
    evidence = []
    if o.phase == "update":
        evidence.append(Evidence(f"{o.tag} went non-finite at step {o.step} while the loss and "
                                 "every gradient norm there were finite: the optimizer's update "
                                 "wrote the first Inf", step=o.step, subject=o.tag))
    if wrote is not None:
        evidence.append(wrote.evidence())
    if why is not None:
        evidence.append(Evidence(why, subject="dtype"))
    if weights is not None:
        evidence.append(weights.evidence())
    meta = ev.result.run.metadata
    eps = meta.number("adam_epsilon") if meta is not None else None
    if adam is not None:
        evidence.extend(adam.evidence())
    elif eps is not None:
        rounds = eps < _HALF_TINY["float16"]
        evidence.append(Evidence(f"configured adam eps={eps:g}"
                                 + (" rounds to 0 in float16" if rounds else ""),
                                 subject="optimizer", value=eps))
    else:
        evidence.append(Evidence("not seen: the optimizer and its eps (no metadata or "
                                 "checkpoint gives them); Adam's default 1e-8 rounds to 0 in "
                                 "float16", subject="optimizer"))
    evidence.append(Evidence(lacking(o.step, "the optimizer step", ev.unit), step=o.step))
    if adam is not None:  # the checkpoint shows the division the update makes
        return [r.finding("high", evidence, 0.9)]
    return [r.finding("medium", evidence, 0.6 + 0.2 * (eps is not None))]


RULES = (adam_eps_too_small,)
