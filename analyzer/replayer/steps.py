"""The step contract: how a replayed step gets its loss from the model and the batch.

A capture says which of four shapes the training step had (``StepSpec.kind``):

``loss_fn``        ``loss_fn(model(inputs), targets)``; a list or tuple of inputs is spread
                   over the model's arguments (version 1's only kind)
``step_fn``        ``step(model, batch) -> loss``: the user's own step function
``model_loss``     the model returns its loss: ``model(**batch)`` for a dict batch,
                   ``model(*batch)`` for a list or tuple, ``model(batch)`` otherwise; the loss
                   is ``out.loss``, ``out["loss"]``, ``out[0]`` or ``out`` itself
``training_step``  a LightningModule: ``model.training_step(batch, batch_idx)``, a tensor or
                   a dict holding ``"loss"``

A micro-batch is what batch.pt holds for one forward pass: ``{"inputs", "targets"}`` for the
``loss_fn`` kind, ``{"batch": nest}`` for the others. With gradient accumulation a step has
several (:class:`StepBatch`), each loss divided by their number when the loop divided it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.model.captures import StepKind
from analyzer.replayer.state import StepConfig, cast_batch
from analyzer.replayer.stats import floating, is_additive_mask, is_finite

LossHook = Callable[[Callable[..., Any], tuple[Any, ...]], Any]
"""Runs a piece of the step that computes the loss outside the model's modules, so the
forward hooks can give it a frame: ``hook(fn, args) -> fn(*args)``."""


def _plain(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


@dataclass(frozen=True)
class StepCall:
    """One recorded step contract, ready to run; ``fn`` is the loss function (``loss_fn``)
    or the step function (``step_fn``)."""

    kind: StepKind = "loss_fn"
    fn: Any = None
    batch_idx: int | None = None

    def loss(self, model: Any, micro: Mapping[str, Any], hook: LossHook | None = None) -> Any:
        """The loss of one micro-batch; ``hook`` runs the step's own loss code."""
        hook = hook or _plain
        if self.kind == "loss_fn":
            inputs, targets = micro.get("inputs"), micro.get("targets")
            outputs = model(*inputs) if isinstance(inputs, list | tuple) else model(inputs)
            return hook(self.fn, (outputs, targets))
        batch = micro.get("batch")
        if self.kind == "step_fn":
            return hook(self.fn, (model, batch))
        if self.kind == "training_step":
            return hook(_training_step, (model, batch, self.batch_idx or 0))
        return loss_of(_call(model, batch))

    @property
    def loss_label(self) -> str:
        """What the loss frame is called in the report."""
        if self.kind == "loss_fn":
            return getattr(self.fn, "__qualname__", type(self.fn).__name__)
        if self.kind == "step_fn":
            return getattr(self.fn, "__qualname__", "step function")
        return "training_step"


def _call(model: Any, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, list | tuple):
        return model(*batch)
    return model(batch)


def _training_step(model: Any, batch: Any, batch_idx: int) -> Any:
    # Lightning passes batch_idx only to a training_step that takes it.
    if _positional(model.training_step) < 2:
        return loss_of(model.training_step(batch))
    return loss_of(model.training_step(batch, batch_idx))


