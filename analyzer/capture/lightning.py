"""The flight recorder as a Lightning callback: two lines in a training script.

::

    from analyzer.capture.lightning import FlightRecorderCallback
    trainer = Trainer(..., callbacks=[FlightRecorderCallback()])

What each hook does:

- ``setup`` (stage "fit") works out how a replay rebuilds the module: its class with the
  hyperparameters ``save_hyperparameters`` kept, as JSON keyword arguments (as
  ``load_from_checkpoint`` would call it). Hyperparameters that are not JSON, or an
  ``__init__`` that needs an argument they do not hold, raise :class:`CaptureSetupError`
  here, before the first batch, not after the crash.
- ``on_fit_start`` builds the :class:`~analyzer.capture.recorder.FlightRecorder`: the run
  folder is the trainer's ``log_dir`` (the logger's version folder, else
  ``default_root_dir``); the optimizers, the precision plugin's GradScaler and autocast
  dtype, ``gradient_clip_val`` and ``accumulate_grad_batches`` are read from the trainer.
  The recorder builds the class once on the meta device and compares it with the live
  module (a mismatch is a CaptureSetupError, also at fit start).
- ``on_train_batch_start`` keeps the start of an optimizer step: the state, the batch as
  ``training_step`` receives it (on its device, after the precision plugin's conversion),
  its ``batch_idx``, the step number ``trainer.global_step``. With gradient accumulation
  the later batches of the same optimizer step are its micro-batches (Lightning zeroes the
  gradients when ``batch_idx % accumulate_grad_batches == 0``, which is where a step
  starts here too).
- ``on_before_backward`` hands each loss to the recorder (as Lightning backpropagates it:
  divided by ``accumulate_grad_batches``), so a loss exists even when the backward pass
  then raises (``detect_anomaly=True``). Under manual optimization every backward of the
  step counts: the first non-finite one is the step's loss.
- ``on_train_batch_end`` ends the step once the optimizer stepped (``global_step`` moved):
  the recorder checks it and writes the capture on the first bad one.
- ``on_exception`` ends an open step with the exception: a step that raised (anomaly
  mode's RuntimeError in backward, a FloatingPointError from ``training_step``) is still
  captured, with its start state, batch and ``batch_idx``.

Replay calls ``module.training_step(batch, batch_idx)`` (step kind "training_step", or the
``step_factory`` given) on a module rebuilt from its class, so layers keep their full paths
(``net.2``, not ``2``).

``guard=True`` or ``guard={...}`` (the keyword arguments of
:class:`~analyzer.capture.guard.StepGuard`: ``every``, ``skip_nonfinite``, ...) adds the
guarded step: per-layer gradient norms and the NaN/Inf check (and, with
``skip_nonfinite``, the refusal) in ``on_before_optimizer_step``, after Lightning unscaled
the gradients and before it clips and steps, with the precision plugin's GradScaler;
weight norms in ``on_train_batch_end`` once the optimizer stepped; both at the step
Lightning logs that batch's values at (``trainer.global_step`` before the update). It
writes into the trainer's TensorBoard logger's ``experiment`` when it has one, else into
a SummaryWriter of its own in the run folder, and is closed when the fit ends or raises.
A step whose update the guard refused is not captured: it changed no weight and the run
goes on from it (see :func:`~analyzer.capture.guarding.drop_step`); the recorder stays
ready for a failure the guard lets through (a backward that raised, a non-finite weight
with ``check_params``). ``record=False`` keeps the guard alone, without the recorder
(nothing is rebuilt or checked for a replay then).

Only global rank zero records (every rank would write the same folder): under DDP a fault
born on another rank shows on rank zero after the gradients' all-reduce, a step later or
more, and that is the step captured. Lightning is imported when the callback class is
first asked for, so importing this module, like ``analyzer.capture``, needs neither
Lightning nor torch.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from analyzer.capture.guard import StepGuard
from analyzer.capture.guarding import GuardOption, build_guard, drop_step, guard_options
from analyzer.capture.recorder import CaptureSetupError, Factoryish, FlightRecorder

if TYPE_CHECKING:
    import torch
    from lightning.pytorch import Callback

__all__ = ["CaptureSetupError", "FlightRecorderCallback", "RecorderHooks", "module_factory"]


def module_factory(module: Any) -> tuple[type, dict[str, Any]]:
    """The class a replay builds ``module`` from and its JSON keyword arguments.

    The arguments are the hyperparameters ``save_hyperparameters`` kept at ``__init__``;
    a module that saved one object (``save_hyperparameters(config)``) gets it back under
    that argument's name, as ``load_from_checkpoint`` does. Raises CaptureSetupError when
    they are not JSON or leave a required argument of ``__init__`` without a value.
    """
    cls = type(module)
    initial = getattr(module, "hparams_initial", None)
    hparams = dict(initial) if isinstance(initial, Mapping) else {}
    params = _init_parameters(cls)
    name = getattr(module, "_hparams_name", None)
    if isinstance(name, str) and name != "kwargs" and name in params:
        kwargs: dict[str, Any] = {name: hparams}
    else:
        kwargs = hparams
    for key, value in kwargs.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CaptureSetupError(
                f"FlightRecorderCallback: the hyperparameter {key!r} of "
                f"{cls.__qualname__} is not JSON ({type(value).__name__}: {exc}); a replay "
                "rebuilds the module from them. Leave it out with "
                f"save_hyperparameters(ignore=[{key!r}]) and give the callback "
                "model_factory= and model_kwargs= that build the same module") from None
    missing = [p.name for p in params.values()
               if p.default is inspect.Parameter.empty and p.name not in kwargs
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        held = ", ".join(sorted(kwargs)) or "none"
        raise CaptureSetupError(
            f"FlightRecorderCallback: {cls.__qualname__}.__init__ needs "
            f"{', '.join(missing)}, which its saved hyperparameters (held: {held}) do not "
            "give, so a replay could not rebuild it. Call self.save_hyperparameters() in "
            "__init__, or give the callback model_factory= and model_kwargs=")
    return cls, kwargs


def _init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return {}
    return dict(signature.parameters)


class RecorderHooks:
    """What :class:`FlightRecorderCallback` does at each Lightning hook, without Lightning's
    base class (the callback class mixes this into ``lightning.pytorch.Callback``).

    ``run_dir`` defaults to the trainer's ``log_dir``; ``model_factory``/``model_kwargs``
    replace the module's class and hyperparameters. ``step_factory`` (with ``step_kwargs``)
    replaces ``training_step`` in a replay by ``step(module, batch) -> loss``, for a
    training_step a replay cannot call: manual optimization (it steps the trainer's
    optimizers itself) or one that needs ``self.trainer``. The other options are the
    recorder's (``mode``, ``every_n``, ``check_grads``, ``check_params``, ``loss_tag``,
    ``seed``, ``trust_code_root``, ``write_env_file``); ``seed`` defaults to the one
    ``seed_everything`` set. ``guard`` adds the guarded step (True, or StepGuard's keyword
    arguments); ``record=False`` leaves the recorder out, for the guard alone.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 model_factory: Factoryish = None,
                 model_kwargs: Mapping[str, Any] | None = None,
                 record: bool = True, guard: GuardOption = None,
                 **recorder_options: Any) -> None:
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.model_factory = model_factory
        self.model_kwargs = dict(model_kwargs) if model_kwargs is not None else None
        for fixed in ("step_kind", "scaler", "autocast_dtype", "grad_clip", "accumulation",
                      "divide_loss", "loss_factory", "model_config"):
            if fixed in recorder_options:
                raise TypeError(f"FlightRecorderCallback reads {fixed} from the trainer; "
                                "it is not an option")
        self.recorder_options = recorder_options
        self.record = record
        self.guard_options = guard_options(guard, "FlightRecorderCallback")
        if not record and self.guard_options is None:
            raise ValueError("FlightRecorderCallback(record=False) does nothing without "
                             "guard=True or guard={...}")
        self.recorder: FlightRecorder | None = None
        self.guard: StepGuard | None = None
        """The guarded step's StepGuard (from fit start, with ``guard``)."""
        self._guard_step: int | None = None
        self._factory: tuple[Factoryish, dict[str, Any]] | None = None
        self._open = False
        self._step_at_begin = -1
        self._manual_losses: list[Any] = []

    @property
    def capture_path(self) -> str | None:
        return self.recorder.capture_path if self.recorder is not None else None

    # -- Lightning hooks -------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # Checked on every rank, so that all of them stop alike.
        if stage != "fit" or not self.record:
            return
        if self.model_factory is not None:
            self._factory = (self.model_factory, dict(self.model_kwargs or {}))
        else:
            cls, kwargs = module_factory(pl_module)
            self._factory = (cls, kwargs if self.model_kwargs is None else self.model_kwargs)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._open = False
        self.recorder = None
        # log_dir is broadcast from rank zero: every rank has to ask for it.
        run_dir = self.run_dir or trainer.log_dir or trainer.default_root_dir
        self._start_guard(trainer, pl_module, run_dir)
        if not trainer.is_global_zero or not self.record:
            return
        if self._factory is None:  # setup ran for another stage, or was overridden
            self.setup(trainer, pl_module, "fit")
        assert self._factory is not None
        factory, kwargs = self._factory
        options = dict(self.recorder_options)
        options.setdefault("seed", _lightning_seed())
        if options.get("step_factory") is None:
            options["step_kind"] = "training_step"
        scaler, autocast = _precision(trainer)
        self.recorder = FlightRecorder(
            run_dir, pl_module, list(trainer.optimizers),
            model_factory=factory, model_kwargs=kwargs,
            scaler=scaler, autocast_dtype=autocast, grad_clip=_grad_clip(trainer),
            accumulation=self._accumulation(trainer, pl_module), divide_loss=True,
            **options)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        rec = self.recorder
        if rec is None or not rec.active:
            return
        accumulation = self._accumulation(trainer, pl_module)
        if self._open and accumulation > 1 and batch_idx % accumulation != 0:
            rec.micro_batch(batch=batch)
            return
        if self._open:  # a step Lightning left without stepping (on_train_batch_start -1)
            rec.end()
        rec.begin(step=int(trainer.global_step), batch=batch, batch_idx=batch_idx)
        self._open = True
        self._step_at_begin = int(trainer.global_step)
        self._manual_losses = []

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        if not self._open or self.recorder is None:
            return
        if pl_module.automatic_optimization:
            self.recorder.loss(loss.detach())
        else:
            # Manual optimization may call backward once per optimizer: keep them all.
            self._manual_losses.append(loss.detach())

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.guard is None:
            return
        # Lightning logs this batch's values at global_step, counted up after the update.
        self._guard_step = int(trainer.global_step)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if not self.guard.after_backward(self._guard_step, scaler=scaler) and self._open:
            # A refused update is the guard's: not the recorder's failure (drop_step).
            self._open = False
            self._manual_losses = []
            if self.recorder is not None:
                drop_step(self.recorder)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.guard is not None and self._guard_step is not None:
            # Only once the optimizer stepped (not after an accumulating batch).
            self.guard.after_update(self._guard_step)
            self._guard_step = None
        if not self._open:
            return
        if pl_module.automatic_optimization and int(trainer.global_step) == self._step_at_begin:
            return  # still accumulating: the optimizer has not stepped yet
        self._finish(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._open:
            # Ctrl-C or a SystemExit is no fault of the step: only checked, never blamed.
            self._finish(exception if isinstance(exception, Exception) else None)
        self._close_guard()  # Lightning calls no teardown hook after an exception

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self._open:
            self._finish(None)
        if stage == "fit":
            self._close_guard()

    # -- the machinery -------------------------------------------------------------------

    def _start_guard(self, trainer: Any, pl_module: Any, run_dir: str) -> None:
        self._close_guard()
        if self.guard_options is None:
            return
        main = bool(trainer.is_global_zero)
        self.guard = build_guard(pl_module, self.guard_options,
                                 writer=_tensorboard_writer(trainer) if main else None,
                                 log_dir=run_dir, main=main)

    def _close_guard(self) -> None:
        self._guard_step = None
        if self.guard is not None:
            self.guard.close()

    def _finish(self, error: BaseException | None) -> None:
        self._open = False
        rec = self.recorder
        if rec is None:
            return
        if self._manual_losses:
            rec.loss(_worst(self._manual_losses))
            self._manual_losses = []
        rec.end(error)

    @staticmethod
    def _accumulation(trainer: Any, pl_module: Any) -> int:
        if not pl_module.automatic_optimization:
            return 1
        return max(1, int(trainer.accumulate_grad_batches))


def _worst(losses: list[Any]) -> Any:
    """The first non-finite loss of a manual step, else its last."""
    import torch

    for loss in losses:
        if isinstance(loss, torch.Tensor) and not bool(loss.isfinite().all()):
            return loss
    return losses[-1]


def _tensorboard_writer(trainer: Any) -> Any:
    """The SummaryWriter of the trainer's first TensorBoard logger (Lightning's or the
    standalone package's), None without one."""
    for logger in getattr(trainer, "loggers", None) or []:
        if any(k.__name__ == "TensorBoardLogger" for k in type(logger).__mro__):
            return logger.experiment
    return None


def _lightning_seed() -> int | None:
    # seed_everything keeps its seed here for the worker processes it starts.
    value = os.environ.get("PL_GLOBAL_SEED")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _precision(trainer: Any) -> tuple[Any, torch.dtype | None]:
    """The GradScaler and autocast dtype of the trainer's precision plugin.

    Only the mixed-precision plugin autocasts; the "-true" plugins cast the parameters,
    which the recorder reads from the parameters themselves.
    """
    import torch

    plugin = trainer.precision_plugin
    precision = str(getattr(plugin, "precision", ""))
    scaler = getattr(plugin, "scaler", None)
    autocast: torch.dtype | None = None
    if precision == "bf16-mixed":
        autocast = torch.bfloat16
    elif precision == "16-mixed":
        autocast = torch.float16
    return scaler, autocast


def _grad_clip(trainer: Any) -> float | None:
    value = trainer.gradient_clip_val
    if value is None or float(value) <= 0:
        return None
    algorithm = str(getattr(trainer, "gradient_clip_algorithm", "norm") or "norm")
    if "value" in algorithm.lower():
        warnings.warn("FlightRecorderCallback: gradient_clip_algorithm='value' is not "
                      "recorded; a replay of a capture will not clip", stacklevel=3)
        return None
    return float(value)


if TYPE_CHECKING:
    class FlightRecorderCallback(RecorderHooks, Callback):
        """Made by :func:`_callback_class` when first asked for."""


@functools.cache
def _callback_class() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:  # the standalone package of the same library
        from pytorch_lightning import Callback  # type: ignore[assignment]

    return type("FlightRecorderCallback", (RecorderHooks, Callback), {
        "__module__": __name__,
        "__doc__": "A Lightning callback keeping a flight recorder on the training "
                   "(see :mod:`analyzer.capture.lightning` and :class:`RecorderHooks` "
                   "for its options).",
        "__qualname__": "FlightRecorderCallback",
    })


def __getattr__(name: str) -> Any:
    # The callback class subclasses Lightning's Callback, so Lightning is imported only
    # when the class is first asked for.
    if name == "FlightRecorderCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
