"""The op-level trace: a dispatch mode that sees every aten op of the step.

For each phase it keeps the first op whose floating inputs were all finite and
whose output was not: that op made the first non-finite value. During backward
it also remembers every autograd node that emitted a non-finite value, so that a
bad parameter gradient can be traced to the node that fed it.

A mask's -inf is written on purpose and is not that value: an op whose fill value is
-inf (``masked_fill(mask, -inf)``, ``torch.where(mask, -inf, x)``, ``torch.full(..., -inf)``)
on otherwise finite inputs, or that reads a float mask of 0 and -inf (a buffer, the
batch), and whose output holds no NaN or +inf, is kept as the phase's mask; ops that
carry its -inf on (an add of the mask to the scores, a triu) are skipped, and the first op
that turns it into NaN or +inf (a softmax over a row masked entirely) is the producer,
with the mask beside it. HF-style masks of ``finfo(dtype).min`` write no -inf at all.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from analyzer.model.replays import OpFault, Phase
from analyzer.replayer.stats import (
    all_finite,
    floating,
    holds_neginf,
    is_finite,
    neginf_only,
    scalar_inputs_finite,
    source_text,
    stats_of,
    user_frames_from_trace,
    user_frames_live,
)

MODULE_KEY = "forensics_module"
"""Key under which the forward pass writes the module name into a node's metadata."""


def node_module(node: Any) -> str | None:
    try:
        value = node.metadata.get(MODULE_KEY)
    except (AttributeError, RuntimeError):
        return None
    return value if isinstance(value, str) else None


def node_source(node: Any) -> tuple[str, tuple[str, ...]] | None:
    """The forward line that created ``node``, from the trace anomaly mode stored."""
    try:
        trace = node.metadata.get("traceback_")
    except (AttributeError, RuntimeError):
        return None
    if not trace:
        return None
    return user_frames_from_trace(trace)


_STACKS_LOCK = threading.Lock()
_stacks_users = 0
_torch_format_stack: Callable[[], list[str]] | None = None


def _bare_format_stack() -> list[str]:
    import torch.fx.traceback as fx_traceback

    if fx_traceback.has_preserved_node_meta() and _torch_format_stack is not None:
        return _torch_format_stack()
    entries = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        entries.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in '
                       f"{code.co_name}\n")
        frame = frame.f_back
    entries.reverse()  # outermost first, as a traceback is written
    return entries


@contextlib.contextmanager
def bare_anomaly_stacks() -> Iterator[None]:
    """Anomaly mode's stacks without their source text, while the block runs.

    Anomaly mode stores on each autograd node the stack of the forward line that created
    it, through ``torch.fx.traceback.format_stack``, which reads every frame's source line
    from disk (a stat of each file per frame, per node): most of the instrumented pass's
    time in a model of many small ops. :func:`node_source` reads only the file, line and
    function of each frame, which this writes the same way without the text. Replays
    running at once in threads of one process share the swap: torch's own function is put
    back when the last of them ends.
    """
    global _stacks_users, _torch_format_stack
    import torch.fx.traceback as fx_traceback

    with _STACKS_LOCK:
        if _stacks_users == 0:
            _torch_format_stack = fx_traceback.format_stack
            fx_traceback.format_stack = _bare_format_stack
        _stacks_users += 1
    try:
        yield
    finally:
        with _STACKS_LOCK:
            _stacks_users -= 1
            if _stacks_users == 0 and _torch_format_stack is not None:
                fx_traceback.format_stack = _torch_format_stack
                _torch_format_stack = None


def forward_op_of(node: Any) -> str | None:
    """``SqrtBackward0`` -> ``sqrt``: the forward op an autograd node differentiates."""
    if node is None:
        return None
    name = re.sub(r"Backward\d*$", "", type(node).__name__)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or None


