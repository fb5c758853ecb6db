"""What a replay finds, as frozen records that hold no tensors.

    TensorStat      shape, dtype and the numbers that matter about one tensor
    ModuleFrame     one module call of the forward pass, in execution order
    OpFault         the first aten op that turned finite inputs into a non-finite output
    ForwardReport   module frames, the producer and a window around it
    ParamGrad       a parameter whose gradient came out non-finite
    BackwardReport  the backward origin op and the first bad parameter gradient
    ParamUpdate     a parameter the optimizer step made non-finite, and why
    UpdateReport    what the optimizer step did to a finite model
    PassOutcome     one plain re-run of the step: where it first went non-finite
    Verdict         the differential conclusion: math fault, range overflow, ...
    ReplayResult    all of the above for one captured step

Everything here is plain Python so that reports can be built, compared and
serialised without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from analyzer.model.jsonform import encode

Phase = Literal["forward", "backward", "update"]
Role = Literal["finite", "producer", "pass-through", "absorbs", "bad-parameters"]
VerdictKind = Literal["math-fault", "range-overflow", "not-reproducible", "bad-input", "finite",
                      "undecided"]

PHASES: tuple[Phase, ...] = ("forward", "backward", "update")
REPLAY_SCHEMA_VERSION = 2
"""Bumped when a key of ``ReplayResult.to_dict()`` changes meaning or disappears. 2: a
pass's ``fingerprint`` is null where no other pass is compared with it bit for bit."""
ROOT_NAME = "(model)"
"""How reports name the model itself; its submodules keep their dotted names."""
LOSS_NAME = "(loss)"
"""How reports name the loss function, which is not a layer of the model."""


@dataclass(frozen=True)
class TensorStat:
    """Summary of one tensor; the float fields cover its finite elements only.

    ``absmin`` is the smallest magnitude, which is what a division or a log by a
    value near zero cares about. Fields are None for a tensor with no finite
    element, or for non-floating tensors where they mean nothing.
    """

    shape: tuple[int, ...]
    dtype: str
    numel: int
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    absmax: float | None = None
    absmin: float | None = None
    min: float | None = None
    max: float | None = None

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.posinf == 0 and self.neginf == 0

    @property
    def kind(self) -> str | None:
        """'nan', '+inf', '-inf' for the first kind present (NaN first), else None."""
        if self.nan:
            return "nan"
        if self.posinf:
            return "+inf"
        if self.neginf:
            return "-inf"
        return None

    def brief(self) -> str:
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        parts = [f"{self.dtype}[{shape}]"]
        if not self.finite:
            bad = [f"{n} {k}" for n, k in ((self.nan, "nan"), (self.posinf, "+inf"),
                                           (self.neginf, "-inf")) if n]
            parts.append(", ".join(bad))
        if self.absmax is not None:
            parts.append(f"absmax {self.absmax:.4g}")
        if self.min is not None and self.max is not None:
            parts.append(f"range [{self.min:.4g}, {self.max:.4g}]")
        if self.absmin is not None:
            parts.append(f"absmin {self.absmin:.4g}")
        return " ".join(parts)


