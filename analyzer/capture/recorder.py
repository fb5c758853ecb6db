"""The flight recorder itself: keeps each step's state, writes the first bad step.

A step is one optimizer step: its batch (or, with gradient accumulation, its micro-batches,
handed in by :meth:`FlightRecorder.micro_batch`), the loss of each, the learning rate of
every param group of every optimizer, and the random states at its start. How the loss came
from the model and the batch is the step contract (``step_kind``), recorded so that replay
computes it the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from analyzer.capture.batch import keepable
from analyzer.capture.env import environment, write_env
from analyzer.capture.folder import (
    BATCH_FILE,
    CAPTURE_DIR,
    ENV_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    HISTORY_FILE,
    META_FILE,
    RNG_FILE,
    STATE_FILE,
    step_dir_name,
    temporary_prefix,
)
from analyzer.capture.format import (
    Factory,
    Mode,
    NoConfigClass,
    class_path,
    dtype_name,
    from_config,
    hparams_json,
    write_json,
)
from analyzer.capture.rng import raw_rng, safe_rng

if TYPE_CHECKING:
    import torch

    from analyzer.model.captures import StepKind


class CaptureSetupError(ValueError):
    """The recorder cannot be set up as asked: a factory that does not import, does not build
    the live model, or a step contract that does not fit. Raised when the recorder is built,
    at step 0, never later in training."""


@dataclass
class _Snapshot:
    """State at the start of one step; tensors are reused between steps to save allocation."""

    step: int = -1
    model: dict[str, Any] = field(default_factory=dict)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    scaler: dict[str, Any] | None = None


@dataclass
class _StepInputs:
    """What a single step needs besides the state: its micro-batches (kept as loadable
    nests), their losses, the random states at its start and every group's lr."""

    step: int
    micro: list[Any]
    rng: tuple[Any, ...]
    lrs: list[list[float]]
    batch_idx: int | None = None
    losses: list[Any] = field(default_factory=list)
    """One per micro-batch, None until the loop hands that micro-batch's loss over."""
    dropped: list[str] = field(default_factory=list)

    @property
    def lr(self) -> float:
        return self.lrs[0][0] if self.lrs and self.lrs[0] else float("nan")


Factoryish = str | Callable[..., Any] | None


