"""RNG states (python, numpy, torch, CUDA) as values torch.load(weights_only=True) opens."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any


def raw_rng(cuda: bool) -> tuple[Any, ...]:
    """The RNG states as their libraries return them: cheap, taken before every step."""
    import numpy as np
    import torch

    cuda_states = list(torch.cuda.get_rng_state_all()) if cuda else []
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda_states


def safe_rng(raw: tuple[Any, ...]) -> dict[str, Any]:
    """Raw RNG states as tensors and plain lists, so that ``weights_only`` loading opens them."""
    import numpy as np
    import torch

    (version, keys, gauss), np_state, torch_state, cuda_states = raw
    bit_generator, key, pos, has_gauss, cached = np_state
    return {
        "torch": torch_state,
        "cuda": cuda_states,
        "numpy": {
            "bit_generator": str(bit_generator),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(cached),
        },
        "python": [int(version), [int(k) for k in keys], gauss],
    }


def rng_state() -> dict[str, Any]:
    """RNG states of python, numpy and torch (CPU and every CUDA device), weights_only-safe."""
    import torch

    return safe_rng(raw_rng(torch.cuda.is_available()))


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set the RNG states saved by :func:`rng_state` (as loaded from ``rng.pt``)."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))
    np_state = state.get("numpy")
    if np_state:
        np.random.set_state(
            {
                "bit_generator": np_state["bit_generator"],
                "state": {
                    "key": np.asarray(np_state["key"].numpy(), dtype=np.uint32),
                    "pos": int(np_state["pos"]),
                },
                "has_gauss": int(np_state["has_gauss"]),
                "gauss": float(np_state["gauss"]),
            }
        )
    py_state = state.get("python")
    if py_state:
        random.setstate((int(py_state[0]), tuple(int(k) for k in py_state[1]), py_state[2]))
