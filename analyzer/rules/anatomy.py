"""What the model is made of, as far as a dead run shows it: the kinds of modules it has.

A post-hoc cause is only as likely as the model lets it be: a softmax over masked keys needs
attention, a zero-variance normalisation needs a normalisation layer, an exploding
recurrence needs a recurrent layer. The names of a run's parameters tell which modules it
had, wherever they were written down: per-layer gradient and weight-norm tags, histogram
tags, the tensors of its checkpoints (their names and shapes).

A :class:`Component` is one module of one kind, with the place its name was read; an
:class:`Anatomy` is all of them, in the order found. Nothing here is a finding: rules use
it to weigh the causes a curve leaves open.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from analyzer.model import RunResult
from analyzer.tags import TagRole, role

KINDS = ("attention", "normalisation", "recurrent", "convolution", "embedding", "temperature")
"""The module kinds an anatomy tells apart."""

_WORDS: dict[str, frozenset[str]] = {
    "attention": frozenset({"attn", "attention", "self_attn", "selfattention", "mha",
                            "q_proj", "k_proj", "v_proj", "qkv", "query", "key", "value",
                            "in_proj_weight", "in_proj_bias", "c_attn", "wq", "wk", "wv"}),
    "normalisation": frozenset({"norm", "ln", "layernorm", "layer_norm", "bn", "batchnorm",
                                "batch_norm", "groupnorm", "group_norm", "gn", "rmsnorm",
                                "instancenorm", "running_mean", "running_var",
                                "num_batches_tracked", "ln_f", "ln_1", "ln_2"}),
    "recurrent": frozenset({"rnn", "lstm", "gru", "weight_ih_l0", "weight_hh_l0",
                            "bias_ih_l0", "bias_hh_l0"}),
    "convolution": frozenset({"conv", "conv1", "conv2", "conv3", "convolution"}),
    "embedding": frozenset({"embed", "embedding", "embeddings", "wte", "wpe", "tok_emb",
                            "pos_emb", "word_embeddings"}),
    "temperature": frozenset({"temperature", "tau", "logit_scale", "log_temperature"}),
}
_PREFIXES = {"attention": ("attn", "attention"), "normalisation": ("norm", "bn", "ln_"),
             "recurrent": ("lstm", "gru", "rnn", "weight_ih", "weight_hh"),
             "convolution": ("conv",), "embedding": ("embed", "emb_")}
_SPLIT = re.compile(r"[./]")


def kinds_of(name: str) -> tuple[str, ...]:
    """The module kinds a parameter or module name shows (``encoder.norm1.weight``:
    normalisation), by its dotted parts and their common prefixes; none for a plain
    ``fc1.weight``."""
    parts = [p.lower() for p in _SPLIT.split(name) if p]
    found: list[str] = []
    for kind in KINDS:
        words = _WORDS[kind]
        prefixes = _PREFIXES.get(kind, ())
        if any(p in words or p.startswith(prefixes) for p in parts):
            found.append(kind)
    return tuple(found)


@dataclass(frozen=True)
class Component:
    """One module of one kind: ``name`` as the run wrote it (a parameter or module path),
    ``source`` where it was read (``tag grad_norm/norm.weight``, ``checkpoint step_3.pt``),
    ``detail`` what else is known (``LayerNorm``, ``eps=0.0``, a weight's shape)."""

    kind: str
    name: str
    source: str
    detail: str = ""

    def brief(self) -> str:
        extra = f", {self.detail}" if self.detail else ""
        return f"{self.name} ({self.kind}{extra}; {self.source})"


@dataclass(frozen=True)
class Anatomy:
    """The modules a run shows, by kind; empty when nothing names them (a run that logged
    only its loss and kept no checkpoint)."""

    components: tuple[Component, ...] = ()

    @property
    def known(self) -> bool:
        """Whether anything at all named the model's modules."""
        return bool(self.components)

    def has(self, kind: str) -> bool:
        return any(c.kind == kind for c in self.components)

    def of(self, kind: str) -> tuple[Component, ...]:
        return tuple(c for c in self.components if c.kind == kind)

    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if self.has(k))


def _module(param: str) -> str:
    """A parameter's module path: ``encoder.norm.weight`` -> ``encoder.norm``."""
    head, _, leaf = param.rpartition(".")
    is_param = leaf in ("running_mean", "running_var", "num_batches_tracked") or \
        leaf.startswith(("weight", "bias", "in_proj_"))
    return head if head and is_param else param


def _collect(names: Iterable[tuple[str, str, str]]) -> tuple[Component, ...]:
    """Components from ``(name, source, detail)``; one per (kind, module), first source."""
    seen: set[tuple[str, str]] = set()
    out: list[Component] = []
    for name, source, detail in names:
        module = _module(name)
        for kind in kinds_of(name):
            if (kind, module) in seen:
                continue
            seen.add((kind, module))
            out.append(Component(kind, module, source, detail))
    return tuple(out)


def _tag_names(result: RunResult) -> Iterable[tuple[str, str, str]]:
    for s in result.run.global_series:
        if role(s.tag) in (TagRole.LAYER_GRAD, TagRole.LAYER_WEIGHT):
            param = s.tag.split("/", 1)[-1]
            yield param, f"tag {s.tag}", ""


def _checkpoint_names(result: RunResult) -> Iterable[tuple[str, str, str]]:
    history = result.run.checkpoints
    if history is None:
        return
    for scan in history.scans:
        source = f"checkpoint {scan.path.rsplit('/', 1)[-1]}"
        for t in scan.tensors:
            if t.group != "model":
                continue
            shape = "x".join(str(n) for n in t.shape)
            yield t.name, source, f"shape {shape}" if shape else ""


def anatomy(result: RunResult) -> Anatomy:
    """The modules the run's tags and checkpoints name."""
    return Anatomy(_collect([*_tag_names(result), *_checkpoint_names(result)]))
