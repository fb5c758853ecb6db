"""Replay one step from a checkpoint, for a run that died without a capture.

``forensics replay RUN --batch FILE`` (or ``--data module:function``) rebuilds the model
from a checkpoint and runs one instrumented step on a batch the user supplies. It is not
the failing step: the state is the checkpoint's, the batch the user's, and the result says
so in its first note, its heading and its JSON ``"origin"``.

What is rebuilt from what, first found first:

- the checkpoint: ``--checkpoint PATH`` (a file, or a Hugging Face checkpoint folder), else
  the run's last checkpoint whose weights are all finite, as the tool's own checkpoint
  scan (:mod:`analyzer.ingest.checkpoints`) orders and reads them;
- the model: ``--model module:factory`` (``--model-kwargs`` JSON), the run's env.json
  ``"recorder"`` key (written by the flight recorder when the run started), or, for a
  Hugging Face folder, the installed transformers class its config.json names
  (``architectures``; a config asking for remote code is refused). A Lightning checkpoint's
  module is called with the checkpoint's ``hyper_parameters``, as ``load_from_checkpoint``
  calls it. Every factory is judged by :mod:`analyzer.trust` exactly as a capture's are;
- the step contract: ``--loss`` (``loss_fn(model(x), y)``), ``--step`` (a factory of
  ``step(model, batch) -> loss``), the recorded one, else the model's own loss (Hugging
  Face) or ``training_step`` (Lightning);
- the optimizer: the checkpoint's own state when one fits the model (Lightning's
  ``optimizer_states``, Hugging Face's ``optimizer.pt`` beside the weights, an
  ``optimizer`` entry of a plain save), its class a ``torch.optim`` one read from the
  hyperparameter names its state holds; else SGD with lr=0, said in a note.

The files (the checkpoint, its optimizer state, the batch) are read by
:mod:`analyzer.replayer.saved`, with ``torch.load(weights_only=True)`` (numpy with
``allow_pickle=False``) through :mod:`analyzer.ingest.safeio`: one that needs unpickling is
refused, never loaded another way. Nothing is written into the run folder.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from analyzer.capture.folder import ENV_FILE, read_env
from analyzer.errors import ForensicsError, UsageError
from analyzer.model import ReplayResult, StepKind
from analyzer.replayer.dtypes import DTYPE_CHOICES
from analyzer.replayer.errors import ModelRebuildError
from analyzer.replayer.loading import build, restore_model
from analyzer.replayer.saved import (
    Saved,
    is_a,
    last_finite_checkpoint,
    read_batch,
    read_checkpoint,
    saved_optimizer,
)
from analyzer.replayer.steps import StepBatch, StepCall
from analyzer.trust import Plan, TrustPolicy, check, check_model_config, import_path, resolve_plan


@dataclass(frozen=True)
class Request:
    """What the command line asked for; ``None``: found as the module docstring says."""

    run: str
    checkpoint: str | None = None
    model: str | None = None
    model_kwargs: Mapping[str, Any] | None = None
    batch: str | None = None
    data: str | None = None
    loss: str | None = None
    step: str | None = None
    device: str = "cpu"
    dtype: str = "as-run"
    import_paths: Sequence[str] = ()
    trust_code: bool = False
    run_roots: Sequence[str] = ()
    passes: str = "auto"


@dataclass(frozen=True)
class CheckpointReplay:
    """A replay from a checkpoint: the replay itself, its label and where it all came from."""

    result: ReplayResult
    label: str
    origin: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The replay's JSON with an ``"origin"`` key saying what was replayed."""
        return {**self.result.to_dict(), "origin": dict(self.origin)}


# --- what the run recorded -----------------------------------------------------------------


