"""The corpus's data sets and batch streams, seeded like :mod:`analyzer.scenarios.data`.

Only the bad-data streams put a non-finite value in the data (a damaged record); every
other failure of the corpus comes from training on finite data.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from analyzer.scenarios import data
from analyzer.scenarios.data import Batch


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def blobs(seed: int, n: int = 1024, features: int = 8, classes: int = 4, spread: float = 4.0,
          scale: float = 1.0, batch: int = 32) -> Iterator[Batch]:
    x, y = data.blobs(n, features, classes, spread, seed)
    return data.epochs((x * scale, y), batch, seed)


def binary_blobs(seed: int, batch: int = 32, spread: float = 4.0) -> Iterator[Batch]:
    """Two separable clusters, targets as float columns (for a one-logit classifier)."""
    x, y = data.blobs(1024, 8, 2, spread, seed)
    return data.epochs((x, y.float().unsqueeze(1)), batch, seed)


def regression(seed: int, features: int = 16, target_scale: float = 1.0,
               input_scale: float = 1.0, batch: int = 32) -> Iterator[Batch]:
    x, y = data.linear_regression(1024, features, 1, 0.1, seed)
    return data.epochs((x * input_scale, y * target_scale), batch, seed)


def counts(seed: int, batch: int = 32) -> Iterator[Batch]:
    """Poisson counts whose log-rate is linear in the inputs, rates up to a few hundred."""
    g = _gen(seed)
    x = torch.randn(1024, 8, generator=g)
    w = torch.randn(8, 1, generator=g) * 0.6
    y = torch.poisson(torch.exp(x @ w + 2.0), generator=g)
    return data.epochs((x, y), batch, seed)


def images(seed: int, n: int = 512, size: int = 16, classes: int = 4, blank_every: int = 0,
           inf_at: int | None = None, scale: float = 1.0, regression: bool = False,
           batch: int = 32) -> Iterator[Batch]:
    """Class patterns plus noise in [0, 1]; every ``blank_every``-th record is a blank
    (black) frame, and record ``inf_at`` decodes with one infinite pixel. ``regression``:
    the target is each image's mean brightness instead of its class."""
    g = _gen(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    patterns = torch.rand(classes, 1, size, size, generator=g)
    x = 0.7 * patterns[labels] + 0.3 * torch.rand(n, 1, size, size, generator=g)
    x = x * scale
    if blank_every:
        x[::blank_every] = 0.0
    if inf_at is not None:
        x[inf_at, 0, 3, 5] = float("inf")
    if regression:
        return data.epochs((x, x.mean(dim=(1, 2, 3)).unsqueeze(1) * 10.0), batch, seed)
    return data.epochs((x, labels), batch, seed)


def sequences(seed: int, n: int = 512, length: int = 20, features: int = 4,
              offset: float = 0.0, scale: float = 1.0, nan_target_at: int | None = None,
              batch: int = 32) -> Iterator[Batch]:
    """Noisy sequences; the target is the sum of the first feature (a regression).
    ``offset``/``scale`` make raw measurements of them (timestamps, counters)."""
    g = _gen(seed)
    x = torch.randn(n, length, features, generator=g)
    y = x[:, :, :1].sum(dim=1) / length**0.5
    x = x * scale + offset
    if nan_target_at is not None:
        y[nan_target_at] = float("nan")
    return data.epochs((x, y), batch, seed)


def tokens(seed: int, n: int = 1024, length: int = 16, vocab: int = 32, empty_every: int = 0,
           short_every: int = 0, batch: int = 32) -> Iterator[Batch]:
    """Token ids 1..vocab-1 padded with 0 at the end; the label says whether token 1
    occurs more often than token 2. Every ``empty_every``-th record is empty (all
    padding), every ``short_every``-th is half padding."""
    g = _gen(seed)
    x = torch.randint(1, vocab, (n, length), generator=g)
    if short_every:
        x[::short_every, length // 2 :] = 0
    if empty_every:
        x[::empty_every] = 0
    y = ((x == 1).sum(1) > (x == 2).sum(1)).long()
    return data.epochs((x, y), batch, seed)


def markov_text(seed: int, n: int = 512, length: int = 24, vocab: int = 16,
                unlabelled: float = 0.0, sharpness: float = 6.0, left_pad_every: int = 0,
                batch: int = 32) -> Iterator[Batch]:
    """Sequences from a sparse random Markov chain (the larger ``sharpness``, the more
    nearly deterministic; ``inf``: each token has one successor): inputs and next-token
    targets. A share ``unlabelled`` of the records has every target masked (``-1``);
    with ``left_pad_every``, tokens are 1..vocab-1 and every such record is a short one,
    left-padded with token 0 (its padded targets ``-1``)."""
    g = _gen(seed)
    if sharpness == math.inf:
        trans = torch.eye(vocab)[torch.randperm(vocab, generator=g)]
    else:
        trans = torch.rand(vocab, vocab, generator=g) ** sharpness
    trans = trans / trans.sum(1, keepdim=True)
    seq = torch.zeros(n, length + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(length):
        seq[:, t + 1] = torch.multinomial(trans[seq[:, t]], 1, generator=g).squeeze(1)
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    if left_pad_every:
        x, y = x % (vocab - 1) + 1, y % (vocab - 1) + 1
        x[::left_pad_every, : length // 3] = 0
        y[::left_pad_every, : length // 3] = -1
    if unlabelled:
        drop = torch.rand(n, generator=g) < unlabelled
        y[drop] = -1
    return data.epochs((x, y), batch, seed)


def binary_images(seed: int, n: int = 512, features: int = 64, flip: float = 0.05,
                  batch: int = 32) -> Iterator[Batch]:
    """Flat binary images (four stroke patterns, a share ``flip`` of pixels flipped);
    target = input."""
    g = _gen(seed)
    patterns = (torch.rand(4, features, generator=g) > 0.5).float()
    which = torch.randint(0, 4, (n,), generator=g)
    flips = (torch.rand(n, features, generator=g) < flip).float()
    x = (patterns[which] - flips).abs()
    return data.epochs((x, x), batch, seed)


def triplets(seed: int, per_class: int = 400, classes: int = 4, features: int = 16,
             zero_every: int = 0, batch: int = 16) -> Iterator[Batch]:
    """(anchor, positive, negative) triples drawn with replacement; the positive is drawn
    from the anchor's class, so now and then it is the anchor itself. Every
    ``zero_every``-th record has all its features missing (zeros)."""
    x, y = data.blobs(per_class * classes, features, classes, 3.0, seed)
    if zero_every:
        x[::zero_every] = 0.0
    members = [torch.nonzero(y == c).squeeze(1) for c in range(classes)]
    g = _gen(seed + 1)
    while True:
        a = torch.randint(0, x.shape[0], (batch,), generator=g)
        pos = torch.stack([members[int(y[i])][torch.randint(0, len(members[int(y[i])]), (1,),
                                                            generator=g)][0] for i in a])
        neg = torch.randint(0, x.shape[0], (batch,), generator=g)
        yield torch.stack([x[a], x[pos], x[neg]], dim=1), y[a]


def views(seed: int, features: int = 16, noise: float = 0.3, batch: int = 32
          ) -> Iterator[Batch]:
    """Two noisy views of each point, for contrastive (InfoNCE) training."""
    x, y = data.blobs(2048, features, 16, 2.0, seed)
    g = _gen(seed + 1)
    while True:
        idx = torch.randint(0, x.shape[0], (batch,), generator=g)
        base = x[idx]
        pair = torch.stack([base + noise * torch.randn(base.shape, generator=g),
                            base + noise * torch.randn(base.shape, generator=g)], dim=1)
        yield pair, y[idx]

