"""What every generator shares: offline settings, seeding, a tiny synthetic regression."""

from __future__ import annotations

import os
import random
from typing import Any

OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # Every progress-bar update reaches the log, so what it shows does not depend on speed.
    "TQDM_MININTERVAL": "0",
}


def offline() -> None:
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)


def seed(value: int = 0) -> None:
    import numpy as np
    import torch

    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    torch.set_num_threads(1)


def regression(n: int = 64, features: int = 4, *, value: int = 0) -> Any:
    """A noisy linear target: a TensorDataset of (x, y), the same for every seed value."""
    import torch
    from torch.utils.data import TensorDataset

    gen = torch.Generator().manual_seed(value)
    x = torch.randn(n, features, generator=gen)
    w = torch.arange(1, features + 1, dtype=torch.float32)
    y = (x @ w).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=gen)
    return TensorDataset(x, y)
