"""The scale of a run's inputs and of its initial weights, read from what it logged.

Both readings rest on how PyTorch initialises a layer and on what the first layer's
gradients are made of.

**The inputs' scale.** For a first layer ``y = W x + b`` (Linear, Conv, a recurrent
layer's input weights) the weight gradient sums ``δ xᵀ`` over the batch and positions while
the bias gradient sums ``δ`` alone, so ``‖∇W‖ / ‖∇b‖`` is about the norm of one input patch,
``sqrt(fan_in) · rms(x)``, whatever the loss and at every step. ``fan_in`` is
``numel(W) / numel(b)`` (the inputs feeding one output), from a checkpoint's tensor shapes;
without one, from ``‖W‖ / ‖b‖`` at the first logged step, which PyTorch's default init
(weight and bias drawn from the same ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``) makes
``sqrt(fan_in)``. The quotient estimates the inputs' RMS: about 1 for standardized data
(up to ~10 for a recurrent layer, whose bias gradients cancel over time), ~100 for raw
pixels. A bias-free first layer (an embedding, ``bias=False``) gives no reading. Without
per-layer gradient tags, gradient histograms (a tensor's histogram holds its sum of squares
and its element count: its norm and its size) or the optimizer's moments in a checkpoint
(``exp_avg``, ``momentum_buffer``: running sums of the same gradients) give the same
quotient.

**The initial weights' scale.** PyTorch's default init gives a weight of shape
``(out, in, *k)`` entries of variance ``1 / (3 · in · prod(k))``, so ``‖W‖ ≈ sqrt(out / 3)``;
the common alternatives (Kaiming-normal, Xavier, orthogonal, ``normal(0, 0.02)``) stay
within about 2.5 times that. A weight norm at the first logged step (after one update,
whose size is bounded by ``lr · max(‖∇W‖, 10 · sqrt(numel))`` for SGD, Adam and RMSprop
alike) far above it was initialised too large. The shape comes from a checkpoint;
embeddings, normalisation and recurrent layers, initialised otherwise, are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analyzer.model import Location, Series
from analyzer.model.checkpoints import CheckpointScan, TensorRecord
from analyzer.rules.anatomy import kinds_of
from analyzer.rules.evidence import Curve, RunEvidence, merge
from analyzer.rules.evidence_ckpt import model_parameters, optimizer_entry
from analyzer.tags import layer_from_tag, param_from_tag

_STAT_PARTS = {"norm", "l2", "l2_norm", "value", "max", "mean", "rms"}
_MOMENTS = ("exp_avg", "momentum_buffer")
"""The optimizer entries that sum a parameter's gradients (Adam's first moment, SGD's
momentum): their norms stand in for the gradients' where no tag logged them."""
UPDATE_SPREAD = 10.0
"""The largest per-element first step of a common optimizer, in units of the rate:
RMSprop's g/sqrt((1-alpha)·g²) with alpha 0.99 (Adam's, Adagrad's and Lion's are 1)."""


@dataclass(frozen=True)
class InputScale:
    """The inputs' RMS estimated from the first layer's gradients."""

    param: str
    """The first layer's weight, ``conv1.weight``."""
    rms: float
    grad_ratio: float
    """``‖∇W‖ / ‖∇b‖``: the median over the logged steps, or the moments' quotient."""
    fan_in: float
    fan_source: str
    grad_source: str
    step: int | None
    location: Location | None

    def text(self) -> str:
        return (f"the first layer {self.param}: ‖∇W‖/‖∇b‖ = {self.grad_ratio:.3g} "
                f"({self.grad_source}) over sqrt(fan_in) = {math.sqrt(self.fan_in):.3g} "
                f"({self.fan_source}) puts the inputs' RMS near {self.rms:.3g} "
                "(about 1 for standardized inputs)")


@dataclass(frozen=True)
class InitScale:
    """One layer's weight norm at the first logged step against PyTorch's default init."""

    param: str
    norm: float
    """The logged norm less the most the first update could have added."""
    expected: float
    shape: tuple[int, ...]
    step: int
    location: Location

    @property
    def ratio(self) -> float:
        return self.norm / self.expected


def param_name(tag: str) -> str:
    """The parameter a per-layer tag names: ``grad_norm/conv1.weight`` and
    ``grad_norm/conv1/weight`` -> ``conv1.weight``."""
    named = param_from_tag(tag)
    if named is not None:
        return named
    parts = [p for p in tag.split("/") if p]
    while len(parts) > 1 and parts[-1].lower() in _STAT_PARTS:
        parts.pop()
    return parts[-1]


