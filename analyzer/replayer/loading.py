"""Read a capture folder and rebuild the objects of the failing step.

Every ``.pt`` file is opened with ``torch.load(weights_only=True)``; a file that
needs more than that is refused, never loaded unsafely. The model, the loss and
the optimizer are rebuilt from the import paths the capture records, which is
the one place replay runs code named by the capture: it imports the modules the
run itself used, and only as :mod:`analyzer.trust` allows. Which folder is a capture, and
what its meta.json must hold, is :mod:`analyzer.capture.folder`'s to say.
"""

from __future__ import annotations

import inspect
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from analyzer.capture.folder import (
    BATCH_FILE,
    HISTORY_FILE,
    RNG_FILE,
    STATE_FILE,
    MetaError,
    capture_of,
    read_capture_meta,
    run_of_capture,
)
from analyzer.ingest.safeio import NotRegularFile, open_regular
from analyzer.model import CaptureMeta, FactorySpec
from analyzer.replayer.errors import CaptureError, ModelRebuildError
from analyzer.trust import Plan, TrustPolicy, check, resolve_plan


@dataclass(frozen=True, eq=False)
class Capture:
    """A loaded capture: the failing step's objects, ready to run on the CPU.

    ``history`` holds the steps to run before the failing one (every_n mode), each
    a dict with ``step``, ``inputs``, ``targets``, ``rng`` and ``lr``.
    """

    path: str
    meta: Mapping[str, Any]
    """meta.json as it stands (checked: ``record`` holds its typed fields)."""
    record: CaptureMeta
    step: int
    model: nn.Module
    loss_fn: Callable[[Any, Any], Any]
    optimizer: torch.optim.Optimizer
    scaler: Any
    inputs: Any
    targets: Any
    rng: Mapping[str, Any] | None
    history: tuple[Mapping[str, Any], ...] = ()
    code_folders: tuple[str, ...] = ()
    """The trusted folders the factories were imported from: the replay keeps them on
    ``sys.path``, for modules the model imports while it runs."""

    @property
    def autocast_dtype(self) -> str | None:
        return self.record.amp.autocast_dtype

    @property
    def grad_clip(self) -> float | None:
        return self.record.grad_clip

    @property
    def lr(self) -> float | None:
        return self.record.lr


def find_capture(path: str) -> str:
    """The capture behind ``path`` (see :func:`analyzer.capture.folder.capture_of`); a path
    without one is a CaptureError."""
    if not os.path.exists(path):
        raise CaptureError(path, "no such file or folder")
    found = capture_of(path)
    if found is None:
        raise CaptureError(path, "holds no capture (no capture/step_<N>/meta.json)")
    return found


def read_meta(folder: str) -> CaptureMeta:
    """The capture's checked meta.json; CaptureError naming the file and what is wrong."""
    try:
        return read_capture_meta(folder)
    except MetaError as exc:
        raise CaptureError(exc.path, exc.reason) from None


def load_pt(folder: str, name: str, *, required: bool = True) -> Any:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        if required:
            raise CaptureError(path, "missing")
        return None
    try:
        handle, _ = open_regular(path)  # a FIFO named state.pt must not block the replay
        with handle:
            return torch.load(handle, weights_only=True, map_location="cpu")
    except NotRegularFile as exc:
        raise CaptureError(path, str(exc)) from None
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CaptureError(path, "refused by torch.load(weights_only=True), and it is not "
                                 f"loaded any other way: {first}") from None
    except Exception as exc:  # torch reports a damaged archive as RuntimeError and kin
        raise CaptureError(path, f"cannot be read: {type(exc).__name__}: {exc}") from None


def build(plan: Plan, kwargs: Mapping[str, Any], policy: TrustPolicy,
          run_folder: str | None) -> tuple[Any, str | None]:
    """Import and call the factory a trust check judged: (object, folder it came from)."""
    target = plan.target
    found = resolve_plan(plan, policy, run_folder=run_folder)
    try:
        return found.obj(**kwargs), found.folder
    except Exception as exc:
        raise ModelRebuildError(target, f"calling it with {kwargs} raised "
                                        f"{type(exc).__name__}: {exc}") from None


