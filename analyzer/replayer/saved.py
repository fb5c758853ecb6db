"""The files of a replay from a checkpoint: the checkpoint itself, its optimizer state, and
the batch the user supplies (:mod:`analyzer.replayer.from_checkpoint` puts them together).

Every ``.pt`` file is read with ``torch.load(weights_only=True)`` through
:func:`analyzer.replayer.loading.load_pt`, safetensors and numpy files (``allow_pickle=False``)
from bytes read through :mod:`analyzer.ingest.safeio`: a file that needs unpickling is
refused, never loaded another way.

Which save is taken by default is the tool's own checkpoint scan's answer
(:mod:`analyzer.ingest.checkpoints`): the last, in its step order, whose weights are all
finite. A Hugging Face checkpoint is its folder (config.json, model.safetensors or
pytorch_model.bin, optimizer.pt); anything else one file, a Lightning save recognised by
its version key and hyperparameters.

The optimizer's class is not saved by torch, Lightning or the Trainer: it is the
``torch.optim`` class whose param groups hold the names the saved groups hold. The saved
state numbers parameters 0.. across its groups; it is taken only when it fits the model in
one of the orders an optimizer lists them in (the model's, the Trainer's decayed-first),
every saved moment having its parameter's shape.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from analyzer.capture.folder import MetaError, read_json_object
from analyzer.errors import UsageError
from analyzer.ingest.safeio import NotRegularFile, read_regular
from analyzer.replayer.errors import CaptureError
from analyzer.replayer.loading import load_pt

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""The weight files of a Hugging Face checkpoint folder, in the order they are taken."""
HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
HF_OPTIMIZER = "optimizer.pt"
ACCELERATE_OPTIMIZERS = ("optimizer.bin", "optimizer.pt")
"""Where ``Accelerator.save_state`` puts the optimizer, beside ``model.safetensors``."""
_STATE_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
_OPTIMIZER_KEYS = ("optimizer_states", "optimizer_state_dict", "optimizer", "optim", "opt")
_STEP_KEYS = ("global_step", "step", "iteration", "iter")


@dataclass
class Saved:
    """One checkpoint, read: the model's tensors and whatever else it says."""

    path: str
    kind: str  # "huggingface", "lightning" or "torch"
    weights: dict[str, Any]
    step: int | None
    config: dict[str, Any] | None = None
    hyper: Mapping[str, Any] | None = None
    hparams_name: str | None = None
    optimizer: Any = None
    notes: list[str] = field(default_factory=list)


# --- finding and reading the checkpoint ----------------------------------------------------


def last_finite_checkpoint(run: str, run_roots: Sequence[str] = ()) -> tuple[str, int | None]:
    """The run's last save (in the checkpoint scan's step order) whose weights are all
    finite: a file, or the Hugging Face folder holding it; UsageError when there is none."""
    from analyzer.ingest.checkpoints import scan_run_checkpoints
    from analyzer.ingest.discover import discover

    files = [f for r in discover([run], run_roots=run_roots).runs for f in r.checkpoint_files]
    if not files:
        raise UsageError(f"{run}: no checkpoint found to replay from; name one with "
                         "--checkpoint PATH")
    history = scan_run_checkpoints(sorted(set(files)))
    good = [s for s in history.scans
            if any(t.role == "weights" for t in s.tensors)
            and not any(t.role == "weights" and t.stats is not None and t.stats.nonfinite
                        for t in s.tensors)]
    if not good:
        raise UsageError(f"{run}: none of its {len(history.scans)} checkpoint file(s) holds "
                         "model weights that are all finite; name one with --checkpoint PATH")
    path = good[-1].path
    folder = os.path.dirname(path)
    name = os.path.basename(path)
    if (name in HF_WEIGHTS or name in HF_INDEXES) and \
            os.path.isfile(os.path.join(folder, "config.json")):
        path = folder
    return path, good[-1].step


