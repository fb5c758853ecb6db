"""The flight recorder inside a Hugging Face ``Trainer``: a two-line change.

::

    from analyzer.capture.hf import FlightRecorderTrainer
    trainer = FlightRecorderTrainer(model=model, args=args, train_dataset=train)  # was Trainer

A Trainer subclass of one's own gets the same with ``with_flight_recorder(MyTrainer)`` (or
``class MyTrainer(FlightRecorderMixin, Trainer)``). Options of :class:`FlightRecorder`
(``check_params=True``, ``every_n=10``, ...) go in ``flight_recorder={...}``. Captures are
written into ``args.output_dir``, next to the Trainer's own ``runs/`` and checkpoints.

What each hook does, and why it is that one:

- ``compute_loss`` (documented "subclass and override"): the one place where the batch is
  the exact keyword arguments the model is called with (after ``_prepare_inputs``, with
  ``num_items_in_batch`` added when the model takes loss keyword arguments) and where the
  forward pass has not started yet. The first call of an optimizer step begins the
  recorded step (state, RNG, batch), later ones are micro-batches of the same step
  (``gradient_accumulation_steps``); the loss it returns is handed to the recorder.
- ``training_step``: only marks that ``compute_loss`` is called for training (evaluation
  calls it too, under ``no_grad``).
- ``FlightRecorderCallback.on_optimizer_step`` ends the step: after clipping and
  ``optimizer.step()`` (so parameter and gradient checks see the update and the gradients),
  before ``model.zero_grad()``. The step is numbered as the Trainer numbers it: optimizer
  steps counted from 1, across epochs and resumed runs (``state.global_step`` once the
  step is done), the step its logs, ``trainer_state.json`` and console give the step's loss
  and grad_norm; ``checkpoint-N/`` holds the state at the start of step N + 1.
- ``train``: a step that raises (``torch.autograd.detect_anomaly``, a FloatingPointError of
  one's own, an error in clipping) never reaches ``on_optimizer_step``; the exception ends
  the open step with ``error=`` before it goes on, so the step is still captured.

Only the main process (``is_world_process_zero``) records, since every process would
write the same ``output_dir/capture/step_<N>/``: under DDP a fault born on another process
reaches the main one through the gradients' all-reduce, and the step captured is the one
where it shows there (with ``check_grads=True`` the step whose gradients it reaches,
otherwise the first step whose loss on the main process is non-finite).

The recorder is built at the first training micro-batch, when the Trainer has prepared
its optimizer (accelerate's ``AcceleratedOptimizer``, unwrapped by the recorder) and the
first batch says whether the loss is scaled for accumulation. What it is told:

- the model factory: the model's class with its config (``model_config``); a class of
  transformers is recorded as ``transformers:<Class>``, a class of one's own (a module, or
  the training script's ``__main__``) by its module and name;
- step kind ``model_loss``: replay calls ``model(**batch)`` and takes its loss, which is
  what ``Trainer.compute_loss`` does. A Trainer that computes the loss otherwise
  (``compute_loss_func``, ``label_smoothing_factor``, a ``compute_loss`` of its own) needs a
  ``step_factory`` in ``flight_recorder`` (``"module:function"`` or the function: it
  returns ``step(model, batch) -> loss``, the batch being compute_loss' ``inputs`` plus
  ``num_items_in_batch`` when the Trainer counted it); without one, training stops in
  its first step with :class:`HFSetupError` rather than leave captures replay would run
  wrongly;
- the accelerator's GradScaler (fp16) and autocast dtype (fp16/bf16), ``max_grad_norm`` as
  the clip, ``gradient_accumulation_steps`` micro-batches with the loss divided as the
  Trainer divides it (not when ``num_items_in_batch`` already normalised it), ``args.seed``.

``guard=True`` or ``guard={...}`` (the keyword arguments of
:class:`~analyzer.capture.guard.StepGuard`: ``every``, ``skip_nonfinite``, ...) adds the
guarded step: per-layer gradient norms, the NaN/Inf check and, with ``skip_nonfinite``,
the refusal in ``on_pre_optimizer_step`` (after the Trainer clipped, with the
accelerator's GradScaler under fp16), weight norms in ``on_optimizer_step``, both at
``state.global_step + 1``, the step the Trainer logs that update's loss and grad_norm at.
It writes through the ``TensorBoardCallback``'s ``tb_writer`` (``report_to`` with
"tensorboard"), else into a SummaryWriter of its own in ``output_dir``, and is closed when
training ends or raises. A step whose update the guard refused is not captured (see
:func:`~analyzer.capture.guarding.drop_step`). ``flight_recorder=False`` keeps the guard
alone, without the recorder.

``transformers`` is imported only when a Trainer class is asked for: importing this
module costs nothing more than :mod:`analyzer.capture`.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Mapping
from typing import Any

from analyzer.capture.accelerate import autocast_dtype
from analyzer.capture.guard import StepGuard
from analyzer.capture.guarding import GuardOption, build_guard, drop_step, guard_options
from analyzer.capture.recorder import CaptureSetupError, FlightRecorder

# Besides these, ``FlightRecorderTrainer`` and ``FlightRecorderCallback`` (module
# ``__getattr__``: they subclass transformers' classes, imported when first asked for).
__all__ = ["FlightRecorderMixin", "HFSetupError", "TrainerRecording", "callback_class",
           "with_flight_recorder"]

_RESERVED = ("model", "optimizer", "run_dir")
"""Recorder arguments that are the Trainer's to give, never an option."""