def restore_model(model: nn.Module, state: Mapping[str, Any], factory: str) -> None:
    """Load ``state`` keeping its dtypes: a run that cast layers keeps them cast."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, value in state.items():
            own = tensors.get(name)
            if (isinstance(value, torch.Tensor) and own is not None
                    and own.dtype != value.dtype and value.is_floating_point()):
                own.data = own.data.to(value.dtype)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelRebuildError(factory, "state.pt does not fit the model the factory "
                                         f"built: {str(exc).strip().splitlines()[-1]}") from None


def build_optimizer(meta: CaptureMeta, model: nn.Module, state: Mapping[str, Any],
                    plan: Plan, policy: TrustPolicy,
                    run_folder: str | None) -> torch.optim.Optimizer:
    target = plan.target
    cls = resolve_plan(plan, policy, run_folder=run_folder).obj
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ModelRebuildError(target, "is not a torch.optim.Optimizer subclass")
    params = list(model.parameters())
    saved = state.get("param_groups") or [{"params": list(range(len(params)))}]
    try:
        groups = [{"params": [params[i] for i in g["params"]]} for g in saved]
    except (IndexError, KeyError, TypeError):
        raise ModelRebuildError(target, "the saved optimizer state names parameters the "
                                        f"model does not have ({len(params)} parameters)") from None
    accepted = inspect.signature(cls).parameters
    hyper = {k: v for k, v in meta.optimizer.hyperparameters.items()
             if k in accepted and k != "params" and not isinstance(v, str)}
    try:
        optimizer = cls(groups, **hyper)
        optimizer.load_state_dict(dict(state))
    except Exception as exc:
        raise ModelRebuildError(target, f"cannot restore its state: {type(exc).__name__}: "
                                        f"{exc}") from None
    return optimizer


def _check_size(plan: tuple[Plan, dict[str, Any]], saved: Mapping[str, Any],
                policy: TrustPolicy, run_folder: str) -> None:
    """The tool's own model factories are trusted with a stranger's arguments: build the
    model on the meta device first (no memory), and refuse one larger than the state the
    capture saved, before arguments such as ``hidden=10**6`` allocate gigabytes."""
    with torch.device("meta"):
        probe, _ = build(*plan, policy, run_folder)
    wanted = sum(p.numel() for p in probe.parameters()) if isinstance(probe, nn.Module) else 0
    have = sum(v.numel() for v in saved.values() if isinstance(v, torch.Tensor))
    if wanted > have:
        raise ModelRebuildError(plan[0].target, f"its arguments build {wanted:,} parameters, "
                                                f"more than the {have:,} state.pt holds")


def _plans(meta: CaptureMeta, policy: TrustPolicy,
           run_folder: str) -> dict[str, tuple[Plan, dict[str, Any]]]:
    """Judge every piece of code the capture names, importing none of it: the model and
    loss factories (with their arguments) and the optimizer class. Raises UntrustedCode or
    RefusedCode for code the policy does not allow."""
    plans = {}
    specs: dict[str, FactorySpec] = {"model": meta.model, "loss": meta.loss}
    for what, spec in specs.items():
        plans[what] = (check(spec.factory, policy, run_folder=run_folder), dict(spec.kwargs))
    plans["optimizer"] = (check(meta.optimizer.cls, policy, run_folder=run_folder,
                                separator="."), {})
    return plans


def load_capture(path: str, *, import_paths: Sequence[str] = (),
                 policy: TrustPolicy | None = None) -> Capture:
    """Load the capture at ``path``: a ``step_N`` folder, a ``capture`` folder, or a run.

    The factories it names are imported only as ``policy`` allows (by default: the
    ``import_paths``, the folders recorded with ``forensics trust`` and the tool's own), and
    checked before any file of the capture is loaded. Raises :class:`UntrustedCode` or
    :class:`RefusedCode` for code the policy does not allow, :class:`CaptureError` for a
    missing, invalid or unsafe file (naming it) and :class:`ModelRebuildError` when the
    model, loss or optimizer cannot be rebuilt (naming the module that cannot be imported).
    """
    policy = policy if policy is not None else TrustPolicy.of(import_paths)
    folder = find_capture(path)
    meta = read_meta(folder)
    run_folder = run_of_capture(folder)
    plans = _plans(meta, policy, run_folder)  # before any file is loaded
    state = load_pt(folder, STATE_FILE)
    batch = load_pt(folder, BATCH_FILE)
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CaptureError(os.path.join(folder, STATE_FILE), "holds no 'model' state dict")
    if not isinstance(batch, dict) or "inputs" not in batch:
        raise CaptureError(os.path.join(folder, BATCH_FILE), "holds no 'inputs'")
    rng = load_pt(folder, RNG_FILE, required=False)
    history: tuple[Mapping[str, Any], ...] = ()
    if meta.mode == "every_n":
        entries = load_pt(folder, HISTORY_FILE, required=False)
        if isinstance(entries, dict) and isinstance(entries.get("steps"), list):
            if not all(isinstance(e, dict) for e in entries["steps"]):
                raise CaptureError(os.path.join(folder, HISTORY_FILE),
                                   "'steps' holds entries that are not dicts")
            history = tuple(entries["steps"])
    if plans["model"][0].source == "tool":
        _check_size(plans["model"], state["model"], policy, run_folder)
    model, model_folder = build(*plans["model"], policy, run_folder)
    if not isinstance(model, nn.Module):
        raise ModelRebuildError(meta.model.factory,
                                f"returned {type(model).__name__}, not an nn.Module")
    restore_model(model, state["model"], meta.model.factory)
    loss_fn, loss_folder = build(*plans["loss"], policy, run_folder)
    if not callable(loss_fn):
        raise ModelRebuildError(meta.loss.factory, "did not return a callable")
    optimizer = build_optimizer(meta, model, state.get("optimizer") or {},
                                plans["optimizer"][0], policy, run_folder)
    scaler = None
    if meta.amp.grad_scaler and isinstance(state.get("scaler"), dict):
        scaler = torch.amp.GradScaler("cpu")
        scaler.load_state_dict(state["scaler"])
    return Capture(path=folder, meta=meta.raw, record=meta, step=meta.step, model=model,
                   loss_fn=loss_fn, optimizer=optimizer, scaler=scaler, inputs=batch["inputs"],
                   targets=batch.get("targets"), rng=rng if isinstance(rng, dict) else None,
                   history=history,
                   code_folders=tuple(dict.fromkeys(f for f in (model_folder, loss_folder) if f)))