@dataclass(frozen=True)
class ModuleFrame:
    """One call of one module; ``index`` is its place in order of completion."""

    index: int
    name: str
    type: str
    call: int
    inputs: tuple[TensorStat, ...]
    outputs: tuple[TensorStat, ...]
    role: Role
    bad_params: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpFault:
    """The first aten op of a phase whose output went non-finite.

    ``inputs_finite`` is False when no op of the phase had all-finite inputs and
    a non-finite output; the record then shows the first op with a non-finite
    output, which points at a non-finite constant or input rather than a producer.
    ``forward_op`` names, for a backward op, the forward op its autograd node
    differentiates (``sqrt`` for ``SqrtBackward0``). ``float64_finite`` is the
    op run again on the same inputs widened to float64: False means the op is
    undefined at those very inputs (log(0), x/0), True that only the dtype's
    range failed; None when it could not be run again.

    ``mask`` is the op that wrote the -inf this op's inputs held on purpose: a mask's
    fill value (``masked_fill(mask, -inf)``, ``torch.where(mask, -inf, x)``, a float mask
    of 0 and -inf). Such a -inf is no fault, so ``inputs_finite`` counts it as finite and
    the record names the op that turned it into NaN or +inf (a softmax over a row masked
    entirely); the mask is kept beside it as context.
    """

    phase: Phase
    op: str
    ordinal: int
    inputs: tuple[TensorStat, ...]
    outputs: tuple[TensorStat, ...]
    inputs_finite: bool
    module: str | None = None
    autograd_node: str | None = None
    source: str | None = None
    source_line: str | None = None
    stack: tuple[str, ...] = ()
    parameter: str | None = None
    forward_op: str | None = None
    float64_finite: bool | None = None
    mask: OpFault | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Names to match against: the aten op, and for backward the forward op."""
        base = self.op.split(".")[0]
        return (base,) if self.forward_op is None else (base, self.forward_op)


@dataclass(frozen=True)
class ForwardReport:
    frames: int
    producer: ModuleFrame | None
    window: tuple[ModuleFrame, ...]
    first_nonfinite: ModuleFrame | None
    loss: float | None
    bad_inputs: tuple[str, ...] = ()
    batch: tuple[TensorStat, ...] = ()
    """Statistics of the batch inputs: their scale is evidence for input-scale causes."""

    @property
    def finite(self) -> bool:
        return self.first_nonfinite is None and self.loss is not None and math.isfinite(self.loss)


@dataclass(frozen=True)
class ParamGrad:
    name: str
    grad: TensorStat
    nodes: tuple[str, ...]
    module: str | None
    forward_source: str | None


@dataclass(frozen=True)
class BackwardReport:
    """What backward did; ``finite`` judges the gradients, which are what the run saw.

    ``origin`` may be set while every gradient is finite: a non-finite value
    that a later op masked out (e.g. sqrt's infinite slope at 0 behind a ReLU).
    """

    ran: bool
    origin: OpFault | None
    first_param: ParamGrad | None
    bad_params: tuple[str, ...]

    @property
    def finite(self) -> bool:
        return self.ran and not self.bad_params


@dataclass(frozen=True)
class ParamUpdate:
    name: str
    kind: str
    reason: str


@dataclass(frozen=True)
class UpdateReport:
    ran: bool
    op: OpFault | None
    params: tuple[ParamUpdate, ...]
    skipped_by_scaler: bool = False
    note: str | None = None

    @property
    def finite(self) -> bool:
        return not self.params and self.op is None


@dataclass(frozen=True)
class PassOutcome:
    """One plain run of the step: the first phase that went non-finite, if any.

    ``fingerprint`` hashes the loss, the gradients and the updated parameters
    bit for bit (a CRC-32C per tensor), so two passes that agree on the phase can still
    be told apart; None for a pass no other is compared with (those of a default replay).
    """

    label: str
    device: str
    dtype: str
    autocast: str | None
    loss: float | None
    phase: Phase | None
    fingerprint: str | None
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    summary: str
    hypothesis: str
    next_check: str


@dataclass(frozen=True)
class ReplayResult:
    source: str
    step: int | None
    device: str
    dtype: str
    autocast: str | None
    phase: Phase | None
    forward: ForwardReport
    forward_op: OpFault | None
    backward: BackwardReport
    update: UpdateReport
    passes: tuple[PassOutcome, ...]
    verdict: Verdict
    notes: tuple[str, ...] = ()

    JSON_EXTRA = ("layer", "op")

    @property
    def op(self) -> OpFault | None:
        """The op fault of the phase that went non-finite first."""
        if self.phase == "forward":
            return self.forward_op
        if self.phase == "backward":
            return self.backward.origin
        if self.phase == "update":
            return self.update.op
        return None

    @property
    def layer(self) -> str | None:
        """The model's module blamed, or None when the loss function or no module made it.

        Forward: the producer module, else the first module whose output was not
        finite (a non-finite batch shows up in the layer that reads it). Backward:
        the module whose autograd node first emitted a non-finite value. Update:
        the module owning the parameter that went non-finite.
        """
        if self.phase == "forward":
            frame = self.forward.producer or self.forward.first_nonfinite
            if frame is not None:
                return _model_layer(frame.name)
            return _model_layer(self.forward_op.module) if self.forward_op else None
        if self.phase == "backward":
            origin = self.backward.origin
            if origin is not None and origin.module is not None:
                return _model_layer(origin.module)
            first = self.backward.first_param
            return first.module if first is not None else None
        if self.phase == "update":
            name = self.update.op.parameter if self.update.op is not None else None
            if name is None and self.update.params:
                name = self.update.params[0].name
            return param_module(name) if name else None
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: non-finite floats become the strings 'nan', 'inf', '-inf'."""
        data = {"schema": "nan-forensics-replay", "schema_version": REPLAY_SCHEMA_VERSION}
        data.update(encode(self))
        return data


def param_module(name: str) -> str:
    """``fc1.weight`` -> ``fc1``; a parameter of the model itself -> ``(model)``."""
    return name.rpartition(".")[0] or ROOT_NAME


def _model_layer(name: str | None) -> str | None:
    """Module names from the loss function are not layers of the model."""
    if name is None or name.startswith(LOSS_NAME):
        return None
    return name