def read_checkpoint(path: str) -> Saved:
    """Read the checkpoint at ``path`` (weights_only); UsageError or CaptureError naming
    the file when it cannot be taken."""
    if not os.path.lexists(path):
        raise UsageError(f"--checkpoint {path}: no such file or folder")
    if os.path.isdir(path):
        return _read_hf_folder(path)
    name = os.path.basename(path)
    folder = os.path.dirname(path) or "."
    if (name in HF_WEIGHTS or name in HF_INDEXES) and \
            os.path.isfile(os.path.join(folder, "config.json")):
        return _read_hf_folder(folder)
    if name in HF_INDEXES:
        root: Any = _load_shards(path)
    else:
        root = _load_safetensors(path) if name.endswith(".safetensors") else _load_pt(path)
    if not isinstance(root, dict):
        raise CaptureError(path, f"holds a {type(root).__name__}, not a state dict or a "
                                 "dict of saved sections")
    step = _step_of(root, path)
    if "pytorch-lightning_version" in root or "hyper_parameters" in root:
        hyper = root.get("hyper_parameters")
        name_key = root.get("hparams_name")
        return Saved(path, "lightning", _weights(root, path), step,
                     hyper=hyper if isinstance(hyper, dict) else None,
                     hparams_name=name_key if isinstance(name_key, str) else None,
                     optimizer=root.get("optimizer_states"))
    optimizer = next((root[k] for k in _OPTIMIZER_KEYS if k in root), None)
    notes: list[str] = []
    if optimizer is None:
        optimizer = _beside(folder, ACCELERATE_OPTIMIZERS, notes)
    return Saved(path, "torch", _weights(root, path), step, optimizer=optimizer, notes=notes)


def _read_hf_folder(folder: str) -> Saved:
    config_path = os.path.join(folder, "config.json")
    try:
        config = read_json_object(config_path, "model's config.json")
    except FileNotFoundError:
        raise UsageError(f"--checkpoint {folder}: a folder without config.json is not a Hugging "
                         "Face checkpoint; name the weights file itself") from None
    except MetaError as exc:
        raise CaptureError(exc.path, exc.reason) from None
    names = [n for n in (*HF_WEIGHTS, *HF_INDEXES) if os.path.isfile(os.path.join(folder, n))]
    if not names:
        raise UsageError(f"--checkpoint {folder}: holds none of "
                         f"{', '.join((*HF_WEIGHTS, *HF_INDEXES))}")
    weights_file = os.path.join(folder, names[0])
    if names[0] in HF_INDEXES:
        weights: Any = _load_shards(weights_file)
    elif weights_file.endswith(".safetensors"):
        weights = _load_safetensors(weights_file)
    else:
        weights = _load_pt(weights_file)
    if not isinstance(weights, dict):
        raise CaptureError(weights_file, "is not a state dict")
    state = _trainer_state_step(folder)
    notes: list[str] = []
    optimizer = _beside(folder, (HF_OPTIMIZER,), notes)
    return Saved(folder, "huggingface", _weights(weights, weights_file),
                 state if state is not None else _step_of({}, weights_file), config=config,
                 optimizer=optimizer, notes=notes)


def _beside(folder: str, names: Sequence[str], notes: list[str]) -> Any:
    """The optimizer state saved beside the weights (the Trainer's optimizer.pt,
    Accelerate's optimizer.bin), or None; one that cannot be taken is a note, not a
    reason to give up the replay."""
    path = next((os.path.join(folder, n) for n in names
                 if os.path.isfile(os.path.join(folder, n))), None)
    if path is None:
        return None
    try:
        return _load_pt(path)
    except CaptureError as exc:
        notes.append(f"optimizer state not used: {exc}")
        return None


def _load_shards(index: str) -> dict[str, Any]:
    """The tensors of a sharded save, each shard named by the index a plain file beside it."""
    from analyzer.ingest.ckpt.sharded import read_weight_map

    try:
        weight_map, problem = read_weight_map(index)
    except OSError as exc:
        raise CaptureError(index, f"cannot be read: {exc}") from None
    if weight_map is None:
        raise CaptureError(index, problem or "holds no weight_map")
    folder = os.path.dirname(index)
    out: dict[str, Any] = {}
    for shard in dict.fromkeys(weight_map.values()):
        if os.path.basename(shard) != shard or shard in (".", ".."):
            raise CaptureError(index, f"names the shard {shard!r}, not a file beside it")
        path = os.path.join(folder, shard)
        if not os.path.isfile(path):
            raise CaptureError(index, f"names the shard {shard}, which is missing")
        tensors = _load_safetensors(path) if shard.endswith(".safetensors") else _load_pt(path)
        if not isinstance(tensors, dict):
            raise CaptureError(path, "is not a state dict shard")
        out.update(tensors)
    return out


