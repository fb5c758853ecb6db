"""One training step, run plainly or under full instrumentation.

The step is the recorded one: zero_grad, then for each micro-batch a forward (under
autocast when the run used it) computing the loss as the step contract says
(:mod:`analyzer.replayer.steps`) and a backward (through the grad scaler when there was
one; the loss divided by the number of micro-batches when the loop divided it), optional
clipping, and every optimizer's step. The instrumented pass runs the micro-batches before
the failing one plainly and instruments the failing one. The light pass (the first of a
default replay) is a plain pass that also watches the module outputs of that micro-batch,
enough to tell that a step stayed finite throughout without the instrumented pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from analyzer.capture.recorder import numeric_error
from analyzer.model.replays import (
    BackwardReport,
    ForwardReport,
    OpFault,
    ParamUpdate,
    PassOutcome,
    Phase,
    UpdateReport,
)
from analyzer.replayer.backward import GradWatch
from analyzer.replayer.errors import ReplayError
from analyzer.replayer.forward import ForwardCensus, ForwardRecorder
from analyzer.replayer.ops import OpTracer, bare_anomaly_stacks
from analyzer.replayer.state import StepConfig, TrainState, dtype_name
from analyzer.replayer.stats import (
    all_finite,
    floating,
    is_additive_mask,
    stats_of,
    tensor_stat,
)
from analyzer.replayer.steps import (
    LossHook,
    StepBatch,
    StepCall,
    bad_parts,
    batch_values,
    model_inputs,
    scaled,
)
from analyzer.replayer.update import explain


def zero_grad(state: TrainState) -> None:
    for optimizer in state.optimizers:
        optimizer.zero_grad(set_to_none=True)
    state.model.zero_grad(set_to_none=True)


def forward(state: TrainState, micro: Mapping[str, Any], call: StepCall, config: StepConfig,
            hook: LossHook | None = None) -> Any:
    """The loss of one micro-batch (gradients are not cleared: see :func:`zero_grad`)."""
    scope: contextlib.AbstractContextManager[Any] = (
        _forward_autocast(state.model, config)
        if config.autocast_forward_only and config.autocast_dtype is not None
        else torch.autocast(config.device_type, dtype=config.autocast_dtype,
                            enabled=config.autocast_dtype is not None))
    with scope:
        return call.loss(state.model, micro, hook)


@contextlib.contextmanager
def _forward_autocast(model: torch.nn.Module, config: StepConfig) -> Iterator[None]:
    """The model's own forward under autocast, its floating outputs cast to float32: what
    Accelerate's prepare does to a model's forward, for this pass's model only."""
    own = vars(model).get("forward")  # an instance's own forward, if one was set on it
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(config.device_type, dtype=config.autocast_dtype):
            out = original(*args, **kwargs)
        return tree_map(lambda t: t.float() if isinstance(t, torch.Tensor)
                        and t.dtype in (torch.float16, torch.bfloat16) else t, out)

    model.forward = forward
    try:
        yield
    finally:
        if own is not None:
            model.forward = own
        else:
            del model.forward  # the class's forward again


def backward(state: TrainState, loss: Any) -> None:
    if state.scaler is not None:
        state.scaler.scale(loss).backward()
    else:
        loss.backward()


def update(state: TrainState, config: StepConfig) -> None:
    if config.grad_clip is not None:
        if state.scaler is not None:
            for optimizer in state.optimizers:
                state.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), config.grad_clip)
    if state.scaler is not None:
        for optimizer in state.optimizers:
            state.scaler.step(optimizer)
        state.scaler.update()
    else:
        for optimizer in state.optimizers:
            optimizer.step()


def run_step(state: TrainState, batch: StepBatch, call: StepCall, config: StepConfig) -> None:
    """The whole step, uninstrumented (history steps of an every_n capture)."""
    zero_grad(state)
    for micro in batch.micro:
        backward(state, scaled(forward(state, micro, call, config), batch.divisor))
    update(state, config)


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _digest(parts: list[int] | None, tensors: Sequence[torch.Tensor]) -> None:
    """Add each tensor's byte count and CRC-32C to ``parts`` (None: no fingerprint is
    kept), read where the bytes lie.

    The fingerprint tells whether two passes of one replay ended bit for bit alike; it
    guards against chance, not against an adversary, so a CRC per tensor (about 10 GB/s)
    does instead of a cryptographic hash of them all (SHA-1, under 1 GB/s here, cost most
    of a healthy replay's time over its step on a model of 0.4 M parameters)."""
    if parts is None:
        return
    for t in tensors:
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        parts += (data.shape[0], _crc(data))


def _crc(data: Any) -> int:
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    else:
        if google_crc32c.implementation == "c":  # its pure-Python CRC is slow
            return int(google_crc32c.value(data))
    return int.from_bytes(hashlib.sha1(data).digest()[:4], "little")


