"""What the model is made of, as far as a dead run shows it: the kinds of modules it has.

A post-hoc cause is only as likely as the model lets it be: a softmax over masked keys needs
attention, a zero-variance normalisation needs a normalisation layer, an exploding
recurrence needs a recurrent layer. What the run wrote down about its model tells which
modules it had, strongest first:

- a description in its log (Lightning's model summary, a printed module: see
  :mod:`analyzer.ingest.logformats.model_print`), which names each module's class and a
  normalisation's ``eps``;
- a Hugging Face ``config.json``: its attention heads (or, without them, its model type:
  every transformers model but the few attention-free families has attention), its norm
  epsilon (``layer_norm_eps``, ``layer_norm_epsilon``, ``rms_norm_eps``, ``norm_eps``) and
  its vocabulary (an embedding);
- the names of its parameters: per-layer gradient and weight-norm tags, histogram tags, the
  tensors of its checkpoints (their names and shapes).

A class counts more than a name: where a description gives the class of the module a name
points at, the class decides. A module called ``norm`` that is a ``Linear`` is no
normalisation (a name is refuted by a leaf class that shows another kind or none; a
container such as ``Sequential`` or a class of the model's own that shows no kind leaves the
name standing). Words that name a member of a kind's module (``q_proj``, ``running_mean``,
``weight_ih_l0``) are checked against the class of the module holding them.

A :class:`Component` is one module of one kind, with the place it was read (for a log, the
file and line); an :class:`Anatomy` is all of them, in the order found. Nothing here is a
finding: rules use it to weigh the causes a curve leaves open.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from analyzer.model import RunResult
from analyzer.tags import TagRole, role
from analyzer.wording import relative_path

KINDS = ("attention", "normalisation", "recurrent", "convolution", "embedding", "temperature")
"""The module kinds an anatomy tells apart."""

_WORDS: dict[str, frozenset[str]] = {
    "attention": frozenset({"attn", "attention", "self_attn", "selfattention", "mha",
                            "q_proj", "k_proj", "v_proj", "qkv",
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


_MEMBERS = frozenset({"q_proj", "k_proj", "v_proj", "qkv", "query", "key", "value",
                      "in_proj_weight", "in_proj_bias", "c_attn", "wq", "wk", "wv",
                      "running_mean", "running_var", "num_batches_tracked", "weight_ih_l0",
                      "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"})
"""Words that name a part of a kind's module (a projection, a buffer, a weight), not the
module itself: the class that decides is the holder's."""
_MEMBER_PREFIXES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"Attention|Attn")),
    ("normalisation", re.compile(r"(?:Layer|Batch|Group|Instance|RMS|Rms|LocalResponse)Norm"
                                 r"|Norm(?:[123]d)?$")),
    ("recurrent", re.compile(r"^(?:RNN|LSTM|GRU)(?:Cell)?$|(?:LSTM|GRU)$")),
    # transformers' Conv1D is a linear layer with its weight transposed: not a convolution.
    ("convolution", re.compile(r"Conv(?:Transpose)?[123]d")),
    ("embedding", re.compile(r"Embedding")),
)
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
TORCH_LEAVES = frozenset({
    "Linear", "Bilinear", "LazyLinear", "Identity", "Flatten", "Unflatten",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "LazyConv1d", "LazyConv2d", "LazyConv3d",
    "Embedding", "EmbeddingBag",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LayerNorm", "GroupNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "RMSNorm", "LocalResponseNorm",
    "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "MultiheadAttention",
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "SELU", "CELU", "GELU", "SiLU",
    "Mish", "Tanh", "Sigmoid", "Hardtanh", "Hardsigmoid", "Hardswish", "Softplus",
    "Softsign", "Softshrink", "Hardshrink", "Tanhshrink", "Threshold", "GLU", "LogSigmoid",
    "Softmax", "Softmax2d", "LogSoftmax", "Softmin",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "LPPool1d", "LPPool2d",
    "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
    "PixelUnshuffle", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
    "ReflectionPad1d", "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d",
    "ChannelShuffle", "CosineSimilarity", "PairwiseDistance",
})
"""torch.nn's leaf modules: a described module of one of these classes holds no other
module, so what it is not, the model does not have there. A class of the user's own (a
Lightning summary at its default depth lists only the top-level children) may hold
anything: it rules nothing out."""

_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")
_EPS_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "norm_eps")
_NO_ATTENTION = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "resnet", "convnext",
                           "convnextv2", "regnet", "efficientnet", "mobilenet_v1",
                           "mobilenet_v2", "bit", "van", "textnet", "timm_wrapper"})
"""transformers model types without attention (state-space, recurrent and convolutional
families); a config of another type and no head count is taken to have attention."""


def _is_member(part: str) -> bool:
    return part in _MEMBERS or part.startswith(_MEMBER_PREFIXES)