@dataclass(frozen=True)
class _Recorded:
    """The ``"recorder"`` key of the run's env.json: how its model, loss and step are built."""

    path: str
    data: Mapping[str, Any]

    def factory(self, key: str) -> tuple[str, dict[str, Any], dict[str, Any] | None] | None:
        """``(factory, kwargs, config)`` of the "model" or "loss" key, or of the step
        factory ("step"); None when absent or malformed."""
        if key == "step":
            call = self.data.get("step_call")
            spec = call.get("factory") if isinstance(call, dict) else None
        else:
            spec = self.data.get(key)
        if not (isinstance(spec, dict) and isinstance(spec.get("factory"), str)):
            return None
        kwargs, config = spec.get("kwargs"), spec.get("config")
        return (spec["factory"], dict(kwargs) if isinstance(kwargs, dict) else {},
                dict(config) if isinstance(config, dict) else None)

    @property
    def kind(self) -> StepKind | None:
        from analyzer.model import STEP_KINDS

        call = self.data.get("step_call")
        kind = call.get("kind") if isinstance(call, dict) else None
        return kind if kind in STEP_KINDS else None

    @property
    def code(self) -> Mapping[str, Any] | None:
        code = self.data.get("code")
        return code if isinstance(code, dict) else None


def recorded(run: str, checkpoint: str) -> _Recorded | None:
    """The nearest env.json with a ``"recorder"`` key, from the checkpoint's folder up to
    the run folder (a Lightning run records in its version folder, above ``checkpoints/``)."""
    run = os.path.abspath(run)
    here = os.path.abspath(checkpoint if os.path.isdir(checkpoint) else os.path.dirname(checkpoint))
    folders = []
    while here.startswith(run.rstrip(os.sep) + os.sep) and here != run:
        folders.append(here)
        here = os.path.dirname(here)
    for folder in [*folders, run]:
        env, _ = read_env(folder)  # a damaged env.json is analyze's to report
        if env is not None and isinstance(env.get("recorder"), dict):
            return _Recorded(os.path.join(folder, ENV_FILE), env["recorder"])
    return None


# --- the model, the step and the batch -----------------------------------------------------


class _Builder:
    """Judges and builds factories under one trust policy, keeping the folders they came
    from (kept on ``sys.path`` while the step runs) and what the trust check said."""

    def __init__(self, policy: TrustPolicy, run: str, code: Mapping[str, Any] | None) -> None:
        self.policy = policy
        self.run = run
        self.code = code
        self.folders: list[str] = []
        self.notes: list[str] = []

    def plan(self, target: str) -> Plan:
        plan = check(target, self.policy, run_folder=self.run, code=self.code)
        self.notes += plan.notes
        return plan

    def resolve(self, plan: Plan) -> Any:
        found = resolve_plan(plan, self.policy, run_folder=self.run)
        if found.folder:
            self.folders.append(found.folder)
        return found.obj

    def build(self, plan: Plan, kwargs: Mapping[str, Any],
              config: Mapping[str, Any] | None = None) -> Any:
        with import_path(self.folders):
            obj, folder = build(plan, kwargs, self.policy, self.run, config)
        if folder:
            self.folders.append(folder)
        return obj


