"""A training batch as the capture keeps it: any nest, saved so ``weights_only`` loads it.

A batch is whatever the loop hands its step: a tensor, a pair, an HF dict of
``input_ids``/``attention_mask``/``labels``, a list of dicts with strings and ints among
them. ``torch.load(weights_only=True)`` reads tensors, dicts, lists, tuples, numbers,
strings, booleans and None back, so those are kept as they are (tuples stay tuples) and
every tensor becomes a detached CPU copy. Other mappings (``BatchEncoding``, a
``UserDict``) become plain dicts with the same keys. Anything else (a custom object) cannot
be loaded back without unpickling code, so it is replaced by None and its place named in
``dropped`` (``batch['meta']``), which meta.json records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PLAIN = (bool, int, float, str, bytes, type(None))


def keepable(batch: Any, where: str = "batch") -> tuple[Any, list[str]]:
    """``batch`` as a nest ``torch.load(weights_only=True)`` reads back, and what was
    dropped from it."""
    dropped: list[str] = []
    return _keep(batch, where, dropped), dropped


def _keep(value: Any, where: str, dropped: list[str]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, Mapping):
        return {k: _keep(v, f"{where}[{k!r}]", dropped) for k, v in value.items()
                if isinstance(k, PLAIN)}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_keep(v, f"{where}[{i}]", dropped) for i, v in enumerate(value))
    if isinstance(value, list | tuple):  # a namedtuple is kept as the tuple of its fields
        items = [_keep(v, f"{where}[{i}]", dropped) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    dropped.append(f"{where} ({type(value).__name__})")
    return None


def tensors_of(batch: Any) -> list[Any]:
    """The tensors of a nest, in order."""
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in tensors_of(v)]
    if isinstance(batch, list | tuple):
        return [t for v in batch for t in tensors_of(v)]
    return []
