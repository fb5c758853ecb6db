"""Module hooks for the forward pass.

Every submodule of the model (and of the loss, when it is a module) gets a pre-
and a post-forward hook. The post hook records a frame; because a parent
finishes after its children, the first frame whose inputs were finite and whose
output was not is the innermost module that made the bad value. The hooks also
keep the stack of running modules, so the op trace can say where an op ran, and
label the autograd nodes each module created, so backward can say it too.

:class:`ForwardCensus` is the light pass's view of the same calls: it counts them and
checks each output for a non-finite value, nothing more, so that a step that stays finite
throughout costs little more than the step itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from analyzer.model.replays import (
    LOSS_NAME,
    ROOT_NAME,
    ForwardReport,
    ModuleFrame,
    Role,
    TensorStat,
)
from analyzer.replayer.ops import MODULE_KEY
from analyzer.replayer.stats import (
    all_finite,
    floating,
    is_finite,
    neginf_only,
    stats_of,
    tensors_in,
    version,
)

WINDOW = 3


def _role(inputs_ok: bool, params_ok: bool, outputs_ok: bool) -> Role:
    if outputs_ok:
        return "finite" if inputs_ok else "absorbs"
    if not inputs_ok:
        return "pass-through"
    return "producer" if params_ok else "bad-parameters"


class ForwardRecorder:
    """Hooks on a model and its loss; use as a context manager around the forward pass."""

    def __init__(self, model: nn.Module, loss_fn: Any,
                 pause: Callable[[bool], None] = lambda _: None,
                 masked: Callable[[], bool] = lambda: False) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.pause = pause
        self.masked = masked
        """Whether a mask's -inf has been written: a module fed it is not fed a fault."""
        self.frames: list[ModuleFrame] = []
        self.stack: list[str] = []
        self.calls: Counter[str] = Counter()
        self._handles: list[RemovableHandle] = []

    def current(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def __enter__(self) -> ForwardRecorder:
        self._hook_tree(self.model, ROOT_NAME, "")
        if isinstance(self.loss_fn, nn.Module):
            self._hook_tree(self.loss_fn, LOSS_NAME, LOSS_NAME + ".")
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook_tree(self, root: nn.Module, root_name: str, prefix: str) -> None:
        for name, module in root.named_modules():
            label = prefix + name if name else root_name
            self._handles.append(module.register_forward_pre_hook(self._pre(label)))
            self._handles.append(module.register_forward_hook(
                self._post(label, module), with_kwargs=True, always_call=True))

    def _pre(self, label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            parent = self.current()
            if parent is not None:
                # What feeds a child and is not labelled yet was made by the running
                # module's own code (h / h.norm() before self.fc2): label it now, or the
                # child's walk back from its output would claim it.
                self.pause(True)
                try:
                    self._label_nodes(args, parent)
                finally:
                    self.pause(False)
            self.stack.append(label)
        return hook

    def _post(self, label: str, module: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if self.stack and self.stack[-1] == label:
                self.stack.pop()
            self._frame(label, type(module).__name__, (args, kwargs), output,
                        list(module.named_parameters(recurse=False)))
        return hook

    def hook(self, label: str) -> Callable[[Callable[..., Any], tuple[Any, ...]], Any]:
        """What runs the step's own loss code (a loss function, a step function, a
        training_step): a loss that is a module is hooked already; a plain function gets a
        frame of its own, called ``label``, and the ops it runs outside the model's modules
        are placed in it."""
        def run(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
            if isinstance(fn, nn.Module):
                return fn(*args)
            self.stack.append(LOSS_NAME)
            try:
                loss = fn(*args)
            finally:
                self.stack.pop()
            self._frame(LOSS_NAME, label, args, loss, [])
            return loss
        return run

    def _frame(self, label: str, kind: str, inputs: Any, output: Any,
               params: list[tuple[str, nn.Parameter]]) -> None:
        self.pause(True)
        try:
            self._label_nodes(output, label)
            ins, outs = floating(inputs), floating(output)
            bad_params = tuple(n for n, p in params if not is_finite(p))
            ins_ok = all_finite(ins) or (self.masked() and neginf_only(ins))
            self.calls[label] += 1
            self.frames.append(ModuleFrame(
                index=len(self.frames), name=label, type=kind, call=self.calls[label],
                inputs=stats_of(inputs), outputs=stats_of(output),
                role=_role(ins_ok, not bad_params, all_finite(outs)),
                bad_params=bad_params))
        finally:
            self.pause(False)

    @staticmethod
    def _label_nodes(output: Any, label: str) -> None:
        """Name this module in the metadata of every new node behind its output.

        Children finish first and label their nodes, so what is still unlabelled
        was created by this module's own code. The walk stops at labelled nodes,
        so each node is visited once over the whole pass.
        """
        todo: list[Any] = [t.grad_fn for t in tensors_in(output) if t.grad_fn is not None]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if id(node) in seen or type(node).__name__ == "AccumulateGrad":
                continue
            seen.add(id(node))
            meta = node.metadata
            if MODULE_KEY in meta:
                continue
            meta[MODULE_KEY] = label
            todo.extend(n for n, _ in node.next_functions if n is not None)

    def report(self, loss: Any, bad_inputs: tuple[str, ...],
               batch: tuple[TensorStat, ...] = ()) -> ForwardReport:
        producer = next((f for f in self.frames if f.role in ("producer", "bad-parameters")),
                        None)
        first_bad = next((f for f in self.frames if not all(s.finite for s in f.outputs)),
                         None)
        centre = producer or first_bad
        window: tuple[ModuleFrame, ...] = ()
        if centre is not None:
            lo = max(0, centre.index - WINDOW)
            window = tuple(self.frames[lo:centre.index + WINDOW + 1])
        value = None
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            value = float(loss.detach().double())
        return ForwardReport(frames=len(self.frames), producer=producer, window=window,
                             first_nonfinite=first_bad, loss=value, bad_inputs=bad_inputs,
                             batch=batch)


class ForwardCensus:
    """Post-forward hooks that count the frames :class:`ForwardRecorder` would record and
    note whether any of them had a non-finite output; the same context-manager use."""

    def __init__(self, model: nn.Module, loss_fn: Any) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.frames = 0
        self.finite = True
        self._handles: list[RemovableHandle] = []
        self._last: torch.Tensor | None = None
        self._last_version: int | None = None

    def __enter__(self) -> ForwardCensus:
        roots = [self.model] + ([self.loss_fn] if isinstance(self.loss_fn, nn.Module) else [])
        for root in roots:
            for module in root.modules():
                self._handles.append(module.register_forward_hook(
                    self._post, always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._last = None

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        self._count(output)

    def _count(self, output: Any) -> None:
        self.frames += 1
        if not self.finite:
            return
        if type(output) is torch.Tensor:
            # A container hands on its last child's output: that tensor, unchanged since
            # that child's hook tested it, is not tested again.
            now = version(output)
            if output is self._last and now is not None and now == self._last_version:
                return
            self.finite = is_finite(output)
            self._last, self._last_version = output, now
        elif not all_finite(floating(output)):
            self.finite = False

    def hook(self, label: str) -> Callable[[Callable[..., Any], tuple[Any, ...]], Any]:
        """As :meth:`ForwardRecorder.hook`: a plain loss function is one frame more."""
        def run(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
            if isinstance(fn, nn.Module):
                return fn(*args)
            loss = fn(*args)
            self._count(loss)
            return loss
        return run
