"""The corpus's failing cases: real training that dies, by family, each of one cause.

Intended causes are rule names; those the catalogue does not have yet (``exp-overflow``,
``softmax-all-masked``, ``zero-variance-normalisation``, ``temperature-collapse``,
``fp16-reduction-overflow``) are the names issue #16's new rules are to take.
"""

from __future__ import annotations

import math

import torch

from analyzer.capture import Factory
from analyzer.scenarios.corpus import streams
from analyzer.scenarios.corpus.cases import Case, make
from analyzer.scenarios.harness import StepHook

PROPOSED: tuple[str, ...] = ()
"""Intended causes that no rule of the catalogue has yet (issue #16's new rules)."""

M = "analyzer.scenarios.models"
L = "analyzer.scenarios.losses"


def _lr_jump(at: int, to: float):  # type: ignore[no-untyped-def]
    """A schedule that sets the learning rate to ``to`` from step ``at`` (a warm restart
    configured with the wrong peak, a resumed run given the base lr of another)."""

    def schedule(optimizer: torch.optim.Optimizer) -> StepHook:
        def hook(step: int, model: torch.nn.Module) -> None:
            if step == at:
                for group in optimizer.param_groups:
                    group["lr"] = to

        return hook

    return schedule


def _anneal_temperature(start: float, decay: float) -> StepHook:
    def hook(step: int, model: torch.nn.Module) -> None:
        log_t: torch.Tensor = model.log_temperature  # type: ignore[assignment]
        with torch.no_grad():
            log_t.fill_(math.log(start) + step * math.log(decay))

    return hook


def _mlp(i: int, h: int, o: int, depth: int = 2, **kw: object) -> Factory:
    return Factory(f"{M}:mlp", {"in_features": i, "hidden": h, "out_features": o,
                                "depth": depth, **kw})


MLP: tuple[Case, ...] = (
    make("mlp_poisson_exp", "mlp", "exp-overflow",
         title="Poisson regression whose rate is torch.exp(output), trained with SGD",
         model=_mlp(8, 32, 1), loss=Factory(f"{L}:poisson_exp"), batches=streams.counts,
         optimizer="sgd", lr=0.002, steps=200, log_style="plain", logged="totals",
         stop_on_nonfinite_loss=True, checkpoint_every=20),
    make("mlp_hand_bce", "mlp", "log-of-zero",
         title="binary classifier with BCE written out on sigmoid(logits)",
         model=_mlp(8, 32, 1), loss=Factory(f"{L}:hand_bce"),
         batches=lambda s: streams.binary_blobs(s, spread=6.0), optimizer="adam", lr=0.05,
         steps=400, log_style="huggingface", logged="loss_lr", checkpoint_every=100),
    make("mlp_raw_features", "mlp", "unnormalized-inputs",
         title="tabular classifier fed raw features in the thousands",
         model=_mlp(16, 64, 4, 3), loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.blobs(s, features=16, scale=400.0), optimizer="sgd",
         lr=0.01, optimizer_kwargs={"momentum": 0.9}, steps=200, log_style="megatron",
         logged="layers", stop_on_nonfinite_loss=False, steps_after_failure=2,
         checkpoint_every=10),
    make("mlp_lr_jump", "mlp", "learning-rate-jump",
         title="regression whose schedule jumps to a learning rate 200 times higher",
         model=_mlp(16, 64, 1, 3), loss=Factory(f"{L}:mse"),
         batches=streams.regression, optimizer="sgd", lr=0.01, steps=200,
         log_style="deepspeed", logged="loss_lr", schedule=_lr_jump(80, 2.0),
         stop_on_nonfinite_loss=False, steps_after_failure=3, checkpoint_every=50),
    make("mlp_fp16_sum", "mlp", "fp16-reduction-overflow",
         title="a float16 regression whose loss sums squared errors before dividing",
         model=_mlp(16, 64, 1), loss=Factory(f"{L}:sum_mse_over_n"),
         batches=lambda s: streams.regression(s, target_scale=12.0, batch=256),
         optimizer="sgd", lr=1e-4, steps=200, log_style="plain", logged="full",
         dtype=torch.float16, checkpoint_every=25),
)

