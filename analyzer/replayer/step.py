"""Replay one training step from live objects: every pass, then the verdict."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from analyzer.errors import UsageError
from analyzer.model.replays import PHASES, OpFault, PassOutcome, Phase, ReplayResult
from analyzer.replayer.errors import ReplayError
from analyzer.replayer.passes import Instrumented, instrumented_pass, light_pass, plain_pass
from analyzer.replayer.state import (
    Restorable,
    RngState,
    StepConfig,
    TrainState,
    clone_state,
    dtype_name,
    dtype_of,
    nonfinite_state,
)
from analyzer.replayer.steps import StepBatch, StepCall, bad_parts
from analyzer.replayer.verdict import decide

PASSES = ("auto", "all")
"""``auto``: the passes the result needs (see :func:`replay_call`); ``all``: every pass."""


class _Once:
    """A pass run on first call and kept: the float64 pass, when the verdict asks for it."""

    def __init__(self, run: Callable[[], PassOutcome]) -> None:
        self.run = run
        self.value: PassOutcome | None = None

    def __call__(self) -> PassOutcome:
        if self.value is None:
            self.value = self.run()
        return self.value


def _as_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    return dtype_of(value) if isinstance(value, str) else value


def _bad_batch(parts: Sequence[tuple[str, ...]]) -> list[str]:
    """What of the batch is non-finite, from ``bad_parts`` of each micro-batch; a float
    mask of 0 and -inf among the inputs (an ``attn_mask``) is a mask, not a bad sample."""
    bad: list[str] = []
    for i, found in enumerate(parts):
        where = f" of micro-batch {i}" if len(parts) > 1 else ""
        for part in found:
            name = {"inputs": "the batch inputs", "targets": "the batch targets"}.get(part, part)
            bad.append(name + where)
    return bad


def _faults(inst: Instrumented) -> dict[Phase, OpFault | None]:
    return {"forward": inst.forward_op, "backward": inst.backward.origin,
            "update": inst.update.op}


def _first_phase(inst: Instrumented) -> Phase | None:
    """The first phase in which an op made a non-finite value, if the step failed.

    A non-finite value that a later op masks still counts when the step fails:
    log(0) = -inf picked out of by an NLL loss leaves the loss finite, and the
    NaN gradients it causes are its doing. A step whose loss, gradients and
    parameters all stay finite has no failing phase.
    """
    observed = inst.observed
    if observed is None:
        return None
    faults = _faults(inst)
    return next(p for p in PHASES if faults[p] is not None or p == observed)


def _computes_in(model: nn.Module, autocast: torch.dtype | None) -> str | None:
    """The dtype the run computed in: its autocast dtype, else its parameters' ("a+b")."""
    if autocast is not None:
        return dtype_name(autocast)
    names = sorted({dtype_name(p.dtype) or "" for p in model.parameters()
                    if p.is_floating_point()} - {""})
    return "+".join(names) or None


def _cast_note(cast: torch.dtype | None) -> tuple[str, ...]:
    if cast is None:
        return ()
    return (f"cast to {dtype_name(cast)}: parameters, batch and optimizer state, with "
            "autocast and the grad scaler off; not the run's own configuration",)


def replay_step(model: nn.Module, inputs: Any, targets: Any, loss_fn: Any,
                optimizer: torch.optim.Optimizer, *, scaler: Any = None,
                autocast_dtype: torch.dtype | str | None = None, device: str = "cpu",
                dtype: torch.dtype | str | None = None, grad_clip: float | None = None,
                rng: Restorable | None = None, repeats: int = 2, expected: bool = True,
                source: str = "<in-memory>", step: int | None = None,
                notes: Sequence[str] = (), passes: str = "auto") -> ReplayResult:
    """Replay one step of ``model`` on ``inputs``/``targets`` and say where it broke.

    The ``loss_fn(model(inputs), targets)`` form of :func:`replay_call`."""
    return replay_call(model, StepBatch.pair(inputs, targets), StepCall("loss_fn", loss_fn),
                       [optimizer], scaler=scaler, autocast_dtype=autocast_dtype,
                       device=device, dtype=dtype, grad_clip=grad_clip, rng=rng,
                       repeats=repeats, expected=expected, source=source, step=step,
                       notes=notes, passes=passes)