class HFSetupError(CaptureSetupError):
    """The Trainer is set up in a way the recorded step would not replay faithfully."""


class TrainerRecording:
    """The recorder of one Trainer and the step it has open; no transformers import.

    The mixin and the callback call it; it never raises into training except
    :class:`HFSetupError` (and the recorder's own setup check) at the first step.
    """

    def __init__(self, trainer: Any, options: Mapping[str, Any] | None = None, *,
                 record: bool = True, guard: GuardOption = None) -> None:
        bad = [k for k in (options or {}) if k in _RESERVED]
        if bad:
            raise HFSetupError(f"flight_recorder={{...}}: {', '.join(bad)} come from the "
                               "Trainer and cannot be given")
        known = inspect.signature(FlightRecorder).parameters
        unknown = [k for k in (options or {}) if k not in known]
        if unknown:
            raise HFSetupError(f"flight_recorder={{...}}: {', '.join(unknown)} is not an "
                               "option of FlightRecorder")
        self.trainer = trainer
        self.options = dict(options or {})
        self.record = record
        self.guard_options = guard_options(guard, "FlightRecorderTrainer")
        self.recorder: FlightRecorder | None = None
        self.guard: StepGuard | None = None
        """The guarded step's StepGuard (from the first optimizer step, with ``guard``)."""
        self.training = False
        """Inside ``training_step``: compute_loss is called for a training micro-batch."""
        self.open = False
        """A step is begun and not yet ended."""
        self.checked = False
        """The setup was checked (at the first micro-batch, on every process)."""

    # -- the hooks ----------------------------------------------------------------------

    def micro_batch(self, inputs: Mapping[str, Any], num_items_in_batch: Any) -> None:
        """``compute_loss`` is about to call the model on ``inputs``."""
        trainer = self.trainer
        if not self.record:
            return
        if self.recorder is None and not self.checked:
            self.recorder = self._build(num_items_in_batch)
        if self.recorder is None or not self.recorder.active:
            return
        batch = dict(inputs)
        # As compute_loss calls the model: with num_items_in_batch when the model takes loss
        # keyword arguments. A step function of one's own gets it whenever the Trainer
        # counted it, as a compute_loss of one's own does.
        own_step = "step_factory" in self.options
        if num_items_in_batch is not None and (own_step or trainer.model_accepts_loss_kwargs):
            batch["num_items_in_batch"] = num_items_in_batch
        recorder = self.recorder
        if self.open:
            recorder.micro_batch(batch=batch)
        else:
            # global_step counts the steps done; the Trainer logs this one as the next.
            recorder.begin(step=int(trainer.state.global_step) + 1, batch=batch)
            self.open = True

    def loss(self, value: Any) -> None:
        if self.open and self.recorder is not None:
            self.recorder.loss(value)

    def end(self, error: BaseException | None = None) -> None:
        """The step is over (``on_optimizer_step``), or it raised ``error``."""
        if self.open and self.recorder is not None:
            self.open = False
            self.recorder.end(error=error)
        self.open = False

    def before_update(self) -> None:
        """``on_pre_optimizer_step``: the guard checks the gradients, and may refuse."""
        if self.guard_options is None:
            return
        trainer = self.trainer
        if self.guard is None:
            # Built here, not at train begin, so that the TensorBoardCallback (whichever
            # order the callbacks run in) has made its writer.
            main = bool(trainer.is_world_process_zero())
            self.guard = build_guard(
                trainer.accelerator.unwrap_model(trainer.model), self.guard_options,
                writer=_tensorboard_writer(trainer) if main else None,
                log_dir=trainer.args.output_dir, main=main)
        step = int(trainer.state.global_step) + 1
        if not self.guard.after_backward(step, scaler=trainer.accelerator.scaler) and self.open:
            # A refused update is the guard's: not the recorder's failure (drop_step).
            self.open = False
            if self.recorder is not None:
                drop_step(self.recorder)

    def after_update(self) -> None:
        """``on_optimizer_step``: the guard checks the weights."""
        if self.guard is not None:
            self.guard.after_update(int(self.trainer.state.global_step) + 1)

    def close_guard(self, *, renew: bool = False) -> None:
        """Training ended or raised (the guard is kept, closed, for its counts); with
        ``renew``, a ``train()`` begins and the guard is built again at its first step."""
        if self.guard is not None:
            self.guard.close()
        if renew:
            self.guard = None

    # -- building the recorder ------------------------------------------------------------

    def _build(self, num_items_in_batch: Any) -> FlightRecorder | None:
        """The recorder, on the main process only; None on the others."""
        trainer = self.trainer
        args = trainer.args
        options = dict(self.options)
        own = _own_loss(trainer)
        if own is not None and "step_factory" not in options:
            # Raised on every process, so that all of them stop alike.
            raise HFSetupError(
                f"the flight recorder replays model(**batch).loss, but this Trainer computes "
                f"its loss with {own}: give flight_recorder={{'step_factory': "
                "'module:function', ...}} (a function returning fn(model, batch) -> loss)")
        if not trainer.is_world_process_zero():
            # Every process would write the same output_dir/capture/step_<N>/.
            self.checked = True
            return None
        model = trainer.accelerator.unwrap_model(trainer.model)
        if "model_factory" not in options:
            options["model_factory"] = model_factory(model)
            options.setdefault("model_config", model_config(model))
        if "step_factory" not in options and "loss_factory" not in options:
            options.setdefault("step_kind", "model_loss")
        options.setdefault("scaler", trainer.accelerator.scaler)
        # The Trainer's AMP is its accelerator's: the same reading as accelerate's loops.
        options.setdefault("autocast_dtype", autocast_dtype(trainer.accelerator))
        # The Trainer's accelerator autocasts the model's forward alone (its outputs cast
        # to float32), not the code around it.
        options.setdefault("autocast_scope", "forward")
        clip = float(args.max_grad_norm or 0.0)
        options.setdefault("grad_clip", clip if clip > 0 else None)
        options.setdefault("accumulation", int(args.gradient_accumulation_steps))
        # The Trainer divides by current_gradient_accumulation_steps, the step's own count
        # (fewer on an epoch's last step), unless num_items_in_batch normalised the loss.
        options.setdefault("divide_loss", False if _loss_scaled_for_accumulation(
            trainer, num_items_in_batch) else "micro_batches")
        options.setdefault("seed", args.seed)
        run_dir = os.fspath(args.output_dir)
        os.makedirs(run_dir, exist_ok=True)
        recorder = FlightRecorder(run_dir, model, trainer.optimizer, **options)
        self.checked = True
        return recorder