CNN: tuple[Case, ...] = (
    make("cnn_standardize_blank", "cnn", "zero-variance-normalisation",
         title="CNN that standardises each image by its own std; the data holds blank frames",
         model=Factory(f"{M}:norm_cnn", {"standardize": True}),
         loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.images(s, blank_every=256), optimizer="sgd", lr=0.05,
         optimizer_kwargs={"momentum": 0.9}, steps=100, steps_per_epoch=16,
         log_style="metric_logger", logged="full", checkpoint_every=10),
    make("cnn_batchnorm_lr", "cnn", "learning-rate-too-high",
         title="CNN with BatchNorm and a regression head, SGD at a far too high lr",
         model=Factory(f"{M}:norm_cnn", {"classes": 1}), loss=Factory(f"{L}:mse"),
         batches=lambda s: streams.images(s, regression=True), optimizer="sgd", lr=3.0,
         steps=100, steps_per_epoch=16, log_style="lightning", logged="totals",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=10),
    make("cnn_amp_collapse", "cnn", "loss-scale-collapse",
         title="AMP float16 CNN on 0-255 pixels: a forward overflow the scaler cannot fix",
         model=Factory(f"{M}:small_cnn", {"channels": 1, "classes": 4, "width": 8,
                                          "size": 16}),
         loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.images(s, scale=255.0), optimizer="sgd", lr=0.003,
         optimizer_kwargs={"momentum": 0.9}, steps=200, steps_per_epoch=16,
         log_style="deepspeed", logged="totals", autocast_dtype=torch.float16,
         scaler={"init_scale": 2.0**16, "growth_interval": 50}, min_loss_scale=1.0,
         stop_on_nonfinite_loss=False, steps_after_failure=100, checkpoint_every=20),
    make("cnn_inf_pixel", "cnn", "nan-in-batch",
         title="CNN with BatchNorm; one image decodes with an infinite pixel",
         model=Factory(f"{M}:norm_cnn", {}), loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.images(s, inf_at=301), optimizer="adam", lr=1e-3,
         steps=100, steps_per_epoch=16, log_style="huggingface", logged="layers",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=5,
         checkpoint_after_failure=True),
    make("cnn_bad_init", "cnn", "bad-initialisation",
         title="CNN without normalisation whose weights were initialised 20 times too large",
         model=Factory(f"{M}:norm_cnn", {"classes": 1, "norm": "none", "init_scale": 8.0}),
         loss=Factory(f"{L}:mse"), batches=lambda s: streams.images(s, regression=True),
         optimizer="sgd",
         lr=0.01, steps=100, steps_per_epoch=16, log_style="plain", logged="full",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=2),
)

RECURRENT: tuple[Case, ...] = (
    make("lstm_nan_target", "recurrent", "nan-in-batch",
         title="LSTM regression; one record's target was stored as NaN",
         model=Factory(f"{M}:recurrent", {"kind": "lstm"}), loss=Factory(f"{L}:mse"),
         batches=lambda s: streams.sequences(s, nan_target_at=77), optimizer="adam",
         lr=3e-3, steps=200, steps_per_epoch=16, log_style="lightning", logged="loss_lr",
         env=False, stop_on_nonfinite_loss=False, steps_after_failure=2,
         checkpoint_every=1000),
    make("rnn_raw_counters", "recurrent", "unnormalized-inputs",
         title="ReLU RNN reading raw counters in the hundreds, not standardised",
         model=Factory(f"{M}:rnn_classifier", {"nonlinearity": "relu"}),
         loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: _seq_classes(s, offset=300.0), optimizer="sgd", lr=0.01,
         steps=200, steps_per_epoch=16, log_style="megatron", logged="totals",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=25),
    make("rnn_long_sequences", "recurrent", "exploding-rnn",
         title="ReLU RNN regression over 200-step sequences, no gradient clipping",
         model=Factory(f"{M}:rnn_classifier", {"nonlinearity": "relu", "classes": 1,
                                               "identity_init": True,
                                               "recurrent_scale": 0.97}),
         loss=Factory(f"{L}:mse"),
         batches=lambda s: streams.sequences(s, length=200), optimizer="sgd", lr=0.02,
         steps=200, steps_per_epoch=16, log_style="plain", logged="layers",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=10),
    make("gru_tagger_unlabelled", "recurrent", "division-by-zero",
         title="GRU tagger whose masked-mean loss divides by the batch's labelled tokens",
         model=Factory(f"{M}:char_lm", {}), loss=Factory(f"{L}:masked_token_mean"),
         batches=lambda s: streams.markov_text(s, unlabelled=0.5, batch=8),
         optimizer="adam", lr=3e-3, steps=400, steps_per_epoch=64,
         log_style="huggingface", logged="full", stop_on_nonfinite_loss=False,
         steps_after_failure=3, checkpoint_every=50),
)


def _seq_classes(seed: int, offset: float):  # type: ignore[no-untyped-def]
    from analyzer.scenarios import data

    x, y = data.sequences(512, 20, 4, seed)
    return data.epochs((x + offset, y), 32, seed)


