"""Small model factories the sample runs train; captures name them as ``module:function``.

Each factory takes JSON keyword arguments only and returns a float32 module; a run that
trains in another dtype casts it afterwards, as the capture's ``dtype`` says.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def mlp(
    in_features: int,
    hidden: int,
    out_features: int,
    depth: int = 2,
    activation: str = "relu",
    init_scale: float = 1.0,
    seed: int | None = None,
) -> nn.Sequential:
    """``depth`` Linear layers named fc1..fcN with an activation between them.

    ``init_scale`` multiplies every default-initialised weight: 1.0 is PyTorch's own
    initialisation, larger values reproduce a badly scaled one.
    """
    if seed is not None:
        torch.manual_seed(seed)
    act: type[nn.Module] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}[activation]
    layers: dict[str, nn.Module] = {}
    widths = [in_features] + [hidden] * (depth - 1) + [out_features]
    for i in range(depth):
        layers[f"fc{i + 1}"] = nn.Linear(widths[i], widths[i + 1])
        if i < depth - 1:
            layers[f"act{i + 1}"] = act()
    model = nn.Sequential()
    for name, layer in layers.items():
        model.add_module(name, layer)
    if init_scale != 1.0:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("weight"):
                    param.mul_(init_scale)
    return model


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head for small square images."""

    def __init__(
        self, channels: int, classes: int, width: int, size: int, negative_slope: float
    ) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width * 2, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(width * 2 * (size // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.leaky_relu(self.conv1(x), self.negative_slope))
        x = self.pool(F.leaky_relu(self.conv2(x), self.negative_slope))
        out: torch.Tensor = self.fc(x.flatten(1))
        return out


def small_cnn(
    channels: int = 1,
    classes: int = 10,
    width: int = 8,
    size: int = 16,
    negative_slope: float = 0.1,
    seed: int | None = None,
) -> SmallCNN:
    if seed is not None:
        torch.manual_seed(seed)
    return SmallCNN(channels, classes, width, size, negative_slope)


class SequenceClassifier(nn.Module):
    """A vanilla ``nn.RNN`` over the sequence; the last hidden state feeds a linear head."""

    def __init__(self, in_features: int, hidden: int, classes: int, nonlinearity: str) -> None:
        super().__init__()
        self.rnn = nn.RNN(in_features, hidden, batch_first=True, nonlinearity=nonlinearity)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(x)
        out: torch.Tensor = self.head(states[:, -1])
        return out


def rnn_classifier(
    in_features: int = 4,
    hidden: int = 32,
    classes: int = 2,
    nonlinearity: str = "tanh",
    recurrent_scale: float = 1.0,
    identity_init: bool = False,
    seed: int | None = None,
) -> SequenceClassifier:
    """``identity_init`` starts the hidden-to-hidden weights at the identity (an IRNN);
    ``recurrent_scale`` then multiplies them."""
    if seed is not None:
        torch.manual_seed(seed)
    model = SequenceClassifier(in_features, hidden, classes, nonlinearity)
    recurrent: Any = model.rnn.weight_hh_l0
    with torch.no_grad():
        if identity_init:
            recurrent.copy_(torch.eye(hidden))
        recurrent.mul_(recurrent_scale)
    return model


class Embedder(nn.Module):
    """An MLP mapping inputs to embeddings, for metric-learning losses."""

    def __init__(self, in_features: int, hidden: int, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(x)))
        return out


def embedder(
    in_features: int = 16, hidden: int = 32, dim: int = 8, seed: int | None = None
) -> Embedder:
    if seed is not None:
        torch.manual_seed(seed)
    return Embedder(in_features, hidden, dim)


class FineTuneNet(nn.Module):
    """A backbone and a head, for runs that train the head first and unfreeze later."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.backbone = nn.Sequential()
        self.backbone.add_module("fc1", nn.Linear(in_features, hidden))
        self.backbone.add_module("act1", nn.Tanh())
        self.backbone.add_module("fc2", nn.Linear(hidden, hidden))
        self.backbone.add_module("act2", nn.Tanh())
        self.head = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.backbone(x))
        return out


def finetune_net(
    in_features: int = 16, hidden: int = 32, out_features: int = 1, seed: int | None = None
) -> FineTuneNet:
    if seed is not None:
        torch.manual_seed(seed)
    return FineTuneNet(in_features, hidden, out_features)


# The evaluation corpus's families (analyzer.scenarios.corpus): a CNN with normalisation
# layers, gated recurrent nets, self-attention, a VAE, a small language model, and embedders.


class NormCNN(nn.Module):
    """Conv -> norm -> ReLU twice, pooled, and a linear head; ``norm`` is ``batch``,
    ``instance`` or ``none``, with the normalisation's ``eps`` as given (0 divides by a
    zero variance). ``standardize`` first scales each image to zero mean and unit std by
    hand, with no guard for a constant image."""

    def __init__(self, channels: int, classes: int, width: int, size: int, norm: str,
                 eps: float, standardize: bool = False) -> None:
        super().__init__()
        self.standardize = standardize
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.norm1 = _norm2d(norm, width, eps)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.norm2 = _norm2d(norm, width, eps)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(width * (size // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.standardize:
            flat = x.flatten(1)
            x = ((flat - flat.mean(1, keepdim=True)) / flat.std(1, keepdim=True)).view_as(x)
        x = self.pool(torch.relu(self.norm1(self.conv1(x))))
        x = self.pool(torch.relu(self.norm2(self.conv2(x))))
        out: torch.Tensor = self.fc(x.flatten(1))
        return out


def _norm2d(norm: str, width: int, eps: float) -> nn.Module:
    if norm == "none":
        return nn.Identity()
    layer: type[nn.Module] = {"batch": nn.BatchNorm2d, "instance": nn.InstanceNorm2d}[norm]
    return layer(width, eps=eps)


def norm_cnn(channels: int = 1, classes: int = 4, width: int = 8, size: int = 16,
             norm: str = "batch", eps: float = 1e-5, init_scale: float = 1.0,
             standardize: bool = False, seed: int | None = None) -> NormCNN:
    if seed is not None:
        torch.manual_seed(seed)
    model = NormCNN(channels, classes, width, size, norm, eps, standardize)
    if init_scale != 1.0:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("weight") and param.dim() > 1:
                    param.mul_(init_scale)
    return model


class GatedRecurrent(nn.Module):
    """An LSTM, GRU or vanilla RNN over the sequence; the last state feeds a linear head."""

    def __init__(self, kind: str, in_features: int, hidden: int, outputs: int) -> None:
        super().__init__()
        cls: type[nn.Module] = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
        self.rnn = cls(in_features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(x)
        out: torch.Tensor = self.head(states[:, -1])
        return out


def recurrent(kind: str = "lstm", in_features: int = 4, hidden: int = 16, outputs: int = 1,
              seed: int | None = None) -> GatedRecurrent:
    if seed is not None:
        torch.manual_seed(seed)
    return GatedRecurrent(kind, in_features, hidden, outputs)


class TinyAttention(nn.Module):
    """One self-attention block over token ids, written out (as many research codes do):
    scores ``q k^T`` (scaled by ``1/sqrt(dim)`` unless ``scale`` is False), padding keys
    masked to -inf, a LayerNorm with the given ``eps``, mean-pooled into a linear head.
    Token 0 is padding; its embedding is zero (``padding_idx``)."""

    def __init__(self, vocab: int, dim: int, classes: int, eps: float, scale: bool,
                 positions: int) -> None:
        super().__init__()
        self.scale = scale
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.pos = nn.Embedding(positions, dim) if positions else None
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        if self.pos is not None:
            h = h + self.pos(torch.arange(tokens.shape[1]))
        h = self.norm(h)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2)
        if self.scale:
            scores = scores / q.shape[-1] ** 0.5
        pad = (tokens == 0).unsqueeze(1)
        scores = scores.masked_fill(pad, float("-inf"))
        h = h + self.out(torch.softmax(scores, dim=-1) @ v)
        out: torch.Tensor = self.head(h.mean(dim=1))
        return out


def tiny_attention(vocab: int = 32, dim: int = 16, classes: int = 2, eps: float = 1e-5,
                   scale: bool = True, positions: int = 16,
                   seed: int | None = None) -> TinyAttention:
    if seed is not None:
        torch.manual_seed(seed)
    return TinyAttention(vocab, dim, classes, eps, scale, positions)


class TinyVAE(nn.Module):
    """A VAE over flat binary images; returns ``[reconstruction logits, mu, logvar]``
    concatenated on the last axis, so a loss can take ``(outputs, targets)``."""

    def __init__(self, in_features: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.enc = nn.Linear(in_features, hidden)
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec1 = nn.Linear(latent, hidden)
        self.dec2 = nn.Linear(hidden, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        logits = self.dec2(torch.relu(self.dec1(z)))
        return torch.cat([logits, mu, logvar], dim=-1)


def tiny_vae(in_features: int = 64, hidden: int = 32, latent: int = 4,
             seed: int | None = None) -> TinyVAE:
    if seed is not None:
        torch.manual_seed(seed)
    return TinyVAE(in_features, hidden, latent)


class CharLM(nn.Module):
    """An autoregressive model: embedding, GRU, logits over the vocabulary at each step."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embed(tokens))
        out: torch.Tensor = self.head(states)
        return out


