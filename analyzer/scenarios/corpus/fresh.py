"""The corpus's fresh batch: failing cases and controls written after the post-hoc rules
were tuned, by someone who did not look at how the rules read them. All are ``heldout``
(:func:`analyzer.scenarios.corpus.cases.split`); none changes an earlier case's half.

Models and bugs differ from the first batch's (failing.py, healthy.py); each label is the
mechanism the training was built with, checked from what the run wrote
(tests/test_evaluation_fresh.py), never from what the analysis says.
"""

from __future__ import annotations

import math

import torch

from analyzer.capture import Factory
from analyzer.scenarios.corpus import streams
from analyzer.scenarios.corpus.cases import HEALTHY, Case, Schedule, make
from analyzer.scenarios.harness import StepHook

F = "analyzer.scenarios.corpus.fresh_models"
M = "analyzer.scenarios.models"
FRESH = "fresh"


def _at(step_lrs: dict[int, float]) -> Schedule:
    """A schedule that sets the learning rate to ``step_lrs[s]`` from step ``s`` on."""

    def schedule(optimizer: torch.optim.Optimizer) -> StepHook:
        def hook(step: int, model: torch.nn.Module) -> None:
            if step in step_lrs:
                for group in optimizer.param_groups:
                    group["lr"] = step_lrs[step]

        return hook

    return schedule


def _warm_up(hold: int, ramp: int, peak: float, start: float = 0.0) -> Schedule:
    """``start`` for ``hold`` steps, then linear up to ``peak`` over ``ramp`` steps."""

    def schedule(optimizer: torch.optim.Optimizer) -> StepHook:
        def hook(step: int, model: torch.nn.Module) -> None:
            frac = min(max(step - hold, 0) / ramp, 1.0) if step >= hold else 0.0
            lr = start + (peak - start) * frac if step >= hold else start
            for group in optimizer.param_groups:
                group["lr"] = lr

        return hook

    return schedule


def _gumbel_anneal(start: float, decay: float) -> StepHook:
    """tau = start * decay**step, with no floor (meant: per epoch, clamped at 0.5)."""

    def hook(step: int, model: torch.nn.Module) -> None:
        log_t: torch.Tensor = model.log_temperature  # type: ignore[assignment]
        log_t.fill_(math.log(start) + step * math.log(decay))

    return hook


