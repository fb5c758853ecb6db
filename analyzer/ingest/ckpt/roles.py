"""What each top-level section of a checkpoint means: evidence, or the trainer's bookkeeping.

The names are the ones the frameworks' save code writes:

* Lightning (``_CheckpointConnector.dump_checkpoint``): ``epoch``, ``global_step``,
  ``pytorch-lightning_version``, ``state_dict``, ``loops``, ``callbacks`` (keyed by each
  callback's ``state_key``), ``optimizer_states``, ``lr_schedulers``, the precision
  plugin's class name (``MixedPrecision``: the GradScaler's state), ``hparams_name``,
  ``hyper_parameters``, ``hparams_type``, ``datamodule_hyper_parameters``.
* DeepSpeed (``DeepSpeedEngine._save_checkpoint``, ``mp_rank_XX_model_states.pt``):
  ``module``, ``buffer_names``, ``optimizer`` (None under ZeRO), ``param_shapes``,
  ``frozen_param_shapes``, ``shared_params``, ``frozen_param_fragments``,
  ``lr_scheduler``, ``data_sampler``, ``random_ltd``, ``sparse_tensor_module_names``,
  ``skipped_steps``, ``global_steps``, ``global_samples``, ``dp_world_size``,
  ``mp_world_size``, ``ds_config``, ``ds_version``; ZeRO's
  ``zero_pp_rank_D_mp_rank_XX_optim_states.pt`` holds ``optimizer_state_dict``,
  ``ds_config`` and ``ds_version``.
* hand-written loops: ``scaler``, ``scheduler``, ``rng_state``, ``step``, ``args``, ...

A section no framework names is ``other``, which stays evidence: an EMA copy of the
weights or a user's own state may be where the NaN is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from analyzer.model.checkpoints import TensorRole

_SECTIONS: dict[str, TensorRole] = {
    **dict.fromkeys(("callbacks",), "callback"),
    **dict.fromkeys(("loops", "data_sampler", "random_ltd", "sampler"), "loop"),
    **dict.fromkeys(("lr_schedulers", "lr_scheduler", "scheduler", "schedulers",
                     "scheduler_state_dict", "lr_scheduler_state_dict", "sched"), "scheduler"),
    **dict.fromkeys(("hyper_parameters", "datamodule_hyper_parameters", "hparams",
                     "hparams_name", "hparams_type", "hyperparameters", "args", "config",
                     "cfg", "ds_config", "training_args", "opt_config"), "hyperparameters"),
    **dict.fromkeys(("rng", "rng_state", "rng_states", "random_state", "random_states",
                     "torch_rng_state", "cuda_rng_state", "cpu_rng_state", "numpy_rng_state",
                     "python_rng_state", "py_rng_state", "generator"), "rng"),
    **dict.fromkeys(("epoch", "global_step", "global_steps", "step", "iteration", "iter",
                     "global_samples", "skipped_steps"), "step"),
    **dict.fromkeys(("pytorch-lightning_version", "ds_version", "buffer_names",
                     "param_shapes", "frozen_param_shapes", "shared_params",
                     "sparse_tensor_module_names", "csr_tensor_module_names",
                     "dp_world_size", "mp_world_size"), "metadata"),
    **dict.fromkeys(("scaler", "grad_scaler", "amp_scaler", "amp", "loss_scaler",
                     "native_amp_scaling_state", "mixedprecision"), "scaler"),
    **dict.fromkeys(("frozen_param_fragments",), "weights"),
}

ZERO_SHARD = re.compile(r"(?:bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt")
"""A ZeRO optimizer partition: listed, its values never read (one per data-parallel rank,
each as large as its share of the fp32 master weights and both Adam moments)."""


def section_role(key: object, value: object) -> TensorRole:
    """The role of one top-level section that is neither the model nor an optimizer."""
    name = str(key).lower()
    role = _SECTIONS.get(name)
    if role is not None:
        return role
    if is_scaler_state(value):  # a precision plugin's state under its class name
        return "scaler"
    return "other"


def is_scaler_state(value: object) -> bool:
    return isinstance(value, Mapping) and "scale" in value and (
        "growth_factor" in value or "_growth_tracker" in value)


def is_zero_shard(path: str, root: object) -> bool:
    """A DeepSpeed ZeRO optimizer partition, by its name or its sections."""
    if ZERO_SHARD.fullmatch(os.path.basename(path)):
        return True
    return isinstance(root, Mapping) and "optimizer_state_dict" in root and "ds_version" in root


def framework_of(root: object) -> str | None:
    """Which trainer wrote the checkpoint, by the version key it adds."""
    if not isinstance(root, Mapping):
        return None
    if "pytorch-lightning_version" in root:
        return "lightning"
    if "ds_version" in root:
        return "deepspeed"
    return None
