"""Finding the parts of a checkpoint in the object tree it unpickles to.

The same walk serves trees built by ``torch.load`` and by the static reader: a module
that was pickled whole appears as an ``nn.Module`` in the first case and as an
:class:`Obj` with ``_parameters`` / ``_buffers`` / ``_modules`` state in the second.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, cast

from analyzer.ingest.ckpt.leaves import Leaf
from analyzer.ingest.ckpt.staticpickle import Call, Obj
from analyzer.model.checkpoints import CheckpointFormat

MODEL_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network", "model_state")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optim", "optimizer_states", "opt")
STEP_KEYS = ("global_step", "global_steps", "step", "iteration", "iter")
"""Keys holding the training step, in the order they are trusted. ``epoch`` is not one: an
epoch counts passes over the data, not steps (it is the metadata's ``epoch``)."""
LIGHTNING_KEYS = {"pytorch-lightning_version", "optimizer_states", "loops", "lr_schedulers"}
MAX_DEPTH = 48

_STEP_IN_NAME = re.compile(
    r"(?:global[_-]?step|step|iter(?:ation)?|it|checkpoint|ckpt)[_\-=]?(\d+)", re.I
)
_EPOCH_IN_NAME = re.compile(r"epoch[_\-=]?(\d+)", re.I)
_ACCELERATE_SAVE = re.compile(r"checkpoint_\d+")
"""Accelerate's automatic naming (``checkpoints/checkpoint_N``) counts saves, not steps."""


class LeafSource(Protocol):
    def leaf(self, value: object) -> Leaf | None: ...


@dataclass(frozen=True)
class Parts:
    """Where the model, the optimizer states and the rest sit in the tree."""

    format: CheckpointFormat
    model: object | None
    model_key: str | None
    optimizers: tuple[tuple[str, Mapping[object, object]], ...]


def _module_state(value: object) -> Mapping[object, object] | None:
    """The state dict of an ``nn.Module`` pickled whole, as a flat name -> tensor map."""
    torch = sys.modules.get("torch")  # no module can have been built without it
    if torch is not None and isinstance(value, torch.nn.Module):
        return cast(Mapping[object, object], value.state_dict())
    return None


def _obj_is_module(value: object) -> bool:
    return (
        isinstance(value, Obj)
        and isinstance(value.state, dict)
        and ("_parameters" in value.state or "_modules" in value.state)
    )


def is_optimizer_state(value: object) -> bool:
    return isinstance(value, Mapping) and "state" in value and "param_groups" in value


def _is_tensor_map(value: object, leaves: LeafSource) -> bool:
    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(leaves.leaf(v) is not None for v in value.values())
    )


def find_parts(root: object, path: str, leaves: LeafSource) -> Parts:
    """Classify the checkpoint and locate its sections."""
    if _module_state(root) is not None or isinstance(root, Obj):
        # A pickled object (a module, or a TorchScript module's attributes) as the root.
        return Parts("full_model", root, None, ())
    if not isinstance(root, Mapping):
        return Parts("other", None, None, ())
    if is_optimizer_state(root):
        return Parts("optimizer", None, None, (("optimizer", root),))
    if "scale" in root and ("growth_factor" in root or "_growth_tracker" in root):
        return Parts("scaler", None, None, ())
    keys = {str(k) for k in root}
    optimizers = _optimizers(root)
    model_key = next((k for k in MODEL_KEYS if k in root and _model_like(root[k], leaves)), None)
    if model_key == "state_dict" and (LIGHTNING_KEYS & keys or "global_step" in keys):
        return Parts("lightning", root[model_key], model_key, optimizers)
    if model_key is not None:
        return Parts("training", root[model_key], model_key, optimizers)
    if _is_tensor_map(root, leaves):
        name = os.path.basename(path)
        kind: CheckpointFormat = "hf_bin" if name.startswith("pytorch_model") else "state_dict"
        return Parts(kind, root, None, optimizers)
    return Parts("other", None, None, optimizers)


def _model_like(value: object, leaves: LeafSource) -> bool:
    if _module_state(value) is not None or _obj_is_module(value):
        return True
    return isinstance(value, Mapping) and any(True for _ in walk(value, "", leaves))


