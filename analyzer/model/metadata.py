"""What a run's framework metadata says: the files read, and the training settings they give.

Frameworks save how a training was configured beside its logs and weights (Lightning's
``hparams.yaml``, the Hugging Face Trainer's ``training_args.bin`` and ``trainer_state.json``,
a scheduler's state). Each file becomes a :class:`MetadataFile` with the fields read from it;
the settings the rules and the step alignment use are resolved once, over every file, into
:class:`Setting` values that name the file and the key each came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from analyzer.model.issues import IngestIssue

MetaValue = bool | int | float | str | None
"""A value read from a metadata file: only plain values are kept, never objects."""

MetadataKind = Literal[
    "hparams",
    "checkpoint_hparams",
    "model_config",
    "generation_config",
    "training_args",
    "trainer_state",
    "scheduler",
    "rng_state",
]
"""``hparams``: Lightning's ``hparams.yaml``; ``checkpoint_hparams``: a Lightning
checkpoint's ``hyper_parameters`` and precision; ``model_config`` and ``generation_config``:
Hugging Face ``config.json`` and ``generation_config.json``; ``training_args``: the
Trainer's pickled ``TrainingArguments`` (read statically); ``trainer_state``: the top-level
fields of a Trainer save's ``trainer_state.json``; ``scheduler``: a learning-rate
scheduler's state_dict; ``rng_state``: random-number generator states, listed only."""

ReadStatus = Literal["read", "partial", "listed", "failed"]
"""``read``: every field looked for was taken; ``partial``: the file is damaged or holds
values that were refused, and what came before is kept; ``listed``: deliberately not
opened (its contents are not evidence, or could only be had by unpickling); ``failed``:
nothing could be read (see the run's issues)."""

SETTING_NAMES = (
    "learning_rate", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "optimizer",
    "adam_epsilon", "weight_decay", "precision", "fp16", "bf16", "max_grad_norm",
    "logging_steps", "gradient_accumulation_steps", "batch_size", "seed", "max_steps",
    "num_train_epochs", "global_step", "model_type", "dtype", "layer_norm_eps",
)  # fmt: skip
"""The training settings resolved over a run's metadata files, in report order."""


@dataclass(frozen=True)
class MetadataFile:
    """One metadata file of the run and the plain fields read from it, under its own keys."""

    path: str
    kind: MetadataKind
    framework: str
    status: ReadStatus
    fields: Mapping[str, MetaValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """One resolved training setting: its value, the file it came from and the key there."""

    value: MetaValue
    source: str
    key: str


@dataclass(frozen=True)
class RunMetadata:
    """The run's framework metadata: the files read and the settings resolved from them.

    When several files give one setting, the one written by the code that ran the training
    wins (``training_args.bin`` over ``trainer_state.json`` over a checkpoint's
    hyperparameters over ``hparams.yaml`` over a scheduler's state over ``config.json``)."""

    files: tuple[MetadataFile, ...] = ()
    settings: Mapping[str, Setting] = field(default_factory=dict)
    issues: tuple[IngestIssue, ...] = ()
    """What could not be read; the run's issues hold them too."""

    def setting(self, name: str) -> Setting | None:
        return self.settings.get(name)

    def number(self, name: str) -> float | None:
        """A numeric setting as a float (booleans are not numbers here)."""
        found = self.settings.get(name)
        value = found.value if found is not None else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    def integer(self, name: str) -> int | None:
        """A setting that counts something, as an int (None when not a whole number)."""
        value = self.number(name)
        return int(value) if value is not None and value.is_integer() else None

    def flag(self, name: str) -> bool | None:
        found = self.settings.get(name)
        return found.value if found is not None and isinstance(found.value, bool) else None

    def text(self, name: str) -> str | None:
        found = self.settings.get(name)
        return found.value if found is not None and isinstance(found.value, str) else None

    @property
    def learning_rate(self) -> float | None:
        return self.number("learning_rate")

    @property
    def logging_steps(self) -> int | None:
        """Optimizer steps between two logged records (the Trainer's ``logging_steps``,
        Lightning's ``log_every_n_steps``)."""
        return self.integer("logging_steps")

    @property
    def gradient_accumulation_steps(self) -> int | None:
        """Batches per optimizer step (``gradient_accumulation_steps``,
        ``accumulate_grad_batches``)."""
        return self.integer("gradient_accumulation_steps")
