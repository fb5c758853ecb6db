"""The corpus's healthy controls: runs that look alarming in places and did not fail.

Each is a trap for a rule that fires on a symptom alone: GradScaler skips that recover,
loss spikes that recover, a loss of exactly 0, a long run, values that are huge but finite.
"""

from __future__ import annotations

import torch

from analyzer.capture import Factory
from analyzer.scenarios.corpus import streams
from analyzer.scenarios.corpus.cases import HEALTHY, Case, make
from analyzer.scenarios.harness import StepHook

M = "analyzer.scenarios.models"
L = "analyzer.scenarios.losses"


def _restarts(every: int, peak: float, base: float):  # type: ignore[no-untyped-def]
    """Warm restarts: ``peak`` for one step every ``every`` steps, ``base`` otherwise."""

    def schedule(optimizer: torch.optim.Optimizer) -> StepHook:
        def hook(step: int, model: torch.nn.Module) -> None:
            lr = peak if step % every == every - 1 else base
            for group in optimizer.param_groups:
                group["lr"] = lr

        return hook

    return schedule


def _mlp(i: int, h: int, o: int, depth: int = 2) -> Factory:
    return Factory(f"{M}:mlp", {"in_features": i, "hidden": h, "out_features": o,
                                "depth": depth})


CASES: tuple[Case, ...] = (
    make("healthy_amp_warmup_cnn", "cnn", HEALTHY,
         title="AMP float16 CNN with BatchNorm; the scaler skips its first steps and recovers",
         model=Factory(f"{M}:norm_cnn", {}), loss=Factory(f"{L}:cross_entropy"),
         batches=streams.images, optimizer="adam", lr=1e-3, steps=100, steps_per_epoch=16,
         log_style="deepspeed", logged="totals", autocast_dtype=torch.float16,
         scaler={"init_scale": 2.0**24, "growth_interval": 40}, benign_skips=True,
         checkpoint_every=50),
    make("healthy_loss_spikes", "mlp", HEALTHY,
         title="regression with a one-step warm restart every 40 steps: spikes that recover",
         model=_mlp(16, 64, 1, 3), loss=Factory(f"{L}:mse"), batches=streams.regression,
         optimizer="sgd", lr=0.01, steps=240, log_style="megatron", logged="totals",
         schedule=_restarts(40, 0.4, 0.01), checkpoint_every=60),
    make("healthy_zero_loss", "mlp", HEALTHY,
         title="multi-class hinge loss on separable clusters: the loss reaches exactly 0",
         model=_mlp(8, 32, 4), loss=Factory(f"{L}:hinge"),
         batches=lambda s: streams.blobs(s, spread=8.0), optimizer="adam", lr=0.01,
         steps=200, log_style="plain", logged="full", checkpoint_every=50),
    make("healthy_long_lstm", "recurrent", HEALTHY,
         title="a long LSTM regression run, logging only loss and lr, one checkpoint",
         model=Factory(f"{M}:recurrent", {"kind": "lstm", "hidden": 8}),
         loss=Factory(f"{L}:mse"), batches=lambda s: streams.sequences(s, length=8),
         optimizer="adam", lr=3e-3, steps=1500, steps_per_epoch=16, log_style="lightning",
         logged="loss_lr", env=False, checkpoint_every=1000),
    make("healthy_huge_values", "mlp", HEALTHY,
         title="regression on targets in the millions with Adam: losses near 1e12, finite",
         model=_mlp(16, 32, 1), loss=Factory(f"{L}:mse"),
         batches=lambda s: streams.regression(s, target_scale=1e6), optimizer="adam",
         lr=0.01, steps=200, log_style="huggingface", logged="full", checkpoint_every=50),
    make("healthy_vae", "generative", HEALTHY,
         title="VAE on binary images with the stable BCE-with-logits likelihood",
         model=Factory(f"{M}:tiny_vae", {}), loss=Factory(f"{L}:vae_elbo", {}),
         batches=streams.binary_images, optimizer="adam", lr=1e-3, steps=200,
         log_style="plain", logged="loss_lr", checkpoint_every=100),
    make("healthy_attention", "attention", HEALTHY,
         title="self-attention classifier with padding, trained the ordinary way",
         model=Factory(f"{M}:tiny_attention", {}), loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.tokens(s, short_every=5), optimizer="adam", lr=1e-3,
         steps=200, log_style="metric_logger", logged="layers", checkpoint_every=50),
    make("healthy_triplet", "metric", HEALTHY,
         title="triplet embedder with F.normalize-style safe distances",
         model=Factory(f"{M}:embedder", {}), loss=Factory(f"{L}:cosine_triplet"),
         batches=streams.triplets, optimizer="adam", lr=1e-3, steps=200,
         log_style="huggingface", logged="totals", checkpoint_every=50),
)