def _tensorboard_writer(trainer: Any) -> Any:
    """The ``tb_writer`` of the Trainer's TensorBoardCallback, None without one."""
    for callback in trainer.callback_handler.callbacks:
        if any(k.__name__ == "TensorBoardCallback" for k in type(callback).__mro__):
            return getattr(callback, "tb_writer", None)
    return None


def model_factory(model: Any) -> Any:
    """``transformers:<Class>`` for a class transformers exports, else the class itself
    (the recorder records its module and name, ``__main__`` included)."""
    cls = type(model)
    if cls.__module__.split(".")[0] == "transformers":
        import transformers

        if getattr(transformers, cls.__name__, None) is cls:
            return f"transformers:{cls.__name__}"
    return cls


def model_config(model: Any) -> dict[str, Any]:
    """The model's whole config as JSON (``to_json_string`` turns dtypes into names)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        raise HFSetupError(f"{type(model).__name__} has no Hugging Face config: give "
                           "flight_recorder={'model_factory': ..., 'model_kwargs': ...}")
    loaded: dict[str, Any] = json.loads(config.to_json_string(use_diff=False))
    return loaded


def _loss_scaled_for_accumulation(trainer: Any, num_items_in_batch: Any) -> bool:
    """Whether ``Trainer.training_step`` leaves the loss undivided by the accumulation
    steps: its own test, kept in the same order."""
    said = getattr(trainer, "loss_is_scaled_for_ga", None)
    if said is not None:
        return bool(said)
    return bool((trainer.model_accepts_loss_kwargs and num_items_in_batch is not None)
                or getattr(trainer, "compute_loss_func", None) is not None)


def _own_loss(trainer: Any) -> str | None:
    """What makes this Trainer's loss something other than ``model(**batch).loss``."""
    if getattr(trainer, "compute_loss_func", None) is not None:
        return "compute_loss_func"
    if getattr(trainer, "label_smoother", None) is not None:
        return "label_smoothing_factor"
    for klass in type(trainer).__mro__:
        if klass.__module__ == "transformers.trainer" and klass.__name__ == "Trainer":
            break
        if klass is not FlightRecorderMixin and "compute_loss" in vars(klass):
            return f"{klass.__qualname__}.compute_loss"
    return None