class FlightRecorder:
    """Keeps the start-of-step state of a training loop and writes the first bad step.

    ``mode="every_step"`` copies model and optimizer state before every step, so the
    capture is the failing step alone. ``mode="every_n"`` copies it only every
    ``every_n`` steps and keeps the batches, RNG states and learning rates of the steps
    since; replay then re-runs those steps before the failing one. Both modes cost
    nothing once a capture is written. Without ``mode``, ``every_n=K`` with K > 1 means
    ``mode="every_n"``; ``mode="every_step"`` with K > 1 is a contradiction and raises
    ``ValueError``, as an invalid mode does.

    The step contract (``step_kind``, inferred from the factories given): ``loss_fn``
    (``loss_factory``: ``loss(model(x), y)``), ``step_fn`` (``step_factory``: a function
    ``step(model, batch) -> loss``), ``model_loss`` (the model returns its loss:
    ``model(**batch).loss``) or ``training_step`` (a LightningModule). Factories are
    ``module:name`` strings or the callables themselves; with ``validate`` each is built once
    here (the model on the meta device) and a mismatch raises :class:`CaptureSetupError`.

    ``check_grads`` and ``check_params`` add a check of every gradient (after the step,
    skipped when a GradScaler is used: skipped overflow steps are its normal business)
    and of every parameter (after the update).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizer: Any,
        *,
        model_factory: Factoryish = None,
        model_kwargs: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
        loss_factory: Factoryish = None,
        loss_kwargs: Mapping[str, Any] | None = None,
        step_factory: Factoryish = None,
        step_kwargs: Mapping[str, Any] | None = None,
        step_kind: StepKind | None = None,
        scaler: Any = None,
        autocast_dtype: torch.dtype | None = None,
        autocast_scope: Literal["step", "forward"] = "step",
        grad_clip: float | None = None,
        accumulation: int = 1,
        divide_loss: bool | Literal["micro_batches"] = True,
        seed: int | None = None,
        mode: Mode | None = None,
        every_n: int = 1,
        check_grads: bool = False,
        check_params: bool = False,
        loss_tag: str = "train/loss",
        write_env_file: bool = True,
        trust_code_root: bool = True,
        validate: bool = True,
    ) -> None:
        if every_n < 1:
            raise ValueError(f"every_n must be at least 1, not {every_n}")
        if accumulation < 1:
            raise ValueError(f"accumulation must be at least 1, not {accumulation}")
        if mode is None:
            mode = "every_n" if every_n > 1 else "every_step"
        if mode not in ("every_step", "every_n"):
            raise ValueError(f"mode must be 'every_step' or 'every_n', not {mode!r}")
        if mode == "every_step" and every_n > 1:
            # Silently copying every step would cost K times what was asked for.
            raise ValueError(f'every_n={every_n} needs mode="every_n" (or no mode): '
                             'mode="every_step" copies the state before every step')
        self.run_dir = os.fspath(run_dir)
        self.model = unwrap_model(model)
        optimizers = list(optimizer) if isinstance(optimizer, list | tuple) else [optimizer]
        self.optimizers = [unwrap_optimizer(o) for o in optimizers]
        self._default_factory = model_factory is None
        if model_factory is None:
            model_factory = type(self.model)
        self.step_kind: StepKind = _step_kind(step_kind, loss_factory, step_factory)
        self.model_factory = Factory(factory_path(model_factory), dict(model_kwargs or {}))
        self.model_config = dict(model_config) if model_config is not None else None
        self.loss_factory = (Factory(factory_path(loss_factory), dict(loss_kwargs or {}))
                             if loss_factory is not None else None)
        self.step_factory = (Factory(factory_path(step_factory), dict(step_kwargs or {}))
                             if step_factory is not None else None)
        self.scaler = scaler
        self.autocast_dtype = autocast_dtype
        if autocast_scope not in ("step", "forward"):
            raise CaptureSetupError(f"autocast_scope {autocast_scope!r} is not 'step' or "
                                    "'forward'")
        self.autocast_scope = autocast_scope
        self.grad_clip = grad_clip
        self.accumulation = accumulation
        self.divide_loss = divide_loss
        self.seed = seed
        self.mode: Mode = mode
        self.every_n = every_n
        self.check_grads = check_grads
        self.check_params = check_params
        self.loss_tag = loss_tag
        self.capture_path: str | None = None
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.global_step = -1
        self._snapshot = _Snapshot()
        self._history: list[_StepInputs] = []
        self._current: _StepInputs | None = None
        self._env: dict[str, Any] | None = None
        self._stopped = False
        self._warned = False
        self._cuda = _cuda_available()
        if validate:
            self._validate()
        self.code = self._code_record(trust_code_root)
        if write_env_file and write_env(self.run_dir, seed, self._rebuild()) is None:
            self.errors.append(f"could not write {ENV_FILE}")

    @property
    def optimizer(self) -> Any:
        """The first optimizer (the only one of most loops)."""
        return self.optimizers[0]

    @property
    def captured(self) -> bool:
        return self.capture_path is not None

    @property
    def active(self) -> bool:
        """False once a capture is written or writing one failed: then it costs nothing."""
        return self.capture_path is None and not self._stopped

    @contextlib.contextmanager
    def step(self, step: int | None = None, inputs: Any = None, targets: Any = None, *,
             batch: Any = None, batch_idx: int | None = None) -> Iterator[FlightRecorder]:
        """Record one training step; the body runs the loop's own step."""
        self.begin(step, inputs, targets, batch=batch, batch_idx=batch_idx)
        error: BaseException | None = None
        try:
            yield self
        except BaseException as exc:
            error = exc
            raise
        finally:
            # Checked even when the body raised: a loop that raises FloatingPointError
            # on a NaN loss is exactly the case worth capturing.
            self.end(error)

    def begin(self, step: int | None = None, inputs: Any = None, targets: Any = None, *,
              batch: Any = None, batch_idx: int | None = None) -> None:
        """Start recording an optimizer step (``step=None``: the recorder's own count)."""
        self.global_step = self.global_step + 1 if step is None else int(step)
        self._current = None
        if self.active:
            self._guard("keep state", self._before, self.global_step,
                        self._batch_of(inputs, targets, batch), batch_idx)

    def micro_batch(self, batch: Any = None, *, inputs: Any = None, targets: Any = None) -> None:
        """A further micro-batch of the same optimizer step (gradient accumulation)."""
        if self.active and self._current is not None:
            self._guard("keep batch", self._add_micro, self._batch_of(inputs, targets, batch))

    def loss(self, value: Any) -> None:
        """Hand the loss of the step's latest micro-batch to the recorder."""
        current = self._current
        if current is not None:
            current.losses[-1] = value

    def end(self, error: BaseException | None = None) -> None:
        """Finish the step: check it and, on the first bad one, write the capture.

        ``error`` is what the step raised, if anything: a raised step is still checked."""
        if self.active and self._current is not None:
            self._guard("check step", self._after, error)
        self._current = None

    def discard(self) -> None:
        """Forget the open step unchecked: a step whose update was refused (the guarded
        step's skip) changed no weight, so it is neither a failure to capture nor a step a
        later capture's replay re-runs."""
        self._current = None

    # The calls above are the whole API a loop needs; the rest is the machinery.

    def _batch_of(self, inputs: Any, targets: Any, batch: Any) -> Any:
        if self.step_kind == "loss_fn":
            if batch is not None and inputs is None:
                if not (isinstance(batch, list | tuple) and len(batch) == 2):
                    raise CaptureSetupError("the loss_fn step needs inputs and targets (or a "
                                            "batch that is an (inputs, targets) pair)")
                inputs, targets = batch
            return {"inputs": inputs, "targets": targets}
        if batch is None:
            batch = inputs if targets is None else (inputs, targets)
        return {"batch": batch}

    def _validate(self) -> None:
        """Build every factory once, now, so a wrong one fails before training."""
        import torch

        try:
            with torch.device("meta"):
                built = self._build_model()
        except CaptureSetupError:
            raise
        except Exception as exc:
            hint = (" (no model_factory was given, so the model's own class was tried with "
                    "model_kwargs; pass model_factory= and model_kwargs= to say how the model "
                    "is built)" if self._default_factory else "")
            raise CaptureSetupError(f"model_factory {self.model_factory.path!r} cannot build "
                                    f"the model: {type(exc).__name__}: {exc}{hint}") from None
        _same_shapes(self.model_factory.path, built, self.model)
        for what, factory in (("loss_factory", self.loss_factory),
                              ("step_factory", self.step_factory)):
            if factory is None:
                continue
            try:
                made = factory.build()
            except Exception as exc:
                raise CaptureSetupError(f"{what} {factory.path!r} cannot be called: "
                                        f"{type(exc).__name__}: {exc}") from None
            if not callable(made):
                raise CaptureSetupError(f"{what} {factory.path!r} returned "
                                        f"{type(made).__name__}, not a callable")
        if self.step_kind == "training_step" and not callable(
                getattr(self.model, "training_step", None)):
            raise CaptureSetupError("step_kind 'training_step' needs a model with a "
                                    "training_step method (a LightningModule)")

    def _build_model(self) -> Any:
        if self.model_config is None:
            return self.model_factory.build()
        try:
            return from_config(self.model_factory.target(), self.model_config)
        except NoConfigClass as exc:
            raise CaptureSetupError(f"model_config given, but {self.model_factory.path!r} "
                                    f"{exc}") from None

    def _code_record(self, trust: bool) -> dict[str, Any] | None:
        """Where the factories' code lives; registered as trusted on this machine."""
        try:
            from analyzer.capture import code
        except ImportError:  # pragma: no cover - the module ships with the package
            return None
        targets = [f.path for f in (self.model_factory, self.loss_factory, self.step_factory)
                   if f is not None]
        try:
            record = code.code_record(targets)
        except Exception as exc:
            self.errors.append(f"code record: {type(exc).__name__}: {exc}")
            return None
        if trust:
            self.notes.extend(code.register_trust(record))
        return record

    def _divisor(self, current: _StepInputs) -> int:
        """What each micro-batch's loss was divided by before backward: the configured
        ``accumulation`` (accelerate's backward), the step's own count of micro-batches
        (``divide_loss="micro_batches"``: the HF Trainer, whose last step of an epoch may
        hold fewer), or 1."""
        if self.divide_loss is False:
            return 1
        if self.divide_loss == "micro_batches":
            return len(current.micro)
        return self.accumulation

    def _rebuild(self) -> dict[str, Any]:
        """How a replay rebuilds this run's model, loss and step: the keys of meta.json that
        say it, written into env.json at the start (for a replay from a checkpoint)."""
        model = self.model_factory.to_json()
        if self.model_config is not None:
            model["config"] = hparams_json(self.model_config)
        return {
            "model": model,
            "loss": self.loss_factory.to_json() if self.loss_factory else None,
            "step_call": {"kind": self.step_kind,
                          "factory": self.step_factory.to_json() if self.step_factory else None},
            "code": self.code,
        }

    def _guard(self, what: str, func: Any, *args: Any) -> None:
        try:
            func(*args)
        except Exception as exc:
            message = f"{what}: {type(exc).__name__}: {exc}"
            if not self._warned:
                warnings.warn(f"flight recorder: {message}", stacklevel=4)
                self._warned = True
            self.errors.append(message)
            if what == "check step":
                # A recorder that failed to write should not retry, and slow, every step.
                self._stopped = True

    def _before(self, step: int, batch: Any, batch_idx: int | None) -> None:
        import torch

        with torch.no_grad():
            since = step - self._snapshot.step
            # A step counter going backwards (a resumed run) also starts a new snapshot.
            if self._snapshot.step < 0 or since >= self.every_n or since <= 0:
                self._snapshot.model = _copy_into(self._snapshot.model, self.model.state_dict())
                old = self._snapshot.optimizers
                self._snapshot.optimizers = [
                    _copy_into(old[i] if i < len(old) else {}, o.state_dict())
                    for i, o in enumerate(self.optimizers)]
                self._snapshot.scaler = _scaler_state(self.scaler)
                self._snapshot.step = step
                self._history.clear()
            kept, dropped = keepable(batch)
            self._current = _StepInputs(
                step=step, micro=[kept], losses=[None], rng=raw_rng(self._cuda),
                lrs=[[float(g["lr"]) for g in o.param_groups] for o in self.optimizers],
                batch_idx=batch_idx, dropped=dropped)

    def _add_micro(self, batch: Any) -> None:
        current = self._current
        assert current is not None
        kept, dropped = keepable(batch, f"micro_batches[{len(current.micro)}]")
        current.micro.append(kept)
        current.losses.append(None)
        current.dropped.extend(dropped)

    def _after(self, error: BaseException | None) -> None:
        current = self._current
        assert current is not None
        trigger = self._find_trigger(current)
        if trigger is None and error is not None and numeric_error(error):
            trigger = {"what": "error", "name": type(error).__name__,
                       "kind": _error_kind(error)}
        if trigger is None:
            if self.mode == "every_n":
                self._history.append(current)
            return
        if error is not None:
            trigger["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:500]
        self.capture_path = self._write(current, trigger)

    def _find_trigger(self, current: _StepInputs) -> dict[str, Any] | None:
        for i, value in enumerate(current.losses):
            kind = _kind_of(value) if value is not None else None
            if kind is not None:
                trigger: dict[str, Any] = {"what": "loss", "name": self.loss_tag, "kind": kind}
                if len(current.micro) > 1:
                    trigger["micro_batch"] = i
                return trigger
        named = list(self.model.named_parameters())
        if self.check_grads and self.scaler is None:
            grads = [(n, p.grad) for n, p in named if p.grad is not None]
            found = _first_nonfinite(grads)
            if found is not None:
                return {"what": "grad", "name": found[0], "kind": found[1]}
        if self.check_params:
            found = _first_nonfinite(named)
            if found is not None:
                return {"what": "param", "name": found[0], "kind": found[1]}
        return None

    def _write(self, current: _StepInputs, trigger: dict[str, Any]) -> str:
        import torch

        final = os.path.join(self.run_dir, CAPTURE_DIR, step_dir_name(current.step))
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        # Written aside and renamed, so a crash mid-write never leaves a half capture: the
        # readers take no folder of the temporary name (analyzer.capture.folder).
        tmp = tempfile.mkdtemp(prefix=temporary_prefix(current.step), dir=parent)
        try:
            optimizers = self._snapshot.optimizers
            torch.save(
                {
                    "model": self._snapshot.model,
                    "optimizer": optimizers[0] if optimizers else {},
                    "optimizers": optimizers,
                    "scaler": self._snapshot.scaler,
                },
                os.path.join(tmp, STATE_FILE),
            )
            torch.save(_batch_file(current, trigger), os.path.join(tmp, BATCH_FILE))
            torch.save(safe_rng(current.rng), os.path.join(tmp, RNG_FILE))
            if self.mode == "every_n":
                torch.save(
                    {"steps": [_history_entry(h) for h in self._history]},
                    os.path.join(tmp, HISTORY_FILE),
                )
            files = [META_FILE, STATE_FILE, BATCH_FILE, RNG_FILE]
            if self.code is not None:
                from analyzer.capture import code

                saved = code.write_main_source(tmp, self.code)
                if saved is not None:
                    files.append(os.path.relpath(saved, tmp).replace(os.sep, "/"))
            # meta.json last: a folder that holds it is complete.
            write_json(os.path.join(tmp, META_FILE), self._meta(current, trigger, files))
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._history.clear()
        self._snapshot = _Snapshot()
        return final

    def _meta(self, current: _StepInputs, trigger: dict[str, Any],
              files: list[str]) -> dict[str, Any]:
        if self._env is None:
            self._env = environment(self.seed)
        params = list(self.model.parameters())
        dtype = dtype_name(params[0].dtype) if params else "float32"
        device = str(params[0].device) if params else "cpu"
        names = {id(p): n for n, p in self.model.named_parameters()}
        optimizers = [_optimizer_json(o, lrs, names)
                      for o, lrs in zip(self.optimizers, current.lrs, strict=True)]
        rebuild = self._rebuild()
        failing = trigger.get("micro_batch")
        meta: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "step": current.step,
            "trigger": trigger,
            "model": rebuild["model"],
            "step_call": {**rebuild["step_call"], "batch_idx": current.batch_idx},
            "optimizer": {k: v for k, v in optimizers[0].items() if k != "lrs"},
            "optimizers": optimizers,
            "lr": current.lr,
            "lrs": current.lrs,
            "grad_clip": self.grad_clip,
            "accumulation": {"micro_batches": len(current.micro),
                             "divide": self.divide_loss is not False,
                             "divisor": self._divisor(current), "failing": failing,
                             "configured": self.accumulation},
            "dtype": dtype,
            "amp": {
                "autocast_dtype": dtype_name(self.autocast_dtype) if self.autocast_dtype else None,
                "device_type": device.split(":")[0],
                "grad_scaler": self.scaler is not None,
                "scope": self.autocast_scope,
            },
            "device": device,
            "seed": self.seed,
            "env": self._env,
            "mode": self.mode,
            "state_step": self._snapshot.step,
            "loss_value": _float_or_none(_failing_loss(current, failing)),
            "code": self.code,
            "batch_dropped": current.dropped,
            "files": files + ([HISTORY_FILE] if self.mode == "every_n" else []),
        }
        if self.loss_factory is not None:
            meta["loss"] = self.loss_factory.to_json()
        if self.mode == "every_n":
            meta["every_n"] = self.every_n
            meta["history_steps"] = [h.step for h in self._history]
        return meta


