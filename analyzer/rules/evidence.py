"""The evidence rules read, derived once per run from what the analysis found.

Scalar views merge a tag's points from every file and keep one value per step (the last
written: a resumed run overwrites the steps it repeats), in step order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from analyzer.curves import last_per_step, most_points, training
from analyzer.model import CaptureMeta, Event, Incident, Location, RunResult, Series
from analyzer.rules.anatomy import Anatomy, anatomy
from analyzer.tags import TagRole, role

T = TypeVar("T")
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Curve:
    """One scalar over steps: unique steps ascending, the tag it came from, where to look."""

    tag: str
    steps: IntArray
    values: FloatArray
    source: Series

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def before(self, step: int | None) -> Curve:
        """The points strictly before ``step`` (all of them when step is None)."""
        if step is None:
            return self
        keep = self.steps < step
        return Curve(self.tag, self.steps[keep], self.values[keep], self.source)

    def tail(self, n: int) -> Curve:
        return Curve(self.tag, self.steps[-n:], self.values[-n:], self.source)

    def location_at(self, step: int) -> Location:
        hits = np.flatnonzero(self.source.steps == step)
        return self.source.location(int(hits[-1]) if hits.size else 0)


def merge(series: list[Series]) -> Curve | None:
    if not series:
        return None
    steps, values = last_per_step(series)
    return Curve(series[0].tag, steps, values, series[0])


@dataclass
class RunEvidence:
    """What a run offers the rules. Built once per run; parts are computed on first use."""

    result: RunResult
    siblings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """env.json contents of the healthy runs beside this one, by run name."""
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def cached(self, key: str, compute: Callable[[], T]) -> T:
        """A reading computed once per run, for readings several rules ask for (defined
        beside their rules, which this module cannot import)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return cast(T, self._memo[key])

    @property
    def incident(self) -> Incident | None:
        return self.result.incident

    @property
    def failed(self) -> bool:
        return self.result.incident is not None

    @property
    def unit(self) -> str:
        """What the failure's step counts: ``step``, or its log's own word (``record``)
        where the log could not be placed on the run's steps."""
        from analyzer.wording import incident_unit

        inc = self.result.incident
        return incident_unit(inc, self.result.run) if inc is not None else "step"

    @property
    def failure_step(self) -> int | None:
        """The first step that can hold the failure: the incident's, or the one after it
        for a log line placed after a step (``Incident.after``)."""
        inc = self.result.incident
        return inc.earliest_step if inc is not None else None

    def _best(self, pick: list[Series]) -> Curve | None:
        return merge(most_points(pick))

    def _train(self, want: TagRole) -> list[Series]:
        """The series of one role from the training pass (validation tags left out)."""
        return training(self.result.run.global_series, want)

    @cached_property
    def loss(self) -> Curve | None:
        return self._best(self._train(TagRole.LOSS))

    @cached_property
    def grad_norm(self) -> Curve | None:
        return self._best(self._train(TagRole.GRAD_NORM))

    @cached_property
    def lr(self) -> Curve | None:
        return self._best(self._train(TagRole.LEARNING_RATE))

    @cached_property
    def loss_scale(self) -> Curve | None:
        return self._best(self._train(TagRole.LOSS_SCALE))

    def _per_layer(self, want: TagRole) -> dict[str, Curve]:
        groups: dict[str, list[Series]] = {}
        for s in self.result.run.global_series:
            if role(s.tag) is want:  # a per-layer role: the tag names a layer
                groups.setdefault(s.tag, []).append(s)
        out: dict[str, Curve] = {}
        for tag, parts in groups.items():
            curve = merge(parts)
            if curve is not None:
                out[tag] = curve
        return out

    @cached_property
    def layer_grad_norms(self) -> dict[str, Curve]:
        return self._per_layer(TagRole.LAYER_GRAD)

    @cached_property
    def layer_weight_norms(self) -> dict[str, Curve]:
        return self._per_layer(TagRole.LAYER_WEIGHT)

    @cached_property
    def onset(self) -> Onset | None:
        """How the failure began in the logged curves (see :func:`onset`)."""
        return onset(self)

    @cached_property
    def float16(self) -> list[Curve]:
        return float16_curves(self)

    @cached_property
    def anatomy(self) -> Anatomy:
        """The kinds of modules the run's names show (:mod:`analyzer.rules.anatomy`)."""
        return anatomy(self.result)

    def events(self, kind: str) -> list[Event]:
        return [e for e in self.result.run.global_events if e.kind == kind]

    @property
    def capture_meta(self) -> CaptureMeta | None:
        """The checked meta.json of the run's earliest capture that has one (read by ingest)."""
        metas = self.result.run.capture_metas
        return metas[0] if metas else None

    @property
    def env(self) -> Mapping[str, Any] | None:
        """The run's env.json, or the environment its capture recorded (read by ingest)."""
        return self.result.run.env

    @property
    def replay(self) -> Any:
        return self.result.replay

    def has(self, need: str) -> bool:
        """Whether one kind of evidence is present; the names rules declare in ``needs``."""
        checks = {
            "loss": lambda: self.loss is not None,
            "grad_norm": lambda: self.grad_norm is not None,
            "lr": lambda: self.lr is not None,
            "loss_scale": lambda: (self.loss_scale is not None
                                   or bool(self.events("overflow_skip"))
                                   or bool(self.result.overflow_skips)),
            "layer_norms": lambda: bool(self.layer_grad_norms or self.layer_weight_norms),
            "replay": lambda: self.replay is not None,
            "capture": lambda: self.capture_meta is not None,
            "anomaly_log": lambda: any("function" in e.detail for e in self.events("nonfinite")),
            "checkpoints": lambda: self.result.run.checkpoints is not None,
            "env": lambda: self.env is not None,
            "siblings": lambda: self.env is not None and bool(self.siblings),
            "ranks": lambda: len({s.rank for s in self.result.run.global_series
                                  if s.rank is not None}) > 1,
        }
        return bool(checks[need]())

    def missing_reason(self, needs: tuple[str, ...]) -> str:
        reasons = {
            "loss": "no loss series",
            "grad_norm": "no total gradient-norm series",
            "lr": "no learning-rate series",
            "loss_scale": "no loss-scale series or overflow messages",
            "layer_norms": "no per-layer gradient or weight norms",
            "replay": (f"no replay ({self.result.replay_error})" if self.result.replay_error
                       else "no replay: the run has no capture of the failing step"),
            "capture": "no capture of the failing step",
            "anomaly_log": "no autograd anomaly message in the logs",
            "checkpoints": "no checkpoints",
            "env": "no env.json",
            "siblings": "no healthy run with an env.json beside this one to compare with",
            "ranks": "no per-rank series",
        }
        return "; ".join(reasons[n] for n in needs)