def bias_of(weight: str) -> str | None:
    """The bias paired with a weight: ``fc.weight`` -> ``fc.bias``, ``rnn.weight_ih_l0`` ->
    ``rnn.bias_ih_l0``, ``in_proj_weight`` -> ``in_proj_bias``; None for a non-weight."""
    head, dot, leaf = weight.rpartition(".")
    if "weight" not in leaf:
        return None
    return f"{head}{dot}{leaf.replace('weight', 'bias', 1)}"


def _in_file_order(curves: dict[str, Curve]) -> list[tuple[str, Curve]]:
    """Per-layer curves by parameter: in the order the file wrote them at their first step
    (a writer logs parameters in model order; readers sort tags by name). Only the source
    file holding most of them is used, where positions compare; none when the first two
    share a position (one text line holding several)."""
    files: dict[str, int] = {}
    for c in curves.values():
        files[c.source.source] = files.get(c.source.source, 0) + 1
    if not files:
        return []
    main = max(files, key=lambda f: files[f])
    same = [c for c in curves.values() if c.source.source == main and len(c.source)]
    same.sort(key=lambda c: int(c.source.positions[0]))
    starts = [int(c.source.positions[0]) for c in same]
    if len(starts) > 1 and starts[0] == starts[1]:
        return []  # several parameters on one log line: the order they were written is lost
    return [(param_name(c.tag), c) for c in same]


def _first_pair(ordered: list[tuple[str, Curve]]) -> tuple[str, str] | None:
    """The first weight in parameter order and its bias; None when it has none (a
    bias-free first layer gives no reading)."""
    names = [n for n, _ in ordered]
    for name in names:
        bias = bias_of(name)
        if bias is None:
            if name.rpartition(".")[2].startswith("bias"):
                continue  # a bias logged before its weight: the weight comes next
            return None
        return (name, bias) if bias in names else None
    return None


def _tensors(ev: RunEvidence) -> list[CheckpointScan]:
    history = ev.result.run.checkpoints
    return list(history.scans) if history is not None else []


def _shape(ev: RunEvidence, param: str) -> tuple[tuple[int, ...], str] | None:
    """A parameter's shape from any checkpoint (shapes do not change), and the file."""
    for scan in _tensors(ev):
        for t in scan.tensors:
            if t.group == "model" and (t.name == param or t.name.endswith("." + param)):
                return t.shape, scan.path.rsplit("/", 1)[-1]
    return None


def _first_weight(ev: RunEvidence) -> str | None:
    """The first parameter a checkpoint saves, in state-dict (model) order."""
    for scan in _tensors(ev):
        for t in model_parameters(scan):
            if t.stats is not None:
                return t.name
    return None


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _at(c: Curve, step: int) -> float | None:
    hit = np.flatnonzero(c.steps == step)
    return float(c.values[hit[-1]]) if hit.size else None


def input_scale(ev: RunEvidence) -> InputScale | None:
    """The inputs' RMS from the first layer's logged gradient norms, else from the
    optimizer's moments in a checkpoint; None when neither reads."""
    return ev.cached("input_scale", lambda: _input_scale(ev))


def _input_scale(ev: RunEvidence) -> InputScale | None:
    hists = _histograms(ev)
    for grad_curves, weight_curves, kind in (
            (ev.layer_grad_norms, ev.layer_weight_norms, "grad-norm tags"),
            (hists.grads, hists.weights, "gradient histograms")):
        found = _from_tags(ev, grad_curves, weight_curves, hists.counts, kind)
        if found is not None:
            return found
    return _from_moments(ev)


@dataclass(frozen=True)
class _Histograms:
    """Per-parameter norms from histogram tags (``sqrt(sum_squares)``) and each
    parameter's element count: a histogram of a tensor is its norm and its size."""

    grads: dict[str, Curve]
    weights: dict[str, Curve]
    counts: dict[str, int]