def _triggers(parts: list[str]) -> dict[str, list[int]]:
    """Per kind, the indices of the dotted parts that show it."""
    found: dict[str, list[int]] = {}
    low = [p.lower() for p in parts]
    for kind in KINDS:
        words = _WORDS[kind]
        prefixes = _PREFIXES.get(kind, ())
        hits = [i for i, p in enumerate(low) if p in words or p.startswith(prefixes)]
        if hits:
            found[kind] = hits
    return found


def kinds_of(name: str) -> tuple[str, ...]:
    """The module kinds a parameter or module name shows (``encoder.norm1.weight``:
    normalisation), by its dotted parts and their common prefixes; none for a plain
    ``fc1.weight``."""
    found = _triggers([p for p in _SPLIT.split(name) if p])
    return tuple(k for k in KINDS if k in found)


def class_kinds(cls: str) -> tuple[str, ...]:
    """The module kinds a class name shows (``LayerNorm``, ``LlamaRMSNorm``:
    normalisation; ``MultiheadAttention``, ``GPT2Attention``: attention; ``Linear``: none)."""
    return tuple(kind for kind, pattern in _CLASSES if pattern.search(cls))


@dataclass(frozen=True)
class Component:
    """One module of one kind: ``name`` as the run wrote it (a parameter or module path,
    or a config key), ``source`` where it was read (``tag grad_norm/norm.weight``,
    ``checkpoint step_3.pt``, ``log train.log:12``, ``config checkpoint-8/config.json``),
    ``detail`` what else is known (``LayerNorm, eps=0``, a weight's shape); ``module_class``
    and ``eps`` the class and epsilon a description gave, as values."""

    kind: str
    name: str
    source: str
    detail: str = ""
    module_class: str = ""
    eps: float | None = None

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

    def eps_zero(self) -> tuple[Component, ...]:
        """The normalisation components whose epsilon is known to be 0: a zero-variance
        feature then divides by zero."""
        return tuple(c for c in self.of("normalisation") if c.eps == 0)


def _module(param: str) -> str:
    """A parameter's module path: ``encoder.norm.weight`` -> ``encoder.norm``."""
    head, _, leaf = param.rpartition(".")
    is_param = leaf in ("running_mean", "running_var", "num_batches_tracked") or \
        leaf.startswith(("weight", "bias", "in_proj_"))
    return head if head and is_param else param


def _eps_text(eps: float) -> str:
    return "eps=0" if eps == 0 else f"eps={eps:g}"


@dataclass(frozen=True)
class _Described:
    """One module a log's description names."""

    parts: tuple[str, ...]
    cls: str
    leaf: bool
    source: str
    eps: float | None


def _part_matches(described: str, part: str) -> bool:
    """``0-3`` (a repr's collapsed repeats) stands for the parts ``0`` to ``3``."""
    if described == part:
        return True
    low, dash, high = described.partition("-")
    return bool(dash) and low.isdigit() and high.isdigit() and part.isdigit() \
        and int(low) <= int(part) <= int(high)


def _key(part: str) -> str:
    return "#" if part[:1].isdigit() else part


class _Classes:
    """The described modules, looked up by a module path: a description's names may lack
    the prefix a checkpoint's have (``model.``, ``module.``), or have one they lack."""

    def __init__(self, described: list[_Described]) -> None:
        self.by_leaf: dict[str, list[_Described]] = {}
        for d in described:
            self.by_leaf.setdefault(_key(d.parts[-1]), []).append(d)

    def find(self, parts: list[str]) -> _Described | None:
        best: _Described | None = None
        best_len = 0
        for d in self.by_leaf.get(_key(parts[-1]), ()):
            n = min(len(d.parts), len(parts))
            if parts[-1][:1].isdigit() and n < 2 and len(parts) != len(d.parts):
                continue  # a bare index names no module by itself
            if n > best_len and all(_part_matches(a, b) for a, b in
                                    zip(d.parts[-n:], parts[-n:], strict=True)):
                best, best_len = d, n
        return best

    def verdict(self, parts: list[str], kind: str) -> bool | None:
        """True when the class of the module ``parts`` name shows ``kind``, False when it
        rules it out, None when no description gives its class."""
        found = self.find(parts) if parts else None
        if found is None:
            return None
        if kind in class_kinds(found.cls):
            return True
        return False if found.leaf and found.cls in TORCH_LEAVES else None


def _described(result: RunResult) -> list[_Described]:
    out: list[_Described] = []
    run = result.run
    for e in run.events:
        if e.kind != "model_description":
            continue
        modules = e.detail.get("modules")
        if not isinstance(modules, list):
            continue
        where = relative_path(e.location.file, run.path)
        for m in modules:
            name, cls = m.get("name"), m.get("class")
            if not isinstance(name, str) or not isinstance(cls, str) or not name:
                continue
            eps = m.get("eps")
            out.append(_Described(tuple(name.split(".")), cls, m.get("leaf") is not False,
                                  f"log {where}:{m.get('line')}",
                                  float(eps) if isinstance(eps, int | float) else None))
    return out