def _fingerprint(parts: list[int]) -> str:
    return hashlib.sha1(b"".join(n.to_bytes(8, "little") for n in parts)).hexdigest()[:16]


def plain_pass(label: str, state: TrainState, batch: StepBatch, call: StepCall,
               config: StepConfig, census: ForwardCensus | None = None, *,
               fingerprint: bool = True) -> PassOutcome:
    """Run the step without instrumentation; say where it first went non-finite.

    ``census`` watches the forward of the micro-batch the instrumented pass would watch.
    ``fingerprint`` False leaves the outcome's fingerprint out, for a pass that no other
    is compared with: the CRCs read every gradient and parameter once more."""
    parts: list[int] | None = [] if fingerprint else None
    params: list[torch.Tensor] | None = None
    phase: Phase | None = None
    loss_value: float | None = None
    error = None
    stage: Phase = "forward"
    try:
        zero_grad(state)
        for i, micro in enumerate(batch.micro):
            stage = "forward"
            if census is not None and i == batch.target:
                with census:
                    loss = forward(state, micro, call, config, census.hook(call.loss_label))
            else:
                loss = forward(state, micro, call, config)
            if i == batch.target:
                loss_value = float(loss.detach().double())
            _digest(parts, [loss])
            if phase is None and not all_finite([loss]):
                phase = "forward"
            stage = "backward"
            backward(state, scaled(loss, batch.divisor))
        stage = "update"
        params = list(state.model.parameters())  # as they are once the forward has run
        grads = _grads(params)
        _digest(parts, grads)
        if phase is None and not all_finite(grads):
            phase = "backward"
        update(state, config)
        _digest(parts, params)
        if phase is None and not all_finite(params):
            phase = "update"
    except Exception as exc:  # a pass that raises is evidence, not a crash of the replay
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if phase is None and numeric_error(exc):
            phase = stage  # the step's own check stopped it there
    autocast = dtype_name(config.autocast_dtype)
    dtype = _param_dtype(params if params is not None else list(state.model.parameters()))
    return PassOutcome(label=label, device=config.device, dtype=dtype, autocast=autocast,
                       loss=loss_value, phase=phase,
                       fingerprint=None if parts is None else _fingerprint(parts), error=error)


def light_pass(label: str, state: TrainState, batch: StepBatch, call: StepCall,
               config: StepConfig, bad_inputs: tuple[str, ...] | None = None,
               ) -> tuple[PassOutcome, Instrumented | None]:
    """A plain pass that also counts the forward's module calls and checks their outputs.

    It is the first pass of a default replay, which no other pass is compared with bit
    for bit, so it has no fingerprint. When the step stays finite throughout (the
    loss, every module's output, the gradients and the parameters) and raises nothing, it
    also gives what the instrumented pass would report of such a step: nothing non-finite
    to locate. Otherwise the second value is None and the instrumented pass must run.
    Unlike that pass it does not look inside a module: a value made non-finite and then
    masked within one module's forward, or within backward or the update, is not sought.
    ``bad_inputs``: ``bad_parts`` of the instrumented micro-batch where the caller has it,
    taken before the pass as the instrumented pass takes it.
    """
    micro = batch.instrumented
    if bad_inputs is None:
        bad_inputs = bad_parts(micro)
    census = ForwardCensus(state.model, call.fn if call.kind == "loss_fn" else None)
    scale_before = state.scaler.get_scale() if state.scaler is not None else None
    outcome = plain_pass(label, state, batch, call, config, census, fingerprint=False)
    if outcome.error is not None or outcome.phase is not None or not census.finite:
        return outcome, None
    fwd = ForwardReport(frames=census.frames, producer=None, window=(), first_nonfinite=None,
                        loss=outcome.loss, bad_inputs=bad_inputs,
                        batch=stats_of(model_inputs(micro)))
    bwd = BackwardReport(ran=True, origin=None, first_param=None, bad_params=())
    skipped = (scale_before is not None and state.scaler is not None
               and state.scaler.get_scale() < scale_before)
    upd = UpdateReport(ran=True, op=None, params=(), skipped_by_scaler=skipped)
    return outcome, Instrumented(fwd, None, bwd, upd)


def _param_dtype(params: list[torch.Tensor]) -> str:
    dtypes = sorted({dtype_name(p.dtype) or "" for p in params})
    return "+".join(dtypes) or "none"


@dataclass(frozen=True)
class Instrumented:
    forward: ForwardReport
    forward_op: OpFault | None
    backward: BackwardReport
    update: UpdateReport

    @property
    def observed(self) -> Phase | None:
        """The first phase whose loss, gradients or parameters came out non-finite.

        This is what a plain pass can see too, so it is what repeated passes are
        compared by; a value masked inside a phase does not show here: a NaN row of
        activations that the loss ignores (padding under ``ignore_index``) leaves the
        forward finite as a plain pass sees it.
        """
        loss = self.forward.loss
        if loss is None or not math.isfinite(loss):
            return "forward"
        if not self.backward.finite:
            return "backward"
        if self.update.ran and not self.update.finite:
            return "update"
        return None


