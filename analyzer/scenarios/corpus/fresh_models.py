"""Models and losses of the corpus's fresh batch (:mod:`analyzer.scenarios.corpus.fresh`).

Kept apart from :mod:`analyzer.scenarios.models` and :mod:`analyzer.scenarios.losses`,
whose line numbers the sample runs' replays quote. Each fragile piece is written the way
real code gets it wrong; its docstring says what goes wrong and what the robust form is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# --- models -----------------------------------------------------------------------------


class GraphAttention(nn.Module):
    """One graph-attention layer (GAT) and a node classifier. The input packs each graph as
    ``(nodes, features + nodes)``: node features, then the adjacency row of each node.

    Scores of non-edges are set to ``-inf`` before the softmax, with no self-loops added:
    a node with no neighbour has a row of ``-inf`` only, and softmax turns it into NaN
    (``exp(-inf - (-inf))``). Adding self-loops, or a finite fill value, avoids it."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.features = features
        self.proj = nn.Linear(features, hidden, bias=False)
        self.att_src = nn.Linear(hidden, 1, bias=False)
        self.att_dst = nn.Linear(hidden, 1, bias=False)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, adj = x[..., : self.features], x[..., self.features :]
        h = self.proj(feats)
        scores = F.leaky_relu(self.att_dst(h) + self.att_src(h).transpose(-1, -2), 0.2)
        scores = scores.masked_fill(adj == 0, float("-inf"))
        alpha = torch.softmax(scores, dim=-1)
        mixed = F.elu(alpha @ h)
        out: torch.Tensor = self.head(mixed).flatten(0, -2)  # one row of logits per node
        return out


def graph_attention(features: int = 8, hidden: int = 16, classes: int = 3) -> GraphAttention:
    return GraphAttention(features, hidden, classes)


