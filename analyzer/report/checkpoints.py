"""A checkpoint scan and a run's checkpoint history as terminal text (``forensics inspect``).

The numbers are the scan's; :mod:`analyzer.ingest.checkpoints` computes them.
"""

from __future__ import annotations

from collections.abc import Mapping

from analyzer.model import CheckpointHistory, CheckpointScan, LayerStats, TensorStats
from analyzer.model.checkpoints import CheckpointMeta, Primitive, TensorRecord
from analyzer.wording import step_words

MAX_ROWS = 15


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def _counts(stats: TensorStats) -> str:
    return f"nan={stats.nan} +inf={stats.pos_inf} -inf={stats.neg_inf}"


def _more(total: int) -> list[str]:
    return [f"  ... {total - MAX_ROWS} more"] if total > MAX_ROWS else []


def _layer_rows(layers: tuple[LayerStats, ...]) -> list[str]:
    ranked = sorted(layers, key=lambda x: (-x.stats.nonfinite, -x.stats.abs_max))
    lines = [
        f"  {'layer':<40} {'numel':>10} {'nonfinite':>9} {'abs_max':>9} {'l2':>9} {'>fp16':>7}"
    ]
    for layer in ranked[:MAX_ROWS]:
        s = layer.stats
        lines.append(
            f"  {layer.layer[-40:]:<40} {s.numel:>10} {s.nonfinite:>9} {_num(s.abs_max):>9} "
            f"{_num(s.l2_norm):>9} {s.beyond_fp16_share:>7.2%}"
        )
    return lines + _more(len(ranked))


def _roles(tensors: tuple[TensorRecord, ...]) -> str:
    counts: dict[str, int] = {}
    for tensor in tensors:
        counts[tensor.role] = counts.get(tensor.role, 0) + 1
    return ", ".join(f"{n} {role}" for role, n in counts.items())


def _value(value: Primitive) -> str:
    return _num(value) if isinstance(value, float) else repr(value)


def _pairs(values: Mapping[str, Primitive], limit: int = MAX_ROWS) -> str:
    shown = [f"{k}={_value(v)}" for k, v in list(values.items())[:limit]]
    more = f" ... ({len(values) - limit} more)" if len(values) > limit else ""
    return " ".join(shown) + more


