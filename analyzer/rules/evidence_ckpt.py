"""What a run's checkpoints and histograms say about precision, read for the causes.

The checkpoint scan (:mod:`analyzer.model.checkpoints`) has already reduced every saved
tensor to its dtype, abs-max and non-finite counts, Adam's moments to the smallest second
moment and the number of exact zeros, and a loss scaler to its scale. This module turns those
numbers into facts the precision and optimizer rules can rest on, each with the file it was
read from:

- the dtype the model's weights were saved in: a training checkpoint whose weights are
  float16 comes from a model cast with ``.half()`` (autocast keeps float32 parameters);
- Adam state held in a half dtype with an ``eps`` that rounds to 0 there, and the elements of
  ``exp_avg_sq`` that are exactly 0, where the update divides by nothing;
- layers held in a half dtype whose finite abs-max in the last finite save is near that
  dtype's largest value;
- the last finite save against the first non-finite one: which layers went first, and a
  first non-finite save whose weights are non-finite beside finite Adam moments (the update
  wrote the value);
- the loss scaler's saved scale at each save;
- histogram minima and maxima (weights, gradients, activations) approaching a dtype's limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from analyzer.model import Evidence, Location
from analyzer.model.checkpoints import CheckpointScan, TensorRecord
from analyzer.rules.evidence import RunEvidence

LIMITS = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38}
"""Largest finite value of each floating dtype."""
TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}
"""Smallest positive (subnormal) value: a number below half of it rounds to 0."""
HALF = ("float16", "bfloat16")
NEAR = 16.0
"""A magnitude within this factor of a dtype's largest value is near it: four doublings,
which a weight norm growing by a few percent a step or an activation squared covers in a
handful of steps (a healthy network's weights and activations sit near 1)."""


BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
"""Module buffers a state dict holds beside the parameters; an optimizer holds no state
for them."""
_STATE = re.compile(r"^(?P<owner>.*?)\.?state\.(?P<index>\d+)\.(?P<key>[A-Za-z_]+)$")


def model_parameters(scan: CheckpointScan) -> list[TensorRecord]:
    """The model tensors of a save that are parameters (its buffers left out), in
    state-dict order: the order an optimizer's state indexes them by, for one group."""
    return [t for t in scan.tensors if t.group == "model" and not t.name.endswith(BUFFERS)]


def optimizer_entry(name: str) -> tuple[str, int, str] | None:
    """An optimizer state tensor's name read: the optimizer it belongs to (the name before
    ``state.``), the parameter index and the entry (``exp_avg``, ``momentum_buffer``)."""
    m = _STATE.match(name)
    return (m["owner"], int(m["index"]), m["key"]) if m is not None else None


def _save(path: str, step: int | None) -> str:
    """A save in a sentence: ``checkpoint step_3.pt (step 3)``, without a step unknown."""
    return f"checkpoint {_name(path)}" + (f" (step {step})" if step is not None else "")


def _name(path: str) -> str:
    """A save's file name for a sentence (the evidence's location carries the path)."""
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or path


def _dtype(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _float_weights(scan: CheckpointScan) -> list[TensorRecord]:
    return [t for t in scan.tensors if t.role == "weights" and t.stats is not None
            and _dtype(t.dtype) in LIMITS]


def _scans(ev: RunEvidence) -> tuple[CheckpointScan, ...]:
    history = ev.result.run.checkpoints
    return history.scans if history is not None else ()


@dataclass(frozen=True)
class WeightDtype:
    """The dtype most of a save's floating weights are held in."""

    dtype: str
    share: float
    scan: CheckpointScan

    def evidence(self) -> Evidence:
        return Evidence(f"{_save(self.scan.path, self.scan.step)}: "
                        f"{self.share:.0%} of the model's floating weights are {self.dtype}"
                        + (" (a model cast with .half(): autocast keeps float32 parameters)"
                           if self.dtype == "float16" else ""),
                        location=Location(self.scan.path), step=self.scan.step,
                        subject="dtype", ratio=self.share)


def weight_dtype(ev: RunEvidence) -> WeightDtype | None:
    """The dtype of the model's weights in the latest save that has any."""
    for scan in reversed(_scans(ev)):
        weights = _float_weights(scan)
        total = sum(t.stats.numel for t in weights if t.stats is not None)
        if not total:
            continue
        by: dict[str, int] = {}
        for t in weights:
            assert t.stats is not None
            by[_dtype(t.dtype)] = by.get(_dtype(t.dtype), 0) + t.stats.numel
        dtype, n = max(sorted(by.items()), key=lambda kv: kv[1])  # a tie by name, not order
        return WeightDtype(dtype, n / total, scan)
    return None


MIXED = ("16-mixed", "bf16-mixed", "fp16", "bf16")
"""Precisions a trainer saved that keep float32 master weights beside the half copies
(Lightning's mixed precision, DeepSpeed's fp16/bf16): their float16 weights are no .half()."""


def half_weights(ev: RunEvidence) -> WeightDtype | None:
    """A save whose weights are mostly float16 and whose trainer kept no float32 master
    copy: the model itself computes in float16."""
    found = weight_dtype(ev)
    if found is None or found.dtype != "float16" or found.share <= 0.5:
        return None
    meta = found.scan.meta
    if found.scan.format == "deepspeed" or (meta is not None and meta.precision in MIXED):
        return None
    return found


@dataclass(frozen=True)
class HalfAdam:
    """Adam state saved in a half dtype whose eps rounds to 0 there."""

    scan: CheckpointScan
    dtype: str
    eps: float
    params: int
    v_zero: int
    """Elements of exp_avg_sq exactly 0 (finite ones), over every parameter of the save."""

    def evidence(self) -> list[Evidence]:
        where = Location(self.scan.path)
        out = [Evidence(f"{_save(self.scan.path, self.scan.step)}: Adam's "
                        f"moments of {self.params} parameter(s) are {self.dtype} and its "
                        f"eps={self.eps:g} is below half of {self.dtype}'s smallest number "
                        f"({TINY[self.dtype]:.3g}): sqrt(exp_avg_sq) + eps is computed with "
                        "eps = 0", location=where, step=self.scan.step, subject="optimizer",
                        value=self.eps)]
        if self.v_zero:
            out.append(Evidence(f"{self.v_zero} element(s) of exp_avg_sq are exactly 0 in the "
                                f"save of step {self.scan.step}: their update divides by 0 as "
                                "soon as exp_avg is not",
                                location=where, step=self.scan.step, subject="exp_avg_sq",
                                value=float(self.v_zero)))
        return out


def half_adam(ev: RunEvidence) -> HalfAdam | None:
    """The latest save holding Adam state in float16 or bfloat16 with an eps that rounds to 0
    in that dtype."""
    for scan in reversed(_scans(ev)):
        if not scan.adam:
            continue
        dtypes = {_dtype(t.dtype) for t in scan.tensors
                  if t.group == "optimizer" and t.name.endswith(".exp_avg_sq")}
        half = [d for d in HALF if d in dtypes]
        if not half:
            continue
        dtype = half[0]
        rounds = [a for a in scan.adam if a.eps < TINY[dtype] / 2]
        if rounds:
            return HalfAdam(scan, dtype, min(a.eps for a in rounds), len(rounds),
                            sum(a.v_zero for a in rounds))
    return None


@dataclass(frozen=True)
class NearLimit:
    """A layer whose largest finite value in a save is near a dtype's largest value."""

    layer: str
    abs_max: float
    dtype: str
    scan: CheckpointScan

    def evidence(self) -> Evidence:
        limit = LIMITS[self.dtype]
        return Evidence(f"{_save(self.scan.path, self.scan.step)}: layer "
                        f"{self.layer}'s largest finite value is {self.abs_max:.4g}, "
                        f"{self.abs_max / limit:.0%} of {self.dtype}'s largest ({limit:g})",
                        location=Location(self.scan.path), step=self.scan.step,
                        subject=self.layer, value=self.abs_max, ratio=self.abs_max / limit)


def last_finite_scan(ev: RunEvidence) -> CheckpointScan | None:
    history = ev.result.run.checkpoints
    if history is None or history.last_finite is None:
        return None
    return history.scans[history.last_finite]


def near_limit(ev: RunEvidence) -> list[NearLimit]:
    """Layers held in a half dtype whose largest finite value in the last finite save is
    within NEAR of that dtype's limit, nearest first (float32 weights are left out: whether
    an autocast region casts them is not in the checkpoint)."""
    scan = last_finite_scan(ev)
    if scan is None:
        return []
    dtype_of = {t.name: _dtype(t.dtype) for t in _float_weights(scan)}
    out = []
    for layer in scan.layers:
        dtype = next((dtype_of[n] for n in layer.tensors if n in dtype_of), "float32")
        peak = layer.stats.abs_max
        if dtype in HALF and np.isfinite(peak) and peak * NEAR >= LIMITS[dtype]:
            out.append(NearLimit(layer.layer, peak, dtype, scan))
    return sorted(out, key=lambda n: -n.abs_max / LIMITS[n.dtype])


def first_bad_save(ev: RunEvidence) -> Evidence | None:
    """The first save holding non-finite values, the layers that hold them and how much each
    had grown over the finite saves before it."""
    history = ev.result.run.checkpoints
    if history is None or history.first_nonfinite is None:
        return None
    bad = history.saves[history.first_nonfinite]
    layers = history.nonfinite_layers
    grown = {g.layer: g.growth for g in history.layers}
    parts = [f"{name} (x{grown[name]:.3g} over the finite saves)"
             if grown.get(name) is not None else name for name in layers[:4]]
    more = f" and {len(layers) - 4} more" if len(layers) > 4 else ""
    last = history.last_finite
    since = (f"; the last finite save is step {history.saves[last].step}"
             if last is not None else "; no save before it is finite")
    return Evidence(f"{_save(bad.path, bad.step)} is the first save with "
                    f"non-finite values: {bad.nonfinite_tensors} tensor(s), in "
                    f"{', '.join(parts) or 'no model layer'}{more}{since}",
                    location=Location(bad.path), step=bad.step,
                    subject=layers[0] if len(layers) == 1 else None,
                    value=float(bad.nonfinite_tensors))


def saved_scales(ev: RunEvidence) -> list[tuple[int, float, str]]:
    """The loss scaler's scale at each save that holds one: (step, scale, file)."""
    history = ev.result.run.checkpoints
    if history is None:
        return []
    return [(s.step, s.scale, s.path) for s in history.saves
            if s.step is not None and s.scale is not None and np.isfinite(s.scale)]


def histogram_peaks(ev: RunEvidence, dtype: str, before: int | None) -> list[Evidence]:
    """Histogram tags whose finite minimum or maximum, before step ``before``, came within
    NEAR of ``dtype``'s largest value: the distribution itself approached the overflow."""
    limit = LIMITS[dtype]
    out = []
    for h in ev.result.run.histograms:
        keep = np.ones(len(h), dtype=bool) if before is None else h.steps < before
        peaks = np.maximum(np.abs(h.mins), np.abs(h.maxs))
        keep &= np.isfinite(peaks)
        if not keep.any():
            continue
        i = int(np.flatnonzero(keep)[np.argmax(peaks[keep])])
        peak = float(peaks[i])
        if peak * NEAR >= limit:
            out.append(Evidence(f"histogram {h.tag} reached {peak:.4g} at step {int(h.steps[i])}, "
                                f"{peak / limit:.0%} of {dtype}'s largest ({limit:g})",
                                location=h.location(i), step=int(h.steps[i]), subject=h.tag,
                                value=peak, ratio=peak / limit))
    return out


@dataclass(frozen=True)
class UpdateWrote:
    """A save whose weights hold NaN or Inf while every Adam moment beside them is finite."""

    scan: CheckpointScan
    tensors: tuple[str, ...]

    def evidence(self) -> Evidence:
        shown = ", ".join(self.tensors[:3]) + (f" and {len(self.tensors) - 3} more"
                                               if len(self.tensors) > 3 else "")
        return Evidence(f"{_save(self.scan.path, self.scan.step)}: the "
                        f"weights {shown} hold NaN or Inf while every Adam moment is finite: "
                        "the moments are updated from the gradient before the weights, so "
                        "the gradient was finite and the update itself wrote the value",
                        location=Location(self.scan.path), step=self.scan.step,
                        subject="optimizer update", tensor=self.tensors[0])


def update_wrote(ev: RunEvidence) -> UpdateWrote | None:
    """The first non-finite save, when only its weights are non-finite and its Adam state
    is finite: Adam folds each gradient into exp_avg and exp_avg_sq before it steps, so a
    NaN or Inf from the forward or backward pass would be in the moments too."""
    history = ev.result.run.checkpoints
    if history is None or history.first_nonfinite is None:
        return None
    scan = history.scans[history.first_nonfinite]
    bad = scan.nonfinite_tensors
    if not scan.adam or not bad or any(a.nonfinite for a in scan.adam):
        return None
    if any(t.role != "weights" for t in bad):
        return None
    return UpdateWrote(scan, tuple(t.name for t in bad))
