"""Gradient hooks for the backward pass.

Each parameter gets a hook that fires once its gradient has been accumulated;
the first one that arrives non-finite is reported with the autograd nodes that
fed it (found by walking the graph from the loss before backward starts) and the
forward line that created them, which anomaly mode stored on each node.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from analyzer.model.replays import BackwardReport, ParamGrad, TensorStat, param_module
from analyzer.replayer.ops import OpTracer, node_module, node_source
from analyzer.replayer.stats import is_finite, tensor_stat


def grad_parents(loss: Any) -> dict[int, list[Any]]:
    """For each leaf tensor (by id), the nodes whose outputs flow into its gradient."""
    parents: dict[int, list[Any]] = {}
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return parents
    todo, seen = [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            variable = getattr(nxt, "variable", None)
            if variable is not None:
                parents.setdefault(id(variable), []).append(node)
            else:
                todo.append(nxt)
    return parents


class GradWatch:
    """Hooks on every trainable parameter; use as a context manager around backward."""

    def __init__(self, model: nn.Module, loss: Any, tracer: OpTracer) -> None:
        self.model = model
        self.tracer = tracer
        self.parents = grad_parents(loss)
        self.arrivals: list[tuple[str, torch.Tensor, TensorStat | None]] = []
        self.ran = False
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> GradWatch:
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    self._hook(name)))
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.ran = exc_type is None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, name: str) -> Any:
        def hook(param: torch.Tensor) -> None:
            self.tracer.paused = True
            try:
                grad = param.grad
                bad = grad is not None and not is_finite(grad)
                self.arrivals.append((name, param, tensor_stat(grad) if bad and grad is not None
                                      else None))
            finally:
                self.tracer.paused = False
        return hook

    def report(self) -> BackwardReport:
        bad = [(name, param, stat) for name, param, stat in self.arrivals if stat is not None]
        first = None
        if bad:
            name, param, stat = bad[0]
            first = self._param_grad(name, param, stat)
        return BackwardReport(ran=self.ran, origin=self.tracer.fault("backward"),
                              first_param=first, bad_params=tuple(n for n, _, _ in bad))

    def _param_grad(self, name: str, param: torch.Tensor, stat: TensorStat) -> ParamGrad:
        feeders = self.parents.get(id(param), [])
        flagged = {id(n) for n in self.tracer.bad_nodes}
        culprits = [n for n in feeders if id(n) in flagged] or feeders
        module = next((m for m in map(node_module, culprits) if m is not None), None)
        if module is None:
            module = param_module(name)
        source = next((s for s in map(node_source, culprits) if s is not None), None)
        return ParamGrad(name=name, grad=stat, nodes=tuple(type(n).__name__ for n in culprits),
                         module=module, forward_source=source[0] if source else None)
