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



# The fresh batch's streams (analyzer.scenarios.corpus.fresh).


def graphs(seed: int, n: int = 512, nodes: int = 6, features: int = 8, classes: int = 3,
           isolated_every: int = 0, batch: int = 16) -> Iterator[Batch]:
    """Small undirected graphs, each a ring plus random chords, packed as
    ``(nodes, features + nodes)`` (features, then adjacency rows; no self-loops); a
    node's label is the class its neighbours' features point to. In every
    ``isolated_every``-th graph the last node has lost its edges (a lone atom)."""
    g = _gen(seed)
    feats = torch.randn(n, nodes, features, generator=g)
    ring = torch.roll(torch.eye(nodes), 1, dims=1)
    chords = (torch.rand(n, nodes, nodes, generator=g) < 0.3).float()
    adj = ((ring + ring.T + chords + chords.transpose(1, 2)) > 0).float()
    adj = adj * (1 - torch.eye(nodes))
    if isolated_every:
        adj[::isolated_every, -1, :] = 0.0
        adj[::isolated_every, :, -1] = 0.0
    labels = (adj @ feats[..., :classes]).argmax(-1)
    return data.epochs((torch.cat([feats, adj], dim=-1), labels), batch, seed)


def weighted_sources(seed: int, sources: int = 8, batch: int = 16,
                     zero_weight_source: int = 7, share: float = 0.01) -> Iterator[Batch]:
    """A regression read one source (domain) per batch, sources drawn by size; targets
    carry a per-record weight column. Source ``zero_weight_source`` (a share ``share`` of
    the records) was switched off by giving its records weight 0."""
    x, y = data.linear_regression(4096, 16, 1, 0.1, seed)
    g = _gen(seed + 1)
    sizes = torch.full((sources,), (1.0 - share) / (sources - 1))
    sizes[zero_weight_source] = share
    source = torch.multinomial(sizes, x.shape[0], replacement=True, generator=g)
    weights = (source != zero_weight_source).float().unsqueeze(1)
    members = [torch.nonzero(source == s).squeeze(1) for s in range(sources)]
    while True:
        s = int(torch.multinomial(sizes, 1, generator=g))
        pick = members[s][torch.randint(0, len(members[s]), (batch,), generator=g)]
        yield x[pick], torch.cat([y[pick], weights[pick]], dim=1)


def waveforms(seed: int, n: int = 512, length: int = 512, classes: int = 4,
              peak: float = 1.0, batch: int = 32) -> Iterator[Batch]:
    """Tones of a class-dependent pitch in noise, at amplitude ``peak`` (int16 PCM read
    as is: ``peak`` about 2e4; scaled to [-1, 1]: ``peak`` 1)."""
    g = _gen(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    t = torch.arange(length, dtype=torch.float32)
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    freq = (labels.float().unsqueeze(1) + 1) * 0.05
    wave = 0.6 * torch.sin(freq * t + phase) + 0.2 * torch.randn(n, length, generator=g)
    return data.epochs(((wave * peak).round() if peak > 1 else wave * peak, labels), batch,
                       seed)


def sensors(seed: int, n: int = 512, length: int = 16, features: int = 3,
            missing_at: int | None = None, outlier_at: int | None = None,
            batch: int = 32) -> Iterator[Batch]:
    """Multivariate sensor series; the target is the mean of the first sensor's readings.
    With ``missing_at``, the table goes through a CSV file in which that record's reading
    is an empty cell, parsed as NaN as ``pandas.read_csv`` does. ``outlier_at``: that
    record's target is mis-scaled by 50 (a finite outlier)."""
    import csv
    import io

    g = _gen(seed)
    x = torch.randn(n, length, features, generator=g).cumsum(1) * 0.3
    y = x[:, :, 0].mean(1, keepdim=True)
    if outlier_at is not None:
        y[outlier_at] *= 50.0
    if missing_at is not None:
        text = io.StringIO()
        out = csv.writer(text)
        for i, series in enumerate(x.tolist()):
            for t, row in enumerate(series):
                cells = [f"{v:.6f}" for v in row]
                if i == missing_at and t == length // 2:
                    cells[1] = ""
                out.writerow([i, t, *cells])
        text.seek(0)
        parsed = [[float(c) if c.strip() else math.nan for c in row[2:]]
                  for row in csv.reader(text)]
        x = torch.tensor(parsed).reshape(n, length, features)
    return data.epochs((x, y), batch, seed)


def flow_points(seed: int, n: int = 2048, batch: int = 64) -> Iterator[Batch]:
    """4-d points for density estimation: two noisy moons in the first two coordinates, a
    correlated third, and a fourth that a disconnected sensor left at exactly 0."""
    g = _gen(seed)
    angle = torch.rand(n, generator=g) * math.pi
    upper = torch.rand(n, generator=g) < 0.5
    px = torch.where(upper, torch.cos(angle), 1 - torch.cos(angle))
    py = torch.where(upper, torch.sin(angle), 0.5 - torch.sin(angle))
    pts = torch.stack([px, py], 1) + 0.1 * torch.randn(n, 2, generator=g)
    third = pts.sum(1, keepdim=True) * 0.5 + 0.1 * torch.randn(n, 1, generator=g)
    x = torch.cat([pts, third, torch.zeros(n, 1)], dim=1)
    return data.epochs((x, torch.zeros(n, dtype=torch.long)), batch, seed)


def count_images(seed: int, n: int = 512, size: int = 16, mean: float = 1.5,
                 batch: int = 32) -> Iterator[Batch]:
    """Noisy images holding a Poisson number of bright 3x3 squares; the target is the
    count (0 for an empty frame)."""
    g = _gen(seed)
    counts = torch.poisson(torch.full((n,), mean), generator=g).clamp(max=6)
    x = 0.2 * torch.rand(n, 1, size, size, generator=g)
    for i in range(n):
        for _ in range(int(counts[i])):
            r, c = torch.randint(0, size - 3, (2,), generator=g).tolist()
            x[i, 0, r : r + 3, c : c + 3] = 1.0
    return data.epochs((x, counts.unsqueeze(1)), batch, seed)