def _positional(method: Any) -> int:
    import inspect

    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def loss_of(out: Any) -> Any:
    """The loss in what a model or a training_step returned."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, Mapping) and isinstance(out.get("loss"), torch.Tensor):
        return out["loss"]
    if isinstance(out, list | tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the step returned {type(out).__name__}, which holds no loss tensor")


@dataclass(frozen=True)
class StepBatch:
    """The micro-batches of one optimizer step and which one to instrument.

    ``failing`` is the micro-batch whose loss the run saw go non-finite; without one (the
    fault came later, in the update) the last is instrumented. ``divide``: each loss is
    divided by the number of micro-batches before backward, as the loop did.
    """

    micro: tuple[Mapping[str, Any], ...]
    failing: int | None = None
    divide: bool = True
    by: int | None = None
    """The recorded divisor, where it is not the number of micro-batches (accelerate
    divides by the configured accumulation even in a shorter last step)."""

    @classmethod
    def pair(cls, inputs: Any, targets: Any) -> StepBatch:
        return cls(({"inputs": inputs, "targets": targets},))

    def on(self, config: StepConfig) -> StepBatch:
        """The micro-batches moved to the pass's device and cast to its dtype."""
        return dataclasses.replace(self, micro=tuple(cast_batch(dict(m), config)
                                                     for m in self.micro))

    @property
    def target(self) -> int:
        last = len(self.micro) - 1
        return self.failing if self.failing is not None and 0 <= self.failing <= last else last

    @property
    def divisor(self) -> int:
        if not self.divide:
            return 1
        return self.by if self.by is not None and self.by >= 1 else len(self.micro)

    @property
    def instrumented(self) -> Mapping[str, Any]:
        return self.micro[self.target]


def micro_batches(entry: Mapping[str, Any], kind: StepKind
                  ) -> tuple[Mapping[str, Any], ...] | None:
    """The micro-batches batch.pt or a history entry holds: every one under
    ``micro_batches`` when the step had several, else the one at the top; None when it
    holds no batch of the step's kind. ValueError for a ``micro_batches`` of another shape."""
    key = "inputs" if kind == "loss_fn" else "batch"
    micro = entry.get("micro_batches")
    if micro is not None:
        if not (isinstance(micro, list) and micro
                and all(isinstance(m, dict) and key in m for m in micro)):
            raise ValueError(f"'micro_batches' is not a list of dicts holding {key!r}")
        return tuple(micro)
    if key not in entry:
        return None
    if key == "inputs":
        return ({"inputs": entry["inputs"], "targets": entry.get("targets")},)
    return ({"batch": entry["batch"]},)


def scaled(loss: Any, divisor: int) -> Any:
    return loss / divisor if divisor > 1 else loss


def bad_parts(micro: Mapping[str, Any]) -> tuple[str, ...]:
    """Which parts of a micro-batch hold NaN/Inf (a float mask of 0 and -inf is a mask)."""
    bad: list[str] = []
    if "batch" not in micro:
        inputs = micro.get("inputs")
        ins = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
        for i, t in enumerate(ins):
            if not _finite(t):
                bad.append(f"inputs[{i}]" if len(ins) > 1 else "inputs")
        if not all(is_finite(t) for t in floating(micro.get("targets"))):
            bad.append("targets")
        return tuple(bad)
    _walk(micro.get("batch"), "batch", bad)
    return tuple(bad)


def _finite(value: Any) -> bool:
    # is_finite first: one reduction settles a finite tensor, where the mask test compares
    # every element with -inf.
    return all(is_finite(t) or is_additive_mask(t) for t in floating(value))


def _walk(value: Any, where: str, bad: list[str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _walk(v, f"{where}[{k!r}]", bad)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _walk(v, f"{where}[{i}]", bad)
    elif not _finite(value):
        bad.append(where)


def batch_values(micro: Mapping[str, Any]) -> Any:
    """The whole of a micro-batch the step reads: ``inputs`` or the whole nest."""
    return micro.get("batch") if "batch" in micro else micro.get("inputs")


TARGET_KEYS = frozenset({"labels", "label", "targets", "target", "y"})
"""Keys of a dict batch that hold what the loss compares with, not what the model reads."""


def model_inputs(micro: Mapping[str, Any]) -> Any:
    """What of a micro-batch the model reads, for the batch's statistics (the inputs'
    scale): ``inputs``; of a whole batch, the first of an ``(x, y, ...)`` sequence, or a
    dict less its label keys (``labels``, ``targets``...)."""
    if "batch" not in micro:
        return micro.get("inputs")
    batch = micro.get("batch")
    if isinstance(batch, list | tuple) and len(batch) >= 2:
        return batch[0]
    if isinstance(batch, Mapping):
        return {k: v for k, v in batch.items() if str(k).lower() not in TARGET_KEYS}
    return batch
