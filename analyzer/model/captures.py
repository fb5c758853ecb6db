"""What a flight-recorder capture says about its failing step: its ``meta.json``, checked.

The record is built by :func:`analyzer.capture.folder.read_capture_meta`, the one reader
of the file; every consumer (ingest, the replay, the rules) reads these fields instead of
the JSON. ``raw`` keeps the whole object, for keys a newer writer adds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

CaptureMode = Literal["every_step", "every_n"]
CaptureDtype = Literal["float32", "float16", "bfloat16", "float64"]
CAPTURE_DTYPES: tuple[CaptureDtype, ...] = ("float32", "float16", "bfloat16", "float64")
CAPTURE_MODES: tuple[CaptureMode, ...] = ("every_step", "every_n")
StepKind = Literal["loss_fn", "step_fn", "model_loss", "training_step"]
STEP_KINDS: tuple[StepKind, ...] = ("loss_fn", "step_fn", "model_loss", "training_step")


@dataclass(frozen=True)
class CaptureTrigger:
    """What the recorder saw go non-finite: ``what`` is ``loss``, ``grad`` or ``param``."""

    what: str | None = None
    name: str | None = None
    kind: str | None = None


@dataclass(frozen=True)
class FactorySpec:
    """An importable ``module:function`` and the JSON keyword arguments it is called with."""

    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    """A Hugging Face config dict: the class is built as ``cls(cls.config_class.from_dict(
    config))`` instead of being called with ``kwargs``."""


@dataclass(frozen=True)
class StepSpec:
    """How the recorded step computes its loss from the model and the batch.

    ``loss_fn``: ``loss(model(inputs), targets)`` with the ``loss`` factory (version 1's only
    kind); ``step_fn``: ``factory()(model, batch)``; ``model_loss``: the model returns its own
    loss (``model(**batch).loss``); ``training_step``: a LightningModule's
    ``training_step(batch, batch_idx)``.
    """

    kind: StepKind = "loss_fn"
    factory: FactorySpec | None = None
    batch_idx: int | None = None


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer class (``torch.optim.Adam``) and param group 0's hyperparameters;
    ``lrs`` the learning rate of every param group at the failing step."""

    cls: str
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    param_groups: int | None = None
    lrs: tuple[float, ...] = ()
    params: tuple[tuple[str, ...], ...] = ()
    """The model's names of each group's parameters, in the optimizer's own order (version
    2); empty: the groups' indices are positions in ``model.parameters()`` (version 1)."""


@dataclass(frozen=True)
class Accumulation:
    """Gradient accumulation: ``micro_batches`` forward/backward passes per optimizer step,
    each loss divided by their number when ``divide``; ``failing`` the index of the
    micro-batch whose loss the run saw go non-finite (None: none did)."""

    micro_batches: int = 1
    divide: bool = True
    failing: int | None = None
    divisor: int | None = None
    """What each loss was divided by (version 2 writers record it; None: the count when
    ``divide``)."""


@dataclass(frozen=True)
class AmpSettings:
    """Mixed precision as the run used it. ``scope``: what ran under autocast, the whole
    step (``step``: a loop's own ``with torch.autocast``) or only the model's forward, its
    floating outputs cast back to float32 (``forward``: Accelerate, the HF Trainer)."""

    autocast_dtype: CaptureDtype | None = None
    device_type: str = "cpu"
    grad_scaler: bool = False
    scope: Literal["step", "forward"] = "step"


@dataclass(frozen=True)
class CaptureMeta:
    """One capture's ``meta.json``, its fields' types checked.

    ``folder`` is the ``step_N`` folder. Optional numbers are None when the file has none.
    """

    folder: str
    step: int
    trigger: CaptureTrigger
    model: FactorySpec
    loss: FactorySpec | None
    """The loss factory of the ``loss_fn`` kind; None for the other kinds (version 2)."""
    optimizer: OptimizerSpec
    dtype: CaptureDtype
    amp: AmpSettings
    device: str
    mode: CaptureMode
    lr: float | None = None
    grad_clip: float | None = None
    seed: int | None = None
    env: Mapping[str, Any] | None = None
    """The environment at the failing step, same keys as the run's ``env.json``."""
    state_step: int | None = None
    every_n: int | None = None
    history_steps: tuple[int, ...] = ()
    loss_value: float | str | None = None
    files: tuple[str, ...] = ()
    version: int = 1
    step_call: StepSpec = field(default_factory=StepSpec)
    optimizers: tuple[OptimizerSpec, ...] = ()
    """Every optimizer of the step, in the loop's order (version 1: the one ``optimizer``)."""
    accumulation: Accumulation = field(default_factory=Accumulation)
    code: Mapping[str, Any] | None = None
    """Where the factories' code lives (file, root, sha256; the script of ``__main__``)."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