def replay_call(model: nn.Module, batch: StepBatch, call: StepCall,
                optimizers: Sequence[torch.optim.Optimizer], *, scaler: Any = None,
                autocast_dtype: torch.dtype | str | None = None, device: str = "cpu",
                dtype: torch.dtype | str | None = None, grad_clip: float | None = None,
                rng: Restorable | None = None, repeats: int = 2, expected: bool = True,
                source: str = "<in-memory>", step: int | None = None,
                notes: Sequence[str] = (), autocast_scope: str = "step",
                passes: str = "auto") -> ReplayResult:
    """Replay one step of ``model`` on ``batch`` as ``call`` computes its loss, with
    ``optimizers`` (the loop's, in order), and say where it broke.

    The objects passed in are never changed: each pass works on its own copy. The
    step runs on ``device``; ``dtype`` casts parameters, floating inputs and
    optimizer state and turns autocast and the scaler off (None keeps the run's
    own dtypes). ``rng`` is restored before each pass (default: the current
    state), and the caller's random state is put back at the end. ``expected``
    says whether the step is known to have gone non-finite in the run.

    ``passes`` "all" runs the instrumented pass, ``repeats`` plain passes in the run's
    configuration and the float64 pass. "auto" (the default) runs one plain pass that
    watches the module outputs (:func:`~analyzer.replayer.passes.light_pass`) and stops
    there when the step stays finite and was not expected to fail; otherwise the
    instrumented pass follows, and the float64 pass only when the verdict rests on it
    (not for bad input or a step that does not reproduce).
    """
    if passes not in PASSES:
        raise UsageError(f"--passes {passes!r}: choose one of {', '.join(PASSES)}")
    cast = _as_dtype(dtype)
    config = StepConfig(
        device=device, dtype=cast,
        autocast_dtype=None if cast is not None else _as_dtype(autocast_dtype),
        grad_scaler=scaler is not None and cast is None, grad_clip=grad_clip,
        autocast_forward_only=autocast_scope == "forward")
    first, *extra = optimizers
    pristine = TrainState(model, first, scaler, tuple(extra))
    own_dtype = _computes_in(model, _as_dtype(autocast_dtype))
    saved = RngState.now()
    restorer: Restorable = rng or saved
    # The step's own code warns as it runs outside its framework (a LightningModule's
    # self.log without a Trainer): noise in a replay's report.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            try:
                on_device = batch.on(config)
                start = clone_state(pristine, config, check_finite=True)
            except Exception as exc:  # e.g. an optimizer that cannot be rebuilt on the device
                raise ReplayError("setup", exc) from exc
            parts = [bad_parts(m) for m in on_device.micro]
            bad_start = _bad_batch(parts) + nonfinite_state(start)
            # a pass cast to another dtype is not the run's configuration: its label says so
            label = "as-run" if cast is None else dtype_name(cast)
            wide = StepConfig(device="cpu", dtype=torch.float64, grad_clip=grad_clip)

            def float64() -> PassOutcome:
                restorer.restore()
                return plain_pass("float64 (cpu)", clone_state(pristine, wide), batch.on(wide),
                                  call, wide, fingerprint=passes == "all")

            if passes == "all":
                restorer.restore()
                inst = instrumented_pass(start, on_device, call, config)
                own = []
                for i in range(repeats):
                    restorer.restore()
                    own.append(plain_pass(f"{label} #{i + 1}", clone_state(pristine, config),
                                          on_device, call, config))
                wide_pass = _Once(float64)
                wide_pass()
            else:
                restorer.restore()
                head, light = light_pass(f"{label} #1", start, on_device, call, config,
                                         parts[on_device.target])
                own = [head]
                if light is not None and not expected and not bad_start:
                    inst = light
                else:
                    restorer.restore()
                    inst = instrumented_pass(clone_state(pristine, config), on_device, call,
                                             config)
                wide_pass = _Once(float64)
            phase = _first_phase(inst)
            run_dtype = own[0].dtype if own else dtype_name(cast) or "?"
            op = _faults(inst)[phase] if phase else None
            verdict = decide(own, inst.observed, phase, wide_pass, op, run_dtype, bad_start,
                             expected, cast=dtype_name(cast), run_dtype=own_dtype)
        finally:
            saved.restore()
    ran = (wide_pass.value,) if wide_pass.value is not None else ()
    return ReplayResult(
        source=source, step=step, device=device, dtype=run_dtype,
        autocast=dtype_name(config.autocast_dtype), phase=phase, forward=inst.forward,
        forward_op=inst.forward_op, backward=inst.backward, update=inst.update,
        passes=(*own, *ran), verdict=verdict, notes=tuple(notes) + _cast_note(cast))