def _meta_lines(meta: CheckpointMeta | None) -> list[str]:
    """What the trainer saved about itself: reported, never evidence."""
    if meta is None:
        return []
    head = [f"{meta.framework} {meta.framework_version or ''}".strip()] if meta.framework else []
    head += [f"global step {meta.global_step}"] if meta.global_step is not None else []
    head += [f"epoch {meta.epoch}"] if meta.epoch is not None else []
    head += [f"precision {meta.precision}"] if meta.precision else []
    lines = [f"  saved by: {', '.join(head)}"] if head else []
    if meta.hyperparameters:
        lines.append(f"  hyperparameters: {_pairs(meta.hyperparameters)}")
    if meta.hyperparameters_other:
        lines.append("  hyperparameters holding objects (not built): "
                     + ", ".join(meta.hyperparameters_other[:MAX_ROWS]))
    for callback in meta.callbacks[:MAX_ROWS]:
        numbers = {k: v for k, v in callback.values.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        monitor = f" (monitor {callback.monitor})" if callback.monitor else ""
        lines.append(f"  callback {callback.callback}{monitor}: {_pairs(numbers)}")
    for index, scheduler in enumerate(meta.schedulers[:MAX_ROWS]):
        lines.append(f"  scheduler {index}: {_pairs(scheduler, 8)}")
    return lines


def format_scan(scan: CheckpointScan) -> str:
    """A checkpoint scan for the terminal: issues first, then what went non-finite."""
    step = "no step" if scan.step is None else f"step {scan.step} (from {scan.step_source})"
    lines = [f"{scan.path}  [{scan.format}, read: {scan.read_mode}, {_size(scan.size)}, {step}]"]
    lines += [f"  ! {issue}" for issue in scan.issues]
    if scan.static is not None and scan.static.globals_wanted:
        lines.append("  globals wanted: " + ", ".join(scan.static.globals_wanted))
    lines += _meta_lines(scan.meta)
    with_stats = [t for t in scan.tensors if t.stats is not None]
    bad = scan.nonfinite_tensors
    lines.append(
        f"  {len(scan.tensors)} tensors, {len(with_stats)} scanned, "
        f"{len(bad)} holding non-finite values"
    )
    if len({t.role for t in scan.tensors}) > 1:
        lines.append(f"  by role: {_roles(scan.tensors)}")
    for tensor in bad[:MAX_ROWS]:
        assert tensor.stats is not None
        lines.append(
            f"  non-finite {tensor.name} {list(tensor.shape)} {tensor.dtype} "
            f"{_counts(tensor.stats)}"
        )
    lines += _more(len(bad))
    kept = scan.nonfinite_metadata
    if kept:
        lines.append(f"  {len(kept)} non-finite values in the trainer's bookkeeping "
                     "(not evidence: an infinite best score or kth_value is how they start):")
        for tensor in kept[:MAX_ROWS]:
            assert tensor.stats is not None
            lines.append(f"    {tensor.name} ({tensor.role}) {_counts(tensor.stats)}")
        lines += _more(len(kept))
    if scan.layers:
        lines.append("  layers (non-finite first, then by abs_max):")
        lines += _layer_rows(scan.layers)
    unscanned = [t for t in scan.tensors if t.stats is None]
    noted = [t for t in unscanned if t.note]
    if noted and with_stats:
        lines.append("  not scanned:")
        for tensor in noted[:MAX_ROWS]:
            lines.append(f"    {tensor.name} {list(tensor.shape)} {tensor.dtype}  ({tensor.note})")
        lines += _more(len(noted))
    if unscanned and not with_stats:
        lines.append("  tensors listed:")
        for tensor in unscanned[:MAX_ROWS]:
            note = f"  ({tensor.note})" if tensor.note else ""
            lines.append(f"    {tensor.name} {list(tensor.shape)} {tensor.dtype}{note}")
        lines += _more(len(unscanned))
    flagged = [a for a in scan.adam if a.flagged]
    if scan.adam:
        lines.append(
            f"  Adam: {len(scan.adam)} parameters, {len(flagged)} with exp_avg_sq "
            "below eps^2 or non-finite"
        )
    for finding in sorted(flagged, key=lambda a: -a.ratio_max)[:MAX_ROWS]:
        name = finding.param_name or f"param {finding.index}"
        lines.append(
            f"    {name}: {finding.v_below_eps}/{finding.numel} below eps^2 "
            f"({finding.v_zero} zero), max |m|/(sqrt(v)+eps)={_num(finding.ratio_max)}, "
            f"non-finite={finding.nonfinite}"
        )
    if scan.scaler is not None:
        lines.append(
            f"  GradScaler ({scan.scaler.key}): scale={_num(scan.scaler.scale)} "
            f"growth_tracker={scan.scaler.growth_tracker}"
        )
    return "\n".join(lines)


def format_history(history: CheckpointHistory) -> str:
    """A run's saves in step order, the first non-finite one, and the fastest-growing layers."""
    lines = [f"{len(history.saves)} checkpoints in step order:"]
    for index, save in enumerate(history.saves):
        mark = "  <- first non-finite" if index == history.first_nonfinite else ""
        where = f"step {save.step:>8}" if save.step is not None else f"{'no step':>13}"
        lines.append(
            f"  {where}  non-finite tensors={save.nonfinite_tensors:<4} "
            f"scale={_num(save.scale):<8} {save.path}{mark}"
        )
    stepless = [save.path for save in history.saves if save.step is None]
    if stepless:
        shown = ", ".join(stepless[:MAX_ROWS]) + (" ..." if len(stepless) > MAX_ROWS else "")
        lines.append(
            f"{len(stepless)} with no step in their name or contents, placed after the "
            f"numbered saves: {shown}"
        )
    if history.first_nonfinite is None:
        lines.append("no checkpoint holds a non-finite tensor")
    else:
        save = history.saves[history.first_nonfinite]
        layers = ", ".join(history.nonfinite_layers[:MAX_ROWS]) or "(no model layer)"
        lines.append(
            f"first save with a non-finite tensor: {step_words(save.step)} ({save.path})"
        )
        lines.append(f"  layers: {layers}")
        if not history.nonfinite_layers:
            lines.append("  tensors: " + ", ".join(history.nonfinite_tensor_names[:MAX_ROWS]))
    growing = [g for g in history.layers if g.growth is not None]
    if growing:
        lines.append("weight-norm growth over the finite saves (fastest first):")
        for row in growing[:10]:
            norms = " -> ".join(_num(n) for n in row.norms)
            lines.append(
                f"  {row.layer}: x{_num(row.growth)} (last save x{_num(row.last_growth)})"
                f"  [{norms}]"
            )
    for issue in history.issues:
        lines.append(f"  ! {issue}")
    return "\n".join(lines)
