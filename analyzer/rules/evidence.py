"""The evidence rules read, derived once per run from what the analysis found.

Scalar views merge a tag's points from every file and keep one value per step (the last
written: a resumed run overwrites the steps it repeats), in step order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.curves import last_per_step, most_points, training
from analyzer.model import CaptureMeta, Event, Incident, Location, RunResult, Series
from analyzer.tags import TagRole, role

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

    @property
    def incident(self) -> Incident | None:
        return self.result.incident

    @property
    def failed(self) -> bool:
        return self.result.incident is not None

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

