"""The table of scenarios: one entry per way a real training run dies (and two that live).

Each entry names its model and loss by importable factory, its data stream, optimizer and
precision, and what is known about its failure (layer, op, phase, verdict, cause). The
failing step and tag are not written here: the run measures them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from analyzer.capture import Factory
from analyzer.scenarios import data
from analyzer.scenarios.harness import Expected, Scenario

M = "analyzer.scenarios.models"
L = "analyzer.scenarios.losses"


def _blobs(seed: int) -> Iterator[data.Batch]:
    return data.epochs(data.blobs(1024, 8, 4, 4.0, seed), 32, seed)


def _regression(seed: int) -> Iterator[data.Batch]:
    return data.epochs(data.linear_regression(1024, 16, 1, 0.1, seed), 32, seed)


def _raw_blobs(seed: int) -> Iterator[data.Batch]:
    # Raw sensor-like features in the hundreds: nobody standardised them.
    x, y = data.blobs(1024, 16, 4, 4.0, seed)
    return data.epochs((x * 50.0, y), 32, seed)


def _scaled_targets(seed: int) -> Iterator[data.Batch]:
    x, y = data.linear_regression(1024, 16, 1, 0.1, seed)
    return data.epochs((x, y * 10.0), 32, seed)


def _images(seed: int) -> Iterator[data.Batch]:
    return data.epochs(data.images_0_255(512, 16, 10, seed), 32, seed)


def _counts(seed: int) -> Iterator[data.Batch]:
    return data.epochs(data.sparse_counts(2048, 16, 3, 2.2, seed), 32, seed)


def _pairs(seed: int) -> Iterator[data.Batch]:
    return data.with_replacement(data.blobs(6000, 16, 8, 3.0, seed), 24, seed)


def _sequences(seed: int) -> Iterator[data.Batch]:
    return data.epochs(data.sequences(512, 120, 4, seed), 32, seed)


def _corrupted_blobs(seed: int) -> Iterator[data.Batch]:
    x, y = data.blobs(1024, 8, 4, 4.0, seed)
    # One record of the data set was damaged on disk and decodes to NaN.
    x = x.clone()
    x[29, 3] = float("nan")
    return data.epochs((x, y), 32, seed)


def _unfreeze_backbone_at(step_to_unfreeze: int):  # type: ignore[no-untyped-def]
    def hook(step: int, model: torch.nn.Module) -> None:
        trainable = step >= step_to_unfreeze
        for p in model.backbone.parameters():  # type: ignore[union-attr]
            p.requires_grad_(trainable)

    return hook


def _mlp(**kwargs: object) -> Factory:
    base: dict[str, object] = {"in_features": 8, "hidden": 32, "out_features": 4, "depth": 2}
    return Factory(f"{M}:mlp", {**base, **kwargs})


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="log_softmax_underflow",
        title="torch.log(F.softmax(logits)) on logits that keep growing",
        story=(
            "A 4-class MLP is trained with Adam on separable clusters; the loss is written as "
            "`F.nll_loss(torch.log(F.softmax(logits)))`. Adam keeps growing the logits until a "
            "class probability underflows to exactly 0 in float32: `torch.log` returns -inf. "
            "The NLL only picks the target's entry, so the loss stays finite, but the backward "
            "of log divides by that 0 and every gradient becomes NaN; the next loss is NaN and "
            "the loop's loss check stops the run."
        ),
        fix="use `F.log_softmax` or `F.cross_entropy`, which never form log(0).",
        model=_mlp(),
        loss=Factory(f"{L}:log_of_softmax_nll"),
        batches=_blobs,
        optimizer="adam",
        optimizer_kwargs={"lr": 0.07},
        steps=400,
        steps_per_epoch=32,
        log_style="plain",
        expected=Expected(None, "aten::log", "forward", "math-fault", "log-of-zero"),
        checkpoint_every=25,
        hist_every=25,
        hist_params=("fc2.weight",),
    ),
    Scenario(
        name="sgd_lr_too_high",
        title="SGD with a learning rate far above the stable range",
        story=(
            "A 3-layer MLP regression trained with plain SGD at lr 0.3 on inputs with a large "
            "scale. Each step overshoots the minimum by more than it corrects, so the loss and "
            "the gradient norm grow exponentially until they overflow float32. The run keeps "
            "going a few steps, logging nan, and saves a checkpoint holding non-finite weights."
        ),
        fix="lower the learning rate (or warm it up) and clip the gradient norm.",
        model=_mlp(in_features=16, hidden=64, out_features=1, depth=3),
        loss=Factory(f"{L}:mse"),
        batches=_regression,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.9},
        steps=200,
        steps_per_epoch=32,
        log_style="megatron",
        expected=Expected(
            None, "aten::mse_loss", "forward", "range-overflow", "learning-rate-too-high"
        ),
        stop_on_nonfinite_loss=False,
        steps_after_failure=4,
        checkpoint_after_failure=True,
        checkpoint_every=10,
        hist_params=("fc1.weight", "fc3.weight"),
    ),
    Scenario(
        name="fp16_no_amp",
        title="a model cast with .half() and trained without autocast or loss scaling",
        story=(
            "The whole MLP is cast to float16 with `.half()` to save memory; inputs are "
            "unnormalised measurements (scale ~8) and SGD with momentum keeps enlarging the "
            "weights. Activations pass 65504, the largest float16, and a linear layer's output "
            "becomes inf in the forward pass. Lightning-style progress bar; the run is stopped "
            "a few steps later."
        ),
        fix="keep float32 master weights: train under `torch.autocast` with a GradScaler, or use "
        "bfloat16.",
        model=_mlp(in_features=16, hidden=64, out_features=4, depth=3),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_raw_blobs,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.003, "momentum": 0.9},
        steps=300,
        steps_per_epoch=32,
        log_style="lightning",
        dtype=torch.float16,
        expected=Expected("fc3", "aten::addmm", "forward", "range-overflow", "fp16-overflow"),
        stop_on_nonfinite_loss=False,
        steps_after_failure=3,
        hist_params=("fc2.weight",),
    ),
    Scenario(
        name="amp_scale_collapse",
        title="AMP with a GradScaler whose loss scale collapses under persistent overflow",
        story=(
            "An MLP trained under `torch.autocast(float16)` with a GradScaler; its activations "
            "grow until a linear layer's float16 output overflows in the forward pass. The loss "
            "is inf on every step from then on, whatever the scale, so the scaler skips every "
            "step and halves the scale each time until it falls below the minimum and the run "
            "exits (DeepSpeed-style log)."
        ),
        fix="find the overflowing activation (normalise inputs, add normalisation layers, lower "
        "the learning rate) or train in bfloat16; a loss scale cannot fix a forward overflow.",
        model=_mlp(in_features=16, hidden=64, out_features=4, depth=3),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_raw_blobs,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.003, "momentum": 0.9},
        steps=300,
        steps_per_epoch=32,
        log_style="deepspeed",
        autocast_dtype=torch.float16,
        scaler={"init_scale": 2.0**16, "growth_interval": 50},
        min_loss_scale=1.0,
        expected=Expected("fc3", "aten::addmm", "forward", "range-overflow", "loss-scale-collapse"),
        stop_on_nonfinite_loss=False,
        steps_after_failure=100,
        hist_params=("fc2.weight",),
    ),
    Scenario(
        name="amp_benign_skips",
        title="AMP with early GradScaler skips that recover (healthy)",
        story=(
            "The healthy AMP baseline: a classifier under `torch.autocast(float16)` with a "
            "GradScaler started at a deliberately high scale. The first steps' scaled gradients "
            "overflow float16, the scaler skips them and halves the scale until it fits, and "
            "training then proceeds; the loss is finite on every step."
        ),
        fix="nothing to fix: skipped overflow steps are how dynamic loss scaling works.",
        model=_mlp(hidden=64),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_blobs,
        optimizer="adam",
        optimizer_kwargs={"lr": 1e-3},
        steps=200,
        steps_per_epoch=32,
        log_style="deepspeed",
        healthy=True,
        benign_skips=True,
        autocast_dtype=torch.float16,
        scaler={"init_scale": 2.0**24, "growth_interval": 40},
        grad_clip=1.0,
        checkpoint_every=50,
        hist_params=("fc1.weight",),
    ),
    Scenario(
        name="unnormalized_inputs",
        title="0-255 image intensities fed to a CNN without normalisation",
        story=(
            "A small CNN is trained with SGD on grey images whose pixels are left as 0-255 "
            "values (the `/ 255` and mean/std normalisation were forgotten). The first "
            "convolution's outputs are in the thousands, the logits and gradients follow, and "
            "within a few steps the weights and then the loss overflow."
        ),
        fix="scale inputs to [0, 1] and normalise them with the data set's mean and std.",
        model=Factory(f"{M}:small_cnn", {"channels": 1, "classes": 10, "width": 8, "size": 16}),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_images,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.003, "momentum": 0.9},
        steps=100,
        steps_per_epoch=16,
        log_style="metric_logger",
        expected=Expected("fc", "aten::addmm", "forward", "range-overflow", "unnormalized-inputs"),
        checkpoint_every=5,
        hist_every=2,
        hist_params=("conv1.weight", "fc.weight"),
    ),
    Scenario(
        name="division_by_zero",
        title="a relative-error loss dividing by a target norm that is zero",
        story=(
            "A regression on sparse count targets uses a relative squared error, "
            "`((y_hat - y)**2).sum(1) / (y**2).sum(1)`, with no epsilon. Rows whose counts are "
            "all zero are rare; the first batch that holds one divides by zero and the loss is "
            "inf. Hugging Face Trainer-style log: the run carries on logging nan for a few steps."
        ),
        fix="add an epsilon to the denominator or drop all-zero rows from the relative error.",
        model=_mlp(in_features=16, hidden=32, out_features=3, depth=2),
        loss=Factory(f"{L}:relative_squared_error"),
        batches=_counts,
        optimizer="adam",
        optimizer_kwargs={"lr": 1e-3},
        steps=300,
        steps_per_epoch=64,
        log_style="huggingface",
        expected=Expected(None, "aten::div", "forward", "math-fault", "division-by-zero"),
        stop_on_nonfinite_loss=False,
        steps_after_failure=3,
        checkpoint_after_failure=True,
        hist_params=("fc2.weight",),
    ),
    Scenario(
        name="sqrt_at_zero",
        title="Euclidean distances with sqrt: finite forward, infinite backward at zero",
        story=(
            "A metric-learning embedder with a pairwise contrastive loss whose distances are "
            "`torch.sqrt((a - b).pow(2).sum(1))`. The sampler draws with replacement, and the "
            "first batch that holds the same sample twice has a distance of exactly 0. The "
            "forward pass is finite, but d sqrt(x)/dx at 0 is inf, and the backward pass turns "
            "it into NaN gradients; the next step's loss is NaN and the run stops."
        ),
        fix="compare squared distances, or use `torch.sqrt(x + eps)` / clamp before the sqrt.",
        model=Factory(f"{M}:embedder", {"in_features": 16, "hidden": 32, "dim": 8}),
        loss=Factory(f"{L}:pairwise_contrastive", {"margin": 1.0}),
        batches=_pairs,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.05},
        steps=300,
        steps_per_epoch=250,
        log_style="lightning",
        expected=Expected(None, "aten::sqrt", "backward", "math-fault", "sqrt-at-zero-backward"),
        hist_params=("fc2.weight",),
    ),
    Scenario(
        name="nan_in_batch",
        title="one corrupted sample carrying NaN in an input batch",
        story=(
            "A healthy classifier run, except that one record of the data set decodes to NaN "
            "(a damaged file). The first batch that draws it makes the first layer's output, "
            "the logits and the loss NaN; the update spreads NaN into every weight. The run "
            "carries on for a few steps (Hugging Face Trainer style) and saves a checkpoint "
            "full of NaN."
        ),
        fix="validate the data (`torch.isfinite(x).all()` in the loader) and drop the record.",
        model=_mlp(),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_corrupted_blobs,
        optimizer="adam",
        optimizer_kwargs={"lr": 1e-3},
        steps=200,
        steps_per_epoch=32,
        log_style="huggingface",
        expected=Expected("fc1", "aten::addmm", "forward", "bad-input", "nan-in-batch"),
        stop_on_nonfinite_loss=False,
        steps_after_failure=3,
        checkpoint_after_failure=True,
        hist_params=("fc1.weight",),
    ),
    Scenario(
        name="exploding_rnn",
        title="a vanilla RNN on long sequences without gradient clipping",
        story=(
            "A single-layer `nn.RNN` reads 120-step sequences whose label depends on the first "
            "step. Back-propagation through time multiplies the recurrent Jacobian 120 times; "
            "with no clipping the gradient norm explodes and an SGD update throws the recurrent "
            "weights far enough that the hidden state overflows (Megatron-style log)."
        ),
        fix="clip the gradient norm (`clip_grad_norm_`), or use an LSTM/GRU, shorter BPTT "
        "windows and a smaller learning rate.",
        model=Factory(
            f"{M}:rnn_classifier",
            {
                "in_features": 4,
                "hidden": 32,
                "classes": 2,
                "nonlinearity": "relu",
                "identity_init": True,
                "recurrent_scale": 0.95,
            },
        ),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_sequences,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.025},
        steps=200,
        steps_per_epoch=16,
        log_style="megatron",
        expected=Expected("rnn", "aten::addmm", "forward", "range-overflow", "exploding-rnn"),
        stop_on_nonfinite_loss=False,
        steps_after_failure=3,
        checkpoint_every=5,
        hist_params=("rnn.weight_hh_l0",),
    ),
    Scenario(
        name="bad_initialisation",
        title="weights initialised twenty times too large",
        story=(
            "A 5-layer ReLU MLP whose weights were scaled up after PyTorch's initialisation. "
            "Activations grow layer by layer, the gradient norm is above 1e5 from the first "
            "step, and SGD's first updates blow the weights up until the forward pass "
            "overflows (Lightning-style progress bar)."
        ),
        fix="use the default (Kaiming/Xavier) initialisation; check activation scales at step 0.",
        model=_mlp(in_features=16, hidden=64, out_features=4, depth=5, init_scale=20.0),
        loss=Factory(f"{L}:cross_entropy"),
        batches=lambda seed: data.epochs(data.blobs(1024, 16, 4, 2.0, seed), 32, seed),
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.001},
        steps=200,
        steps_per_epoch=32,
        log_style="lightning",
        expected=Expected("fc5", "aten::addmm", "forward", "range-overflow", "bad-initialisation"),
        stop_on_nonfinite_loss=False,
        steps_after_failure=2,
        checkpoint_every=2,
        hist_every=1,
        hist_params=("fc1.weight", "fc5.weight"),
    ),
    Scenario(
        name="adam_eps_fp16",
        title="Adam with eps=1e-8 on float16 weights: the update divides by zero",
        story=(
            "Fine-tuning in pure float16: the head trains alone first, then the backbone is "
            "unfrozen. Its first gradients are small; Adam's second moment (1-beta2)*g**2 "
            "underflows to 0 in float16 and eps=1e-8 is below float16's smallest number, so "
            "`exp_avg / (sqrt(exp_avg_sq) + eps)` divides by exactly 0. The update writes inf "
            "and NaN into the backbone's weights; the next loss is NaN."
        ),
        fix="keep float32 master weights (AMP), or use eps >= 1e-4 for float16 parameters.",
        model=Factory(f"{M}:finetune_net", {"in_features": 16, "hidden": 32, "out_features": 1}),
        loss=Factory(f"{L}:mse"),
        batches=_scaled_targets,
        optimizer="adam",
        optimizer_kwargs={"lr": 1e-3, "eps": 1e-8},
        steps=200,
        steps_per_epoch=32,
        log_style="plain",
        dtype=torch.float16,
        expected=Expected(
            "backbone.fc1", "aten::addcdiv_", "update", "math-fault", "adam-eps-too-small"
        ),
        on_step=_unfreeze_backbone_at(40),
        hist_params=("backbone.fc1.weight",),
    ),
    Scenario(
        name="healthy_control",
        title="healthy control: the log-softmax run's model trained the robust way",
        story=(
            "The same 4-class MLP and data as `log_softmax_underflow`, trained with Adam and "
            "`F.cross_entropy`. It completes every step with every logged value finite."
        ),
        fix="nothing to fix.",
        model=_mlp(),
        loss=Factory(f"{L}:cross_entropy"),
        batches=_blobs,
        optimizer="adam",
        optimizer_kwargs={"lr": 0.01},
        steps=200,
        steps_per_epoch=32,
        log_style="huggingface",
        healthy=True,
        checkpoint_every=50,
        hist_every=10,
        hist_params=("fc2.weight",),
    ),
)


def by_name() -> dict[str, Scenario]:
    return {sc.name: sc for sc in SCENARIOS}