FP16_EXACT_MIN = 8
"""Distinct logged values, all exactly representable in float16, that show a float16 model
(a float32 value is float16-exact by chance about once in 8,000)."""


@dataclass(frozen=True)
class Onset:
    """How the training loss, gradient and weights first went non-finite, read post hoc.

    ``phase`` is ``forward`` when the loss went first (or with everything else), ``backward``
    when a gradient went non-finite at a step whose loss was still finite, ``update`` when a
    weight norm went first while loss and gradients were finite."""

    step: int
    phase: str
    loss_kind: str | None
    """``+inf``, ``-inf`` or ``nan``: the loss at ``step``; None when it was finite there."""
    prior: FloatArray
    """The finite loss values logged before ``step``, in step order."""
    tag: str
    """The tag that went first (the loss's when several went at once)."""


def _first_bad(c: Curve) -> int | None:
    bad = np.flatnonzero(~np.isfinite(c.values))
    return int(c.steps[bad[0]]) if bad.size else None


def _kind(v: float) -> str:
    return "nan" if math.isnan(v) else ("+inf" if v > 0 else "-inf")


def onset(ev: RunEvidence) -> Onset | None:
    """The first non-finite step of the loss, gradient or weight curves, and its phase."""
    loss = ev.loss
    if loss is None or not ev.failed:
        return None
    grads = [c for c in (ev.grad_norm, *ev.layer_grad_norms.values()) if c is not None]
    firsts = {"loss": _first_bad(loss),
              "grad": min((s for s in map(_first_bad, grads) if s is not None), default=None),
              "weight": min((s for s in map(_first_bad, ev.layer_weight_norms.values())
                             if s is not None), default=None)}
    seen = [s for s in firsts.values() if s is not None]
    if not seen:
        return None
    step = min(seen)
    at = np.flatnonzero(loss.steps == step)
    loss_value = float(loss.values[at[-1]]) if at.size else None
    loss_kind = _kind(loss_value) if loss_value is not None and not math.isfinite(
        loss_value) else None
    if firsts["loss"] == step or loss_value is None:
        phase, tag = "forward", loss.tag
    elif firsts["grad"] == step:
        phase = "backward"
        tag = next(c.tag for c in grads if _first_bad(c) == step)
    else:
        phase = "update"
        tag = next(c.tag for c in ev.layer_weight_norms.values() if _first_bad(c) == step)
    before = loss.before(step).values
    return Onset(step, phase, loss_kind, before[np.isfinite(before)], tag)