def mask_storages(model: torch.nn.Module, inputs: Any) -> set[int]:
    """Where the float masks of 0 and -inf the step starts with live: a causal mask kept as
    a buffer, an ``attn_mask`` passed in with the batch."""
    found = [b for b in model.buffers() if is_additive_mask(b)]
    found += [t for t in floating(inputs) if is_additive_mask(t)]
    return {t.untyped_storage().data_ptr() for t in found}


def instrumented_pass(state: TrainState, batch: StepBatch, call: StepCall,
                      config: StepConfig) -> Instrumented:
    """The step under module hooks, the op trace, anomaly mode and gradient hooks: the
    micro-batches before the instrumented one run plainly first, accumulating gradients."""
    model = state.model
    micro = batch.instrumented
    try:
        zero_grad(state)
        for earlier in batch.micro[:batch.target]:
            backward(state, scaled(forward(state, earlier, call, config), batch.divisor))
    except Exception as exc:
        raise ReplayError("forward", exc) from exc
    values = batch_values(micro)
    names = {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}
    recorder: ForwardRecorder | None = None
    tracer = OpTracer(lambda: recorder.current() if recorder else None, names,
                      mask_storages(model, values))
    recorder = ForwardRecorder(model, call.fn if call.kind == "loss_fn" else None,
                               pause=lambda on: setattr(tracer, "paused", on),
                               masked=tracer.masked)
    bad_inputs = bad_parts(micro)
    stats = stats_of(model_inputs(micro))
    with warnings.catch_warnings():
        # anomaly mode warns that it is on, and again for each node it blames
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(check_nan=False), bare_anomaly_stacks(), tracer:
            try:
                with recorder:
                    loss = forward(state, micro, call, config, recorder.hook(call.loss_label))
            except Exception as exc:
                if not (numeric_error(exc) and _saw_fault(recorder, tracer)):
                    raise ReplayError("forward", exc) from exc
                # The step's own code stopped on the non-finite value it met (a training_step
                # raising FloatingPointError on a NaN loss): what made it is already seen.
                return _raised(recorder.report(None, bad_inputs, stats), tracer, exc)
            fwd = recorder.report(loss, bad_inputs, stats)
            loss = scaled(loss, batch.divisor)
            watch = GradWatch(model, loss, tracer)
            tracer.phase = "backward"
            try:
                with watch:
                    backward(state, loss)
            except Exception as exc:
                raise ReplayError("backward", exc) from exc
            bwd = watch.report()
            tracer.phase = "update"
            upd = _update_pass(state, config, fwd, bwd, tracer)
    return Instrumented(fwd, tracer.fault("forward"), bwd, upd)


def _saw_fault(recorder: ForwardRecorder, tracer: OpTracer) -> bool:
    return tracer.fault("forward") is not None or any(
        not all(s.finite for s in f.outputs) for f in recorder.frames)


def _raised(fwd: ForwardReport, tracer: OpTracer, exc: BaseException) -> Instrumented:
    said = f"{type(exc).__name__}: {exc}".splitlines()[0]
    bwd = BackwardReport(ran=False, origin=None, first_param=None, bad_params=())
    upd = UpdateReport(ran=False, op=None, params=(),
                       note=f"not run: the step raised {said} after a non-finite value in "
                            "forward")
    return Instrumented(fwd, tracer.fault("forward"), bwd, upd)


def _update_pass(state: TrainState, config: StepConfig, fwd: ForwardReport,
                 bwd: BackwardReport, tracer: OpTracer) -> UpdateReport:
    if not (fwd.finite and bwd.finite):
        where = "forward" if not fwd.finite else "backward"
        return UpdateReport(ran=False, op=None, params=(),
                            note=f"not run: the step was already non-finite in {where}")
    named = list(state.model.named_parameters())
    tracer.paused = True
    before = {n: p.detach().clone() for n, p in named}
    grads = {n: p.grad.detach().clone() if p.grad is not None else None for n, p in named}
    scale_before = state.scaler.get_scale() if state.scaler is not None else None
    tracer.paused = False
    try:
        update(state, config)
    except Exception as exc:
        raise ReplayError("update", exc) from exc
    tracer.paused = True
    try:
        params = []
        for name, p in named:
            if all_finite([p]) or not all_finite([before[name]]):
                continue
            stat = tensor_stat(p)
            params.append(ParamUpdate(name, stat.kind or "?",
                                      explain(state.owner(p), p, before[name], grads[name])))
        skipped = (scale_before is not None and state.scaler is not None
                   and state.scaler.get_scale() < scale_before)
    finally:
        tracer.paused = False
    return UpdateReport(ran=True, op=tracer.fault("update"), params=tuple(params),
                        skipped_by_scaler=skipped)

