"""A learnable temperature or logit scale that runs to zero (or its log to -inf)."""

from __future__ import annotations

import math
import re

import numpy as np

from analyzer.model import Evidence, Finding, Location
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence, lacking

_NAME = re.compile(r"(temperature|(^|[._])(temp|tau)($|[._])|logit_scale)", re.IGNORECASE)
_LOG_SPACE = re.compile(r"(log|logit_scale)", re.IGNORECASE)
LOG_LIMIT = 10.0
"""|log t| at which a temperature held in log space has collapsed: t = e^-10 ~ 4.5e-5 (CLIP
clamps its logit scale at log(100) ~ 4.6), so logits are scaled by more than 20,000."""
LOG_RISE = 5.0
"""How far |log t| must have moved since its first point: a log-temperature that starts at
a large but constant value is a choice, not a collapse."""
LINEAR_FALL = 100.0
"""How many times over a temperature held as itself must have shrunk."""
LINEAR_LIMIT = 1e-3


def _collapse(name: str, first: float, last: float) -> str | None:
    """Why ``first`` -> ``last`` (absolute values, as norms give them) is a collapse."""
    if _LOG_SPACE.search(name):
        if last >= LOG_LIMIT and last - first >= LOG_RISE:
            return (f"its log-space value's magnitude rose from {first:.3g} to {last:.3g}: "
                    f"the temperature is about e^-{last:.3g} = {math.exp(-last):.3g}")
        return None
    if last <= LINEAR_LIMIT and first >= LINEAR_FALL * last:
        return f"it shrank from {first:.3g} to {last:.3g}"
    return None


def _from_norms(ev: RunEvidence) -> list[Evidence]:
    out = []
    for tag, curve in ev.layer_weight_norms.items():
        if not _NAME.search(tag.rsplit("/", 1)[-1]):
            continue
        keep = np.isfinite(curve.values)
        if int(np.sum(keep)) < 2:
            continue
        steps, values = curve.steps[keep], np.abs(curve.values[keep])
        why = _collapse(tag, float(values[0]), float(values[-1]))
        if why:
            out.append(Evidence(f"{tag}: {why} between steps {int(steps[0])} and "
                                f"{int(steps[-1])}", location=curve.location_at(int(steps[-1])),
                                step=int(steps[-1]), subject=tag, onset=int(steps[0]),
                                value=float(values[-1])))
    return out


def _from_checkpoints(ev: RunEvidence) -> list[Evidence]:
    history = ev.result.run.checkpoints
    if history is None:
        return []
    seen: dict[str, list[tuple[int, float, str]]] = {}
    for scan in history.scans:
        if scan.step is None:
            continue
        for t in scan.tensors:
            if (t.stats is None or t.stats.numel != 1 or t.group != "model"
                    or not _NAME.search(t.name) or not math.isfinite(t.stats.abs_max)):
                continue
            seen.setdefault(t.name, []).append((scan.step, t.stats.abs_max, scan.path))
    out = []
    for name, points in seen.items():
        points.sort()
        if len(points) < 2:
            continue
        why = _collapse(name, points[0][1], points[-1][1])
        if why:
            out.append(Evidence(f"checkpoints: parameter {name}: {why} between the saves "
                                f"of steps {points[0][0]} and {points[-1][0]}",
                                location=Location(points[-1][2]), step=points[-1][0],
                                subject=name, onset=points[0][0],
                                value=points[-1][1], tensor=name))
    return out


@rule("NF209", "temperature-collapse", "a learnable temperature or logit scale collapses",
      needs=("layer_norms", "checkpoints"))
def temperature_collapse(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A temperature that divides logits (contrastive losses, distillation, attention with a
    learned scale) shrinking towards zero, or its log-space form (`log_temperature`, CLIP's
    `logit_scale`) running away, seen in per-parameter weight norms or in the checkpoints'
    scalar parameters, in a run that then failed.

    ## Why it produces NaN/Inf
    Logits divided by t grow as 1/t: once t is ~1e-5 a cosine similarity of 1 becomes a
    logit of 1e5, the softmax saturates (the loss sits at a constant such as log(batch)),
    gradients vanish or explode, and exp or the division overflows. Nothing in the loss
    keeps a learned t away from 0, and a schedule that anneals it per step instead of per
    epoch drives it there on purpose.

    ## Evidence
    A per-layer weight-norm tag or a checkpoint's single-element parameter whose name says
    temperature, tau or logit scale: held in log space, its magnitude above 10 and risen by
    at least 5 since its first point; held as itself, below 1e-3 and shrunk at least 100
    times.

    ## Fix
    Keep the temperature in a range, in log space:
    ```python
    self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    scale = self.logit_scale.clamp(max=math.log(100)).exp()   # as CLIP does
    logits = scale * a @ b.T
    # or bound a temperature from below: t = 0.01 + F.softplus(self.raw_t)
    # and anneal a schedule per epoch, not per step
    ```

    ## Known false positives
    A parameter whose name happens to contain "temp" (a template, a temporal layer) and
    whose norm shrinks for another reason; the finding names the tag so it can be checked.
    """
    if not ev.failed:
        return []
    evidence = _from_norms(ev) + _from_checkpoints(ev)
    if not evidence:
        return []
    step = ev.failure_step
    if step is not None and ev.replay is None:
        evidence.append(Evidence(lacking(step, "the op that the scaled logits broke", ev.unit),
                                 step=step))
    return [r.finding("medium", evidence, 0.8)]


RULES = (temperature_collapse,)
