"""torch on one thread during a scan, without importing torch for a scan that does not
need it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

_pinning: list[int | None] = []
"""One entry per open :func:`single_threaded`: the thread count torch had before it was
pinned to one, or None while torch has not been pinned (not imported yet)."""


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one thread for the duration, then restore the setting.

    The reductions here are memory-bound; on a shared or busy machine every parallel
    region also waits for a second thread to be scheduled, which made each 4 MiB chunk
    several times slower than on one thread. One thread also fixes the order of torch's
    sums, which :mod:`npsum` reproduces. torch is not imported for this: a scan that
    never needs it never loads it, and one that does pins it when it first asks for it
    (:func:`torch_pinned`).
    """
    _pinning.append(None)
    if "torch" in sys.modules:
        torch_pinned()
    try:
        yield
    finally:
        before = _pinning.pop()
        if before is not None:
            sys.modules["torch"].set_num_threads(before)


def torch_pinned() -> ModuleType:
    """torch, set to one thread when inside :func:`single_threaded` (the first call in
    it imports torch where needed and pins it; later ones only return it)."""
    import torch

    if _pinning and _pinning[-1] is None:
        _pinning[-1] = torch.get_num_threads()
        torch.set_num_threads(1)
    return torch