class FlightRecorderMixin:
    """Put before ``Trainer`` in a class's bases; ``flight_recorder={...}`` holds the
    recorder's options (False: no recorder), ``guard=True`` or ``guard={...}`` adds the
    guarded step. See the module docstring for the hooks."""

    _flight: TrainerRecording

    def __init__(self, *args: Any, flight_recorder: Mapping[str, Any] | bool | None = None,
                 guard: GuardOption = None, **kwargs: Any) -> None:
        record = flight_recorder is not False
        options = flight_recorder if isinstance(flight_recorder, Mapping) else None
        if not record and guard_options(guard, "FlightRecorderTrainer") is None:
            raise ValueError("FlightRecorderTrainer(flight_recorder=False) does nothing "
                             "without guard=True or guard={...}")
        super().__init__(*args, **kwargs)
        self._flight = TrainerRecording(self, options, record=record, guard=guard)
        self.add_callback(callback_class()(self._flight))  # type: ignore[attr-defined]

    @property
    def flight_recorder(self) -> FlightRecorder | None:
        """The recorder (None until the first training step)."""
        return self._flight.recorder

    @property
    def step_guard(self) -> StepGuard | None:
        """The guard (None until the first optimizer step, and without ``guard``); kept
        after training, closed, for its ``skipped`` and faults."""
        return self._flight.guard

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            self._flight.end(error=exc)
            self._flight.close_guard()
            raise

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._flight.training = True
        try:
            return super().training_step(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._flight.training = False

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        flight = self._flight
        if not flight.training:
            return super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]
        num_items = kwargs.get("num_items_in_batch", args[1] if len(args) > 1 else None)
        flight.micro_batch(inputs, num_items)
        result = super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]
        flight.loss(result[0] if isinstance(result, tuple) else result)
        return result


@functools.cache
def callback_class() -> type:
    """``FlightRecorderCallback``, a ``transformers.TrainerCallback`` (built on first use)."""
    from transformers import TrainerCallback

    class FlightRecorderCallback(TrainerCallback):
        """Ends the recorded step after the optimizer step; the mixin adds it."""

        def __init__(self, flight: TrainerRecording) -> None:
            self.flight = flight

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # A step left open by a train() that stopped (auto_find_batch_size retries)
            # is not the next one's; nor is its guard.
            self.flight.end()
            self.flight.close_guard(renew=True)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                                  **kwargs: Any) -> None:
            self.flight.before_update()

        def on_optimizer_step(self, args: Any, state: Any, control: Any,
                              **kwargs: Any) -> None:
            self.flight.after_update()
            self.flight.end()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.flight.close_guard()

    FlightRecorderCallback.__module__ = __name__
    return FlightRecorderCallback


_WRAPPED: dict[type, type] = {}


def with_flight_recorder(trainer_class: type) -> type:
    """``trainer_class`` with the flight recorder: ``FlightRecorderMixin`` first in its
    bases. The same class each time for the same ``trainer_class``."""
    if issubclass(trainer_class, FlightRecorderMixin):
        return trainer_class
    if trainer_class not in _WRAPPED:
        _WRAPPED[trainer_class] = type(
            f"FlightRecorder{trainer_class.__name__}", (FlightRecorderMixin, trainer_class),
            {"__module__": __name__,
             "__doc__": f"{trainer_class.__name__} keeping a flight recorder "
                        "(analyzer.capture.hf); its options go in flight_recorder={...}."})
    return _WRAPPED[trainer_class]


def __getattr__(name: str) -> Any:
    # The Trainer classes need transformers: built when first asked for, not at import.
    if name == "FlightRecorderTrainer":
        from transformers import Trainer

        return with_flight_recorder(Trainer)
    if name == "FlightRecorderCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
