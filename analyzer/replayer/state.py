"""The state one replay pass starts from, and fresh copies of it.

Every pass (instrumented, plain, float64) starts from its own copy of the model,
optimizer and scaler, made the same way: a deep copy of the model cast to the
pass's device and dtype, and a new optimizer of the same class that loads the
original's state dict, which casts the optimizer state to match the parameters.
"""

from __future__ import annotations

import copy
import copyreg
import functools
import inspect
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from analyzer.replayer.stats import is_finite, version

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
           "float32": torch.float32, "float64": torch.float64}


def dtype_of(name: str | None) -> torch.dtype | None:
    return None if name is None else _DTYPES[name]


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


@dataclass
class StepConfig:
    """How the step runs: where, in which dtype, with which mixed-precision tools."""

    device: str = "cpu"
    dtype: torch.dtype | None = None
    autocast_dtype: torch.dtype | None = None
    grad_scaler: bool = False
    grad_clip: float | None = None
    autocast_forward_only: bool = False
    """Autocast the model's forward alone, its outputs cast back to float32 (as Accelerate
    and the HF Trainer run it), not the whole step."""

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type


class Restorable(Protocol):
    def restore(self) -> None: ...


@dataclass
class RngState:
    """Random states restored before every pass, so dropout draws the same masks."""

    torch_cpu: torch.Tensor | None = None
    cuda: list[torch.Tensor] = field(default_factory=list)
    numpy: Any = None
    python: Any = None

    @classmethod
    def now(cls) -> RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        return cls(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())

    def restore(self) -> None:
        if self.torch_cpu is not None:
            torch.set_rng_state(self.torch_cpu)
        if self.cuda and torch.cuda.is_available() and len(self.cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(self.cuda)
        if self.numpy is not None:
            np.random.set_state(self.numpy)
        if self.python is not None:
            random.setstate(self.python)


Checked = tuple[torch.Tensor, int | None, bool]


@dataclass
class TrainState:
    """The model, its optimizers (``optimizer`` and any ``extra`` ones, in the loop's order)
    and the grad scaler."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any = None
    extra: tuple[torch.optim.Optimizer, ...] = ()
    checked: dict[int, Checked] = field(default_factory=dict, repr=False, compare=False)
    """Tensors whose finiteness ``clone_state`` tested as it made them, by id, for
    ``nonfinite_state``: the tensor, its version counter then (an in-place change since
    moves it on) and whether it was finite."""

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return (self.optimizer, *self.extra)

    def owner(self, param: torch.Tensor) -> torch.optim.Optimizer:
        """The optimizer that updates ``param`` (the first, when none does)."""
        for opt in self.optimizers:
            if any(p is param for g in opt.param_groups for p in g["params"]):
                return opt
        return self.optimizer


def _cast(value: Any, device: str, dtype: torch.dtype | None) -> Any:
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device=device)
    if isinstance(value, list | tuple):
        return type(value)(_cast(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, device, dtype) for k, v in value.items()}
    return value


def cast_batch(value: Any, config: StepConfig) -> Any:
    return _cast(value, config.device, config.dtype)


def clone_state(state: TrainState, config: StepConfig, *,
                check_finite: bool = False) -> TrainState:
    """A fresh model, optimizer and scaler for one pass, on the pass's device and dtype.

    ``check_finite``: the state whose start ``nonfinite_state`` will test; each tensor is
    tested as soon as it is copied, while its bytes are still in the processor's cache (a
    pass over the whole state later reads them from memory), where no cast follows."""
    # Parameters cloned as Parameter.__deepcopy__ clones them, ahead of the deep copy:
    # through the copy module, each costs several times more.
    checked: dict[int, Checked] | None = (
        {} if check_finite and config.dtype is None else None)
    originals = list(state.model.parameters())
    memo: dict[int, Any] = {}
    for p in originals:
        if type(p) is nn.Parameter:
            made = memo[id(p)] = nn.Parameter(p.data.clone(memory_format=torch.preserve_format),
                                              p.requires_grad)
            if checked is not None:
                checked[id(made)] = (made, version(made), is_finite(made))
    model = copy_module(state.model, memo).to(config.device)
    if config.dtype is not None:
        model = model.to(config.dtype)
    index = {id(p): i for i, p in enumerate(originals)}
    params = list(model.parameters())
    optimizers = []
    for original in state.optimizers:
        groups = [{"params": [params[index[id(p)]] for p in group["params"]]}
                  for group in original.param_groups]
        optimizer = type(original)(groups, **_accepted(type(original), original.defaults))
        # load_state_dict keeps tensors that already have the right dtype and device:
        # without the copy, a pass would update the moments of the original in place.
        saved = original.state_dict()
        optimizer.load_state_dict(_copied(saved, {}, checked) if _plain_tensors(saved)
                                  else copy.deepcopy(saved))
        optimizers.append(optimizer)
    scaler = None
    if config.grad_scaler and state.scaler is not None:
        scaler = torch.amp.GradScaler(config.device_type)
        scaler.load_state_dict(state.scaler.state_dict())
    return TrainState(model, optimizers[0], scaler, tuple(optimizers[1:]), checked or {})


_ATOMS = (int, float, bool, str, bytes, type(None))
_HOLDERS = (dict, OrderedDict)


def copy_module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    """``copy.deepcopy(module, memo)``, made the same way with less of the copy module's
    machinery per attribute.

    For a module whose class copies as ``nn.Module`` does (no ``__deepcopy__``, reduce or
    state methods of its own), deepcopy makes ``cls.__new__(cls)``, remembers it, deep-copies
    ``__getstate__()`` (the ``__dict__`` without the compiled call) and hands that to
    ``__setstate__``. So does this, except that it copies the values deepcopy would return
    unchanged (numbers, strings, tuples of them) by reference, and the dicts a module keeps
    its parameters, buffers, submodules and hooks in as new dicts of the same type whose
    values are copied the same way, submodules by this function. Everything else, and a
    module of any other class, goes to ``copy.deepcopy`` with the same memo."""
    found = memo.get(id(module))
    if found is not None:
        return found  # type: ignore[no-any-return]
    cls = type(module)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = _copies_plainly(cls)
    if not plain:
        return copy.deepcopy(module, memo)
    new = cls.__new__(cls)
    memo[id(module)] = new
    state = {k: _copy_value(v, memo) for k, v in module.__dict__.items()
             if k != "_compiled_call_impl"}
    new.__setstate__(state)  # type: ignore[no-untyped-call]
    return new


def _copy_value(value: Any, memo: dict[int, Any]) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    found = memo.get(id(value))
    if found is not None:
        return found
    if kind is tuple and all(type(v) in _ATOMS for v in value):
        return value  # what deepcopy returns for such a tuple
    if kind in _HOLDERS:
        holder = memo[id(value)] = kind()
        for key, item in value.items():
            holder[key if type(key) in _ATOMS else copy.deepcopy(key, memo)] = (
                _copy_value(item, memo))
        return holder
    if kind is set and all(type(v) in _ATOMS for v in value):
        copied = memo[id(value)] = set(value)
        return copied
    if isinstance(value, nn.Module):
        return copy_module(value, memo)
    return copy.deepcopy(value, memo)


_PLAIN: dict[type, bool] = {}
"""``_copies_plainly`` per module class met."""


def _copies_plainly(cls: type) -> bool:
    """Whether ``copy.deepcopy`` copies instances of ``cls`` as it copies an ``nn.Module``
    (see ``copy_module``)."""
    return (issubclass(cls, nn.Module) and cls not in copyreg.dispatch_table
            and getattr(cls, "__deepcopy__", None) is None
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getnewargs_ex__", None) is None
            and getattr(cls, "__getnewargs__", None) is None
            and cls.__getstate__ is nn.Module.__getstate__
            and cls.__setstate__ is nn.Module.__setstate__)


def _owns_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is a plain dense tensor that is its storage whole, so that a clone of
    it copies everything a deep copy would (no other tensor can view the same bytes)."""
    return (t.layout == torch.strided and not t.is_quantized and t.device.type != "meta"
            and t.storage_offset() == 0 and t.is_contiguous()
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _plain_tensors(value: Any) -> bool:
    """Whether every tensor in an optimizer's state dict is a plain one that owns its
    storage (see ``_owns_storage``); otherwise the dict is deep-copied as it stands."""
    if isinstance(value, torch.Tensor):
        return type(value) is torch.Tensor and _owns_storage(value)
    if isinstance(value, dict):
        return all(_plain_tensors(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_plain_tensors(v) for v in value)
    return True


def _copied(value: Any, memo: dict[int, Any],
            checked: dict[int, Checked] | None = None) -> Any:
    """A deep copy of an optimizer's state dict: its tensors cloned directly (deepcopy
    takes each through its storage, in Python: most of a clone's time on a small model),
    the containers rebuilt, anything else deep-copied. ``memo`` keeps a tensor met twice
    one tensor in the copy; each tensor copied is tested for finiteness into ``checked``
    where one is given (see ``TrainState.checked``)."""
    found = memo.get(id(value))
    if found is not None:
        return found
    if isinstance(value, torch.Tensor) and type(value) is torch.Tensor:
        copied: Any = value.detach().clone()
        if checked is not None:
            checked[id(copied)] = (copied, version(copied), is_finite(copied))
    elif type(value) is dict:
        copied = {k: _copied(v, memo, checked) for k, v in value.items()}
    elif type(value) is list:
        copied = [_copied(v, memo, checked) for v in value]
    elif type(value) is tuple:
        copied = tuple(_copied(v, memo, checked) for v in value)
    else:
        return copy.deepcopy(value, memo)
    memo[id(value)] = copied
    return copied


def _accepted(cls: type, defaults: Any) -> dict[str, Any]:
    """The defaults ``cls.__init__`` takes: an optimizer may keep one it does not accept
    (torch's AdamW keeps ``decoupled_weight_decay``, fixed to True, among its defaults)."""
    names = _init_names(cls)
    if names is None:
        return dict(defaults)
    return {k: v for k, v in dict(defaults).items() if k in names}


@functools.lru_cache(maxsize=64)
def _init_names(cls: type) -> frozenset[str] | None:
    """The keyword names ``cls.__init__`` takes; None when it takes any."""
    params = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


def nonfinite_state(state: TrainState) -> list[str]:
    """Parameters and optimizer state already non-finite before the step starts."""
    checked = state.checked

    def finite(t: torch.Tensor) -> bool:
        known = checked.get(id(t))
        if known is not None and known[0] is t and known[1] is not None \
                and known[1] == version(t):
            return known[2]
        return is_finite(t)

    named = list(state.model.named_parameters())
    bad = [n for n, p in named if not finite(p)]
    names = {id(p): n for n, p in named}
    for optimizer in state.optimizers:
        for param, slots in optimizer.state.items():
            for key, value in slots.items():
                if isinstance(value, torch.Tensor) and not finite(value):
                    bad.append(f"optimizer state {key} of {names.get(id(param), '?')}")
    return bad
