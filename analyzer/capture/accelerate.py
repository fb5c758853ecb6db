"""The flight recorder for a loop written with Hugging Face Accelerate.

Two lines in the user's script::

    recorder = recorder_for(accelerator, run_dir, model, optimizer,
                            model_factory=make_model, loss_factory=make_loss)
    for x, y in loader:
        with accelerator.accumulate(model), recorder.step(inputs=x, targets=y):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            ...                                   # clip, optimizer.step(), zero_grad()

What :func:`recorder_for` reads from the accelerator, so the replay runs the step the way
Accelerate 1.x ran it (``Accelerator.backward``, ``accumulate``, ``clip_grad_norm_``):

- the model through ``accelerator.unwrap_model`` (its parameter names are the user's
  module's) and the optimizers under their ``AcceleratedOptimizer`` wrappers;
- ``accelerator.scaler`` (a GradScaler only for fp16 on an accelerator device) and the
  autocast dtype of ``mixed_precision`` when Accelerate autocasts (``native_amp``);
- ``gradient_accumulation_steps`` as the micro-batches of one optimizer step, with the loss
  divided by it, as ``backward`` divides every micro-batch's loss;
- the end of an optimizer step from ``accelerator.sync_gradients``, which ``accumulate``
  sets on entry: one ``recorder.step`` per loop iteration (micro-batch), and the recorder's
  step is over when the micro-batch that synchronised leaves (at the end of a dataloader
  that may be after fewer than ``gradient_accumulation_steps`` micro-batches: Accelerate
  syncs there too, and still divides by ``gradient_accumulation_steps``);
- the loss handed to ``accelerator.backward`` (before its division) and the ``max_norm``
  of ``accelerator.clip_grad_norm_``, seen by wrapping those two methods on this one
  accelerator object: the loop needs no ``rec.loss`` and no ``grad_clip=``.

``guard=True`` (or StepGuard's options) adds the guarded step (:mod:`analyzer.capture.guard`):
the gradients are checked where the update is about to happen (the first
``accelerator.clip_grad_norm_`` or optimizer ``step`` of a synchronising micro-batch, the
optimizers' ``step`` wrapped like the two methods above), the weights when that micro-batch
leaves ``recorder.step``.

A loop that zeroes the gradients inside the step (``optimizer.zero_grad()`` after
``optimizer.step()``, as Accelerate's examples do) leaves ``check_grads`` nothing to see when
the step ends: ``check_params=True`` catches the NaN the update wrote instead.

Accelerate autocasts the model's forward alone and casts its floating outputs to float32:
the capture says so (``amp.scope`` ``forward``) and the replay does the same. What the
replay does not reproduce: ``clip_grad_norm_`` over a subset of the model's parameters
(the replay clips them all) or with a norm other than 2 (said in ``notes``);
the all-reduce of a multi-process run (only the main process records: the replay is its
step on its own batch); DeepSpeed, Megatron-LM, FSDP, XLA and fp8, which own the step
themselves and are refused with :class:`CaptureSetupError` when the recorder is made.

``accelerate`` itself is never imported here: everything is read from the object given.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from analyzer.capture.guard import StepGuard
from analyzer.capture.guarding import GuardOption, build_guard, drop_step, guard_options
from analyzer.capture.recorder import CaptureSetupError, FlightRecorder

if TYPE_CHECKING:
    import torch

# Distributed types whose engine runs backward, the update or the sharding itself.
_REFUSED = {"DEEPSPEED", "MEGATRON_LM", "FSDP", "XLA"}
_OWN = ("scaler", "autocast_dtype", "autocast_scope", "accumulation", "divide_loss")


class AcceleratorRecorder:
    """A :class:`FlightRecorder` driven by an ``accelerate.Accelerator``'s own state.

    ``step`` is entered once per loop iteration, i.e. per micro-batch; the recorder's
    optimizer step begins with the first micro-batch after a synchronised one and ends with
    the next that synchronises (or raises). ``recorder`` is the FlightRecorder underneath
    (None on the processes other than the main one, which record nothing, and with
    ``record=False``); ``guard`` the guarded step's StepGuard, or None.
    """

    def __init__(self, accelerator: Any, recorder: FlightRecorder | None,
                 guard: StepGuard | None = None, optimizers: Sequence[Any] = ()) -> None:
        self.accelerator = accelerator
        self.recorder = recorder
        self.guard = guard
        self._open = False
        self._steps = -1  # optimizer steps begun, when no recorder counts them
        self._guarded = False  # the guard has checked this optimizer step's gradients
        self._wrapped: list[tuple[Any, str]] = []
        if recorder is not None:
            self._wrap(accelerator, "backward", self._on_backward)
        if recorder is not None or guard is not None:
            self._wrap(accelerator, "clip_grad_norm_", self._on_clip)
        if guard is not None:
            for optimizer in optimizers:
                self._wrap(optimizer, "step", self._before_update)

    @contextlib.contextmanager
    def step(self, batch: Any = None, *, inputs: Any = None, targets: Any = None,
             step: int | None = None) -> Iterator[AcceleratorRecorder]:
        """Record one micro-batch: ``batch=`` for the step_fn and model_loss kinds,
        ``inputs``/``targets`` for the loss_fn kind; ``step`` is the global step (default:
        the recorder's own count of optimizer steps)."""
        rec = self.recorder if self.recorder is not None and self.recorder.active else None
        if self._open:
            if rec is not None:
                rec.micro_batch(batch, inputs=inputs, targets=targets)
        else:
            self._steps = self._steps + 1 if step is None else int(step)
            if rec is not None:
                rec.begin(step, inputs, targets, batch=batch)
            self._open = True
            self._guarded = False
        try:
            yield self
        except BaseException as exc:
            self._open = False
            if rec is not None:
                rec.end(exc)
            raise
        if self.accelerator.sync_gradients:
            self._open = False
            if self.guard is not None and self._guarded:
                self.guard.after_update(self._step_number())
            if rec is not None:
                rec.end()

    def loss(self, value: Any) -> None:
        """Hand the loss over by hand (``accelerator.backward`` already does)."""
        if self.recorder is not None:
            self.recorder.loss(value)

    def close(self) -> None:
        """Put back the methods wrapped (the accelerator's ``backward`` and
        ``clip_grad_norm_``, the optimizers' ``step``) and close the guard's writer."""
        for owner, name in self._wrapped:
            vars(owner).pop(name, None)
        self._wrapped.clear()
        if self.guard is not None:
            self.guard.close()

    @property
    def captured(self) -> bool:
        return self.recorder is not None and self.recorder.captured

    @property
    def capture_path(self) -> str | None:
        return None if self.recorder is None else self.recorder.capture_path

    @property
    def errors(self) -> list[str]:
        return [] if self.recorder is None else self.recorder.errors

    @property
    def notes(self) -> list[str]:
        return [] if self.recorder is None else self.recorder.notes

    @property
    def active(self) -> bool:
        return self.recorder is not None and self.recorder.active

    @property
    def global_step(self) -> int | None:
        return None if self.recorder is None else self.recorder.global_step

    def _step_number(self) -> int:
        rec = self.recorder
        return rec.global_step if rec is not None and rec.global_step >= 0 else self._steps

    def _wrap(self, owner: Any, name: str, hook: Any) -> None:
        original = getattr(owner, name)
        self._wrapped.append((owner, name))

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            hook(*args, **kwargs)
            return original(*args, **kwargs)

        # An attribute of this one object, not of its class: other objects are untouched.
        setattr(owner, name, wrapper)

    def _on_backward(self, loss: Any, **_: Any) -> None:
        if self._open and self.recorder is not None:
            self.recorder.loss(loss)

    def _on_clip(self, parameters: Any, max_norm: float, norm_type: float = 2) -> None:
        # The guard reads the gradients as backward left them, before the clip scales them.
        self._before_update()
        rec = self.recorder
        if rec is None or not rec.active:
            return
        if float(norm_type) != 2.0:
            _note(rec, f"clip_grad_norm_ with norm_type={norm_type}: the replay clips "
                       "by the L2 norm")
        rec.grad_clip = float(max_norm)

    def _before_update(self, *_: Any, **__: Any) -> None:
        """The guard's check of the gradients, once an optimizer step, where the update is
        about to happen (the first clip or optimizer step of a synchronising micro-batch)."""
        if self.guard is None or not self._open or self._guarded:
            return
        if not self.accelerator.sync_gradients:
            return  # an accumulating micro-batch: AcceleratedOptimizer.step does nothing
        self._guarded = True
        refused = not self.guard.after_backward(self._step_number(),
                                                scaler=self.accelerator.scaler)
        if refused and self.recorder is not None and self.recorder.active:
            drop_step(self.recorder)  # the guard's refusal, not a failure to capture


def recorder_for(accelerator: Any, run_dir: str | os.PathLike[str], model: torch.nn.Module,
                 optimizer: Any, *, guard: GuardOption = None, record: bool = True,
                 **options: Any) -> AcceleratorRecorder:
    """A recorder for a loop that ``accelerator`` prepared ``model`` and ``optimizer`` for.

    ``options`` are :class:`FlightRecorder`'s keyword arguments (the factories, ``seed``,
    ``mode``, the checks, ``grad_clip`` when the loop clips without
    ``accelerator.clip_grad_norm_``...), except the four read from the accelerator:
    ``scaler``, ``autocast_dtype``, ``accumulation`` and ``divide_loss``. ``optimizer`` may
    be a list (several optimizers). Raises :class:`CaptureSetupError` for a setup whose
    step the replay cannot run, and whatever FlightRecorder raises for wrong factories.

    ``guard=True`` or ``guard={...}`` (:class:`~analyzer.capture.guard.StepGuard`'s keyword
    arguments) adds the guarded step: it checks (and logs the norms of) the gradients when
    the update is about to happen, at the first ``accelerator.clip_grad_norm_`` or
    optimizer ``step`` of a synchronising micro-batch (wrapped on those optimizer objects),
    and the weights when that micro-batch leaves ``recorder.step``; it writes through the
    accelerator's TensorBoard tracker when ``init_trackers`` made one, else into
    ``run_dir``. A step whose update it refused is not captured. ``record=False`` keeps the
    guard alone.
    """
    guard_kwargs = guard_options(guard, "recorder_for")
    if not record and guard_kwargs is None:
        raise ValueError("recorder_for(record=False) records nothing: add guard=True or "
                         "guard={...}")
    given = sorted(set(_OWN) & set(options))
    if given:
        raise TypeError(f"recorder_for reads {', '.join(given)} from the accelerator; "
                        "do not pass them")
    kind = str(getattr(accelerator.distributed_type, "name", accelerator.distributed_type))
    if kind in _REFUSED:
        raise CaptureSetupError(f"the flight recorder cannot replay a {kind} step "
                                "(the engine runs backward and the update itself)")
    if str(accelerator.mixed_precision) == "fp8":
        raise CaptureSetupError("the flight recorder cannot replay fp8 mixed precision")
    main = bool(accelerator.is_main_process)
    optimizers = list(optimizer) if isinstance(optimizer, list | tuple) else [optimizer]
    recorder = None
    if record and main:
        recorder = FlightRecorder(
            # The recorder takes the user's optimizers from under their AcceleratedOptimizer.
            run_dir, accelerator.unwrap_model(model), optimizers,
            # Accelerate autocasts the model's forward alone and casts its outputs to float32.
            scaler=accelerator.scaler, autocast_dtype=autocast_dtype(accelerator),
            autocast_scope="forward",
            accumulation=int(accelerator.gradient_accumulation_steps), divide_loss=True,
            **options)
    step_guard = None
    if guard_kwargs is not None:
        # Every process checks (and refuses alike: the gradients are all-reduced); only the
        # main one writes.
        step_guard = build_guard(accelerator.unwrap_model(model), guard_kwargs,
                                 writer=_tensorboard_writer(accelerator) if main else None,
                                 log_dir=run_dir, main=main)
    return AcceleratorRecorder(accelerator, recorder, step_guard, optimizers)


def autocast_dtype(accelerator: Any) -> torch.dtype | None:
    """The dtype Accelerate autocasts the forward to, or None when it does not (no native
    AMP, or an ``AutocastKwargs(enabled=False)`` handler)."""
    import torch

    handler = getattr(accelerator, "autocast_handler", None)
    if not getattr(accelerator, "native_amp", False) or not getattr(handler, "enabled", True):
        return None
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(str(accelerator.mixed_precision))


def _tensorboard_writer(accelerator: Any) -> Any:
    """The SummaryWriter of the accelerator's ``tensorboard`` tracker, if it has one."""
    for tracker in getattr(accelerator, "trackers", None) or ():
        if getattr(tracker, "name", None) == "tensorboard":
            return getattr(tracker, "tracker", None)
    return None


def _note(rec: FlightRecorder, message: str) -> None:
    if message not in rec.notes:
        rec.notes.append(message)