def float16_curves(ev: RunEvidence) -> list[Curve]:
    """The loss and gradient curves whose logged values are all float16-exact: a model
    computing in float16 (values logged as rounded text are never taken for it)."""
    out = []
    for c in (ev.loss, ev.grad_norm):
        if c is None:
            continue
        v = c.values[np.isfinite(c.values)]
        with np.errstate(over="ignore"):
            exact = bool(np.all(v.astype(np.float16) == v))
        if np.unique(v).size >= FP16_EXACT_MIN and exact:
            out.append(c)
    return out


SATURATED_LOSS = 1e-3
"""A loss driven this close to 0 just before the failure: probabilities saturated at 0 or 1,
where a log of one of them is a step away from log(0)."""
GROWING = 10.0
"""A last value this many times the median of those before it rose into the failure."""
MIN_PRIOR = 5
"""Finite loss values before the failure needed to call the loss flat, growing or saturated."""


def rose(values: FloatArray) -> bool:
    """Whether the last finite value is GROWING times the median of the earlier ones."""
    v = np.abs(values[np.isfinite(values)])
    if v.size < 2:
        return False
    return bool(v[-1] > GROWING * max(float(np.median(v[:-1])), 1e-30))


def gradient_rose(ev: RunEvidence, step: int) -> bool:
    """Whether the total gradient norm rose into ``step`` (a growth, not a sudden fault)."""
    g = ev.grad_norm
    return g is not None and rose(g.before(step).values)


def saturated(o: Onset) -> bool:
    """The loss stayed near 0 over the last values before the failure (a loss that
    alternates between 0 and hundreds, as a float16 one can, is not saturated)."""
    last = o.prior[-MIN_PRIOR:]
    return (o.prior.size >= MIN_PRIOR and float(np.median(last)) < SATURATED_LOSS
            and float(np.max(np.abs(last))) < 100 * SATURATED_LOSS)


RECORD_ONE = ("To record one: `callbacks=[FlightRecorderCallback()]` in a Lightning Trainer, "
              "`FlightRecorderTrainer` for a Hugging Face Trainer, or, in a loop, `recorder = "
              "FlightRecorder(run_dir, model, optimizer, loss_factory=make_loss)` "
              "(analyzer.capture) and `with recorder.step(inputs=x, targets=y) as rec:` "
              "around each step (docs/capture.md)")
"""The two lines that leave a capture of the failing step, for a finding's 'not seen'."""
ANOMALY = "`torch.autograd.set_detect_anomaly(True)`"


def lacking(step: int, op: str, unit: str = "step") -> str:
    """What a post-hoc finding lacks, and the two lines that would decide it."""
    return (f"not seen: the op that made the first non-finite value ({op}); a capture of "
            f"{unit} {step} or an anomaly traceback would name it. {RECORD_ONE}, or {ANOMALY}")
