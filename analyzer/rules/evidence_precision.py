"""One reading of a run's precision: the dtype its model computes in, and its loss scaler.

Several rules ask the same two questions ("does this model compute in float16 itself?",
"did a dynamic loss scaler run?"); they all read the answer here, once per run, so that a
run is never a float16 model to one rule and a float32 one to the next.

The compute dtype is read from, in this order: the configured precision (Lightning's
``16-true``/``bf16-true``, ``half``), torch's default dtype in env.json, loss and gradient
curves whose every value is a float16 number, and the dtype of the weights a checkpoint
saved without float32 master copies (:func:`~analyzer.rules.evidence_ckpt.half_weights`).
Mixed precision (Lightning's ``16-mixed``/``bf16-mixed``, a Trainer's ``fp16``/``bf16``
flags, a DeepSpeed config) is recorded too, as a compute dtype whose weights stay float32:
it never makes the model a float16 one.

The loss scaler is ``dynamic`` where it visibly worked (a logged scale other than 1.0,
skipped steps a log reports, a saved scaler state: ``GradScaler.state_dict()`` is empty
when it is disabled), ``disabled`` where otherwise the logged scale is exactly 1.0 at two
or more points and at every point (what a GradScaler built with ``enabled=False`` reports:
its ``get_scale()`` is 1.0), ``unknown`` where a scale was logged but says
neither (one point of 1.0, which a scaler at its floor also shows, or non-finite points
beside 1.0), and ``none`` where nothing of a scaler was seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_ckpt import MIXED, WeightDtype, half_weights, saved_scales

ScalerState = Literal["dynamic", "disabled", "unknown", "none"]

_TRUE = {"16-true": "float16", "half": "float16", "float16": "float16",
         "bf16-true": "bfloat16", "bfloat16": "bfloat16"}
"""Configured precisions that put the model's weights themselves in a half dtype."""
_MIXED = {"16-mixed": "float16", "16": "float16", "fp16": "float16",
          "bf16-mixed": "bfloat16", "bf16": "bfloat16"}
"""Configured precisions that autocast beside float32 master weights."""


@dataclass(frozen=True)
class Compute:
    """One thing the run shows about the dtype its model computes in."""

    dtype: str
    """``float16`` or ``bfloat16``."""
    masters: bool
    """Whether float32 master weights are kept (autocast, mixed precision)."""
    why: str


@dataclass(frozen=True)
class Scaler:
    """What the run shows of a loss scaler, with the sentence it rests on."""

    state: ScalerState
    why: str | None
    skips: bool
    """Whether a log or the scale series shows skipped steps (the series infers one at a
    non-finite gradient norm even where the scale never moved, so a disabled scaler can
    show one: the state, not this, says whether a scaler worked)."""


@dataclass(frozen=True)
class PrecisionReading:
    """The run's precision as far as it shows it (see the module's docstring)."""

    model: str | None
    """Why the model computes in float16 itself, from its configuration, env.json or its
    curves, in words; None when none of them shows it."""
    weights: WeightDtype | None
    """A save whose weights are float16 without float32 masters."""
    compute: tuple[Compute, ...]
    scaler: Scaler

    @property
    def half_model(self) -> bool:
        """Whether anything shows the model itself computing in float16."""
        return self.model is not None or self.weights is not None

    def half_words(self) -> str | None:
        """The first reason to call the run a float16 one, in words: the model itself, or
        a dynamic scaler (which only float16 autocast needs)."""
        if self.model is not None:
            return self.model
        if self.weights is not None:
            return self.weights.evidence().text
        if self.scaler.state == "dynamic":
            return f"{self.scaler.why} (float16 autocast)"
        return None


def precision(ev: RunEvidence) -> PrecisionReading:
    """The run's precision reading, computed once per run."""
    return ev.cached("precision", lambda: _read(ev))


def _read(ev: RunEvidence) -> PrecisionReading:
    compute = _compute(ev)
    model = next((c.why for c in compute if c.dtype == "float16" and not c.masters), None)
    weights = half_weights(ev)
    if weights is not None:
        compute.append(Compute("float16", False, weights.evidence().text))
    return PrecisionReading(model, weights, tuple(compute), _scaler(ev))


def _compute(ev: RunEvidence) -> list[Compute]:
    out: list[Compute] = []
    meta = ev.result.run.metadata
    configured = meta.text("precision") if meta is not None else None
    if configured is not None:
        key = configured.lower()
        if key in _TRUE:
            words = "float16 weights" if _TRUE[key] == "float16" else "bfloat16 weights"
            out.append(Compute(_TRUE[key], False,
                               f"the run's configuration sets precision={configured} ({words})"))
        elif key in _MIXED:
            out.append(Compute(_MIXED[key], True, f"the run's configuration sets "
                               f"precision={configured} (autocast, float32 weights)"))
    env = ev.env
    if env is not None and env.get("default_dtype") == "float16":
        out.append(Compute("float16", False, "env.json records torch's default dtype as float16"))
    if ev.float16:
        names = " and ".join(c.tag for c in ev.float16)
        out.append(Compute("float16", False,
                           f"every logged value of {names} is exactly representable in float16 "
                           "(computed in float16, not float32)"))
    for flag, dtype in (("fp16", "float16"), ("bf16", "bfloat16")):
        if meta is not None and meta.flag(flag):
            out.append(Compute(dtype, True, f"the trainer's arguments set {flag}=True "
                               "(autocast, float32 weights)"))
    history = ev.result.run.checkpoints
    for scan in reversed(history.scans if history is not None else ()):
        saved = scan.meta.precision if scan.meta is not None else None
        if saved in MIXED and saved is not None:
            if any(c.dtype == _MIXED[saved] and c.masters for c in out):
                break  # the configuration read from this save already says it
            out.append(Compute(_MIXED[saved], True, f"checkpoint {scan.path} was written with "
                               f"precision {saved} (float32 master weights)"))
            break
    return out


def _scaler(ev: RunEvidence) -> Scaler:
    logged = bool(ev.events("overflow_skip"))
    skips = logged or bool(ev.result.overflow_skips)
    curve = ev.loss_scale
    finite = curve.values[np.isfinite(curve.values)] if curve is not None else np.empty(0)
    if curve is not None and bool(np.any(finite != 1.0)):
        return Scaler("dynamic", f"{curve.tag} is logged with values other than 1.0", skips)
    if logged:
        return Scaler("dynamic", "the loss scaler skipped overflowing steps", skips)
    saved = saved_scales(ev)
    if saved:
        step, scale, path = saved[-1]
        return Scaler("dynamic", f"checkpoint {path} (step {step}) holds a loss scaler's state "
                      f"(scale {scale:g})", skips)
    if curve is None:
        return Scaler("none", None, skips)
    if len(curve) >= 2 and finite.size == len(curve):
        # the series' inferred skip at a non-finite gradient is no skip of a scale that
        # never moved: a disabled scaler skips nothing
        return Scaler("disabled", f"{curve.tag} is 1.0 at every logged step", skips)
    return Scaler("unknown", f"{curve.tag} is logged but shows neither a working nor a disabled "
                  "scaler", skips)


def float16_model(ev: RunEvidence) -> str | None:
    """Why the run's model computed in float16 itself (not autocast with a scaler), in
    words; None when nothing shows it."""
    return precision(ev).model
