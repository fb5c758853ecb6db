"""The guarded step: per-layer norms in the run's events, a NaN/Inf check, an opt-in skip.

Two calls at fixed points of any training step, so a plain loop and every framework
integration use it alike::

    guard = StepGuard(model, log_dir=run_dir, every=10, skip_nonfinite=True)
    loss.backward()
    if guard.after_backward(step, scaler=scaler):   # False: the guard refused the update
        optimizer.step()                            # (a no-op anyway: every .grad is None)
    guard.after_update(step)
    guard.close()

What it writes, as TensorBoard scalars at the step it is given (tag names the analyzer
reads as per-layer tags, :mod:`analyzer.tags`):

- ``grad_norm/<param>`` and ``grad_norm/total`` after backward, ``weight_norm/<param>``
  after the update, with full dotted parameter names (``net.0.weight``), every ``every``
  steps and at any step whose check found a non-finite value, so the step that fails
  leaves layer-level evidence whatever ``every`` is;
- ``guard/loss_scale``, the GradScaler's scale the step used, beside the gradient norms
  (which are divided by it while the gradients are still scaled) and at the two steps
  around each change of the scale: the analyzer reads a scaler's skips from its drops;
- ``guard/skipped_steps``, the number of updates the guard refused so far, at each step it
  grows (:func:`analyzer.scaler.guard_skips` reads those steps back).

Each kind of norm is one ``torch._foreach_norm`` call (in float32, so a float16 tensor's
norm does not overflow) and one copy to the host. The check reads the same norms: a
tensor holding a NaN or an Inf has a non-finite norm, and only then is the tensor itself
looked at, to tell ``nan`` from ``+inf`` and ``-inf`` and to pass over a norm that
overflowed though every element is finite.

Under an enabled GradScaler, non-finite gradients are the scaler's own business: it skips
that update itself, so they are neither a fault nor a guard skip. Weights are checked
after the update either way. A fault (:class:`GuardFault`: step, parameter, gradient or
weight, ``nan``/``+inf``/``-inf``) is kept in :attr:`StepGuard.first_fault` and
:attr:`StepGuard.last_fault`, and the first is warned about (``UserWarning``, once); a
writer that fails is warned about once and left alone (:attr:`StepGuard.errors`). Nothing
is raised into the loop. Frozen parameters (``requires_grad=False``) and parameters
without a gradient are left out; a model wrapped in DataParallel, DistributedDataParallel
or ``torch.compile`` is named as the model inside; a sparse gradient is read by its
coalesced values.

``torch`` and ``torch.utils.tensorboard`` are imported when first needed.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from analyzer.capture.recorder import tensor_kind, unwrap_model
from analyzer.tags import GUARD_SKIPS_TAG

if TYPE_CHECKING:
    import torch

GRAD_PREFIX = "grad_norm/"
WEIGHT_PREFIX = "weight_norm/"
TOTAL_GRAD_TAG = "grad_norm/total"
SCALE_TAG = "guard/loss_scale"
SKIPS_TAG = GUARD_SKIPS_TAG  # the analyzer reads it back: one name, in analyzer.tags

FaultKind = Literal["nan", "+inf", "-inf"]
FaultTensor = Literal["gradient", "weight"]


class ScalarWriter(Protocol):
    """What the guard writes through: torch's SummaryWriter, tensorboardX's, Lightning's
    ``logger.experiment``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> Any: ...


@dataclass(frozen=True)
class GuardFault:
    """The first parameter whose gradient or weight was non-finite at one step."""

    step: int
    parameter: str
    tensor: FaultTensor
    kind: FaultKind

    def __str__(self) -> str:
        return f"{self.tensor} of {self.parameter} is {self.kind} at step {self.step}"