ATTENTION: tuple[Case, ...] = (
    make("attn_empty_sequence", "attention", "softmax-all-masked",
         title="self-attention with a padding mask; one record is empty (all padding)",
         model=Factory(f"{M}:tiny_attention", {}), loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.tokens(s, empty_every=400), optimizer="adam", lr=1e-3,
         steps=200, log_style="huggingface", logged="totals", stop_on_nonfinite_loss=False,
         steps_after_failure=2, checkpoint_every=20),
    make("attn_layernorm_eps0", "attention", "zero-variance-normalisation",
         title="attention with LayerNorm(eps=0) over padding embeddings that are zero",
         model=Factory(f"{M}:tiny_attention", {"eps": 0.0, "positions": 0}),
         loss=Factory(f"{L}:cross_entropy"),
         batches=lambda s: streams.tokens(s, short_every=300), optimizer="adam", lr=1e-3,
         steps=200, log_style="lightning", logged="layers", checkpoint_every=25),
    make("attn_fp16_scores", "attention", "fp16-overflow",
         title="unscaled attention scores in float16 grow past 65504",
         model=Factory(f"{M}:tiny_attention", {"scale": False}),
         loss=Factory(f"{L}:cross_entropy"), batches=streams.tokens, optimizer="sgd",
         lr=0.2, optimizer_kwargs={"momentum": 0.9}, steps=300, log_style="megatron",
         logged="full", dtype=torch.float16, stop_on_nonfinite_loss=False,
         steps_after_failure=2, checkpoint_every=25),
    make("attn_adam_fp16", "attention", "adam-eps-too-small",
         title="pure float16 attention model trained with Adam(eps=1e-8)",
         model=Factory(f"{M}:tiny_attention", {}), loss=Factory(f"{L}:cross_entropy"),
         batches=streams.tokens, optimizer="adam", lr=1e-3,
         optimizer_kwargs={"eps": 1e-8}, steps=200, log_style="plain", logged="loss_lr",
         env=False, dtype=torch.float16, checkpoint_every=5),
)

GENERATIVE: tuple[Case, ...] = (
    make("vae_naive_bce", "generative", "log-of-zero",
         title="VAE on binary images with the Bernoulli likelihood written as log(sigmoid)",
         model=Factory(f"{M}:tiny_vae", {}), loss=Factory(f"{L}:vae_elbo", {"bce": "naive"}),
         batches=lambda s: streams.binary_images(s, flip=0.0), optimizer="adam", lr=0.01, steps=400,
         log_style="plain", logged="totals", checkpoint_every=50),
    make("vae_kl_lr", "generative", "learning-rate-too-high",
         title="VAE trained with SGD and momentum at a far too high lr: the loss runs away "
         "for five steps until the KL term's exp(logvar) overflows",
         model=Factory(f"{M}:tiny_vae", {}), loss=Factory(f"{L}:vae_elbo", {}),
         batches=streams.binary_images, optimizer="sgd", lr=0.05,
         optimizer_kwargs={"momentum": 0.9}, steps=300, log_style="deepspeed",
         logged="full", stop_on_nonfinite_loss=False, steps_after_failure=2,
         checkpoint_every=30),
    make("lm_left_padding", "generative", "softmax-all-masked",
         title="causal attention LM on left-padded batches: a padded position sees no key",
         model=Factory(f"{M}:causal_lm", {}), loss=Factory(f"{L}:lm_cross_entropy"),
         batches=lambda s: streams.markov_text(s, left_pad_every=500), optimizer="adam",
         lr=3e-3, steps=300, steps_per_epoch=16, log_style="metric_logger",
         logged="loss_lr", log_name="stdout.txt", checkpoint_every=100),
)

METRIC: tuple[Case, ...] = (
    make("metric_annealed_temperature", "metric", "temperature-collapse",
         title="InfoNCE whose temperature is annealed by 0.7 every step (meant: every epoch)",
         model=Factory(f"{M}:temperature_embedder", {"temperature": 0.5,
                                                     "learnable": False}),
         loss=Factory(f"{L}:info_nce_learned_t"), batches=streams.views, optimizer="sgd",
         lr=0.05, steps=400, on_step=_anneal_temperature(0.5, 0.7), log_style="lightning",
         logged="layers",
         stop_on_nonfinite_loss=False, steps_after_failure=2, checkpoint_every=40),
    make("metric_naive_logsumexp", "metric", "exp-overflow",
         title="InfoNCE on raw dot products with log(exp(s).sum())",
         model=Factory(f"{M}:embedder", {}),
         loss=Factory(f"{L}:info_nce_naive", {"temperature": 0.078}),
         batches=streams.views, optimizer="adam", lr=0.03, steps=400, log_style="plain",
         logged="totals", checkpoint_every=50),
    make("metric_zero_embedding", "metric", "division-by-zero",
         title="triplet loss on embeddings normalised by hand; some records are all zero",
         model=Factory(f"{M}:relu_embedder", {}), loss=Factory(f"{L}:cosine_triplet"),
         batches=lambda s: streams.triplets(s, zero_every=250), optimizer="adam", lr=1e-3,
         steps=300, log_style="megatron", logged="full", stop_on_nonfinite_loss=False,
         steps_after_failure=2, checkpoint_every=20),
    make("metric_triplet_sqrt", "metric", "sqrt-at-zero-backward",
         title="triplet loss with distances pow(0.5); a positive is now and then the anchor",
         model=Factory(f"{M}:embedder", {}), loss=Factory(f"{L}:triplet_pow_half"),
         batches=lambda s: streams.triplets(s, per_class=600), optimizer="sgd", lr=0.05,
         steps=300, log_style="huggingface", logged="loss_lr", checkpoint_every=1000),
)

CASES: tuple[Case, ...] = (*MLP, *CNN, *RECURRENT, *ATTENTION, *GENERATIVE, *METRIC)