def _model(req: Request, saved: Saved, rec: _Recorded | None,
           builder: _Builder) -> tuple[nn.Module, str, str]:
    """The model with the checkpoint's weights, its factory and what named it."""
    spec = rec.factory("model") if rec is not None else None
    config: dict[str, Any] | None = None
    if req.model is not None:
        target, source = req.model, "--model"
        same = spec is not None and spec[0] == req.model
        kwargs = dict(req.model_kwargs) if req.model_kwargs is not None else (
            spec[1] if spec is not None and same else {})
        config = spec[2] if spec is not None and same and req.model_kwargs is None else None
        if config is None and req.model_kwargs is None and saved.kind == "huggingface":
            config = saved.config  # a model class named for a Hugging Face folder
    elif spec is not None and rec is not None:
        target, kwargs, config = spec
        source = rec.path
    elif saved.kind == "huggingface":
        target, kwargs, config, source = _hf_class(saved), {}, saved.config, "config.json"
    elif saved.kind == "lightning":
        raise UsageError(f"{saved.path}: a Lightning checkpoint does not say its "
                         "LightningModule class, and the run recorded none (env.json); name "
                         "it with --model module:Class")
    else:
        raise UsageError(f"{saved.path}: holds weights only, and the run recorded no model "
                         "(env.json); name it with --model module:factory (and "
                         "--model-kwargs JSON)")
    if config is not None:
        check_model_config(target, config)
    plan = builder.plan(target)
    if saved.kind == "lightning" and req.model_kwargs is None and saved.hyper is not None:
        kwargs = _init_kwargs(builder.resolve(plan), saved)
    if plan.source == "tool":
        _check_size(builder, plan, kwargs, saved)
    if plan.source == "library":
        builder.resolve(plan)  # imports transformers, whose notes are then quieted
    with warnings.catch_warnings(), _library_quiet():
        warnings.simplefilter("ignore")  # a config's deprecation notices are not findings
        model = builder.build(plan, kwargs, config)
    if not isinstance(model, nn.Module):
        raise ModelRebuildError(target, f"returned {type(model).__name__}, not an nn.Module")
    try:
        restore_model(model, _with_tied(model, saved.weights), target)
    except ModelRebuildError as exc:  # its words name a capture's state.pt
        detail = exc.reason.partition(": ")[2].strip() or exc.reason
        raise ModelRebuildError(target, f"the weights of {saved.path} do not fit the model it "
                                        f"built: {detail}") from None
    return model, target, source


def _hf_class(saved: Saved) -> str:
    names = (saved.config or {}).get("architectures")
    if not (isinstance(names, list) and names and isinstance(names[0], str)):
        raise UsageError(f"{saved.path}: its config.json names no model class "
                         "('architectures'); name one with --model module:factory")
    return f"transformers:{names[0]}"


def _init_kwargs(cls: Any, saved: Saved) -> dict[str, Any]:
    """A LightningModule's arguments from the checkpoint's hyperparameters, as Lightning's
    ``load_from_checkpoint`` passes them: under the name of the one object saved, if so,
    and only those ``__init__`` takes unless it takes ``**kwargs``."""
    hyper = dict(saved.hyper or {})
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return hyper
    if saved.hparams_name and saved.hparams_name != "kwargs" and saved.hparams_name in params:
        return {saved.hparams_name: hyper}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return hyper
    return {k: v for k, v in hyper.items() if k in params}


def _check_size(builder: _Builder, plan: Plan, kwargs: Mapping[str, Any], saved: Saved) -> None:
    """The tool's own factories are trusted with a stranger's arguments: build on the meta
    device first, and refuse a model larger than the checkpoint's weights."""
    with torch.device("meta"):
        probe = builder.build(plan, kwargs)
    wanted = sum(p.numel() for p in probe.parameters()) if isinstance(probe, nn.Module) else 0
    have = sum(v.numel() for v in saved.weights.values())
    if wanted > have:
        raise ModelRebuildError(plan.target, f"its arguments build {wanted:,} parameters, more "
                                             f"than the {have:,} the checkpoint holds")


def _with_tied(model: nn.Module, weights: Mapping[str, Any]) -> dict[str, Any]:
    """The weights plus the tied tensors a save leaves out (``save_pretrained`` writes a
    tied ``lm_head.weight`` once, as the embedding): each filled from its twin."""
    own = model.state_dict(keep_vars=True)
    by_storage: dict[int, str] = {}
    for name, tensor in own.items():
        if name in weights and tensor.data_ptr():
            by_storage.setdefault(tensor.data_ptr(), name)
    out = dict(weights)
    for name, tensor in own.items():
        twin = by_storage.get(tensor.data_ptr()) if name not in weights else None
        if twin is not None:
            out[name] = weights[twin]
    return out


