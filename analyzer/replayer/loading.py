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
from dataclasses import dataclass, field
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
from analyzer.capture.format import NoConfigClass, from_config
from analyzer.ingest import storage
from analyzer.ingest.safeio import NotRegularFile, open_regular
from analyzer.model import CaptureMeta, FactorySpec, OptimizerSpec
from analyzer.replayer.errors import CaptureError, ModelRebuildError
from analyzer.replayer.steps import StepBatch, StepCall, micro_batches
from analyzer.trust import Plan, TrustPolicy, check, check_model_config, resolve_plan


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
    loss_fn: Callable[[Any, Any], Any] | None
    """The loss function of the ``loss_fn`` step contract; None for the others."""
    optimizer: torch.optim.Optimizer
    scaler: Any
    inputs: Any
    """The failing micro-batch's inputs (``loss_fn`` kind) or whole batch (other kinds)."""
    targets: Any
    rng: Mapping[str, Any] | None
    history: tuple[Mapping[str, Any], ...] = ()
    code_folders: tuple[str, ...] = ()
    """The trusted folders the factories were imported from: the replay keeps them on
    ``sys.path``, for modules the model imports while it runs."""
    call: StepCall = field(default_factory=StepCall)
    batch: StepBatch = field(default_factory=lambda: StepBatch(()))
    extra_optimizers: tuple[torch.optim.Optimizer, ...] = ()
    notes: tuple[str, ...] = ()
    """What the trust check said of the code (changed since the capture, which copy ran)."""

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return (self.optimizer, *self.extra_optimizers)

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
    if not storage.exists(path):
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
    path = storage.join(folder, name)  # a capture on object storage is read in place
    if not storage.exists(path):
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
          run_folder: str | None, config: Mapping[str, Any] | None = None
          ) -> tuple[Any, str | None]:
    """Import and call the factory a trust check judged: (object, folder it came from).
    With a Hugging Face ``config``, the class is built from it instead of from kwargs."""
    target = plan.target
    found = resolve_plan(plan, policy, run_folder=run_folder)
    try:
        if config is not None:
            return from_config(found.obj, config), found.folder
        return found.obj(**kwargs), found.folder
    except NoConfigClass:
        raise ModelRebuildError(target, "has no config_class to build from the recorded "
                                        "config") from None
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


def build_optimizer(spec: OptimizerSpec, model: nn.Module, state: Mapping[str, Any],
                    plan: Plan, policy: TrustPolicy,
                    run_folder: str | None) -> torch.optim.Optimizer:
    """One optimizer of the step, over the parameters its saved state names (the index of
    each in ``model.parameters()``, as ``state_dict`` numbers them for one optimizer)."""
    target = plan.target
    cls = resolve_plan(plan, policy, run_folder=run_folder).obj
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ModelRebuildError(target, "is not a torch.optim.Optimizer subclass")
    groups = _groups(spec, model, state, target)
    accepted = inspect.signature(cls).parameters
    hyper = {k: v for k, v in spec.hyperparameters.items()
             if k in accepted and k != "params" and not isinstance(v, str)}
    try:
        optimizer = cls(groups, **hyper)
        optimizer.load_state_dict(dict(state))
    except Exception as exc:
        raise ModelRebuildError(target, f"cannot restore its state: {type(exc).__name__}: "
                                        f"{exc}") from None
    return optimizer


def _groups(spec: OptimizerSpec, model: nn.Module, state: Mapping[str, Any],
            target: str) -> list[dict[str, Any]]:
    """The optimizer's param groups over the rebuilt model's parameters: by the names the
    capture recorded (version 2), else by position in ``model.parameters()`` (version 1,
    whose one optimizer listed them in the model's order)."""
    if spec.params:
        named = dict(model.named_parameters())
        missing = [n for g in spec.params for n in g if n not in named]
        if missing:
            raise ModelRebuildError(target, f"the capture's optimizer names parameters the "
                                            f"model does not have: {', '.join(missing[:3])}")
        return [{"params": [named[n] for n in g]} for g in spec.params]
    params = list(model.parameters())
    saved = state.get("param_groups") or [{"params": list(range(len(params)))}]
    try:
        return [{"params": [params[i] for i in g["params"]]} for g in saved]
    except (IndexError, KeyError, TypeError):
        raise ModelRebuildError(target, "the saved optimizer state names parameters the "
                                        f"model does not have ({len(params)} parameters)") from None


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
    """Judge every piece of code the capture names, importing none of it: the model, loss
    and step factories (with their arguments) and the optimizer classes. Raises
    UntrustedCode or RefusedCode for code the policy does not allow."""
    plans = {}
    specs: dict[str, FactorySpec | None] = {"model": meta.model, "loss": meta.loss,
                                            "step": meta.step_call.factory}
    for what, spec in specs.items():
        if spec is None:
            continue
        plans[what] = (check(spec.factory, policy, run_folder=run_folder, code=meta.code,
                             capture_folder=meta.folder), dict(spec.kwargs))
    if meta.model.config is not None:
        check_model_config(meta.model.factory, meta.model.config)
    for i, opt in enumerate(meta.optimizers):
        plans[f"optimizer{i}"] = (check(opt.cls, policy, run_folder=run_folder,
                                        separator=".", code=meta.code,
                                        capture_folder=meta.folder), {})
    return plans


