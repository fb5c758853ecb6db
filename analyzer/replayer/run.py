"""Replay a capture from disk: load it, bring the state to the failing step, replay."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from analyzer.capture import restore_rng
from analyzer.errors import UsageError
from analyzer.model.replays import ReplayResult
from analyzer.replayer.dtypes import DTYPE_CHOICES
from analyzer.replayer.loading import Capture, load_capture
from analyzer.replayer.passes import run_step
from analyzer.replayer.state import StepConfig, TrainState, clone_state, dtype_of
from analyzer.replayer.stats import all_finite
from analyzer.replayer.step import replay_call
from analyzer.replayer.steps import StepBatch, micro_batches
from analyzer.trust import TrustPolicy, import_path

_PHASE_OF_TRIGGER = {"loss": "forward", "grad": "backward", "param": "update"}


class CapturedRng:
    """The RNG states of ``rng.pt``; CUDA states are skipped where the devices differ."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.state = dict(state)
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(self.state.get("cuda") or []) != devices:
            self.state["cuda"] = []

    def restore(self) -> None:
        restore_rng(self.state)


def check_device(device: str) -> None:
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device name (cpu, cuda, cuda:1)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: CUDA is not available on this machine")
    index = torch.device(device).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} "
                         "CUDA device(s)")
    if kind not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: only cpu and cuda are supported")


def _set_lrs(state: TrainState, lrs: Any, lr: Any = None) -> None:
    """Every group's lr as the run had it at that step (``lrs``: a list per optimizer);
    version 1 recorded only param group 0's (``lr``)."""
    if isinstance(lrs, list) and len(lrs) == len(state.optimizers):
        for optimizer, groups in zip(state.optimizers, lrs, strict=True):
            if isinstance(groups, list) and len(groups) == len(optimizer.param_groups):
                for group, value in zip(optimizer.param_groups, groups, strict=True):
                    if isinstance(value, int | float):
                        group["lr"] = float(value)
        return
    if isinstance(lr, int | float) and state.optimizer.param_groups:
        state.optimizer.param_groups[0]["lr"] = float(lr)


def _history_batch(cap: Capture, entry: Mapping[str, Any]) -> StepBatch | None:
    """One history step's micro-batches (version 1: its ``inputs`` and ``targets``); None
    when it holds none that can be run."""
    try:
        micro = micro_batches(entry, cap.call.kind)
    except ValueError:
        return None
    return None if micro is None else StepBatch(micro, None, cap.batch.divide, by=cap.batch.by)


def _advance(cap: Capture, config: StepConfig) -> tuple[TrainState, list[str]]:
    """Run the history steps (every_n mode) so the state is the failing step's start."""
    state = TrainState(cap.model, cap.optimizer, cap.scaler, cap.extra_optimizers)
    if not cap.history:
        return state, []
    state = clone_state(state, config)
    notes = [f"state.pt holds step {cap.meta.get('state_step')}; replayed steps "
             f"{cap.history[0].get('step')}..{cap.history[-1].get('step')} first"]
    for entry in cap.history:
        if isinstance(entry.get("rng"), dict):
            CapturedRng(entry["rng"]).restore()
        _set_lrs(state, entry.get("lrs"), entry.get("lr"))
        batch = _history_batch(cap, entry)
        if batch is None:
            notes.append(f"history step {entry.get('step')} holds no batch; stopped there")
            break
        run_step(state, batch.on(config), cap.call, config)
        if not all_finite(list(state.model.parameters())):
            notes.append(f"history step {entry.get('step')} already made parameters "
                         "non-finite in replay")
            break
    return state, notes


def _notes(cap: Capture, device: str) -> list[str]:
    meta = cap.meta
    notes = []
    trigger = meta.get("trigger") or {}
    notes.append(f"the run saw {trigger.get('kind', '?')} in {trigger.get('what', '?')} "
                 f"{trigger.get('name', '')!s} at step {cap.step}".replace("  ", " "))
    if str(meta.get("device", "cpu")).split(":")[0] != torch.device(device).type:
        notes.append(f"the run trained on {meta.get('device')}; replayed on {device}")
    run_torch = (meta.get("env") or {}).get("torch")
    if run_torch and run_torch != torch.__version__:
        notes.append(f"the run used torch {run_torch}; replayed with {torch.__version__}")
    if cap.rng is None:
        notes.append("rng.pt is missing: random ops (dropout) may draw differently")
    return notes


def replay_capture(path: str, *, device: str = "cpu", dtype: str = "as-run",
                   import_paths: Sequence[str] = (), trust_code: bool = False,
                   passes: str = "auto") -> ReplayResult:
    """Load the capture behind ``path`` and replay its step on ``device``.

    ``dtype`` other than "as-run" casts parameters, inputs and optimizer state
    to it and turns autocast and the grad scaler off. The capture's factories are
    imported only as :class:`analyzer.trust.TrustPolicy` allows. ``passes``: as
    :func:`analyzer.replayer.step.replay_call` takes it.
    """
    if dtype not in DTYPE_CHOICES:
        raise UsageError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_CHOICES)}")
    check_device(device)
    cap = load_capture(path, policy=TrustPolicy.of(import_paths, trust_code))
    with import_path(cap.code_folders):
        autocast = cap.autocast_dtype
        forward_only = cap.record.amp.scope == "forward"
        as_run = StepConfig(device=device, autocast_dtype=dtype_of(autocast),
                            grad_scaler=cap.scaler is not None, grad_clip=cap.grad_clip,
                            autocast_forward_only=forward_only)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a LightningModule's self.log outside a Trainer
            state, history_notes = _advance(cap, as_run)
        _set_lrs(state, cap.meta.get("lrs"), cap.lr)
        result = replay_call(
            state.model, cap.batch, cap.call, state.optimizers,
            scaler=state.scaler, autocast_dtype=autocast, device=device,
            dtype=None if dtype == "as-run" else dtype, grad_clip=cap.grad_clip,
            rng=CapturedRng(cap.rng) if cap.rng is not None else None,
            source=cap.path, step=cap.step,
            notes=_notes(cap, device) + history_notes + list(cap.notes),
            autocast_scope=cap.record.amp.scope, passes=passes)
    expected = _PHASE_OF_TRIGGER.get(str((cap.meta.get("trigger") or {}).get("what")))
    if result.phase is not None and expected is not None and result.phase != expected:
        extra = (f"the run noticed the fault in {expected}; replay finds it first in "
                 f"{result.phase}",)
        result = dataclasses.replace(result, notes=result.notes + extra)
    return result
