"""A :class:`SweepSummary` as terminal text: counts, causes, first failing steps, and the
keys that separate failed runs from healthy ones, each with its effect and p-value.

The words stay within what the tests say: a separator is an association in these runs
(it may stand for another key that varied with it), and a key not significant on few runs
is not shown to be harmless.
"""

from __future__ import annotations

from analyzer.model.fleet import HyperValue, Separator, Side, SkippedKey, SweepSummary

_REASONS = {
    "constant": "constant", "identifier": "a different value in every run",
    "missing": "missing in half the runs or more", "one_outcome": "in one outcome's runs only",
    "too_few": "too few runs of one outcome",
}  # fmt: skip
_MAX_NOT_SIGNIFICANT = 8


def _value(value: HyperValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def side_text(key: str, side: Side) -> str:
    """``lr >= 0.003: 41 of 44 failed``."""
    return f"{key} {side.op} {_value(side.value)}: {side.failed} of {side.runs} failed"


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def effect(separator: Separator) -> str:
    """``lr >= 0.003: 41 of 44 failed; lr <= 0.001: 2 of 120 failed``."""
    key = separator.key
    return f"{side_text(key, separator.failing)}; {side_text(key, separator.other)}"


def _counts(summary: SweepSummary) -> list[str]:
    judged = summary.failed + summary.finite
    share = f" ({summary.failed / judged:.0%} of those read)" if judged else ""
    return [f"Sweep: {summary.runs} runs: {summary.failed} failed{share}, "
            f"{summary.finite} finite, {summary.unreadable} unreadable"]


def _causes(summary: SweepSummary) -> list[str]:
    if not summary.causes:
        return []
    lines = ["", "Causes (top finding of each failed run):"]
    width = max(len(str(c.runs)) for c in summary.causes)
    for c in summary.causes:
        label = f"{c.code} {c.name}" if c.code else c.name
        tie = f" ({c.tied} tied with another cause)" if c.tied else ""
        lines.append(f"  {c.runs:>{width}}  {label}{tie}")
    if any(c.tied for c in summary.causes):
        lines.append("  a run whose top causes tie counts for each of them")
    return lines


def _steps(summary: SweepSummary) -> list[str]:
    s = summary.steps
    if not s.runs:
        return ["", f"First non-finite step: none of the {s.without_step} failed runs names "
                "a global step"] if s.without_step else []
    lines = ["", f"First non-finite step ({s.runs} failed runs"
             + (f"; {s.without_step} without a global step" if s.without_step else "")
             + "):",
             f"  min {s.minimum}  q1 {s.q1:g}  median {s.median:g}  q3 {s.q3:g}  "
             f"max {s.maximum}"]
    peak = max(b.runs for b in s.bins)
    for b in s.bins:
        span = f"{b.low}" if b.low == b.high else f"{b.low}-{b.high}"
        bar = "#" * round(20 * b.runs / peak) if peak else ""
        lines.append(f"  {span:>13}  {b.runs:>4}  {bar}")
    return lines


def _separators(summary: SweepSummary) -> list[str]:
    found = [s for s in summary.separators if s.significant]
    weak = [s for s in summary.separators if not s.significant]
    lines = ["", f"Separating keys (Holm-adjusted p < {summary.alpha:g}; "
             f"at least {summary.min_runs} runs of each outcome):"]
    if not summary.separators:
        lines.append("  none tested")
    elif not found:
        lines.append("  none: no key separates failed from finite runs at this level")
    for s in found:
        test = "Mann-Whitney" if s.test == "mann-whitney" else "Fisher"
        lines.append(f"  {s.key}  p={_p(s.p_adjusted)} ({test}, n={s.runs})")
        lines.append(f"      {effect(s)}")
    if weak:
        shown = ", ".join(f"{s.key} (p={_p(s.p_adjusted)}, n={s.runs})"
                          for s in weak[:_MAX_NOT_SIGNIFICANT])
        more = f", and {len(weak) - _MAX_NOT_SIGNIFICANT} more" \
            if len(weak) > _MAX_NOT_SIGNIFICANT else ""
        lines.append(f"  not significant: {shown}{more}")
    lines.extend(_skipped(summary.skipped))
    if found:
        lines.append("  (associations in these runs, not proof of cause: a key may stand for "
                     "another that varied with it)")
    return lines


def _skipped(skipped: tuple[SkippedKey, ...]) -> list[str]:
    if not skipped:
        return []
    by_reason: dict[str, int] = {}
    for k in skipped:
        by_reason[k.reason] = by_reason.get(k.reason, 0) + 1
    said = ", ".join(f"{n} {_REASONS[r]}" for r, n in sorted(by_reason.items()))
    keys = "key" if len(skipped) == 1 else "keys"
    return [f"  not tested: {len(skipped)} {keys} ({said})"]


def format_summary(summary: SweepSummary) -> str:
    """The summary's text block, lines joined, ending with a newline."""
    lines = [*_counts(summary), *_causes(summary), *_steps(summary)]
    if summary.failed + summary.finite:
        lines.extend(_separators(summary))
    return "\n".join(lines) + "\n"
