"""Run metadata that frameworks save beside a training's logs and weights: which files
they are. Reading them is this package's modules' work; discovery only asks
:func:`is_metadata_file` to list them on the run that holds them.

    read         a run's metadata files into one RunMetadata, settings resolved
                 (``read_run_metadata``; ``with_checkpoints`` adds a Lightning
                 checkpoint's hyperparameters once the checkpoints are scanned)
    hparams      hparams.yaml, by PyYAML's safe loader
    hfjson       config.json, generation_config.json, trainer_state.json's top level
    torchsaved   training_args.bin and scheduler states, their pickles walked statically
    keys         which key names which setting, and the types settings take

    hparams.yaml             Lightning's logger: the module's and datamodule's hyperparameters
    config.json              Hugging Face model config (architecture, dtype, eps, sizes)
    generation_config.json   Hugging Face generation defaults
    training_args.bin        Hugging Face TrainingArguments, pickled by torch.save: read
                             statically, never unpickled
    scheduler.pt/.bin        a learning-rate scheduler's state_dict (Trainer and Accelerate
                             save folders)
    rng_state*.pth           random-number generator states (listed, not evidence)
    random_states_*.pkl      Accelerate's pickled RNG states: listed, never unpickled

None of them is a checkpoint (:func:`analyzer.ingest.checkpoints.is_checkpoint_file` says
no): a scaler's ``scaler.pt`` is, since its scale is evidence.
"""

from __future__ import annotations

import os
import re

from analyzer.ingest.safeio import NotRegularFile
from analyzer.model import IngestIssue, Location

METADATA_NAMES = frozenset({
    "hparams.yaml", "config.json", "generation_config.json", "training_args.bin",
    "scheduler.pt", "scheduler.bin",
})
_PATTERNS = re.compile(r"rng_state(_\d+)?\.pth|random_states_\d+\.pkl")


def is_metadata_file(path: str) -> bool:
    """True for the names of the run metadata files this package knows."""
    name = os.path.basename(path).lower()
    return name in METADATA_NAMES or bool(_PATTERNS.fullmatch(name))


def open_failure(path: str, exc: OSError) -> IngestIssue:
    """The issue of a metadata file that could not be opened: refused by its type (a FIFO,
    device, socket or folder) or unreadable."""
    if isinstance(exc, NotRegularFile):
        return IngestIssue(Location(path), "not_regular", str(exc))
    return IngestIssue(Location(path), "unreadable", f"cannot read: {exc.strerror or exc}")
