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


# The evaluation corpus's losses (analyzer.scenarios.corpus), each fragile in one way.


def poisson_exp() -> LossFn:
    """Poisson NLL with the rate written ``torch.exp(outputs)``: a log-rate past ~88.7
    overflows float32 to inf. ``F.poisson_nll_loss(log_input=True)`` keeps it in logs."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (torch.exp(outputs) - targets * outputs).mean()

    return loss_fn


def hand_bce() -> LossFn:
    """Binary cross-entropy written out on ``sigmoid(outputs)``: a probability that rounds
    to exactly 0 or 1 gives log(0); ``F.binary_cross_entropy_with_logits`` never does."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(outputs)
        t = targets.to(p.dtype)
        return -(t * torch.log(p) + (1 - t) * torch.log(1 - p)).mean()

    return loss_fn


def vae_elbo(in_features: int = 64, bce: str = "logits", beta: float = 1.0) -> LossFn:
    """Reconstruction plus KL; the KL is written with ``exp(logvar)`` as in most
    tutorials. ``bce`` is ``logits`` (the stable form) or ``naive`` (log of a sigmoid)."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = outputs[..., :in_features]
        mu, logvar = outputs[..., in_features:].chunk(2, dim=-1)
        if bce == "naive":
            p = torch.sigmoid(logits)
            rec = -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p)).sum(-1)
        else:
            rec = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
        kl = -0.5 * (1 + logvar - mu.pow(2) - torch.exp(logvar)).sum(-1)
        return (rec + beta * kl).mean()

    return loss_fn




def masked_token_mean() -> LossFn:
    """Cross-entropy averaged over the tokens a mask keeps: ``sum / mask.sum()``, with no
    guard for a batch whose mask keeps none (0 / 0). Targets ``-1`` are masked out."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        keep = (targets >= 0).to(outputs.dtype)
        per = F.cross_entropy(outputs.flatten(0, 1), targets.clamp(min=0).flatten(),
                              reduction="none")
        return (per * keep.flatten()).sum() / keep.sum()

    return loss_fn


def sum_mse_over_n() -> LossFn:
    """Squared error summed, then divided by the batch size, in the outputs' dtype: in
    float16 the sum passes 65504 though every term is far below it."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        err = (outputs - targets.to(outputs.dtype)).pow(2)
        return err.sum() / outputs.shape[0]

    return loss_fn


def info_nce_learned_t() -> LossFn:
    """InfoNCE between two views, logits divided by the model's learnable temperature (its
    last output column); nothing keeps the temperature away from 0."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        emb, t = outputs[..., :-1], outputs[:, 0, -1:]
        a = F.normalize(emb[:, 0], dim=-1)
        b = F.normalize(emb[:, 1], dim=-1)
        logits = (a @ b.T) / t
        labels = torch.arange(a.shape[0])
        return F.cross_entropy(logits, labels)

    return loss_fn


def info_nce_naive(temperature: float = 0.1) -> LossFn:
    """InfoNCE on raw dot products with the log-sum-exp written ``log(exp(s).sum())``:
    a similarity past ~88.7 * temperature overflows exp. ``torch.logsumexp`` or
    ``F.cross_entropy`` subtracts the maximum first."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        a, b = outputs[:, 0], outputs[:, 1]
        sims = (a @ b.T) / temperature
        return (torch.log(torch.exp(sims).sum(dim=1)) - sims.diagonal()).mean()

    return loss_fn


def cosine_triplet(margin: float = 0.2) -> LossFn:
    """Triplet loss on embeddings normalised by hand, ``e / e.norm()``: an embedding of
    exactly 0 divides 0 by 0. ``F.normalize`` clamps the norm with an eps."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        e = outputs / outputs.norm(dim=-1, keepdim=True)
        anchor, positive, negative = e[:, 0], e[:, 1], e[:, 2]
        d_pos = (anchor - positive).pow(2).sum(-1)
        d_neg = (anchor - negative).pow(2).sum(-1)
        return F.relu(d_pos - d_neg + margin).mean()

    return loss_fn


def triplet_pow_half(margin: float = 1.0) -> LossFn:
    """Triplet loss with distances ``d.pow(2).sum().pow(0.5)``: an anchor equal to its
    positive has distance 0, and the backward of ``x ** 0.5`` at 0 is infinite."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        anchor, positive, negative = outputs[:, 0], outputs[:, 1], outputs[:, 2]
        d_pos = (anchor - positive).pow(2).sum(-1).pow(0.5)
        d_neg = (anchor - negative).pow(2).sum(-1).pow(0.5)
        return F.relu(d_pos - d_neg + margin).mean()

    return loss_fn


def hinge() -> LossFn:
    """Multi-class hinge loss: exactly 0 once every margin is met."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.multi_margin_loss(outputs, targets)

    return loss_fn


def lm_cross_entropy() -> LossFn:
    """Next-token cross-entropy; targets ``-1`` (padding) are ignored."""

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten(),
                               ignore_index=-1)

    return loss_fn