def _load_pt(path: str) -> Any:
    try:
        head = read_regular(path, 4)
    except NotRegularFile as exc:
        raise CaptureError(path, str(exc)) from None
    except OSError as exc:
        raise CaptureError(path, f"cannot be read: {exc.strerror or exc}") from None
    # torch.save writes a zip archive (or, before torch 1.6, a pickle): a text file's
    # refusal would otherwise read as a pickle weights_only declined
    if not (head.startswith(b"PK") or head[:1] == b"\x80"):
        raise CaptureError(path, "cannot be read: not a file torch.save writes (neither a zip "
                                 "archive nor a pickle)")
    return load_pt(os.path.dirname(path) or ".", os.path.basename(path))


def _load_safetensors(path: str) -> dict[str, Any]:
    from safetensors.torch import load

    try:
        return dict(load(read_regular(path)))
    except NotRegularFile as exc:
        raise CaptureError(path, str(exc)) from None
    except Exception as exc:  # safetensors reports a damaged header as its own error
        raise CaptureError(path, f"cannot be read as safetensors: {type(exc).__name__}: "
                                 f"{exc}") from None


def _weights(root: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The model's state dict inside a save: the save itself when it is one, else the
    first of the usual section names holding one."""
    if root and all(isinstance(v, torch.Tensor) for v in root.values()):
        return dict(root)
    for key in _STATE_KEYS:
        value = root.get(key)
        if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor)
                                                     for v in value.values()):
            return dict(value)
    raise CaptureError(path, "holds no model state dict (a dict of tensors, or one under "
                             f"{', '.join(repr(k) for k in _STATE_KEYS)})")


def _step_of(root: Mapping[str, Any], path: str) -> int | None:
    for key in _STEP_KEYS:
        value = root.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    from analyzer.ingest.ckpt.tree import step_from_name

    return step_from_name(path)[0]


def _trainer_state_step(folder: str) -> int | None:
    try:
        value = read_json_object(os.path.join(folder, "trainer_state.json"),
                                 "trainer_state.json").get("global_step")
    except (FileNotFoundError, MetaError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_batch(path: str) -> Any:
    """A batch file: a ``.pt`` (weights_only) holding any nest of tensors, or numpy's
    ``.npy``/``.npz`` (no pickles); UsageError naming the file when it cannot be taken."""
    if not os.path.lexists(path):
        raise UsageError(f"--batch {path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"--batch {path}: a folder, not a batch file")
    if path.lower().endswith((".npy", ".npz")):
        return _read_numpy(path)
    try:
        return _load_pt(path)
    except CaptureError as exc:
        raise UsageError(f"--batch {exc}") from None


def _read_numpy(path: str) -> Any:
    import numpy as np

    try:
        data = np.load(io.BytesIO(read_regular(path)), allow_pickle=False)
        if isinstance(data, np.ndarray):
            return torch.from_numpy(data.copy())
        arrays = {k: torch.from_numpy(data[k].copy()) for k in data.files}
    except NotRegularFile as exc:
        raise UsageError(f"--batch {path}: {exc}") from None
    except Exception as exc:  # numpy's refusal of pickled objects and of damage alike
        raise UsageError(f"--batch {path}: cannot be read by numpy without pickles: "
                         f"{type(exc).__name__}: {exc}") from None
    positional = [f"arr_{i}" for i in range(len(arrays))]
    if sorted(arrays) == sorted(positional):  # np.savez(file, x, y)
        return tuple(arrays[k] for k in positional)
    return arrays


# --- the optimizer's state -----------------------------------------------------------------


def saved_optimizer(model: nn.Module,
                    saved: Saved) -> tuple[torch.optim.Optimizer, str | None, str]:
    """The checkpoint's optimizer when its state fits the model: (optimizer, its class name
    or None for the lr=0 stand-in, a note)."""
    state = saved.optimizer
    why = "the checkpoint holds no optimizer state"
    if isinstance(state, list):  # Lightning's optimizer_states, one per optimizer
        why = f"it holds {len(state)} optimizer states, not one" if len(state) != 1 else why
        state = state[0] if len(state) == 1 else None
    if isinstance(state, dict):
        restored, name = _restore(model, state, is_hf_model(model))
        if restored is None:
            why = name
        else:
            return restored, name, (f"optimizer: {name} with the checkpoint's state (its class "
                                    "read from the hyperparameter names the state holds)")
    stand_in = torch.optim.SGD(model.parameters(), lr=0.0)
    return stand_in, None, (f"optimizer: SGD with lr=0, since {why}: the update phase says "
                            "nothing; forward and backward still say where")


def _restore(model: nn.Module, state: Mapping[str, Any],
             hf: bool) -> tuple[torch.optim.Optimizer | None, str]:
    groups, per_param = state.get("param_groups"), state.get("state")
    if not (isinstance(groups, list) and groups and isinstance(per_param, dict)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)):
        return None, "its optimizer state is not a torch optimizer's state_dict"
    cls = optimizer_class(groups[0])
    if cls is None:
        keys = ", ".join(sorted(str(k) for k in groups[0] if k != "params"))
        return None, f"its optimizer's hyperparameters ({keys}) match no torch.optim class"
    sizes = [len(g["params"]) for g in groups]
    for order in _orders(model, hf):
        split = _split(order, sizes, per_param)
        if split is None:
            continue
        try:
            make: Any = cls  # a torch.optim class: its own __init__ has the defaults
            optimizer = make([{"params": ps} for ps in split])
            optimizer.load_state_dict(dict(state))
        except Exception:  # the next order, else the stand-in
            continue
        return optimizer, f"torch.optim.{cls.__name__}"
    return None, (f"its optimizer state ({sum(sizes)} parameters in {len(sizes)} groups) does "
                  f"not fit the model's {len(list(model.parameters()))} parameters")


def optimizer_class(group: Mapping[str, Any]) -> type[torch.optim.Optimizer] | None:
    """The ``torch.optim`` class whose param groups hold the names a saved group holds
    (less ``params`` and a scheduler's ``initial_lr``; an older torch may have saved fewer),
    closest first; Adam and AdamW, which share them, told apart by
    ``decoupled_weight_decay``."""
    keys = set(group) - {"params", "initial_lr"}
    ranked: list[tuple[int, int, str, type[torch.optim.Optimizer]]] = []
    for name, cls, held in _group_keys():
        if keys <= held:
            decoupled = bool(group.get("decoupled_weight_decay"))
            preferred = 0 if (name == "AdamW") == decoupled else 1
            ranked.append((len(held - keys), preferred, name, cls))
    return min(ranked)[3] if ranked else None


@functools.cache
def _group_keys() -> tuple[tuple[str, type[torch.optim.Optimizer], frozenset[str]], ...]:
    """Each torch.optim class and the names its param groups hold, read from one built
    over a dummy parameter (its defaults, which a signature does not always show)."""
    out = []
    for name in getattr(torch.optim, "__all__", ()):
        cls = getattr(torch.optim, name, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or \
                cls is torch.optim.Optimizer:
            continue
        make: Any = cls
        try:
            groups = make([torch.zeros(2, 2, requires_grad=True)]).param_groups
        except Exception:  # a class that needs arguments no default gives
            continue
        out.append((name, cls, frozenset(groups[0]) - {"params"}))
    return tuple(out)


def _orders(model: nn.Module, hf: bool) -> list[list[nn.Parameter]]:
    """The orders an optimizer may have listed the model's parameters in: the Hugging Face
    Trainer's (weight-decayed ones first, then the rest) for its models, and the model's."""
    params = [p for p in model.parameters() if p.requires_grad]
    orders = [params]
    if hf:
        try:
            from transformers import Trainer

            decay = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
        except Exception:
            return orders
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        orders.insert(0, [p for n, p in named if n in decay] + [p for n, p in named
                                                                 if n not in decay])
    return orders


def _split(order: list[nn.Parameter], sizes: list[int],
           per_param: Mapping[Any, Any]) -> list[list[nn.Parameter]] | None:
    """``order`` cut into the saved groups, when every saved state tensor has its
    parameter's shape (a state_dict numbers parameters 0.. across its groups, in order)."""
    if sum(sizes) != len(order):
        return None
    for index, entry in per_param.items():
        if not (isinstance(index, int) and 0 <= index < len(order) and isinstance(entry, dict)):
            return None
        for value in entry.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and \
                    value.shape != order[index].shape:
                return None
    out, start = [], 0
    for size in sizes:
        out.append(order[start:start + size])
        start += size
    return out


def is_hf_model(model: Any) -> bool:
    return is_a(model, "transformers", "PreTrainedModel")


def is_a(obj: Any, package: str, name: str) -> bool:
    """Whether ``obj`` derives from ``package``'s class ``name``, importing nothing."""
    return any(c.__name__ == name and c.__module__.split(".")[0] == package
               for c in type(obj).__mro__)
