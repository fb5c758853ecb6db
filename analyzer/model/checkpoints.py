"""Records produced by the checkpoint scan.

Frozen dataclasses only. Numbers are plain Python floats and ints so that a scan can be
kept after every tensor it looked at has been released.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from analyzer.model.issues import IngestIssue
from analyzer.model.jsonform import encode

CheckpointFormat = Literal[
    "state_dict",
    "training",
    "lightning",
    "hf_bin",
    "full_model",
    "optimizer",
    "scaler",
    "safetensors",
    "sharded",
    "torchscript",
    "incomplete",
    "deepspeed",
    "zero_optimizer",
    "other",
    "unknown",
]
"""What the file holds. ``full_model`` is a pickled ``nn.Module`` rather than its state;
``optimizer`` and ``scaler`` are files holding only that state (``optimizer.pt``,
``scaler.pt`` beside a Hugging Face checkpoint). ``deepspeed`` is an engine's
``mp_rank_XX_model_states.pt``, ``zero_optimizer`` one ZeRO optimizer partition
(``zero_pp_rank_D_mp_rank_XX_optim_states.pt``), listed without reading its values."""

ReadMode = Literal["weights_only", "static", "trusted", "header", "none"]
"""How the contents were read.

``weights_only``: ``torch.load(weights_only=True)``. ``static``: the pickle's opcodes were
walked without executing anything. ``trusted``: the user asked for a full unpickling.
``header``: safetensors, read from its JSON header. ``none``: nothing could be read.
"""

TensorGroup = Literal["model", "optimizer", "other"]

TensorRole = Literal[
    "weights",
    "optimizer",
    "scaler",
    "other",
    "scheduler",
    "rng",
    "callback",
    "loop",
    "hyperparameters",
    "step",
    "metadata",
]
"""What a tensor means in its checkpoint. ``weights`` (the model's parameters and
buffers), ``optimizer`` (its moments and step counts), ``scaler`` (a loss scaler's state)
and ``other`` (a section no framework names, an EMA copy say) are evidence: a non-finite
value there fails the save. The rest is the trainer's bookkeeping, reported and never a
finding: ``callback`` (Lightning's ModelCheckpoint keeps ``kth_value = inf`` until its
top k fill, EarlyStopping's ``best_score`` starts at inf), ``loop`` (progress counters),
``scheduler``, ``rng``, ``hyperparameters``, ``step`` (global step, epoch) and
``metadata`` (versions, shapes, world sizes)."""

EVIDENCE_ROLES: frozenset[str] = frozenset({"weights", "optimizer", "scaler", "other"})

Primitive = int | float | str | bool | None
"""A plain value read from a checkpoint's metadata (a one-value tensor read as a float)."""

FP16_MAX = 65504.0


@dataclass(frozen=True)
class TensorStats:
    """Summary numbers of one tensor, or of a layer when aggregated.

    ``abs_max`` and ``l2_norm`` are taken over the finite values only, so that one NaN
    does not hide how large the rest of the tensor has grown. ``beyond_fp16`` counts
    finite values whose magnitude exceeds 65504, the largest float16.
    """

    numel: int
    nan: int
    pos_inf: int
    neg_inf: int
    abs_max: float
    sum_squares: float
    beyond_fp16: int

    JSON_EXTRA = ("l2_norm", "nonfinite", "beyond_fp16_share")

    @property
    def nonfinite(self) -> int:
        return self.nan + self.pos_inf + self.neg_inf

    @property
    def l2_norm(self) -> float:
        return math.sqrt(self.sum_squares)

    @property
    def beyond_fp16_share(self) -> float:
        return self.beyond_fp16 / self.numel if self.numel else 0.0


@dataclass(frozen=True)
class TensorRecord:
    """One tensor found in the checkpoint. ``stats`` is None for integer and bool
    tensors and for tensors whose bytes could not be read."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    group: TensorGroup
    stats: TensorStats | None = None
    note: str | None = None
    role: TensorRole = "other"

    @property
    def evidence(self) -> bool:
        """Whether a non-finite value here is a finding (see :data:`TensorRole`)."""
        return self.role in EVIDENCE_ROLES


@dataclass(frozen=True)
class LayerStats:
    """The model tensors sharing one module prefix, aggregated."""

    layer: str
    tensors: tuple[str, ...]
    stats: TensorStats


@dataclass(frozen=True)
class AdamFinding:
    """Adam state of one parameter.

    ``ratio_max`` is the largest ``|exp_avg| / (sqrt(exp_avg_sq) + eps)`` over the
    parameter, the step size in units of the learning rate (bias corrections left out):
    where ``exp_avg_sq`` is at or near zero while ``exp_avg`` is not, the update divides
    by little more than ``eps`` and this ratio explodes.
    """

    index: int
    param_name: str | None
    numel: int
    eps: float
    v_zero: int
    v_below_eps: int
    v_min: float
    ratio_max: float
    nonfinite: int

    @property
    def flagged(self) -> bool:
        return self.nonfinite > 0 or self.v_below_eps > 0


@dataclass(frozen=True)
class ScalerState:
    """A GradScaler state: the loss scale and how it moves."""

    key: str
    scale: float | None
    growth_tracker: int | None
    growth_factor: float | None
    backoff_factor: float | None
    growth_interval: int | None


@dataclass(frozen=True)
class StaticListing:
    """What a pickle that was not loaded asks for, read from its opcodes."""

    globals_wanted: tuple[str, ...]
    globals_all: tuple[str, ...]


@dataclass(frozen=True)
class CallbackState:
    """One callback's saved state (Lightning's ``callbacks`` section): metadata only.

    ``key`` is the state key Lightning files it under (``"ModelCheckpoint{'monitor':
    'val_loss', ...}"``), ``callback`` the class name it starts with; ``values`` its plain
    entries and one-value tensors (``kth_value``, ``best_model_score``, ``wait_count``),
    an infinite score kept as it is."""

    key: str
    callback: str
    monitor: str | None
    values: Mapping[str, Primitive]


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint says about the training that wrote it, beside the evidence.

    ``framework``: ``lightning``, ``deepspeed`` or None; ``framework_version`` its
    version string as saved. ``global_step`` and ``epoch`` as the trainer counted them.
    ``hyperparameters``: the plain values of Lightning's ``hyper_parameters`` (and
    ``datamodule_hyper_parameters``, prefixed ``datamodule.``) or DeepSpeed's
    ``ds_config``, nested keys dotted (``opt.betas.0``); ``hyperparameters_other`` the keys
    whose value is an object, named but never built. ``precision``: ``"16-mixed"`` where a
    Lightning precision plugin saved its GradScaler (``MixedPrecision``), or the dtype
    DeepSpeed's config enables (``"fp16"``, ``"bf16"``). ``callbacks``, ``counters`` (loop
    progress, DeepSpeed's skipped steps and samples) and ``schedulers`` (each scheduler's
    plain state: ``_last_lr.0``, ...). ``sections``: every top-level key of the file with
    its role."""

    framework: str | None = None
    framework_version: str | None = None
    global_step: int | None = None
    epoch: int | None = None
    hyperparameters: Mapping[str, Primitive] = field(default_factory=dict)
    hyperparameters_other: tuple[str, ...] = ()
    precision: str | None = None
    callbacks: tuple[CallbackState, ...] = ()
    counters: Mapping[str, int] = field(default_factory=dict)
    schedulers: tuple[Mapping[str, Primitive], ...] = ()
    sections: Mapping[str, TensorRole] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointScan:
    """Everything read from one checkpoint file (or one sharded index and its shards).

    ``step`` is the training step of the save; ``step_source`` where it was read: a key
    (``'global_step' key``, ``'global_steps' key`` for DeepSpeed, ``'step' key``,
    ``'iteration' key``, ``'iter' key``), the ``file name`` (``epoch=3-step=120.ckpt``) or
    the ``folder name`` (``checkpoint-500/``, ``global_step500/``). An epoch is never
    taken for a step: it is ``meta.epoch``. ``meta`` holds what the trainer saved about
    itself (None for a file that is not a map of sections, a bare state dict say, unless
    its name gives an epoch). Each tensor's ``role`` says whether it is evidence."""

    path: str
    size: int
    format: CheckpointFormat
    read_mode: ReadMode
    step: int | None = None
    step_source: str | None = None
    tensors: tuple[TensorRecord, ...] = ()
    layers: tuple[LayerStats, ...] = ()
    adam: tuple[AdamFinding, ...] = ()
    scaler: ScalerState | None = None
    static: StaticListing | None = None
    files: tuple[str, ...] = ()
    issues: tuple[IngestIssue, ...] = ()
    meta: CheckpointMeta | None = None

    @property
    def nonfinite_tensors(self) -> tuple[TensorRecord, ...]:
        """The evidence tensors holding NaN or Inf: what fails the save."""
        return tuple(t for t in self.tensors if t.evidence and _nonfinite(t))

    @property
    def nonfinite_metadata(self) -> tuple[TensorRecord, ...]:
        """Bookkeeping tensors holding NaN or Inf (an initial ``kth_value = inf``):
        reported, never a finding."""
        return tuple(t for t in self.tensors if not t.evidence and _nonfinite(t))

    @property
    def nonfinite_layers(self) -> tuple[LayerStats, ...]:
        return tuple(layer for layer in self.layers if layer.stats.nonfinite)

    @property
    def has_nonfinite(self) -> bool:
        return bool(self.nonfinite_tensors)

    def to_dict(self) -> dict[str, object]:
        return encode(self)  # type: ignore[no-any-return]


def _nonfinite(tensor: TensorRecord) -> bool:
    return tensor.stats is not None and tensor.stats.nonfinite > 0


@dataclass(frozen=True)
class LayerGrowth:
    """One layer's weight norm at each save of a run, in step order.

    A norm is None where the save lacks the layer and NaN where the layer held NaN or
    Inf. ``growth`` is last over first finite norm before the first non-finite save;
    ``last_growth`` the same over the last interval.
    """

    layer: str
    norms: tuple[float | None, ...]
    growth: float | None
    last_growth: float | None


@dataclass(frozen=True)
class SaveRef:
    """One save of a run: which file, which step, and whether it held non-finite values."""

    path: str
    step: int | None
    nonfinite_tensors: int
    scale: float | None


@dataclass(frozen=True)
class CheckpointHistory:
    """A run's checkpoints, ordered by step.

    ``first_nonfinite`` indexes ``saves`` (and ``scans``); ``layers`` is ordered with the
    fastest-growing layer (over the finite saves) first.
    """

    scans: tuple[CheckpointScan, ...]
    saves: tuple[SaveRef, ...]
    first_nonfinite: int | None
    nonfinite_layers: tuple[str, ...]
    nonfinite_tensor_names: tuple[str, ...]
    layers: tuple[LayerGrowth, ...]
    issues: tuple[IngestIssue, ...] = ()

    @property
    def last_finite(self) -> int | None:
        stop = len(self.saves) if self.first_nonfinite is None else self.first_nonfinite
        return stop - 1 if stop > 0 else None

    def to_dict(self) -> dict[str, object]:
        return encode(self)  # type: ignore[no-any-return]