def _step_call(req: Request, model: nn.Module, rec: _Recorded | None,
               builder: _Builder) -> tuple[StepCall, str]:
    """How the step computes its loss, and what said so."""
    if req.step is not None:
        return StepCall("step_fn", _callable(builder, req.step, rec, "step")), "--step"
    if req.loss is not None:
        return StepCall("loss_fn", _callable(builder, req.loss, rec, "loss")), "--loss"
    kind = rec.kind if rec is not None else None
    if rec is not None and kind is not None:
        key = {"step_fn": "step", "loss_fn": "loss"}.get(kind)
        spec = rec.factory(key) if key else None
        if key is None:
            return StepCall(kind, None, 0), rec.path
        if spec is not None:
            return StepCall(kind, _callable(builder, spec[0], rec, key), 0), rec.path
    if is_a(model, "transformers", "PreTrainedModel"):
        return StepCall("model_loss"), "a Hugging Face model returns its loss"
    if is_a(model, "lightning", "LightningModule") or is_a(model, "pytorch_lightning",
                                                               "LightningModule"):
        return StepCall("training_step", None, 0), "a LightningModule's training_step"
    raise UsageError("say how the step computes its loss: --loss module:factory "
                     "(loss(model(inputs), targets)) or --step module:factory (a function "
                     "step(model, batch) -> loss); the run recorded neither (env.json)")


def _callable(builder: _Builder, target: str, rec: _Recorded | None, key: str) -> Any:
    spec = rec.factory(key) if rec is not None else None
    kwargs = spec[1] if spec is not None and spec[0] == target else {}
    fn = builder.build(builder.plan(target), kwargs)
    if not callable(fn):
        raise ModelRebuildError(target, "did not return a callable")
    return fn


def _micro(value: Any, kind: StepKind, where: str) -> dict[str, Any]:
    """One micro-batch as the step contract takes it. A capture's own batch.pt layout
    (``{"inputs", "targets"}`` or ``{"batch"}``) is taken as such."""
    if not _has_tensor(value):
        raise UsageError(f"{where} holds no tensor: {type(value).__name__}")
    capture = isinstance(value, dict) and ("inputs" in value or "batch" in value) and \
        set(value) <= {"inputs", "targets", "batch", "micro_batches"}
    if kind == "loss_fn":
        if capture and "inputs" in value:
            return {"inputs": value["inputs"], "targets": value.get("targets")}
        if isinstance(value, list | tuple) and len(value) == 2:
            return {"inputs": value[0], "targets": value[1]}
        raise UsageError(f"{where} holds a {type(value).__name__}; a step of the form "
                         "loss(model(inputs), targets) needs an (inputs, targets) pair")
    if capture and "batch" in value:
        return {"batch": value["batch"]}
    if capture:
        return {"batch": [value["inputs"], value.get("targets")]}
    return {"batch": value}


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return False


def _batch(req: Request, call: StepCall, step: int | None,
           builder: _Builder) -> tuple[StepBatch, str]:
    if req.batch is not None:
        where = f"--batch {req.batch}"
        value = read_batch(req.batch)
    else:
        assert req.data is not None
        where = f"--data {req.data}"
        fn = builder.resolve(builder.plan(req.data))
        if not callable(fn):
            raise ModelRebuildError(req.data, "is not a function")
        try:
            with import_path(builder.folders):
                value = fn(step)
        except Exception as exc:
            raise ModelRebuildError(req.data, f"calling it with step {step} raised "
                                              f"{type(exc).__name__}: {exc}") from None
    return StepBatch((_micro(value, call.kind, where),)), where


# --- the replay ----------------------------------------------------------------------------


