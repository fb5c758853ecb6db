"""Which keys of a metadata file name which training setting, and the values they may take.

Lightning's hyperparameters are whatever the user called them: a setting is recognised by
the last part of a key (``model.optimizer.lr`` names the learning rate), among the names
frameworks and common training scripts use. The first key found at the shallowest depth
wins, so a top-level ``lr`` is taken over one nested in a sub-config. The frameworks' own
files (``training_args.bin``, ``trainer_state.json``) use their field names, mapped here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from analyzer.model import MetaValue

NUMERIC = frozenset({
    "learning_rate", "warmup_steps", "warmup_ratio", "adam_epsilon", "weight_decay",
    "max_grad_norm", "logging_steps", "gradient_accumulation_steps", "batch_size", "seed",
    "max_steps", "num_train_epochs", "global_step", "layer_norm_eps",
})  # fmt: skip
FLAGS = frozenset({"fp16", "bf16"})
TEXT = frozenset({"lr_scheduler_type", "optimizer", "precision", "model_type", "dtype"})

_HPARAM_NAMES: dict[str, str] = {
    **dict.fromkeys(("lr", "learning_rate", "learningrate", "base_lr", "max_lr", "peak_lr",
                     "init_lr", "initial_lr"), "learning_rate"),
    **dict.fromkeys(("warmup_steps", "num_warmup_steps", "warmup_iters", "warmup"),
                    "warmup_steps"),
    **dict.fromkeys(("warmup_ratio", "warmup_proportion", "warmup_fraction"), "warmup_ratio"),
    **dict.fromkeys(("lr_scheduler_type", "lr_scheduler", "scheduler", "lr_schedule"),
                    "lr_scheduler_type"),
    **dict.fromkeys(("optimizer", "optim", "optimizer_name", "opt"), "optimizer"),
    **dict.fromkeys(("adam_epsilon", "adam_eps", "optimizer_eps", "opt_eps"), "adam_epsilon"),
    **dict.fromkeys(("weight_decay", "wd"), "weight_decay"),
    "precision": "precision",
    "fp16": "fp16",
    "bf16": "bf16",
    **dict.fromkeys(("gradient_clip_val", "max_grad_norm", "clip_grad_norm", "grad_clip",
                     "clip_norm", "gradient_clipping", "clip_grad"), "max_grad_norm"),
    **dict.fromkeys(("log_every_n_steps", "logging_steps", "log_interval", "log_every"),
                    "logging_steps"),
    **dict.fromkeys(("accumulate_grad_batches", "gradient_accumulation_steps",
                     "grad_accum_steps", "accumulation_steps", "grad_accum"),
                    "gradient_accumulation_steps"),
    **dict.fromkeys(("batch_size", "train_batch_size", "per_device_train_batch_size",
                     "micro_batch_size"), "batch_size"),
    **dict.fromkeys(("seed", "random_seed"), "seed"),
    **dict.fromkeys(("max_steps", "total_steps", "num_training_steps"), "max_steps"),
    **dict.fromkeys(("max_epochs", "num_train_epochs", "epochs", "num_epochs"),
                    "num_train_epochs"),
}
"""Hyperparameter names (lower case, the key's last part) and the setting each gives."""

_EPS_PARENT = re.compile(r"optim", re.IGNORECASE)
"""``eps`` is the optimizer's epsilon only under an optimizer's sub-config (elsewhere it
may be a layer norm's)."""

TRAINING_ARGS: dict[str, str] = {
    "learning_rate": "learning_rate", "warmup_steps": "warmup_steps",
    "warmup_ratio": "warmup_ratio", "lr_scheduler_type": "lr_scheduler_type",
    "optim": "optimizer", "adam_epsilon": "adam_epsilon", "weight_decay": "weight_decay",
    "fp16": "fp16", "bf16": "bf16", "max_grad_norm": "max_grad_norm",
    "logging_steps": "logging_steps",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "per_device_train_batch_size": "batch_size", "seed": "seed", "max_steps": "max_steps",
    "num_train_epochs": "num_train_epochs",
}  # fmt: skip
"""TrainingArguments' fields and the settings they give; the others read are kept on the
file's record (``adam_beta1``, ``adam_beta2``, ``logging_strategy``)."""
TRAINING_ARGS_EXTRA = ("adam_beta1", "adam_beta2", "logging_strategy", "save_steps",
                       "gradient_checkpointing")

TRAINER_STATE: dict[str, str] = {
    "global_step": "global_step", "max_steps": "max_steps", "logging_steps": "logging_steps",
    "train_batch_size": "batch_size", "num_train_epochs": "num_train_epochs",
}  # fmt: skip
TRAINER_STATE_EXTRA = ("epoch", "eval_steps", "save_steps", "best_metric",
                       "best_global_step", "best_model_checkpoint")

MODEL_CONFIG: dict[str, str] = {
    "model_type": "model_type", "torch_dtype": "dtype", "dtype": "dtype",
    "layer_norm_eps": "layer_norm_eps", "layer_norm_epsilon": "layer_norm_eps",
    "rms_norm_eps": "layer_norm_eps", "norm_eps": "layer_norm_eps",
}  # fmt: skip
MODEL_CONFIG_EXTRA = ("architectures", "hidden_size", "n_embd", "d_model", "num_hidden_layers",
                      "n_layer", "num_attention_heads", "n_head", "num_heads", "n_heads",
                      "encoder_attention_heads", "decoder_attention_heads", "intermediate_size",
                      "vocab_size", "max_position_embeddings", "n_positions",
                      "transformers_version")

MAX_INT = 2**63
"""Integers beyond int64 are no setting, and Python cannot even write those of thousands of
digits as text (the JSON report would fail): they are dropped where they are read."""
MAX_TEXT = 200


def plain(value: object) -> MetaValue | None:
    """``value`` when it is a plain value a report can hold (strings cut to MAX_TEXT), else
    None (so a None read is told from a value refused by ``value is None``)."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value < MAX_INT else None
    if isinstance(value, str):
        return value[:MAX_TEXT]
    return None


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def hparam_setting(path: tuple[str, ...]) -> str | None:
    """The setting a hyperparameter's key path names, or None."""
    last = path[-1].lower()
    if last in ("eps", "epsilon"):
        return "adam_epsilon" if any(_EPS_PARENT.search(p) for p in path[:-1]) else None
    return _HPARAM_NAMES.get(last)


def coerce(setting: str, value: MetaValue) -> MetaValue:
    """``value`` in the type ``setting`` takes, or None when it cannot be one.

    Numbers written as text are taken (YAML 1.1 reads ``5e-3`` as a string); a boolean is
    not a number, and a number is not a precision flag."""
    if setting in NUMERIC:
        if isinstance(value, bool):
            return None
        if setting == "max_steps" and isinstance(value, int | float) and value < 0:
            return None  # the Trainer's -1: no step limit, the epochs decide
        if isinstance(value, int | float):
            return plain(value)
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            number = float(value)
            whole = number.is_integer() and "." not in value and abs(number) < MAX_INT
            return int(number) if whole else number
        return None
    if setting in FLAGS:
        return value if isinstance(value, bool) else None
    if setting in TEXT:
        if isinstance(value, str):
            return value
        if setting == "precision" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # Lightning's precision=16
        return None
    return None


def mapped(fields: Mapping[str, MetaValue], names: Mapping[str, str]
           ) -> dict[str, tuple[str, MetaValue]]:
    """The settings a framework file's fields give: setting -> (key, value)."""
    out: dict[str, tuple[str, MetaValue]] = {}
    for key, setting in names.items():
        if key in fields and setting not in out:
            value = coerce(setting, fields[key])
            if value is not None:
                out[setting] = (key, value)
    return out


MAX_FIELDS = 256
"""Fields kept per file beside the recognised ones: a sweep's summary compares every plain
hyperparameter of its runs, and a config of thousands of keys is not one."""
MAX_VISITS = 20_000
_SECRET = re.compile(r"token|secret|password|passwd|api_?key|credential", re.IGNORECASE)
"""Names of fields never kept: a pickled TrainingArguments holds ``hub_token`` as set."""


def is_secret(key: str) -> bool:
    return bool(_SECRET.search(key))


def _items(document: Mapping[object, object]) -> Iterator[tuple[str, object]]:
    """The top level's values, then those of the mappings one level below it."""
    for key, value in document.items():
        if isinstance(key, str) and not isinstance(value, Mapping):
            yield key, value
    for key, value in document.items():
        if isinstance(key, str) and isinstance(value, Mapping) and not is_secret(key):
            yield from ((f"{key}.{k}", v) for k, v in value.items() if isinstance(k, str))


def every_plain(document: Mapping[object, object], fields: dict[str, MetaValue]) -> None:
    """Add to ``fields`` the plain values of ``document``'s top level, then those of the
    mappings one level below it (keys joined with ``.``), up to :data:`MAX_FIELDS` more, looking at
    no more than :data:`MAX_VISITS` items (YAML aliases can repeat one mapping under every
    key); fields already there keep their value. A secret's key is never added; lists are
    not values."""
    added = 0
    for visits, (name, item) in enumerate(_items(document)):
        if added >= MAX_FIELDS or visits >= MAX_VISITS:
            return
        if name in fields or is_secret(name) or isinstance(item, Mapping):
            continue
        got = plain(item)
        if got is not None or item is None:
            fields[name] = got
            added += 1