def _class_components(described: list[_Described]) -> Iterable[Component]:
    for d in described:
        for kind in class_kinds(d.cls):
            eps = d.eps if kind == "normalisation" else None
            detail = d.cls if eps is None else f"{d.cls}, {_eps_text(eps)}"
            yield Component(kind, ".".join(d.parts), d.source, detail, d.cls, eps)


def _config_components(result: RunResult) -> Iterable[Component]:
    meta = result.run.metadata
    for f in meta.files if meta is not None else ():
        if f.kind != "model_config":
            continue
        source = f"config {relative_path(f.path, result.run.path)}"
        fields = f.fields
        model = fields.get("model_type")
        model_type = model if isinstance(model, str) else ""
        heads = next(((k, v) for k in _HEADS if isinstance(v := fields.get(k), int)
                      and not isinstance(v, bool) and v > 0), None)
        if heads is not None:
            yield Component("attention", heads[0], source, f"{heads[0]}={heads[1]}")
        elif model_type and model_type not in _NO_ATTENTION:
            yield Component("attention", "model_type", source,
                            f"model_type={model_type} (a transformers model)")
        for key in _EPS_KEYS:
            eps = fields.get(key)
            if isinstance(eps, int | float) and not isinstance(eps, bool):
                yield Component("normalisation", key, source, _eps_text(float(eps)),
                                eps=float(eps))
        vocab = fields.get("vocab_size")
        if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
            yield Component("embedding", "vocab_size", source, f"vocab_size={vocab}")


def _name_components(names: Iterable[tuple[str, str, str]], classes: _Classes
                     ) -> Iterable[Component]:
    """Components from ``(name, source, detail)``, each kind a name shows that no
    description's class rules out; a kind a class confirms is the description's already."""
    for name, source, detail in names:
        parts = [p for p in _SPLIT.split(name) if p]
        module = _module(name)
        for kind, hits in _triggers(parts).items():
            verdicts = [classes.verdict(parts[:i] if _is_member(parts[i].lower())
                                        else parts[:i + 1], kind) for i in hits]
            if True in verdicts or None not in verdicts:
                continue  # confirmed (the description's component), or ruled out
            yield Component(kind, module, source, detail)


_QKV = frozenset({"query", "key", "value", "q", "k", "v"})
"""Projection names that show attention only together: a lone ``value`` head is an RL
critic's, a lone ``key`` anything."""


def _paired_projections(names: Iterable[tuple[str, str, str]]) -> Iterable[Component]:
    """Attention where one module holds at least two of query, key and value."""
    held: dict[str, set[str]] = {}
    first: dict[str, str] = {}
    for name, source, _ in names:
        parts = [p for p in _SPLIT.split(name) if p]
        if parts and parts[-1] in ("weight", "bias"):
            parts = parts[:-1]
        if len(parts) >= 2 and parts[-1].lower() in _QKV:
            parent = ".".join(parts[:-1])
            held.setdefault(parent, set()).add(parts[-1].lower()[0])
            first.setdefault(parent, source)
    for parent, letters in held.items():
        if len(letters) >= 2:
            yield Component("attention", parent, first[parent], "query/key/value projections")


def _collect(components: Iterable[Component]) -> tuple[Component, ...]:
    """One component per (kind, name), the first source."""
    seen: set[tuple[str, str]] = set()
    out: list[Component] = []
    for c in components:
        if (c.kind, c.name) not in seen:
            seen.add((c.kind, c.name))
            out.append(c)
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
        source = f"checkpoint {relative_path(scan.path, result.run.path)}"
        for t in scan.tensors:
            if t.group != "model":
                continue
            shape = "x".join(str(n) for n in t.shape)
            yield t.name, source, f"shape {shape}" if shape else ""


def _described_names(described: list[_Described]) -> Iterable[tuple[str, str, str]]:
    for d in described:
        yield ".".join(d.parts), d.source, d.cls


def anatomy(result: RunResult) -> Anatomy:
    """The modules the run's log descriptions, model config, tags and checkpoints name."""
    described = _described(result)
    classes = _Classes(described)
    names = [*_tag_names(result), *_checkpoint_names(result), *_described_names(described)]
    return Anatomy(_collect([*_class_components(described), *_config_components(result),
                             *_name_components(names, classes), *_paired_projections(names)]))


def described_whole(result: RunResult) -> bool:
    """Whether a log's model description lists the whole model down to torch.nn's own
    leaf modules (a printed repr, a summary deep enough): only then does a kind missing
    from it mean the model has none."""
    events = [e for e in result.run.events if e.kind == "model_description"]
    for e in events:
        modules = e.detail.get("modules")
        if not isinstance(modules, list) or not modules:
            continue
        leaves = [m for m in modules if isinstance(m, dict) and m.get("leaf") is not False]
        if leaves and all(m.get("class") in TORCH_LEAVES for m in leaves):
            return True
    return False