def _histograms(ev: RunEvidence) -> _Histograms:
    grads: dict[str, Curve] = {}
    weights: dict[str, Curve] = {}
    counts: dict[str, int] = {}
    for h in ev.result.run.histograms:
        if layer_from_tag(h.tag) is None or not len(h):
            continue
        norms = np.sqrt(np.where(h.sum_squares >= 0, h.sum_squares, np.nan))
        curve = merge([Series(tag=h.tag, steps=h.steps, values=norms, wall_times=h.wall_times,
                              source=h.source, positions=h.positions)])
        if curve is None:
            continue
        (grads if "grad" in h.tag.lower() else weights)[h.tag] = curve
        counts.setdefault(param_name(h.tag), int(h.counts[0]))
    return _Histograms(grads, weights, counts)


def _from_tags(ev: RunEvidence, grad_curves: dict[str, Curve],
               weight_curves: dict[str, Curve], counts: dict[str, int],
               kind: str) -> InputScale | None:
    grads = {param_name(t): c for t, c in grad_curves.items()}
    if kind == "gradient histograms" and len(grads) < 4:
        return None  # a few layers picked out, not the model's parameters from the first
    pair = _first_pair(_in_file_order(grad_curves))
    if pair is None:
        return None
    first_saved = _first_weight(ev)
    if first_saved is not None and first_saved != pair[0] and not (
            first_saved.endswith("." + pair[0]) or pair[0].endswith("." + first_saved)):
        return None  # a checkpoint shows the model starts elsewhere: not its inputs
    w_name, b_name = pair
    gw, gb = grads[w_name].before(ev.failure_step), grads[b_name].before(ev.failure_step)
    steps, wi, bi = np.intersect1d(gw.steps, gb.steps, return_indices=True)
    a, b = gw.values[wi], gb.values[bi]
    ok = np.isfinite(a) & np.isfinite(b) & (b > 0)
    if not np.any(ok):
        return None
    ratio = float(np.median(a[ok] / b[ok]))
    fan = _fan_in(ev, w_name, b_name, weight_curves, counts)
    if fan is None:
        return None
    fan_in, fan_source = fan
    first = int(steps[0])
    span = f"step {first}" if len(steps) == 1 else f"median from step {first} to {int(steps[-1])}"
    return InputScale(w_name, ratio / math.sqrt(fan_in), ratio, fan_in, fan_source,
                      f"{kind}, {span}", first, gw.location_at(first))


def _fan_in(ev: RunEvidence, w_name: str, b_name: str, weight_curves: dict[str, Curve],
            counts: dict[str, int]) -> tuple[float, str] | None:
    """``numel(W) / numel(b)`` from a checkpoint's shapes or histograms' element counts;
    else ``(‖W‖ / ‖b‖)²`` at the first logged step, which the default init makes the
    fan-in."""
    w_shape, b_shape = _shape(ev, w_name), _shape(ev, b_name)
    if w_shape is not None and b_shape is not None and _numel(b_shape[0]):
        return _numel(w_shape[0]) / _numel(b_shape[0]), f"shapes in {w_shape[1]}"
    if counts.get(w_name, 0) > 0 and counts.get(b_name, 0) > 0:
        return counts[w_name] / counts[b_name], "histograms' element counts"
    weights = {param_name(t): c for t, c in weight_curves.items()}
    cw, cb = weights.get(w_name), weights.get(b_name)
    loss = ev.loss
    if cw is None or cb is None or not len(cw) or (loss is not None and len(loss)
                                                   and cw.steps[0] > loss.steps[0]):
        return None  # weight norms logged from later on no longer show the init
    step = int(cw.steps[0])
    w, b = _at(cw, step), _at(cb, step)
    if w is None or b is None or not (math.isfinite(w) and math.isfinite(b)) or b <= 0:
        return None
    return (w / b) ** 2, f"‖W‖/‖b‖ at step {step}, the default init's"


def _from_moments(ev: RunEvidence) -> InputScale | None:
    """The quotient from the optimizer's first moments (or momentum) of the first weight
    and its bias, in the last checkpoint saved before the failure."""
    for scan in reversed(_finite_scans(ev)):
        found = _moments_of(scan)
        if found is not None:
            w, b, mw, mb = found
            ratio = mw.stats.l2_norm / mb.stats.l2_norm  # type: ignore[union-attr]
            fan_in = _numel(w.shape) / _numel(b.shape)
            name = scan.path.rsplit("/", 1)[-1]
            kind = mw.name.rpartition(".")[2]
            return InputScale(w.name, ratio / math.sqrt(fan_in), ratio, fan_in,
                              f"shapes in {name}", f"{kind} in {name}", scan.step,
                              Location(scan.path))
    return None