def _step_batch(meta: CaptureMeta, folder: str, batch: Mapping[str, Any]) -> StepBatch:
    """The micro-batches of batch.pt: every one when there were several, else the one."""
    path = os.path.join(folder, BATCH_FILE)
    key = "inputs" if meta.step_call.kind == "loss_fn" else "batch"
    if key not in batch:
        raise CaptureError(path, f"holds no {key!r}")
    try:
        micro = micro_batches(batch, meta.step_call.kind)
    except ValueError as exc:
        raise CaptureError(path, str(exc)) from None
    assert micro is not None  # the key is there
    return StepBatch(micro, meta.accumulation.failing, meta.accumulation.divide,
                     by=meta.accumulation.divisor)


def _optimizer_states(meta: CaptureMeta, state: Mapping[str, Any],
                      folder: str) -> list[Mapping[str, Any]]:
    saved = state.get("optimizers")
    if saved is None:
        return [state.get("optimizer") or {}]
    if not (isinstance(saved, list) and all(isinstance(s, dict) for s in saved)
            and len(saved) == len(meta.optimizers)):
        raise CaptureError(os.path.join(folder, STATE_FILE),
                           f"'optimizers' does not hold the {len(meta.optimizers)} optimizer "
                           "states meta.json lists")
    return saved


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
    if not isinstance(batch, dict):
        raise CaptureError(os.path.join(folder, BATCH_FILE), "holds no batch dict")
    step_batch = _step_batch(meta, folder, batch)
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
    model, model_folder = build(*plans["model"], policy, run_folder, meta.model.config)
    if not isinstance(model, nn.Module):
        raise ModelRebuildError(meta.model.factory,
                                f"returned {type(model).__name__}, not an nn.Module")
    restore_model(model, state["model"], meta.model.factory)
    folders = [model_folder]
    loss_fn = None
    fn: Any = None
    if "loss" in plans:
        loss_fn, loss_folder = build(*plans["loss"], policy, run_folder)
        folders.append(loss_folder)
        if not callable(loss_fn):
            raise ModelRebuildError(plans["loss"][0].target, "did not return a callable")
        fn = loss_fn
    if "step" in plans:
        fn, step_folder = build(*plans["step"], policy, run_folder)
        folders.append(step_folder)
        if not callable(fn):
            raise ModelRebuildError(plans["step"][0].target, "did not return a callable")
    optimizers = [
        build_optimizer(spec, model, opt_state, plans[f"optimizer{i}"][0], policy, run_folder)
        for i, (spec, opt_state) in enumerate(zip(meta.optimizers,
                                                  _optimizer_states(meta, state, folder),
                                                  strict=True))]
    scaler = None
    if meta.amp.grad_scaler and isinstance(state.get("scaler"), dict):
        scaler = torch.amp.GradScaler("cpu")
        scaler.load_state_dict(state["scaler"])
    failing = step_batch.instrumented
    notes = tuple(n for plan, _ in plans.values() for n in plan.notes)
    return Capture(path=folder, meta=meta.raw, record=meta, step=meta.step, model=model,
                   loss_fn=loss_fn, optimizer=optimizers[0], scaler=scaler,
                   inputs=failing.get("inputs", failing.get("batch")),
                   targets=failing.get("targets"), rng=rng if isinstance(rng, dict) else None,
                   history=history,
                   code_folders=tuple(dict.fromkeys(f for f in folders if f)),
                   call=StepCall(meta.step_call.kind, fn, meta.step_call.batch_idx),
                   batch=step_batch, extra_optimizers=tuple(optimizers[1:]), notes=notes)