def char_lm(vocab: int = 16, dim: int = 16, seed: int | None = None) -> CharLM:
    if seed is not None:
        torch.manual_seed(seed)
    return CharLM(vocab, dim)


class TemperatureEmbedder(nn.Module):
    """An embedder of two views with a temperature ``exp(log_temperature)`` that nothing
    clamps (CLIP clamps its logit scale at 100), learned or set by an annealing schedule:
    the output holds both views' embeddings and the temperature as a last column."""

    def __init__(self, in_features: int, hidden: int, dim: int, temperature: float,
                 learnable: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.log_temperature = nn.Parameter(torch.tensor(temperature).log(),
                                            requires_grad=learnable)

    def forward(self, views: torch.Tensor) -> torch.Tensor:
        emb = self.fc2(torch.relu(self.fc1(views)))
        t = torch.exp(self.log_temperature).expand(*emb.shape[:-1], 1)
        return torch.cat([emb, t], dim=-1)


def temperature_embedder(in_features: int = 16, hidden: int = 32, dim: int = 8,
                         temperature: float = 1.0, learnable: bool = True,
                         seed: int | None = None) -> TemperatureEmbedder:
    if seed is not None:
        torch.manual_seed(seed)
    return TemperatureEmbedder(in_features, hidden, dim, temperature, learnable)


def relu_embedder(in_features: int = 16, hidden: int = 32, dim: int = 8,
                  seed: int | None = None) -> nn.Sequential:
    """Embeddings from a ReLU and bias-free layers: an all-zero input embeds to exactly 0."""
    if seed is not None:
        torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(in_features, hidden, bias=False))
    model.add_module("act1", nn.ReLU())
    model.add_module("fc2", nn.Linear(hidden, dim, bias=False))
    model.add_module("act2", nn.ReLU())
    return model


class CausalLM(nn.Module):
    """A one-block causal self-attention language model over token ids, written out:
    each position attends to itself and the positions before it, and padding keys (token
    0) are masked to -inf. A left-padded sequence's first positions see only padding."""

    def __init__(self, vocab: int, dim: int, positions: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.pos(torch.arange(n))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future | (tokens == 0).unsqueeze(1), float("-inf"))
        out: torch.Tensor = self.head(h + torch.softmax(scores, dim=-1) @ v)
        return out


def causal_lm(vocab: int = 16, dim: int = 16, positions: int = 24,
              seed: int | None = None) -> CausalLM:
    if seed is not None:
        torch.manual_seed(seed)
    return CausalLM(vocab, dim, positions)