def _widen(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        wide = torch.float64 if value.is_floating_point() else value.dtype
        return value.detach().to("cpu", wide, copy=True)
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    if isinstance(value, torch.device):
        return torch.device("cpu")
    return value


def float64_finite(func: Any, args_kwargs: Any) -> bool | None:
    """Run ``func`` again on its inputs widened to float64; is the result finite?

    None when the op cannot run that way (an op without a float64 kernel).
    """
    args, kwargs = tree_map(_widen, args_kwargs)
    try:
        with torch.no_grad():
            out = func(*args, **kwargs)
    except Exception:  # any failure only means this piece of evidence is missing
        return None
    results = floating(out)
    if func._schema.is_mutable:
        results += floating(_written_args(func, args, kwargs))
    return all_finite(results) if results else None


_WRITES: dict[Any, tuple[tuple[int, str], ...]] = {}
"""Per op overload, the position and name of each argument it writes into."""


def _written_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments an in-place or out= op writes into."""
    writes = _WRITES.get(func)
    if writes is None:
        writes = tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)
                       if arg.alias_info is not None and arg.alias_info.is_write)
        _WRITES[func] = writes
    written = []
    for i, name in writes:
        if name in kwargs:
            written.append(kwargs[name])
        elif i < len(args):
            written.append(args[i])
    return written


def _aliased(call: Any, written: list[torch.Tensor]) -> bool:
    """Whether an argument the op only reads shares memory with one it writes: the op
    changes it too, so it must be judged before the op runs."""
    storages = {t.untyped_storage().data_ptr() for t in written}
    ids = {id(t) for t in written}
    return any(t.untyped_storage().data_ptr() in storages for t in floating(call)
               if id(t) not in ids)


def _clone_if(value: Any, ids: set[int]) -> Any:
    if isinstance(value, torch.Tensor) and id(value) in ids:
        return value.detach().clone()
    return value


def _with_copies(call: Any, ids: set[int]) -> Any:
    """``call`` (args and kwargs) with a copy of each tensor in ``ids``: plain tuples,
    lists and dicts rebuilt here, anything else through pytree."""
    kind = type(call)
    if kind is tuple or kind is list:
        return kind(_with_copies(item, ids) for item in call)
    if kind is dict:
        return {key: _with_copies(item, ids) for key, item in call.items()}
    if isinstance(call, torch.Tensor) or kind in (type(None), bool, int, float, str):
        return _clone_if(call, ids)
    return tree_map(lambda v: _clone_if(v, ids), call)


def _narrow(value: Any, index: int) -> Any:
    """Element ``index`` of every list argument of a foreach op."""
    if isinstance(value, list | tuple) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        return value[index] if index < len(value) else None
    if isinstance(value, dict):
        return {k: _narrow(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_narrow(v, index) for v in value)
    return value


UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                           "new_empty_strided", "empty_permuted"})
"""Ops that return memory nobody wrote yet (dropout draws its mask into ``empty_like``): a
NaN bit pattern left there is no fault of theirs."""


class OpTracer(TorchDispatchMode):
    """Finds the first non-finite-producing aten op of each phase.

    ``module_of`` names the module running now (forward); ``param_names`` maps a
    parameter's storage address to its name (update). Set ``phase`` before each
    phase; set ``paused`` while the replay's own bookkeeping runs tensors ops.
    """

    def __init__(self, module_of: Callable[[], str | None],
                 param_names: dict[int, str] | None = None,
                 mask_storages: set[int] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.module_of = module_of
        self.param_names = param_names or {}
        self.mask_storages = mask_storages or set()
        """Storage addresses of float masks of 0 and -inf the step starts with."""
        self.masks: dict[Phase, OpFault] = {}
        """The first op of each phase that wrote (or read) a mask's -inf."""
        self.phase: Phase = "forward"
        self.paused = False
        self.counts: dict[Phase, int] = {"forward": 0, "backward": 0, "update": 0}
        self.producers: dict[Phase, OpFault] = {}
        self.first_bad: dict[Phase, OpFault] = {}
        self.bad_nodes: list[Any] = []
        self._bad_node_ids: set[int] = set()

    def fault(self, phase: Phase) -> OpFault | None:
        return self.producers.get(phase) or self.first_bad.get(phase)

    def masked(self) -> bool:
        """Whether a mask's -inf has been written in the phase running now."""
        return self.phase in self.masks

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        phase = self.phase
        self.counts[phase] += 1
        ordinal = self.counts[phase]
        searching = phase not in self.producers
        mutable = bool(func._schema.is_mutable)
        before = None
        if searching and mutable:
            # An in-place op overwrites its input: keep a copy of what it writes into. Until
            # the phase has a first bad op, any op may become it, so the copy is made without
            # looking; whether its inputs were finite is asked only if its output is not.
            targets = floating(_written_args(func, args, kwargs))
            written = {id(t) for t in targets}
            late = phase not in self.first_bad and not _aliased((args, kwargs), targets)
            ok = None if late else all_finite(floating((args, kwargs)))
            keep = ok is None or ok  # else it cannot be recorded anyway
            before = (ok, _with_copies((args, kwargs), written) if keep else (args, kwargs))
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ in UNINITIALISED:
            return out  # whatever bytes the allocator left, not a value any op computed
        results = floating(out) + (floating(_written_args(func, args, kwargs)) if mutable else [])
        if not results or all_finite(results):
            return out
        node = torch._C._current_autograd_node() if phase == "backward" else None
        if node is not None and id(node) not in self._bad_node_ids:
            self._bad_node_ids.add(id(node))
            self.bad_nodes.append(node)
        if searching:
            self._record(func, args, kwargs, out, before, node, phase, ordinal)
        return out

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                before: tuple[bool | None, Any] | None, node: Any, phase: Phase,
                ordinal: int) -> None:
        in_args: Any = (args, kwargs)
        if before is not None:
            known, in_args = before
            # the copies of what the op wrote into, and its other arguments, which it left
            inputs_ok = known if known is not None else all_finite(floating(in_args))
        else:
            inputs_ok = all_finite(floating(in_args))
        inputs_ok = inputs_ok and scalar_inputs_finite((args, kwargs))
        mask = None
        if not inputs_ok:
            outputs = out if out is not None else _written_args(func, args, kwargs)
            reading = self._mask_reading(phase, (args, kwargs), in_args, outputs)
            if reading == "mask":
                if phase not in self.masks:
                    self.masks[phase] = self._fault(func, in_args, out, args, kwargs, node,
                                                    phase, ordinal, False, None, None)
                return
            if reading == "made":
                inputs_ok, mask = True, self.masks.get(phase)
        if not inputs_ok and phase in self.first_bad:
            return
        wide = float64_finite(func, in_args) if inputs_ok else None
        fault = self._fault(func, in_args, out, args, kwargs, node, phase, ordinal, inputs_ok,
                            wide, mask)
        if inputs_ok:
            self.producers[phase] = fault
        else:
            self.first_bad[phase] = fault

    def _mask_reading(self, phase: Phase, call: Any, in_args: Any, outputs: Any) -> str | None:
        """'mask' for an op that writes or carries a mask's -inf, 'made' for one that turns
        it into NaN or +inf, None for anything else (a non-finite value of another kind).

        A fill value is a Python float or a 0-dim tensor; any other non-finite input must
        hold -inf only and come from a mask already written (or a mask the step starts
        with).
        """
        scalars = [v for v in tree_leaves(call) if isinstance(v, float) and not math.isfinite(v)]
        if any(v != -math.inf for v in scalars):
            return None
        tensors = floating(in_args)
        if not neginf_only(tensors):
            return None
        fill = bool(scalars) or any(t.dim() == 0 and holds_neginf(t) for t in tensors)
        known = phase in self.masks or any(
            t.untyped_storage().data_ptr() in self.mask_storages for t in tensors
            if not is_finite(t))
        carried = [t for t in tensors if not is_finite(t) and t.dim() > 0]
        if carried and not known:
            return None
        if not (fill or carried):
            return None
        if neginf_only(floating(outputs)):
            return "mask"
        return "made" if phase in self.masks or known else None

    def _fault(self, func: Any, in_args: Any, out: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any], node: Any, phase: Phase, ordinal: int,
               inputs_ok: bool, wide: bool | None, mask: OpFault | None) -> OpFault:
        index = self._bad_element(out, args)
        if index is not None:
            in_args = _narrow(in_args, index)
            out = _narrow(out, index)
        outputs = out if out is not None else _written_args(func, args, kwargs)
        if index is not None and out is None:
            outputs = _narrow(outputs, index)
        return OpFault(
            phase=phase,
            op=str(func.overloadpacket.__name__) + "." + func._overloadname,
            ordinal=ordinal,
            inputs=stats_of(in_args),
            outputs=stats_of(outputs),
            inputs_finite=inputs_ok,
            module=self._module(phase, node),
            autograd_node=type(node).__name__ if node is not None else None,
            parameter=self._parameter(outputs) if phase == "update" else None,
            forward_op=forward_op_of(node),
            float64_finite=wide,
            mask=mask,
            **self._where(phase, node),
        )

    def _module(self, phase: Phase, node: Any) -> str | None:
        if phase == "forward":
            return self.module_of()
        if node is not None:
            return node_module(node)
        return None

    def _where(self, phase: Phase, node: Any) -> dict[str, Any]:
        found = None
        if phase == "forward":
            found = user_frames_live()
        elif node is not None:
            found = node_source(node)
        elif phase == "update":
            found = user_frames_live()
        if found is None:
            return {}
        return {"source": found[0], "stack": found[1], "source_line": source_text(found[0])}

    def _bad_element(self, out: Any, args: tuple[Any, ...]) -> int | None:
        """For a foreach op, the index of the first list element that went bad."""
        lists = [v for v in (out, *args) if isinstance(v, list | tuple) and v
                 and all(isinstance(t, torch.Tensor) for t in v)]
        if not lists:
            return None
        for i, t in enumerate(lists[0]):
            if not is_finite(t):
                return i
        return None

    def _parameter(self, outputs: Any) -> str | None:
        for t in floating(outputs):
            name = self.param_names.get(t.untyped_storage().data_ptr())
            if name is not None:
                return name
        return None