def factory_path(factory: Factoryish) -> str:
    """A factory as recorded: a ``module:name`` string as given, a function or class as its
    module and qualified name (``__main__:make_model`` for one of the training script)."""
    if isinstance(factory, str):
        return factory
    if factory is None:
        raise CaptureSetupError("no factory given")
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None)
    if not module or not name or "<locals>" in name or "<lambda>" in name:
        raise CaptureSetupError(f"{factory!r} is not a module-level function or class; a "
                                "replay can rebuild only what it can import by name")
    return f"{module}:{name}"


def _step_kind(kind: StepKind | None, loss: Factoryish, step: Factoryish) -> StepKind:
    from analyzer.model.captures import STEP_KINDS  # analyzer.model imports numpy

    if kind is None:
        if loss is not None and step is not None:
            raise CaptureSetupError("give loss_factory or step_factory, not both")
        kind = "loss_fn" if loss is not None else "step_fn" if step is not None else None
        if kind is None:
            raise CaptureSetupError("say how the step computes its loss: loss_factory= "
                                    "(loss_fn(model(x), y)), step_factory= (step(model, "
                                    "batch)), or step_kind='model_loss' (the model returns "
                                    "its loss)")
    if kind not in STEP_KINDS:
        raise CaptureSetupError(f"step_kind {kind!r} is not one of {', '.join(STEP_KINDS)}")
    if kind == "loss_fn" and loss is None:
        raise CaptureSetupError("step_kind 'loss_fn' needs loss_factory=")
    if kind == "step_fn" and step is None:
        raise CaptureSetupError("step_kind 'step_fn' needs step_factory=")
    return kind