class ConvHead(nn.Module):
    """Two conv blocks and a linear head of ``labels`` outputs for small square images."""

    def __init__(self, labels: int, width: int, size: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.head = nn.Linear(width * (size // 4) ** 2, labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        out: torch.Tensor = self.head(x.flatten(1))
        return out


class CountingCNN(ConvHead):
    """An object-counting CNN whose predicted Poisson rate is ``relu(head)``, the head's
    bias started at the data's mean count. ReLU keeps the rate non-negative but reaches
    exactly 0, and the likelihood's ``log(rate)`` is then ``-inf``; ``softplus`` or
    predicting the log-rate (``F.poisson_nll_loss(log_input=True)``) avoids it."""

    def __init__(self, width: int, size: int, mean_count: float) -> None:
        super().__init__(1, width, size)
        with torch.no_grad():
            self.head.bias.fill_(mean_count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(super().forward(x))


def counting_cnn(width: int = 8, size: int = 16, mean_count: float = 1.5) -> CountingCNN:
    return CountingCNN(width, size, mean_count)


class AudioCNN(nn.Module):
    """A 1-D convolutional keyword classifier over waveforms."""

    def __init__(self, classes: int, width: int, negative_slope: float) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.conv1 = nn.Conv1d(1, width, 9, stride=4)
        self.conv2 = nn.Conv1d(width, width, 9, stride=4)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.conv1(x.unsqueeze(1)), self.negative_slope)
        x = F.leaky_relu(self.conv2(x), self.negative_slope)
        out: torch.Tensor = self.head(x.mean(dim=-1))
        return out


def audio_cnn(classes: int = 4, width: int = 16, negative_slope: float = 0.01) -> AudioCNN:
    return AudioCNN(classes, width, negative_slope)


class MaskedRMSTagger(nn.Module):
    """GRU tagger whose hidden states are zeroed at padding (``h * mask``), then
    RMS-normalised by hand as ``h / (sqrt(mean(h**2)) + eps)``.

    At a padded position the state is exactly 0: the forward is finite (``0 / eps``), but
    the derivative of sqrt at 0 is infinite, and the backward turns ``inf * 0`` into NaN,
    which the mask's product carries into the GRU's weights. ``rsqrt(mean + eps)`` (eps
    inside the root, as ``nn.RMSNorm`` does) avoids it."""

    def __init__(self, vocab: int, dim: int, classes: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.norm_weight = nn.Parameter(torch.ones(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x != 0).unsqueeze(-1).to(self.embed.weight.dtype)
        h, _ = self.gru(self.embed(x))
        h = h * mask
        rms = h.pow(2).mean(dim=-1, keepdim=True).sqrt()
        h = h / (rms + self.eps) * self.norm_weight
        out: torch.Tensor = self.head(h)  # per-token logits
        return out


def masked_rms_tagger(vocab: int = 16, dim: int = 16, classes: int = 16,
                      eps: float = 1e-6) -> MaskedRMSTagger:
    return MaskedRMSTagger(vocab, dim, classes, eps)


class SensorGRU(nn.Module):
    """GRU regression over multivariate sensor series."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        out: torch.Tensor = self.head(h[:, -1])
        return out


def sensor_gru(features: int = 3, hidden: int = 16) -> SensorGRU:
    return SensorGRU(features, hidden)


def deep_mlp(in_features: int = 16, hidden: int = 128, out_features: int = 1, depth: int = 10,
             std: float = 1.0) -> nn.Sequential:
    """A deep ReLU MLP whose weights are drawn from ``N(0, std**2)`` and biases zeroed, as
    ``nn.init.normal_(w, std=1.0)`` does: each layer multiplies the activations by about
    ``std * sqrt(hidden / 2)``. Kaiming's ``std = sqrt(2 / fan_in)`` keeps them level."""
    layers: list[nn.Module] = []
    widths = [in_features] + [hidden] * (depth - 1) + [out_features]
    for i in range(depth):
        linear = nn.Linear(widths[i], widths[i + 1])
        with torch.no_grad():
            nn.init.normal_(linear.weight, std=std)
            nn.init.zeros_(linear.bias)
        layers.append(linear)
        if i < depth - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class AffineCoupling(nn.Module):
    """A RealNVP-style normalizing flow of two affine couplings on 4-d data: each maps one
    half ``x2`` to ``x2 * exp(s) + t`` with ``(s, t)`` computed from the other half.

    The log-scale ``s`` is unbounded (no ``tanh``): where a data dimension is constant the
    likelihood grows without limit as ``s`` grows, until ``exp(s)`` overflows. Bounding it
    (``s = scale * tanh(s)``) or dequantising the constant dimension avoids it. Returns
    ``z`` and the per-dimension log-scales side by side."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net1 = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, 4))
        self.net2 = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x[:, :2], x[:, 2:]
        s1, t1 = self.net1(a).chunk(2, dim=1)
        b = b * torch.exp(s1) + t1
        s2, t2 = self.net2(b).chunk(2, dim=1)
        a = a * torch.exp(s2) + t2
        return torch.cat([a, b, s2, s1], dim=1)


def affine_flow(hidden: int = 32) -> AffineCoupling:
    return AffineCoupling(hidden)


class GumbelVAE(nn.Module):
    """A discrete VAE: the encoder's logits over ``codes`` categories go through a
    Gumbel-softmax at temperature ``exp(log_temperature)``, set by the training loop.

    ``softmax((logits + g) / tau)``: as tau goes to 0 the quotient overflows to ``inf``
    and the softmax gives ``inf - inf = NaN``; annealing schedules clamp tau (0.5 is
    usual). Returns the reconstruction logits."""

    def __init__(self, in_features: int, hidden: int, codes: int, temperature: float) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, codes))
        self.dec = nn.Sequential(nn.Linear(codes, hidden), nn.ReLU(),
                                 nn.Linear(hidden, in_features))
        self.register_buffer("log_temperature", torch.tensor(math.log(temperature)))
        self.noise = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.enc(x)
        u = torch.rand(logits.shape, generator=self.noise).clamp(1e-9, 1 - 1e-9)
        gumbel = -torch.log(-torch.log(u)).to(logits.dtype)
        log_t: torch.Tensor = self.log_temperature  # type: ignore[assignment]
        tau = torch.exp(log_t)
        code = torch.softmax((logits + gumbel) / tau, dim=-1)
        out: torch.Tensor = self.dec(code)
        return out


def gumbel_vae(in_features: int = 64, hidden: int = 32, codes: int = 8,
               temperature: float = 1.0) -> GumbelVAE:
    return GumbelVAE(in_features, hidden, codes, temperature)


class ZeroHeadClassifier(nn.Module):
    """Token-bag attention classifier whose output layer starts at zero (a recipe for
    fine-tuning heads): its first loss is exactly ``log(classes)``."""

    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.head = nn.Linear(dim, classes)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = x == 0
        h = self.embed(x)
        h, _ = self.attn(h, h, h, key_padding_mask=pad, need_weights=False)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        out: torch.Tensor = self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))
        return out


def zero_head_classifier(vocab: int = 32, dim: int = 16, classes: int = 4
                         ) -> ZeroHeadClassifier:
    return ZeroHeadClassifier(vocab, dim, classes)


# --- losses -----------------------------------------------------------------------------


def weighted_mse() -> LossFn:
    """Per-record weighted mean ``sum(w * e**2) / sum(w)``, the weights in the targets'
    second column. A batch whose weights are all 0 divides 0 by 0; ``clamp(min=eps)`` on
    the denominator, or skipping such a batch, avoids it."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        y, w = targets[:, :1], targets[:, 1:]
        return (w * (outputs - y).pow(2)).sum() / w.sum()

    return loss_fn


def poisson_rate_nll() -> LossFn:
    """Poisson negative log-likelihood of counts, written out: ``rate - y * log(rate)``."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs - targets * torch.log(outputs)).mean()

    return loss_fn


def flow_nll(dims: int = 4) -> LossFn:
    """The flow's negative log-likelihood under a standard normal base, per record:
    ``0.5 * |z|^2 - sum(s)`` (constants left out), from ``AffineCoupling``'s output."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z, s = outputs[:, :dims], outputs[:, dims:]
        return (0.5 * z.pow(2).sum(1) - s.sum(1)).mean()

    return loss_fn


def bernoulli_recon() -> LossFn:
    """Reconstruction loss of binary images (the stable BCE-with-logits)."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, targets, reduction="sum") / \
            outputs.shape[0]

    return loss_fn


def tagger_cross_entropy() -> LossFn:
    """Per-token cross-entropy, padding targets (``-1``) ignored."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten(),
                               ignore_index=-1)

    return loss_fn


def node_cross_entropy() -> LossFn:
    """Node classification: one label per node, the graphs of a batch flattened."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets.flatten())

    return loss_fn


def triplet_squared(margin: float = 1.0) -> LossFn:
    """Triplet loss on squared Euclidean distances of raw (unnormalised) embeddings."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        anchor, positive, negative = outputs[:, 0], outputs[:, 1], outputs[:, 2]
        d_pos = (anchor - positive).pow(2).sum(-1)
        d_neg = (anchor - negative).pow(2).sum(-1)
        return F.relu(d_pos - d_neg + margin).mean()

    return loss_fn
