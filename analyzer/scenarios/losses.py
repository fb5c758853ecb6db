"""Loss factories: each returns ``loss_fn(outputs, targets) -> scalar tensor``.

Several are written the fragile way on purpose, the way the failing runs wrote them;
the docstrings say what goes wrong and what the robust form is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy() -> LossFn:
    """The robust classification loss (log-softmax fused with the NLL)."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.float(), targets)

    return loss_fn


def mse() -> LossFn:
    """Mean squared error, computed in the outputs' dtype (as the fp16 run did)."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(outputs, targets.to(outputs.dtype))

    return loss_fn


def log_of_softmax_nll() -> LossFn:
    """NLL of ``torch.log(F.softmax(logits))``: a class probability that underflows to 0
    gives log(0) = -inf. ``F.log_softmax`` or ``F.cross_entropy`` never forms the 0."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(outputs, dim=-1)
        return F.nll_loss(torch.log(probs), targets)

    return loss_fn


def relative_squared_error() -> LossFn:
    """Per-sample squared error divided by the target's squared norm, with no epsilon:
    an all-zero target row divides by zero."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        err = (outputs - targets).pow(2).sum(dim=1)
        scale = targets.pow(2).sum(dim=1)
        return (err / scale).mean()

    return loss_fn


def pairwise_contrastive(margin: float = 1.0) -> LossFn:
    """Contrastive loss over all pairs with distances ``sqrt(sum(d**2))``.

    Two identical embeddings (the same sample drawn twice) give a distance of exactly 0:
    finite forward, but the derivative of sqrt at 0 is infinite and the backward pass
    turns it into NaN. ``torch.sqrt(x + eps)`` or comparing squared distances avoids it.
    """

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = outputs.shape[0]
        i, j = torch.triu_indices(n, n, offset=1)
        diff = outputs[i] - outputs[j]
        dist = torch.sqrt(diff.pow(2).sum(dim=1))
        same = (targets[i] == targets[j]).to(outputs.dtype)
        pull = same * dist
        push = (1 - same) * F.relu(margin - dist).pow(2)
        return (pull + push).mean()

    return loss_fn