def _same_shapes(path: str, built: Any, live: Any) -> None:
    import torch

    if not isinstance(built, torch.nn.Module):
        raise CaptureSetupError(f"model_factory {path!r} returned {type(built).__name__}, "
                                "not an nn.Module")
    want = {k: tuple(v.shape) for k, v in live.state_dict().items()
            if isinstance(v, torch.Tensor)}
    got = {k: tuple(v.shape) for k, v in built.state_dict().items()
           if isinstance(v, torch.Tensor)}
    if want == got:
        return
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    shapes = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    parts = []
    if missing:
        parts.append(f"lacks {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
    if extra:
        parts.append(f"has {', '.join(extra[:3])} the live model has not"
                     + (" ..." if len(extra) > 3 else ""))
    if shapes:
        k = shapes[0]
        parts.append(f"builds {k} as {got[k]}, the live model has {want[k]}")
    raise CaptureSetupError(f"model_factory {path!r} does not build the model being trained: "
                            f"it {'; '.join(parts)} (check its kwargs)")


def unwrap_model(model: Any) -> Any:
    """The module whose parameters train, under its parameters' own names: the model inside
    DataParallel, DistributedDataParallel and ``torch.compile`` (``_orig_mod``)."""
    import torch

    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while True:
        inner = model.module if isinstance(model, wrappers) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer behind a framework's wrapper (Lightning's LightningOptimizer keeps
    it in ``_optimizer``, accelerate's AcceleratedOptimizer in ``optimizer``)."""
    import torch

    for _ in range(4):
        if type(optimizer).__module__.startswith("torch."):
            return optimizer
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise CaptureSetupError(f"{type(optimizer).__name__} is not a torch optimizer")
    return optimizer


def _optimizer_json(optimizer: Any, lrs: list[float], names: Mapping[int, str]
                    ) -> dict[str, Any]:
    """One optimizer as meta.json records it. ``params``: the model's names of each group's
    parameters, in the optimizer's order, which is the order its state_dict numbers them
    in (not the model's: a second optimizer, or groups listed out of the model's order)."""
    return {
        "class": class_path(optimizer),
        "hyperparameters": hparams_json(
            {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}),
        "param_groups": len(optimizer.param_groups),
        "lrs": lrs,
        "params": [[names.get(id(p), "") for p in g["params"]] for g in optimizer.param_groups],
    }


def _batch_file(current: _StepInputs, trigger: Mapping[str, Any]) -> dict[str, Any]:
    """batch.pt: the failing micro-batch's keys at the top (version 1 readers take
    ``inputs`` and ``targets`` there), every micro-batch when there were several."""
    index = trigger.get("micro_batch")
    failing = current.micro[index if isinstance(index, int) else -1]
    out = dict(failing)
    if len(current.micro) > 1:
        out["micro_batches"] = list(current.micro)
    return out


def _failing_loss(current: _StepInputs, index: Any) -> Any:
    return current.losses[index if isinstance(index, int) else -1]


def numeric_error(error: BaseException) -> bool:
    """An exception that says a value went non-finite: FloatingPointError, anomaly mode's
    RuntimeError ("returned nan values"), a ValueError about nan/inf."""
    if isinstance(error, FloatingPointError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError | ValueError | ArithmeticError) and any(
        word in text for word in ("nan", "inf", "non-finite", "not finite"))


def _error_kind(error: BaseException) -> str:
    text = str(error).lower()
    if "nan" in text or "inf" not in text:
        return "nan"
    return "-inf" if "-inf" in text else "+inf"


def _copy_into(previous: Any, new: Any) -> Any:
    """Deep-copy ``new``, writing tensors into ``previous``'s buffers where shapes match.

    The matching tensors are copied by one ``_foreach_copy_`` call rather than one call
    per tensor: this runs before every training step.
    """
    import torch

    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []

    def walk(old: Any, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if (
                isinstance(old, torch.Tensor)
                and old.shape == value.shape
                and old.dtype == value.dtype
                and old.device == value.device
            ):
                dst.append(old)
                src.append(value.detach())
                return old
            return value.detach().clone()
        if isinstance(value, Mapping):
            prev = old if isinstance(old, Mapping) else {}
            return {k: walk(prev.get(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            seq = old if isinstance(old, list | tuple) else ()
            items = [walk(seq[i] if i < len(seq) else None, v) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    result = walk(previous, new)
    if dst:
        with torch.no_grad():
            torch._foreach_copy_(dst, src)
    return result


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _first_nonfinite(named: list[tuple[str, Any]]) -> tuple[str, str] | None:
    """The first tensor holding NaN/Inf and its kind, or None.

    One norm per tensor and a single synchronisation in the common all-finite case; a
    non-finite norm may only mean that finite values overflowed when squared, so the
    tensors are then checked exactly.
    """
    import torch

    if not named:
        return None
    with torch.no_grad():
        tensors = [t.detach() for _, t in named]
        norms = torch._foreach_norm(tensors)
        if bool(torch.stack([n.float() for n in norms]).isfinite().all()):
            return None
        for (name, tensor), norm in zip(named, norms, strict=True):
            if bool(norm.isfinite()):
                continue
            kind = _kind_of(tensor)
            if kind is not None:
                return name, kind
    return None


def _scaler_state(scaler: Any) -> dict[str, Any] | None:
    if scaler is None or not scaler.is_enabled():
        return None
    return dict(scaler.state_dict())


def _history_entry(h: _StepInputs) -> dict[str, Any]:
    entry = dict(h.micro[0])  # version 1 keys: inputs and targets (or the batch)
    entry.update({"step": h.step, "rng": safe_rng(h.rng), "lr": h.lr, "lrs": h.lrs,
                  "batch_idx": h.batch_idx})
    if len(h.micro) > 1:
        entry["micro_batches"] = list(h.micro)
    return entry


def tensor_kind(t: Any) -> Literal["nan", "+inf", "-inf"] | None:
    """How a tensor is non-finite: ``nan`` when it holds a NaN, else ``+inf`` or ``-inf``;
    None when every element is finite."""
    t = t.detach()
    if bool(t.isfinite().all()):
        return None
    if bool(t.isnan().any()):
        return "nan"
    return "+inf" if bool(t.isposinf().any()) else "-inf"


def _kind_of(value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor):
        return tensor_kind(value)
    x = float(value)
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "+inf" if x > 0 else "-inf"
    return None


def _float_or_none(value: Any) -> float | str | None:
    if value is None:
        return None
    try:
        x = float(value.detach().float().mean()) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    # JSON has no NaN/Infinity; the strings keep the meta.json strict JSON.
    return x if x == x and abs(x) != float("inf") else repr(x)
