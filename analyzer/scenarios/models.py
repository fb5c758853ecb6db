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