def _optimizers(root: Mapping[object, object]) -> tuple[tuple[str, Mapping[object, object]], ...]:
    found: list[tuple[str, Mapping[object, object]]] = []
    for key in OPTIMIZER_KEYS:
        value = root.get(key)
        if is_optimizer_state(value):
            found.append((key, value))  # type: ignore[arg-type]
        elif isinstance(value, list | tuple):
            found.extend((f"{key}.{i}", v) for i, v in enumerate(value) if is_optimizer_state(v))
    return tuple(found)


def walk(value: object, prefix: str, leaves: LeafSource) -> Iterator[tuple[str, Leaf]]:
    """Every tensor under ``value`` with its dotted name, in the tree's order.

    Each container is entered once: a pickle can reference one list from many places,
    and walking every path through such sharing could take exponential time. Tensors
    shared under two names (tied weights) are still listed under both.
    """
    return _walk(value, prefix, leaves, 0, set())


def _walk(
    value: object, prefix: str, leaves: LeafSource, depth: int, seen: set[int]
) -> Iterator[tuple[str, Leaf]]:
    if depth > MAX_DEPTH:
        return
    leaf = leaves.leaf(value)
    if leaf is not None:
        yield prefix, leaf
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    state = _module_state(value)
    if state is not None:
        value = state
    children: list[tuple[str, object]] = []
    if isinstance(value, Obj):
        children = _obj_children(value)
    elif isinstance(value, Mapping):
        children = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        children = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, Call):
        children = [(str(i), v) for i, v in enumerate(value.args)]
    for key, item in children:
        yield from _walk(item, _join(prefix, key), leaves, depth + 1, seen)


def _obj_children(value: Obj) -> list[tuple[str, object]]:
    state = value.state
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
        state = state[0]
    if isinstance(state, dict) and ("_parameters" in state or "_modules" in state):
        # A module's own tensors carry no section name, as in its state_dict().
        children: list[tuple[str, object]] = []
        for section in ("_parameters", "_buffers", "_modules"):
            part = state.get(section)
            if isinstance(part, Mapping):
                children.extend((str(k), v) for k, v in part.items())
        return children
    children = [(str(k), v) for k, v in state.items()] if isinstance(state, dict) else []
    return children + [(str(i), v) for i, v in enumerate(value.args)]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def find_scaler(
    root: object, depth: int = 0, key: str = ""
) -> tuple[str, Mapping[str, object]] | None:
    """The first GradScaler state in the tree: a dict with a scale and its growth rules."""
    if depth > 4 or not isinstance(root, Mapping):
        return None
    if "scale" in root and ("growth_factor" in root or "_growth_tracker" in root):
        return key, root
    for name, value in root.items():
        found = find_scaler(value, depth + 1, _join(key, str(name)))
        if found is not None:
            return found
    return None


def step_from_name(path: str) -> tuple[int | None, str | None]:
    """A step number in the file name (``epoch=3-step=120.ckpt``, ``step_1200.pt``), or
    else in the folder's (``checkpoint-500/``, ``global_step500/``, the folder above a
    DeepSpeed tag folder named ``checkpoint``), with which it was."""
    folder = os.path.dirname(path)
    names = [(os.path.basename(path), "file name"), (os.path.basename(folder), "folder name")]
    if names[1][0] == "checkpoint":  # Lightning's DeepSpeed strategy: <name>.ckpt/checkpoint/
        names.append((os.path.basename(os.path.dirname(folder)), "folder name"))
    for part, source in names:
        stem = part.split(".", 1)[0]
        if source == "folder name" and _ACCELERATE_SAVE.fullmatch(stem) and \
                os.path.basename(os.path.dirname(folder)) == "checkpoints":
            continue
        found = _STEP_IN_NAME.findall(stem)
        if found:
            return int(found[-1]), source
    return None, None


def epoch_from_name(path: str) -> int | None:
    """An epoch number in the file name (``model_epoch3.pt``, ``epoch=3.ckpt``)."""
    found = _EPOCH_IN_NAME.findall(os.path.basename(path).split(".", 1)[0])
    return int(found[-1]) if found else None