def _finite_scans(ev: RunEvidence) -> list[CheckpointScan]:
    history = ev.result.run.checkpoints
    if history is None:
        return []
    stop = history.last_finite
    return list(history.scans[:stop + 1]) if stop is not None else []


def _moments_of(scan: CheckpointScan
                ) -> tuple[TensorRecord, TensorRecord, TensorRecord, TensorRecord] | None:
    """The first weight, its bias, and their moments, matched by parameter index and
    checked by shape (an index that lands elsewhere fails the check)."""
    params = [t for t in model_parameters(scan) if t.stats is not None]
    if len(params) < 2:
        return None
    w = params[0]
    names = [t.name for t in params]
    bias = bias_of(w.name)
    if bias is None or bias not in names or not w.shape:
        return None
    j = names.index(bias)
    b = params[j]
    if len(b.shape) != 1 or b.shape[0] != w.shape[0]:
        return None  # not a bias of the weight's rows (a transposed convolution's)
    moments: dict[int, TensorRecord] = {}
    prefix: str | None = None
    for t in scan.tensors:
        entry = optimizer_entry(t.name)
        if entry is None or entry[2] not in _MOMENTS or t.stats is None or (
                prefix is not None and entry[0] != prefix):
            continue
        prefix = entry[0]
        moments.setdefault(entry[1], t)
    mw, mb = moments.get(0), moments.get(j)
    if mw is None or mb is None or mw.shape != w.shape or mb.shape != b.shape:
        return None
    if mw.stats is None or mb.stats is None or mw.stats.nonfinite or mb.stats.nonfinite or \
            not mb.stats.l2_norm > 0:
        return None
    return w, b, mw, mb


def init_scales(ev: RunEvidence) -> list[InitScale]:
    """Each weight's norm at the first logged step (less the most the first update could
    add) against the default init's for its checkpointed shape, in parameter order."""
    return ev.cached("init_scales", lambda: _init_scales(ev))


def _init_scales(ev: RunEvidence) -> list[InitScale]:
    loss, lr = ev.loss, ev.lr
    out: list[InitScale] = []
    grads = {param_name(t): c for t, c in ev.layer_grad_norms.items()}
    for name, curve in _in_file_order(ev.layer_weight_norms):
        if not len(curve) or (loss is not None and len(loss) and curve.steps[0] > loss.steps[0]):
            continue
        if bias_of(name) is None or set(kinds_of(name)) & {"embedding", "normalisation",
                                                            "recurrent"}:
            continue
        found = _shape(ev, name)
        if found is None or len(found[0]) < 2:
            continue
        shape = found[0]
        step = int(curve.steps[0])
        norm = float(curve.values[0])
        if not math.isfinite(norm):
            continue
        rate = _at(lr, step) if lr is not None else None
        grad = _at(grads[name], step) if name in grads else None
        if rate is None or grad is None or not (math.isfinite(rate) and math.isfinite(grad)):
            continue  # the first updates' size cannot be bounded
        # the norm is logged after the step's update: take off the most the updates up to
        # it could have added (steps counted from 0; one more when they count from 1)
        moved = (step + 1) * rate * max(grad, UPDATE_SPREAD * math.sqrt(_numel(shape)))
        if norm - moved <= 0:
            continue  # the rate alone could have made this norm: no reading
        out.append(InitScale(name, norm - moved, math.sqrt(shape[0] / 3), shape, step,
                             curve.location_at(step)))
    return out


INIT_EXCESS = 4.0
"""A first weight norm this many times the default init's for its shape was drawn too large:
the common schemes (Kaiming-normal, Xavier, orthogonal) stay within sqrt(6) ~ 2.45 times it,
``torch.randn`` weights are sqrt(3 · fan_in) times it (5 or more from a fan-in of 9). The
norm compared is a lower bound (less the first update's largest size), hence the margin."""
UNNORMALIZED_RMS = 20.0
"""An input RMS estimate above this was not standardized: standardized inputs read about 1
(up to ~10 through a recurrent layer), raw 0-255 pixels ~100 or more."""
def oversized(ev: RunEvidence) -> list[InitScale]:
    """The weights drawn INIT_EXCESS times (or more) too large."""
    return [i for i in init_scales(ev) if i.ratio >= INIT_EXCESS]
