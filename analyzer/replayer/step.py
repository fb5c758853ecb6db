"""Replay one training step from live objects: every pass, then the verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from analyzer.model.replays import PHASES, OpFault, Phase, ReplayResult
from analyzer.replayer.errors import ReplayError
from analyzer.replayer.passes import Instrumented, instrumented_pass, plain_pass
from analyzer.replayer.state import (
    Restorable,
    RngState,
    StepConfig,
    TrainState,
    cast_batch,
    clone_state,
    dtype_name,
    dtype_of,
    nonfinite_state,
)
from analyzer.replayer.stats import all_finite, floating, is_additive_mask
from analyzer.replayer.verdict import decide


def _as_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    return dtype_of(value) if isinstance(value, str) else value


def _bad_batch(inputs: Any, targets: Any) -> list[str]:
    """What of the batch is non-finite; a float mask of 0 and -inf among the inputs (an
    ``attn_mask``) is a mask, not a bad sample."""
    bad = []
    if not all_finite(t for t in floating(inputs) if not is_additive_mask(t)):
        bad.append("the batch inputs")
    if not all_finite(floating(targets)):
        bad.append("the batch targets")
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


def replay_step(model: nn.Module, inputs: Any, targets: Any, loss_fn: Any,
                optimizer: torch.optim.Optimizer, *, scaler: Any = None,
                autocast_dtype: torch.dtype | str | None = None, device: str = "cpu",
                dtype: torch.dtype | str | None = None, grad_clip: float | None = None,
                rng: Restorable | None = None, repeats: int = 2, expected: bool = True,
                source: str = "<in-memory>", step: int | None = None,
                notes: Sequence[str] = ()) -> ReplayResult:
    """Replay one step of ``model`` on ``inputs``/``targets`` and say where it broke.

    The objects passed in are never changed: each pass works on its own copy. The
    step runs on ``device``; ``dtype`` casts parameters, floating inputs and
    optimizer state and turns autocast and the scaler off (None keeps the run's
    own dtypes). ``rng`` is restored before each pass (default: the current
    state), and the caller's random state is put back at the end. ``expected``
    says whether the step is known to have gone non-finite in the run.
    """
    cast = _as_dtype(dtype)
    config = StepConfig(
        device=device, dtype=cast,
        autocast_dtype=None if cast is not None else _as_dtype(autocast_dtype),
        grad_scaler=scaler is not None and cast is None, grad_clip=grad_clip)
    pristine = TrainState(model, optimizer, scaler)
    saved = RngState.now()
    restorer: Restorable = rng or saved
    try:
        try:
            x, y = cast_batch((inputs, targets), config)
            start = clone_state(pristine, config)
        except Exception as exc:  # e.g. an optimizer that cannot be rebuilt on the device
            raise ReplayError("setup", exc) from exc
        bad_start = _bad_batch(x, y) + nonfinite_state(start)
        restorer.restore()
        inst = instrumented_pass(start, x, y, loss_fn, config)
        own = []
        for i in range(repeats):
            restorer.restore()
            own.append(plain_pass(f"as-run #{i + 1}", clone_state(pristine, config), x, y,
                                  loss_fn, config))
        wide = StepConfig(device="cpu", dtype=torch.float64, grad_clip=grad_clip)
        restorer.restore()
        wx, wy = cast_batch((inputs, targets), wide)
        f64 = plain_pass("float64 (cpu)", clone_state(pristine, wide), wx, wy, loss_fn, wide)
    finally:
        saved.restore()
    phase = _first_phase(inst)
    run_dtype = own[0].dtype if own else dtype_name(cast) or "?"
    op = _faults(inst)[phase] if phase else None
    verdict = decide(own, inst.observed, phase, f64, op, run_dtype, bad_start, expected)
    return ReplayResult(
        source=source, step=step, device=device, dtype=run_dtype,
        autocast=dtype_name(config.autocast_dtype), phase=phase, forward=inst.forward,
        forward_op=inst.forward_op, backward=inst.backward, update=inst.update,
        passes=(*own, f64), verdict=verdict, notes=tuple(notes))
