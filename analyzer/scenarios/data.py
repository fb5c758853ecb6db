"""Seeded synthetic data sets and the batch streams the scenarios draw from.

Every stream is an endless iterator of ``(inputs, targets)`` built from a fixed data set
and a seeded ``torch.Generator``, so a scenario sees the same batches on every machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


def blobs(n: int, features: int, classes: int, spread: float, seed: int) -> Batch:
    """Gaussian clusters, one per class, ``spread`` apart: linearly separable when large."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g) * spread
    labels = torch.randint(0, classes, (n,), generator=g)
    points = centres[labels] + torch.randn(n, features, generator=g)
    return points, labels


def linear_regression(n: int, features: int, outputs: int, noise: float, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, outputs, generator=g) / features**0.5
    y = x @ w + noise * torch.randn(n, outputs, generator=g)
    return x, y


def epochs(data: Batch, batch_size: int, seed: int) -> Iterator[Batch]:
    """Shuffled mini-batches without replacement, epoch after epoch."""
    x, y = data
    g = torch.Generator().manual_seed(seed + 1)
    while True:
        order = torch.randperm(x.shape[0], generator=g)
        for start in range(0, x.shape[0] - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]


def with_replacement(data: Batch, batch_size: int, seed: int) -> Iterator[Batch]:
    """Mini-batches drawn with replacement (a ``RandomSampler(replacement=True)``)."""
    x, y = data
    g = torch.Generator().manual_seed(seed + 1)
    while True:
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=g)
        yield x[idx], y[idx]


def images_0_255(n: int, size: int, classes: int, seed: int) -> Batch:
    """Grey images stored as 0-255 intensities: a class-dependent pattern plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    patterns = torch.rand(classes, 1, size, size, generator=g)
    noise = torch.rand(n, 1, size, size, generator=g)
    pixels = (0.7 * patterns[labels] + 0.3 * noise) * 255.0
    return pixels.round(), labels


def sequences(n: int, length: int, features: int, seed: int) -> Batch:
    """Noise sequences whose label is the sign of the first step's first feature: the
    information sits ``length`` steps back from the prediction."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, features, generator=g)
    labels = (x[:, 0, 0] > 0).long()
    return x, labels


def sparse_counts(n: int, features: int, outputs: int, floor: float, seed: int) -> Batch:
    """Poisson count targets with a mean of at least ``floor`` per output: a row is all
    zero with probability at most ``exp(-floor * outputs)``, rare but not impossible."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, outputs, generator=g) * 0.3
    mean = torch.nn.functional.softplus(x @ w) + floor
    y = torch.poisson(mean, generator=g)
    return x, y
