"""Optimizer state: its tensors, and Adam's second moment where the update divides by it."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from analyzer.ingest.ckpt.leaves import Leaf
from analyzer.ingest.ckpt.npstats import NpChunk, adam_add, as_torch, widen
from analyzer.ingest.ckpt.pinning import torch_pinned
from analyzer.ingest.ckpt.staticpickle import dict_key
from analyzer.ingest.ckpt.stats import StatsAccumulator, count, scratch, work_view
from analyzer.ingest.ckpt.tree import LeafSource
from analyzer.model.checkpoints import AdamFinding, TensorRecord

if TYPE_CHECKING:
    import torch
    from torch import Tensor

DEFAULT_EPS = 1e-8


class _AdamAccumulator:
    def __init__(self, eps: float) -> None:
        self.eps = eps
        self.v_zero = 0
        self.v_below_eps = 0
        self.v_min = float("inf")
        self.ratio_max = 0.0

    def add(self, m_chunk: object, v_chunk: object) -> None:
        if isinstance(m_chunk, NpChunk) and isinstance(v_chunk, NpChunk):
            m_torch, v_torch = as_torch(m_chunk, "adam_m"), as_torch(v_chunk, "adam_v")
            if m_torch is not None and v_torch is not None:
                m_chunk, v_chunk = m_torch, v_torch
        if isinstance(m_chunk, NpChunk) and isinstance(v_chunk, NpChunk):
            v_low, zero, below, ratio_max = adam_add(self.eps, m_chunk, v_chunk)
            self.v_min = min(self.v_min, v_low)
            self.v_zero += zero
            self.v_below_eps += below
            self.ratio_max = max(self.ratio_max, ratio_max)
            return
        torch = torch_pinned()
        # detached: a saved tensor may say it requires grad, and out= refuses those
        m = work_view(_as_torch(m_chunk), "adam_m").detach()
        v = work_view(_as_torch(v_chunk), "adam_v").detach()
        bounds = [float(x) for x in (*torch.aminmax(m), *torch.aminmax(v))]
        if not all(math.isfinite(x) for x in bounds):
            finite = torch.isfinite(m) & torch.isfinite(v)
            m, v = m[finite], v[finite]
            if v.numel() == 0:
                return
            bounds = [float(x) for x in (*torch.aminmax(m), *torch.aminmax(v))]
        v_low = bounds[2]
        self.v_min = min(self.v_min, v_low)
        threshold = self.eps * self.eps
        if v_low <= 0:
            self.v_zero += count(v == 0)
        if v_low < threshold:
            self.v_below_eps += count(v < threshold)
        denominator = scratch("adam_den", v.dtype, v.numel())
        # IEEE's correctly rounded root, what numpy's reading gives (npstats.adam_add);
        # torch's float32 kernel is not. numpy's sqrt is, in float32 and float64, on the
        # tensor's own memory; other dtypes take the float64 root rounded once.
        root = v.clamp(min=0) if v_low < 0 else v
        if root.dtype in (torch.float32, torch.float64) and root.device.type == "cpu":
            np.sqrt(root.numpy(), out=denominator.view(root.shape).numpy())
        else:
            denominator.copy_(torch.sqrt(root.double()))
        denominator.add_(self.eps)
        ratio = scratch("adam_ratio", m.dtype, m.numel())
        torch.abs(m, out=ratio)
        ratio.div_(denominator)
        self.ratio_max = max(self.ratio_max, float(ratio.max()))


def _as_torch(chunk: object) -> torch.Tensor:
    """A chunk as a torch tensor (one of a pair read with numpy, the other not)."""
    if isinstance(chunk, NpChunk):
        torch = torch_pinned()
        return cast("Tensor", torch.from_numpy(widen(chunk.raw, chunk.kind, "adam_torch").copy()))
    return cast("Tensor", chunk)


def _eps_by_param(groups: object) -> dict[object, float]:
    found: dict[object, float] = {}
    if not isinstance(groups, list | tuple):
        return found
    for group in groups:
        if not isinstance(group, Mapping):
            continue
        eps = group.get("eps", DEFAULT_EPS)
        eps = float(eps) if isinstance(eps, int | float) else DEFAULT_EPS
        params = group.get("params")
        for param in params if isinstance(params, list | tuple) else ():
            found[dict_key(param)] = eps
    return found


def _names_by_shape(
    order: Sequence[object], shapes: Mapping[object, tuple[int, ...]], model: Sequence[TensorRecord]
) -> dict[object, str]:
    """Optimizer indices follow ``model.parameters()`` order, which is state_dict order
    without the buffers: match them greedily by shape, skipping what does not fit."""
    names: dict[object, str] = {}
    position = 0
    for param in order:
        shape = shapes.get(param)
        if shape is None:
            continue
        while position < len(model) and model[position].shape != shape:
            position += 1
        if position == len(model):
            break
        names[param] = model[position].name
        position += 1
    return names


def scan_optimizer(
    key: str,
    state_dict: Mapping[object, object],
    leaves: LeafSource,
    model: Sequence[TensorRecord],
    record: object,
) -> tuple[list[TensorRecord], list[AdamFinding]]:
    """Records for every tensor of one optimizer state and findings for its Adam moments.

    ``record`` is the caller's ``(name, group, leaf) -> TensorRecord`` function.
    """
    state = state_dict.get("state")
    if not isinstance(state, Mapping):
        return [], []
    eps_of = _eps_by_param(state_dict.get("param_groups"))
    order = list(eps_of) or list(state)
    shapes: dict[object, tuple[int, ...]] = {}
    for param, slots in state.items():
        leaf = leaves.leaf(slots.get("exp_avg")) if isinstance(slots, Mapping) else None
        if leaf is not None:
            shapes[param] = leaf.shape
    names = _names_by_shape(order, shapes, [r for r in model if r.stats is not None])
    records: list[TensorRecord] = []
    findings: list[AdamFinding] = []
    for index, (param, slots) in enumerate(state.items()):
        if not isinstance(slots, Mapping):
            continue
        prefix = f"{key}.state.{param}"
        paired = _paired(slots, leaves)
        for slot, value in slots.items():
            leaf = leaves.leaf(value)
            if leaf is None or (paired is not None and slot in ("exp_avg", "exp_avg_sq")):
                continue
            records.append(record(f"{prefix}.{slot}", "optimizer", leaf))  # type: ignore[operator]
        if paired is not None:
            param_index = param if isinstance(param, int) else index
            eps = eps_of.get(param, DEFAULT_EPS)
            pair_records, finding = _adam(prefix, paired, eps, param_index, names.get(param))
            records.extend(pair_records)
            findings.append(finding)
    return records, findings


def _paired(slots: Mapping[object, object], leaves: LeafSource) -> tuple[Leaf, Leaf] | None:
    m = leaves.leaf(slots.get("exp_avg"))
    v = leaves.leaf(slots.get("exp_avg_sq"))
    if m is None or v is None or m.chunks is None or v.chunks is None:
        return None
    if m.shape != v.shape or m.layout != v.layout or not (m.numeric and v.numeric):
        return None  # chunks of the two would not line up value for value
    return m, v


def _adam(
    prefix: str, pair: tuple[Leaf, Leaf], eps: float, index: int, name: str | None
) -> tuple[list[TensorRecord], AdamFinding]:
    m_leaf, v_leaf = pair
    m_acc, v_acc, adam = StatsAccumulator(), StatsAccumulator(), _AdamAccumulator(eps)
    assert m_leaf.chunks is not None and v_leaf.chunks is not None
    for m, v in _zip_chunks(m_leaf.chunks(), v_leaf.chunks()):
        m_acc.add(m, "adam_m")
        v_acc.add(v, "adam_v")
        adam.add(m, v)
    m_stats, v_stats = m_acc.result(), v_acc.result()
    records = [
        TensorRecord(f"{prefix}.exp_avg", m_leaf.shape, m_leaf.dtype, "optimizer", m_stats,
                     role="optimizer"),
        TensorRecord(f"{prefix}.exp_avg_sq", v_leaf.shape, v_leaf.dtype, "optimizer", v_stats,
                     role="optimizer"),
    ]
    finding = AdamFinding(
        index=index,
        param_name=name,
        numel=v_stats.numel,
        eps=eps,
        v_zero=adam.v_zero,
        v_below_eps=adam.v_below_eps,
        v_min=adam.v_min if v_stats.numel else 0.0,
        ratio_max=adam.ratio_max,
        nonfinite=m_stats.nonfinite + v_stats.nonfinite,
    )
    return records, finding


def _zip_chunks(
    first: Iterator[torch.Tensor | NpChunk], second: Iterator[torch.Tensor | NpChunk]
) -> Iterator[tuple[torch.Tensor | NpChunk, torch.Tensor | NpChunk]]:
    # Both iterators are advanced to their end so that each releases its last chunk.
    while True:
        a, b = next(first, None), next(second, None)
        if a is None or b is None:
            return
        n = min(a.numel(), b.numel())
        yield a[:n], b[:n]