class StepGuard:
    """Per-layer gradient and weight norms, a per-parameter NaN/Inf check and an opt-in
    skip of non-finite updates, for any training step (see the module docstring).

    ``log_dir`` makes a ``torch.utils.tensorboard.SummaryWriter`` there on the first write
    (closed by :meth:`close`); ``writer`` is one of the caller's, flushed but not closed.
    With neither, nothing is written and the check still runs. ``every`` spaces the
    norms out (0: only at steps whose check failed); ``check=False`` turns the NaN/Inf
    check off, so steps between the ``every`` ones cost nothing. ``skip_nonfinite``
    needs the check.
    """

    def __init__(self, model: torch.nn.Module, *, log_dir: str | os.PathLike[str] | None = None,
                 writer: ScalarWriter | None = None, every: int = 10, check: bool = True,
                 skip_nonfinite: bool = False) -> None:
        if log_dir is not None and writer is not None:
            raise ValueError("StepGuard takes log_dir or writer, not both")
        if every < 0:
            raise ValueError(f"every must be 0 or more, not {every}")
        if skip_nonfinite and not check:
            raise ValueError("skip_nonfinite=True needs check=True")
        self.every = every
        self.check = check
        self.skip_nonfinite = skip_nonfinite
        self.skipped = 0
        """Updates the guard refused (a GradScaler's own skips are not counted)."""
        self.first_fault: GuardFault | None = None
        """The run's first fault: what to look at first."""
        self.last_fault: GuardFault | None = None
        """The latest fault: the first offending parameter of the latest step with one."""
        self.errors: list[str] = []
        """Why writing stopped, when it did."""
        self._params = [(n, p) for n, p in unwrap_model(model).named_parameters()
                        if p.requires_grad]
        self._log_dir = None if log_dir is None else os.fspath(log_dir)
        self._writer = writer
        self._owned = False
        self._scale_seen: tuple[int, float, bool] | None = None  # step, scale, written there

    # -- the two calls of a step -------------------------------------------------------

    def after_backward(self, step: int, *, scaler: Any = None) -> bool:
        """Check and log the gradients of ``step``; False when the guard refused the
        update (``skip_nonfinite``), having set every gradient to None so that any
        torch optimizer's ``step()`` changes nothing. Call it after backward and before
        the optimizer (and before ``scaler.step``)."""
        due = self._due(step)
        scaled = _enabled(scaler)
        check = self.check and not scaled  # under a scaler, an overflow is its own to skip
        follow = self.check and scaled  # its scale at every step, to pin the skips to steps
        if not (due or check or follow):
            return True
        named = [(n, _dense(p.grad)) for n, p in self._params if p.grad is not None] \
            if due or check else []
        scale_t, scale = _scale_of(scaler)
        values = _norms([g for _, g in named], [] if scale_t is None else [scale_t])
        if scale_t is not None:
            scale = values.pop()
        fault = _first_fault(step, "gradient", named, values) if check else None
        if due or fault is not None:
            self._write_grads(step, named, values, scale, divide=not _unscaled(scaler))
        if follow and scale is not None:
            self._follow_scale(step, scale, written=due)
        if fault is None:
            return True
        self._fault(fault)
        if not self.skip_nonfinite:
            return True
        for _, p in self._params:
            p.grad = None
        self.skipped += 1
        self._write(step, [(SKIPS_TAG, float(self.skipped))])
        return False

    def after_update(self, step: int) -> None:
        """Check and log the weights after ``step``'s update."""
        due = self._due(step)
        if not (due or self.check):
            return
        import torch

        with torch.no_grad():
            weights = list(self._params)  # under no_grad: no graph, no detach needed
            values = _norms([w for _, w in weights], [])
        fault = _first_fault(step, "weight", weights, values) if self.check else None
        if due or fault is not None:
            self._write(step, [(WEIGHT_PREFIX + name, v)
                               for (name, _), v in zip(weights, values, strict=True)])
        if fault is not None:
            self._fault(fault)

    def close(self) -> None:
        """Flush what was written; close the writer the guard made itself."""
        if self._writer is None:
            return
        flush = getattr(self._writer, "flush", None)
        if callable(flush):
            flush()
        if self._owned:
            self._writer.close()  # type: ignore[attr-defined]
            self._writer = None
            self._owned = False

    def __enter__(self) -> StepGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------

    def _due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def _write_grads(self, step: int, named: Sequence[tuple[str, Any]], values: list[float],
                     scale: float | None, *, divide: bool) -> None:
        div = scale if scale and divide else 1.0
        unscaled = [v / div for v in values]
        pairs = [(GRAD_PREFIX + name, v) for (name, _), v in zip(named, unscaled, strict=True)]
        if unscaled:
            pairs.append((TOTAL_GRAD_TAG, math.sqrt(math.fsum(v * v for v in unscaled))))
        if scale is not None:
            pairs.append((SCALE_TAG, scale))
        self._write(step, pairs)

    def _follow_scale(self, step: int, scale: float, *, written: bool) -> None:
        """Write the scale of both steps around each change, so that a drop lies between
        consecutive steps, which is how the analyzer pins a scaler's skip to its step."""
        seen = self._scale_seen
        self._scale_seen = (step, scale, written)
        if seen is None or seen[1] == scale:
            return
        if not seen[2]:
            self._write(seen[0], [(SCALE_TAG, seen[1])])
        if not written:
            self._write(step, [(SCALE_TAG, scale)])
            self._scale_seen = (step, scale, True)

    def _fault(self, fault: GuardFault) -> None:
        self.last_fault = fault
        if self.first_fault is not None:
            return
        self.first_fault = fault
        then = ("the update was skipped (guard.skipped counts such steps)"
                if fault.tensor == "gradient" and self.skip_nonfinite else
                "training goes on; StepGuard keeps the last fault in last_fault")
        warnings.warn(f"StepGuard: the {fault}; {then}", UserWarning, stacklevel=3)

    def _write(self, step: int, pairs: Sequence[tuple[str, float]]) -> None:
        """The values of one step, as one event where the writer is a SummaryWriter
        (torch's or tensorboardX's: a hundred times cheaper than an ``add_scalar`` each),
        else through ``add_scalar``. A writer that fails (a full disk, a closed writer)
        is warned about once, kept in ``errors`` and not used again: training goes on."""
        if self.errors:
            return
        try:
            self._write_now(step, pairs)
        except Exception as exc:  # any writer's failure: the loop is not the guard's to stop
            self.errors.append(f"step {step}: {type(exc).__name__}: {exc}")
            warnings.warn(f"StepGuard: writing failed ({self.errors[0]}); the guard writes "
                          "nothing more and goes on checking", UserWarning, stacklevel=4)

    def _write_now(self, step: int, pairs: Sequence[tuple[str, float]]) -> None:
        writer: Any = self._writer
        if writer is None:
            if self._log_dir is None:
                return
            from torch.utils.tensorboard import SummaryWriter

            writer = self._writer = SummaryWriter(log_dir=self._log_dir)
            self._owned = True
        if not pairs:
            return
        summary = _summary(writer, pairs)
        if summary is not None:
            writer._get_file_writer().add_summary(summary, step)
            return
        for tag, value in pairs:
            writer.add_scalar(tag, value, step)