def replay_checkpoint(req: Request) -> CheckpointReplay:
    """Rebuild the model from a checkpoint and replay one step on the supplied batch."""
    from analyzer.replayer.run import check_device
    from analyzer.replayer.step import replay_call

    if req.dtype not in DTYPE_CHOICES:
        raise UsageError(f"--dtype {req.dtype!r}: choose one of {', '.join(DTYPE_CHOICES)}")
    check_device(req.device)
    run, checkpoint = req.run, req.checkpoint
    if not os.path.exists(run):
        raise UsageError(f"{run}: no such file or folder")
    if not os.path.isdir(run):  # a checkpoint named in place of its run
        run, checkpoint = os.path.dirname(os.path.abspath(run)), checkpoint or run
    if req.batch is None and req.data is None:
        raise UsageError("a replay from a checkpoint needs a batch: --batch FILE or --data "
                         "module:function")
    if req.batch is not None and req.data is not None:
        raise UsageError("give --batch FILE or --data module:function, not both")
    found_step: int | None = None
    if checkpoint is None:
        checkpoint, found_step = last_finite_checkpoint(run, req.run_roots)
    saved = read_checkpoint(checkpoint)
    step = saved.step if saved.step is not None else found_step
    rec = recorded(run, saved.path)
    builder = _Builder(TrustPolicy.of(req.import_paths, req.trust_code), os.path.abspath(run),
                       rec.code if rec is not None else None)
    model, target, model_from = _model(req, saved, rec, builder)
    call, call_from = _step_call(req, model, rec, builder)
    batch, batch_from = _batch(req, call, step, builder)
    optimizer, optimizer_class_name, optimizer_note = saved_optimizer(model, saved)
    label = (f"replay from checkpoint {_shown(saved.path, run)} "
             f"({'step ' + str(step) if step is not None else 'step unknown'}) on a supplied "
             f"batch ({batch_from}), not the failing step")
    notes = [label, f"model: {target}, from {_shown(model_from, run)}, with the weights of "
                    f"{_shown(saved.path, run)}",
             f"step: {call.kind}, from {_shown(call_from, run)}", optimizer_note,
             *saved.notes, *dict.fromkeys(builder.notes)]
    try:
        with import_path(builder.folders), warnings.catch_warnings(), _library_quiet():
            warnings.simplefilter("ignore")  # a LightningModule's self.log outside a Trainer
            result = replay_call(model, batch, call, [optimizer], device=req.device,
                                 dtype=None if req.dtype == "as-run" else req.dtype,
                                 expected=False, source=saved.path, step=step, notes=notes,
                                 passes=req.passes)
    except ForensicsError as exc:
        raise UsageError(f"{exc} (replaying {_shown(saved.path, run)} on {batch_from})") \
            from None
    origin = {"kind": "checkpoint", "label": label, "checkpoint": saved.path,
              "format": saved.kind, "checkpoint_step": step, "batch": batch_from,
              "model": {"factory": target, "from": model_from},
              "step_call": {"kind": call.kind, "from": call_from},
              "optimizer": {"class": optimizer_class_name,
                            "restored": optimizer_class_name is not None}}
    return CheckpointReplay(result, label, origin)


@contextlib.contextmanager
def _library_quiet() -> Iterator[None]:
    """transformers logs its notes on a config (token ids beyond a tiny vocabulary, the
    default loss) as warnings on stderr: they are not the replay's findings."""
    library = sys.modules.get("transformers")
    logs = getattr(getattr(library, "utils", None), "logging", None)
    if logs is None:
        yield
        return
    level = logs.get_verbosity()
    logs.set_verbosity_error()
    try:
        yield
    finally:
        logs.set_verbosity(level)


def _shown(path: str, run: str) -> str:
    """A path inside the run relative to it; anything else as it is."""
    if not os.path.isabs(path) and not os.path.exists(path):
        return path
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(run))
    return path if rel.startswith("..") else rel


def parse_kwargs(text: str | None) -> dict[str, Any] | None:
    """``--model-kwargs``: a JSON object, or UsageError."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--model-kwargs is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("--model-kwargs is not a JSON object of keyword arguments")
    return value


__all__ = ["CheckpointReplay", "Request", "parse_kwargs", "recorded", "replay_checkpoint"]
