"""What a logged tag measures: the one vocabulary of tag names.

Every part of the analyzer that asks what a tag is asks here: the onset's tie-break, the
curves the rules read and the dashboard's panels, so their answers cannot drift apart.

    role(tag)              a TagRole: loss, grad norm, layer grad, loss scale, learning
                           rate, layer weight or other
    layer_from_tag(tag)    the layer a per-layer tag names: ``grads/fc1.weight`` -> ``fc1``
    is_validation(tag)     a tag of a validation or test pass: ``val_loss``, ``eval/loss``
    is_loss_scale_tag(tag) a mixed-precision loss scale: ``loss_scale``, ``amp/grad_scale``
    is_guard_skips_tag(tag) the count of updates a guarded step refused:
                           ``guard/skipped_steps`` (analyzer.capture.StepGuard)
    tie_rank(tag)          where a tag goes when several fail at one step: loss before
                           total gradient norm before per-layer gradients before the rest

Names are matched case-insensitively, as the frameworks write them: Lightning
(``train_loss_step``, ``lr-Adam``, ``grad_2.0_norm/fc1.weight``), Hugging Face
(``train/loss``, ``train/grad_norm``, ``train/learning_rate``), fairseq and DeepSpeed
(``loss_scale``), and the per-parameter families a training loop logs itself
(``grad_norm/<param>``, ``weight_norm/<param>``, histograms under ``grads/`` and
``weights/``). A tag has one role; the checks run in the order of ``role``'s docstring.
"""

from __future__ import annotations

import re
from enum import StrEnum


class TagRole(StrEnum):
    """What a tag measures. The values are how the dashboard names them."""

    LOSS = "loss"
    GRAD_NORM = "grad norm"
    """A gradient measure that names no layer: the total gradient norm, mostly."""
    LAYER_GRAD = "layer grad"
    LOSS_SCALE = "loss scale"
    LEARNING_RATE = "learning rate"
    LAYER_WEIGHT = "layer weight"
    """A weight or parameter norm of one layer."""
    OTHER = "other"

    @property
    def is_gradient(self) -> bool:
        """Gradients, whose values a loss scaler's overflow skip makes non-finite on purpose."""
        return self in (TagRole.GRAD_NORM, TagRole.LAYER_GRAD)


TIE_ORDER = (TagRole.LOSS, TagRole.GRAD_NORM, TagRole.LAYER_GRAD)
"""Roles in the order the onset prefers them at one step; every other role comes after."""

_FAMILY = re.compile(r"grad|weight|param|activ|norm|hist|update|act$|acts$", re.IGNORECASE)
_STAT = {
    "max", "min", "mean", "std", "var", "norm", "l2", "l1", "rms", "sum", "median", "abs_max",
    "absmax", "max_abs", "l2_norm", "grad_norm", "weight_norm", "value", "values", "hist",
}
_NOT_LAYER = {"total", "all", "global", "overall", "model", "sum"}
_PARAM_SUFFIX = re.compile(
    r"\.(weight\w*|bias\w*|gamma|beta|scale|running_mean|running_var|in_proj_\w+)$")
_SCALE = re.compile(r"loss[_\-/ ]?scale|grad[_\-]?scale|amp[_\-/ ]?scale|scaler", re.IGNORECASE)
_LR = re.compile(r"(^|[/_\-])(lr|learning[_ ]?rate)([/_\-]|$)", re.IGNORECASE)
_PARAM_GROUP = re.compile(r"pg\d+", re.IGNORECASE)
_WEIGHT = re.compile(r"^(weight_norm|weight_norms|param_norm|weights?)(/|$)", re.IGNORECASE)
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_VALIDATION = {"val", "valid", "validation", "validate", "test", "testing", "eval",
               "evaluation", "evaluate"}


def role(tag: str) -> TagRole:
    """What ``tag`` measures: a loss scale; else a loss (``loss`` in the name, ``scale``
    not); else a gradient (``grad`` in the name), per layer when it names one; else a
    learning rate; else a per-layer weight norm; else other."""
    low = tag.lower()
    if is_loss_scale_tag(tag):
        return TagRole.LOSS_SCALE
    if "loss" in low and "scale" not in low:
        return TagRole.LOSS
    layer = layer_from_tag(tag)
    if "grad" in low:
        return TagRole.GRAD_NORM if layer is None else TagRole.LAYER_GRAD
    if _is_learning_rate(tag):
        return TagRole.LEARNING_RATE
    if layer is not None and _WEIGHT.search(tag):
        return TagRole.LAYER_WEIGHT
    return TagRole.OTHER


def tie_rank(tag: str) -> int:
    """The tag's place in ``TIE_ORDER``; ``len(TIE_ORDER)`` for every other role."""
    r = role(tag)
    return TIE_ORDER.index(r) if r in TIE_ORDER else len(TIE_ORDER)


def is_loss_scale_tag(tag: str) -> bool:
    return bool(_SCALE.search(tag))


GUARD_SKIPS_TAG = "guard/skipped_steps"
"""The tag of ``analyzer.capture.StepGuard``'s count of refused updates."""


def is_guard_skips_tag(tag: str) -> bool:
    """The guard's counter, also under a logger's prefix (``train/guard/skipped_steps``)."""
    return tag == GUARD_SKIPS_TAG or tag.endswith("/" + GUARD_SKIPS_TAG)


def is_validation(tag: str) -> bool:
    """A tag of a validation, evaluation or test pass, by a word of its name (``val_loss``,
    ``eval/loss``, ``valLoss``); a word that merely contains one (``value_loss``,
    ``interval``) does not count."""
    return any(w.lower() in _VALIDATION for w in _WORD.findall(tag))


def _is_learning_rate(tag: str) -> bool:
    """``lr``, ``learning_rate``, ``train/lr``, ``lr-Adam``; Lightning's monitor names a
    parameter group ``lr-Adam/pg1`` and a momentum ``lr-Adam-momentum``."""
    parts = tag.split("/")
    last = parts[-1]
    if len(parts) > 1 and _PARAM_GROUP.fullmatch(last):
        last = parts[-2]
    return bool(_LR.search(last)) and "momentum" not in last.lower()


def _named_parts(tag: str) -> list[str] | None:
    """The parts of a per-layer tag after its family (``grad_norm``, ``weights``, ...) and
    before its trailing statistics (``/max``); None for a tag with no family."""
    parts = [p for p in tag.split("/") if p]
    while len(parts) > 1 and parts[-1].lower() in _STAT:
        parts.pop()
    families = 0
    while families < len(parts) - 1 and _FAMILY.search(parts[families]):
        families += 1
    if families == 0 or "/".join(parts[families:]).lower() in _NOT_LAYER:
        return None
    return parts[families:]


def param_from_tag(tag: str) -> str | None:
    """The parameter a per-layer tag names, dotted: ``grad_norm/conv1.weight`` and
    ``grad_norm/conv1/weight`` -> ``conv1.weight``; None for a tag that names no layer."""
    parts = _named_parts(tag)
    return ".".join(parts) if parts is not None else None


def layer_from_tag(tag: str) -> str | None:
    """The layer a per-layer tag names, e.g. ``grads/fc1.weight`` -> ``fc1``.

    A tag names a layer when it has a leading family component (``grad_norm``, ``weights``,
    ``grads``, ...) followed by a name; trailing statistics (``/max``) are dropped, and so is a
    parameter suffix such as ``.weight``.
    """
    parts = _named_parts(tag)
    if parts is None:
        return None
    name = "/".join(parts)
    return _PARAM_SUFFIX.sub("", name) or name