def _summary(writer: Any, pairs: Sequence[tuple[str, float]]) -> Any:
    """One ``Summary`` of simple values in the proto module of ``writer``'s own library;
    None for any other writer."""
    proto = _PROTOS.get(type(writer).__module__.split(".")[0])
    if proto is None or not callable(getattr(writer, "_get_file_writer", None)):
        return None
    summary: Any = importlib.import_module(proto).Summary
    return summary(value=[summary.Value(tag=t, simple_value=v) for t, v in pairs])


_PROTOS = {"torch": "tensorboard.compat.proto.summary_pb2",
           "tensorboardX": "tensorboardX.proto.summary_pb2"}


def _dense(grad: torch.Tensor) -> torch.Tensor:
    """A sparse gradient's values (coalesced, as its norm needs); a dense one as it is."""
    return grad.coalesce().values() if grad.is_sparse else grad


def _scale_of(scaler: Any) -> tuple[torch.Tensor | None, float | None]:
    """An enabled GradScaler's scale: as a tensor where the scaler keeps one (read with
    the norms, in one copy to the host), else as a number; (None, None) without a scaler
    or with a disabled one."""
    if not _enabled(scaler):
        return None, None
    tensor = getattr(scaler, "_scale", None)
    import torch

    if isinstance(tensor, torch.Tensor):
        return tensor.detach().reshape(()).float(), 1.0
    return None, float(scaler.get_scale())


def _enabled(scaler: Any) -> bool:
    return scaler is not None and bool(scaler.is_enabled())


def _unscaled(scaler: Any) -> bool:
    """Whether ``scaler.unscale_`` ran for an optimizer this step (torch's own record), as
    in a loop that clips and in Lightning's mixed-precision plugin: the gradients are
    no longer scaled."""
    if not _enabled(scaler):
        return False
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict):
        return False
    return any(getattr(s.get("stage"), "value", 0) == 1 for s in states.values())


def _norms(tensors: Sequence[torch.Tensor], extra: Sequence[torch.Tensor]) -> list[float]:
    """The float32 2-norm of each tensor, then ``extra`` 0-d values: one foreach call per
    device and one copy to the host."""
    if not tensors and not extra:
        return []
    import torch

    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    parts: list[tuple[list[int], torch.Tensor]] = []
    for idx in by_device.values():
        norms = torch._foreach_norm([tensors[i] for i in idx], 2, dtype=torch.float32)
        parts.append((idx, torch.stack(norms)))
    tail = [e.reshape(1).to(parts[0][1].device if parts else e.device) for e in extra]
    if len(parts) == 1:
        flat = torch.cat([parts[0][1], *tail]).tolist()
        order = parts[0][0]
    else:  # several devices: one copy each
        flat = [v for _, t in parts for v in t.cpu().tolist()] + [float(e) for e in tail]
        order = [i for idx, _ in parts for i in idx]
    out = [0.0] * len(tensors)
    for i, v in zip(order, flat, strict=False):
        # A float32 norm overflows over finite elements beyond about 1.8e19 (their squares
        # pass float32's largest): such a tensor is huge, not non-finite, and its norm is
        # read again in float64 (one more host sync, only then).
        out[i] = v if math.isfinite(v) else _wide_norm(tensors[i])
    return out + flat[len(order):]


def _wide_norm(t: torch.Tensor) -> float:
    """The norm in float64 of a tensor whose float32 norm was not finite: still inf or NaN
    when the tensor holds an Inf or a NaN."""
    return float(t.detach().double().norm())


def _first_fault(step: int, tensor: FaultTensor, named: Sequence[tuple[str, torch.Tensor]],
                 values: Sequence[float]) -> GuardFault | None:
    """The first parameter (in the model's order) holding a NaN or an Inf; a norm that
    overflowed over finite elements is no fault."""
    for (name, t), v in zip(named, values, strict=True):
        if math.isfinite(v):
            continue
        kind = tensor_kind(t)
        if kind is not None:
            return GuardFault(step=step, parameter=name, tensor=tensor, kind=kind)
    return None