FAILING: tuple[Case, ...] = (
    make("fresh_gat_isolated_node", "attention", "softmax-all-masked",
         title="graph attention (GAT) without self-loops; one graph has a node with no edge",
         model=Factory(f"{F}:graph_attention"), loss=Factory(f"{F}:node_cross_entropy"),
         batches=lambda s: streams.graphs(s, isolated_every=512), optimizer="adam",
         lr=3e-3, steps=200, log_style="lightning", logged="layers",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=15,
         batch=FRESH),
    make("fresh_mlp_weighted_sources", "mlp", "division-by-zero",
         title="regression with a per-record weighted mean; a switched-off source has "
         "weight 0 and fills a batch alone",
         model=Factory(f"{M}:mlp", {"in_features": 16, "hidden": 32, "out_features": 1}),
         loss=Factory(f"{F}:weighted_mse"), batches=streams.weighted_sources,
         optimizer="sgd", lr=0.02, optimizer_kwargs={"momentum": 0.9}, steps=400,
         log_style="megatron", logged="totals", stop_on_nonfinite_loss=False,
         steps_after_failure=2, checkpoint_every=40, batch=FRESH),
    make("fresh_mlp_deep_std1", "mlp", "bad-initialisation",
         title="ten-layer ReLU MLP initialised with normal_(std=1.0) instead of Kaiming",
         model=Factory(f"{F}:deep_mlp"), loss=Factory("analyzer.scenarios.losses:mse"),
         batches=streams.regression, optimizer="sgd", lr=1e-3, steps=100,
         log_style="megatron", logged="full", stop_on_nonfinite_loss=False,
         steps_after_failure=2, checkpoint_every=1, batch=FRESH),
    make("fresh_cnn_relu_counts", "cnn", "log-of-zero",
         title="object-counting CNN with a ReLU Poisson rate; the NLL takes log(rate)",
         model=Factory(f"{F}:counting_cnn"), loss=Factory(f"{F}:poisson_rate_nll"),
         batches=streams.count_images, optimizer="adam", lr=3e-3, steps=500,
         steps_per_epoch=16, log_style="huggingface", logged="loss_lr",
         checkpoint_every=100, batch=FRESH),
    make("fresh_cnn_raw_pcm", "cnn", "unnormalized-inputs",
         title="1-D CNN keyword spotter fed int16 PCM samples unscaled (about 2e4)",
         model=Factory(f"{F}:audio_cnn", {"negative_slope": 0.01}),
         loss=Factory("analyzer.scenarios.losses:cross_entropy"),
         batches=lambda s: streams.waveforms(s, peak=20000.0), optimizer="sgd", lr=0.01,
         optimizer_kwargs={"momentum": 0.9}, steps=200, steps_per_epoch=16,
         log_style="plain", logged="full", stop_on_nonfinite_loss=False,
         steps_after_failure=2, checkpoint_every=20, batch=FRESH),
    make("fresh_gru_masked_rmsnorm", "recurrent", "sqrt-at-zero-backward",
         title="GRU tagger zeroing padded states, then an RMSNorm with eps outside the sqrt",
         model=Factory(f"{F}:masked_rms_tagger"),
         loss=Factory(f"{F}:tagger_cross_entropy"),
         batches=lambda s: streams.markov_text(s, n=2048, left_pad_every=2048),
         optimizer="adam", lr=3e-3, steps=200, steps_per_epoch=64, log_style="deepspeed",
         logged="layers", stop_on_nonfinite_loss=False, steps_after_failure=2,
         checkpoint_every=25, checkpoint_after_failure=True, batch=FRESH),
    make("fresh_gru_csv_missing", "recurrent", "nan-in-batch",
         title="GRU over sensor series read from CSV; one empty cell parsed as NaN",
         model=Factory(f"{F}:sensor_gru"), loss=Factory("analyzer.scenarios.losses:mse"),
         batches=lambda s: streams.sensors(s, missing_at=333), optimizer="adam", lr=3e-3,
         steps=200, steps_per_epoch=16, log_style="plain", logged="none", env=False,
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=30,
         batch=FRESH),
    make("fresh_flow_unbounded_scale", "generative", "exp-overflow",
         title="RealNVP-style flow with an unbounded log-scale; one data column is "
         "constant 0",
         model=Factory(f"{F}:affine_flow"), loss=Factory(f"{F}:flow_nll"),
         batches=streams.flow_points, optimizer="adam", lr=1e-2, steps=600,
         log_style="lightning", logged="totals", log_name="stdout.txt", checkpoint_every=50,
         batch=FRESH),
    make("fresh_dvae_gumbel_anneal", "generative", "temperature-collapse",
         title="discrete VAE whose Gumbel-softmax temperature is annealed by 0.8 every "
         "step with no floor",
         model=Factory(f"{F}:gumbel_vae"), loss=Factory(f"{F}:bernoulli_recon"),
         batches=streams.binary_images, optimizer="adam", lr=3e-3, steps=500,
         on_step=_gumbel_anneal(1.0, 0.8), log_style="huggingface", logged="full",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=50,
         batch=FRESH),
    make("fresh_metric_restart_100x", "metric", "learning-rate-jump",
         title="triplet embedder whose warm restart resets the lr to 100x the base",
         model=Factory(f"{M}:embedder", {}), loss=Factory(f"{F}:triplet_squared"),
         batches=streams.triplets, optimizer="sgd", lr=0.01, steps=300,
         schedule=_at({150: 1.0}), log_style="metric_logger", logged="loss_lr",
         env=False, stop_on_nonfinite_loss=False, steps_after_failure=3, checkpoint_every=50,
         batch=FRESH),
)

CONTROLS: tuple[Case, ...] = (
    make("fresh_healthy_logc_plateau", "attention", HEALTHY,
         title="attention classifier with a zero-initialised head, held at lr 0 for 30 "
         "steps: the loss sits at exactly log(2), then trains",
         model=Factory(f"{F}:zero_head_classifier", {"classes": 2}),
         loss=Factory("analyzer.scenarios.losses:cross_entropy"),
         batches=lambda s: streams.tokens(s, short_every=7), optimizer="adam", lr=0.0,
         steps=160, schedule=_warm_up(30, 10, 3e-3), log_style="lightning",
         logged="loss_lr", checkpoint_every=40, batch=FRESH),
    make("fresh_healthy_one_spike", "recurrent", HEALTHY,
         title="clipped GRU regression; one mis-scaled target spikes the gradient once",
         model=Factory(f"{F}:sensor_gru"), loss=Factory("analyzer.scenarios.losses:mse"),
         # Record 1135 is drawn at step 70 of the first epoch (of 128 steps).
         batches=lambda s: streams.sensors(s, n=4096, outlier_at=1135), optimizer="adam",
         lr=3e-3, steps=120, grad_clip=1.0, log_style="megatron", logged="totals",
         checkpoint_every=60, batch=FRESH),
    make("fresh_healthy_amp_steep_warmup", "metric", HEALTHY,
         title="AMP float16 triplet embedder: a 5-step warm-up to 1e-2 and a few benign "
         "scaler skips",
         model=Factory(f"{M}:mlp", {"in_features": 16, "hidden": 64, "out_features": 8,
                                        "depth": 3, "activation": "gelu"}),
         loss=Factory("analyzer.scenarios.losses:cosine_triplet"), batches=streams.triplets,
         optimizer="adam", lr=1e-4, steps=200, schedule=_warm_up(0, 5, 1e-2, 1e-4),
         log_style="deepspeed", logged="totals", autocast_dtype=torch.float16,
         scaler={"init_scale": 2.0**24, "growth_interval": 50}, benign_skips=True,
         checkpoint_every=100, batch=FRESH),
)

CASES: tuple[Case, ...] = (*FAILING, *CONTROLS)
