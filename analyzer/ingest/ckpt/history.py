"""A run's checkpoints side by side: when values went non-finite, which layer ran away."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable

from analyzer.ingest.ckpt.sharded import is_index, read_weight_map
from analyzer.model import Incident, Location, NonFiniteKind
from analyzer.model.checkpoints import CheckpointHistory, CheckpointScan, LayerGrowth, SaveRef


def _natural(path: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def _shards_named_by(index_path: str) -> set[str]:
    """The shard files an index would read (never an index: those it does not follow)."""
    try:
        weight_map, _ = read_weight_map(index_path)
    except OSError:
        return set()
    folder = os.path.dirname(index_path)
    names = weight_map.values() if weight_map is not None else ()
    return {os.path.normpath(os.path.join(folder, n)) for n in names if not is_index(n)}


def drop_shards(paths: list[str]) -> list[str]:
    """Shards named by an index in the list are scanned through that index only."""
    covered: set[str] = set()
    for path in paths:
        if is_index(path):
            covered |= _shards_named_by(path)
    return [p for p in paths if is_index(p) or os.path.normpath(p) not in covered]


def build_history(paths: list[str], scan_one: Callable[[str], CheckpointScan]) -> CheckpointHistory:
    """Scan the saves and order them by step; saves with no step go after every numbered
    one, by epoch where they name one, else in natural file name order, since nothing
    else says when they were written."""
    scans = [scan_one(p) for p in drop_shards(paths)]
    scans.sort(key=_order)
    first = next((i for i, s in enumerate(scans) if s.has_nonfinite), None)
    bad_layers: tuple[str, ...] = ()
    bad_tensors: tuple[str, ...] = ()
    if first is not None:
        bad_layers = tuple(layer.layer for layer in scans[first].nonfinite_layers)
        bad_tensors = tuple(t.name for t in scans[first].nonfinite_tensors)
    saves = tuple(
        SaveRef(
            s.path,
            s.step,
            len(s.nonfinite_tensors),
            s.scaler.scale if s.scaler is not None else None,
        )
        for s in scans
    )
    return CheckpointHistory(
        scans=tuple(scans),
        saves=saves,
        first_nonfinite=first,
        nonfinite_layers=bad_layers,
        nonfinite_tensor_names=bad_tensors,
        layers=_growth(scans, len(scans) if first is None else first),
        issues=tuple(i for s in scans for i in s.issues),
    )


def _order(scan: CheckpointScan) -> tuple[bool, int, bool, int, list[object]]:
    epoch = scan.meta.epoch if scan.meta is not None else None
    return (scan.step is None, scan.step or 0, epoch is None, epoch or 0, _natural(scan.path))


def _ratio(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0 or not math.isfinite(after):
        return None
    return after / before


def _growth(scans: list[CheckpointScan], finite_end: int) -> tuple[LayerGrowth, ...]:
    names: dict[str, None] = {}
    norms_by_save: list[dict[str, float]] = []
    for scan in scans:
        # A layer holding NaN/Inf gets a NaN norm: its finite-only norm would mislead.
        norms = {
            layer.layer: math.nan if layer.stats.nonfinite else layer.stats.l2_norm
            for layer in scan.layers
        }
        norms_by_save.append(norms)
        names.update(dict.fromkeys(norms))
    rows: list[LayerGrowth] = []
    for name in names:
        series = tuple(saved.get(name) for saved in norms_by_save)
        finite = [n for n in series[:finite_end] if n is not None and math.isfinite(n)]
        growth = _ratio(finite[0], finite[-1]) if len(finite) >= 2 else None
        last = _ratio(finite[-2], finite[-1]) if len(finite) >= 2 else None
        rows.append(LayerGrowth(name, series, growth, last))
    rows.sort(key=lambda r: (r.growth is None, -(r.growth or 0.0), r.layer))
    return tuple(rows)


def checkpoint_incident(history: CheckpointHistory) -> Incident | None:
    """The first save holding a non-finite tensor as an :class:`Incident`.

    ``tag`` is ``checkpoint/<tensor name>`` of the first non-finite model tensor (or any
    tensor when no model tensor is), ``layer`` its module prefix. None when no save is
    non-finite. A save whose step is unknown (``final.pt``) still fails the run: its
    incident has step None, and ``decided_by`` says why.
    """
    if history.first_nonfinite is None:
        return None
    scan = history.scans[history.first_nonfinite]
    bad = scan.nonfinite_tensors
    tensor = next((t for t in bad if t.group == "model"), bad[0])
    assert tensor.stats is not None
    kind: NonFiniteKind = "nan" if tensor.stats.nan else "+inf" if tensor.stats.pos_inf else "-inf"
    last = history.last_finite
    last_step = history.saves[last].step if last is not None else None
    layer = history.nonfinite_layers[0] if history.nonfinite_layers else None
    decided_by = "checkpoint-scan"
    epoch = scan.meta.epoch if scan.meta is not None else None
    if scan.step is None:
        named = "no step" if epoch is None else f"epoch {epoch} but no step"
        decided_by = (
            f"the save names {named} (none in its file or folder name, no step key inside "
            "it): it counts as later than every numbered save"
        )
    return Incident(
        step=scan.step,
        tag=f"checkpoint/{tensor.name}",
        kind=kind,
        last_finite_step=last_step,
        location=Location(scan.path),
        layer=layer,
        decided_by=decided_by,
        origin="checkpoint",
    )
