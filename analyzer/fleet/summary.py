"""The sweep summary: which runs died, of what, when, and what the dead ones have in common.

:func:`summarize` takes the results of many runs (a sweep, a cluster's logdir) and counts
their outcomes, ranks the causes by the failed runs they explain, describes the first
failing steps, and tests each hyperparameter (:func:`analyzer.fleet.hyperparams.
hyperparameters`) for association with failure:

- a number: the Mann-Whitney U test (the failed runs' values against the healthy ones',
  two sided), its effect the cut that best separates the outcomes (the largest Youden's J,
  ``lr >= 0.003: 41 of 44 failed; lr <= 0.001: 2 of 120``);
- a category (text, a flag, a seed, or a key whose values mix types): Fisher's exact test of each
  value against the rest, two sided; the key's p is its values' smallest times the number
  of values tested (Bonferroni within the key; a two-valued key is one test).

Across keys the p-values are adjusted by Holm's method, and a key is a separator only when
its adjusted p is under ``alpha`` (0.01): the others are kept, marked not significant, so
a reader sees what was tested on how many runs. Keys are not tested, and are counted as
skipped, when they are constant, a different text in every run (an identifier: a name, a
seed drawn per run), missing
from half the judged runs or more, present in one outcome only, or held by fewer than
``min_runs`` runs of either outcome. Unreadable runs count, and are judged for nothing else.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from analyzer.fleet.hyperparams import hyperparameters
from analyzer.model import RunResult, top_tie
from analyzer.model.fleet import (
    CauseCount,
    HyperValue,
    RunRow,
    Separator,
    Side,
    SkippedKey,
    SkipReason,
    StepBin,
    StepDistribution,
    SweepSummary,
)
from analyzer.model.jsonform import encode

ALPHA = 0.01
MIN_RUNS = 3
MAX_BINS = 10
NO_CAUSE = "no cause named"


def _row(result: RunResult) -> RunRow:
    causes = [f for f in top_tie(result.findings) if f.role == "cause"] if result.failed else []
    incident = result.incident
    return RunRow(path=result.run.path, name=result.run.name, status=result.status,
                  cause=causes[0].code if causes else None,
                  causes=tuple(f.code for f in causes),
                  first_step=incident.step if incident is not None and incident.aligned
                  else None,
                  hyperparameters=hyperparameters(result))


def _causes(results: Sequence[RunResult]) -> tuple[CauseCount, ...]:
    runs: Counter[tuple[str | None, str]] = Counter()
    tied: Counter[tuple[str | None, str]] = Counter()
    for result in results:
        if not result.failed:
            continue
        causes = [f for f in top_tie(result.findings) if f.role == "cause"]
        if not causes:
            runs[(None, NO_CAUSE)] += 1
        for f in causes:
            runs[(f.code, f.name)] += 1
            if len(causes) > 1:
                tied[(f.code, f.name)] += 1
    ranked = sorted(runs, key=lambda k: (-runs[k], k[0] is None, k[0] or ""))
    return tuple(CauseCount(code, name, runs[(code, name)], tied[(code, name)])
                 for code, name in ranked)


def _steps(rows: Sequence[RunRow]) -> StepDistribution:
    failed = [r for r in rows if r.status == "failed"]
    steps = np.array(sorted(r.first_step for r in failed if r.first_step is not None),
                     dtype=np.int64)
    without = len(failed) - int(steps.size)
    if not steps.size:
        return StepDistribution(0, without)
    q1, median, q3 = (float(q) for q in np.percentile(steps, [25, 50, 75]))
    low, high = int(steps[0]), int(steps[-1])
    width = max(1, math.ceil((high - low + 1) / MAX_BINS))
    bins = []
    for start in range(low, high + 1, width):
        end = min(start + width - 1, high)
        bins.append(StepBin(start, end, int(((steps >= start) & (steps <= end)).sum())))
    return StepDistribution(int(steps.size), without, low, q1, median, q3, high, tuple(bins))


def _number(value: HyperValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_NUMERIC_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _numbers(pairs: list[tuple[HyperValue, bool]]) -> list[tuple[HyperValue, bool]]:
    """The pairs with numbers written as text read as numbers, when every value of the key
    is a number either way: YAML 1.1 reads ``5e-3`` as a string, ``5.0e-3`` as a float,
    and one sweep's configs may hold both."""
    if all(_number(v) for v, _ in pairs) or not all(
            _number(v) or (isinstance(v, str) and _NUMERIC_TEXT.fullmatch(v.strip()))
            for v, _ in pairs):
        return pairs
    read = [(v if _number(v) else float(v), f) for v, f in pairs]
    return read if all(math.isfinite(float(v)) for v, _ in read) else pairs  # "1e999"


def _label(key: str) -> bool:
    """A seed (``seed``, ``data_seed``, ``env.seed``): a number whose order means nothing,
    compared as a category (distinct in every run, an identifier)."""
    last = key.rsplit(".", 1)[-1].lower()
    return last == "seed" or last.endswith("_seed")


def _cut(values: list[float], failed: list[bool]) -> tuple[Side, Side]:
    """The threshold between two neighbouring values that best separates the outcomes (the
    largest Youden's J, either direction), as (the failing side, the other side)."""
    order = np.argsort(values, kind="stable")
    v = np.asarray(values, dtype=np.float64)[order]
    f = np.asarray(failed, dtype=bool)[order]
    n_fail, n_ok = int(f.sum()), int((~f).sum())
    fail_below = np.cumsum(f)  # failed runs with a value <= v[i]
    ok_below = np.cumsum(~f)
    best: tuple[float, int, bool] | None = None
    for i in range(len(v) - 1):
        if v[i] == v[i + 1]:
            continue
        # Share of failed runs at or below the cut minus share of healthy ones.
        j = fail_below[i] / n_fail - ok_below[i] / n_ok
        if best is None or abs(j) > best[0] + 1e-12:
            best = (abs(j), i, j < 0)  # j < 0: failures above the cut
    assert best is not None  # a key is tested only with two values or more
    _, i, above = best
    lo, hi = _plain(v[i]), _plain(v[i + 1])
    below = Side("<=", lo, i + 1, int(fail_below[i]))
    upper = Side(">=", hi, len(v) - i - 1, n_fail - int(fail_below[i]))
    return (upper, below) if above else (below, upper)


def _plain(value: np.float64) -> HyperValue:
    number = float(value)
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _numeric_test(key: str, pairs: list[tuple[HyperValue, bool]]) -> Separator:
    from scipy.stats import mannwhitneyu

    values = [float(v) for v, _ in pairs]
    failed = [f for _, f in pairs]
    bad = [v for v, f in zip(values, failed, strict=True) if f]
    good = [v for v, f in zip(values, failed, strict=True) if not f]
    p = float(mannwhitneyu(bad, good, alternative="two-sided").pvalue)
    failing, other = _cut(values, failed)
    return Separator(key, "number", "mann-whitney", len(pairs), len(bad), _p(p), _p(p), False,
                     failing, other)


def _category_test(key: str, pairs: list[tuple[HyperValue, bool]]) -> Separator:
    from scipy.stats import fisher_exact

    texts = [(_text(v), f) for v, f in pairs]
    n_fail = sum(f for _, f in texts)
    counts: Counter[str] = Counter(v for v, _ in texts)
    fails: Counter[str] = Counter(v for v, f in texts if f)
    tests = 1 if len(counts) == 2 else len(counts)
    best: tuple[float, float, str] | None = None
    for value in sorted(counts):
        a, b = fails[value], counts[value] - fails[value]
        c, d = n_fail - a, len(texts) - n_fail - b
        p = float(fisher_exact([[a, b], [c, d]], alternative="two-sided").pvalue)
        rate_gap = a / counts[value] - (c / (c + d) if c + d else 0.0)
        if best is None or (p, -abs(rate_gap)) < (best[0], -abs(best[1])):
            best = (p, rate_gap, value)
    assert best is not None
    p, gap, value = best
    inside = Side("==", value, counts[value], fails[value])
    rest = [v for v in counts if v != value]
    # Of two values, the rest is the other one: say it by name.
    outside = Side("==" if len(rest) == 1 else "!=", rest[0] if len(rest) == 1 else value,
                   len(texts) - counts[value], n_fail - fails[value])
    failing, other = (inside, outside) if gap >= 0 else (outside, inside)
    adjusted = min(1.0, p * tests)
    return Separator(key, "category", "fisher", len(texts), n_fail, _p(adjusted),
                     _p(adjusted), False, failing, other)


def _text(value: HyperValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _p(p: float) -> float:
    return 1.0 if math.isnan(p) else min(1.0, max(0.0, p))


def _skip_reason(pairs: list[tuple[HyperValue, bool]], judged: int, min_runs: int
                 ) -> SkipReason | None:
    if 2 * len(pairs) <= judged:
        return "missing"
    n_fail = sum(f for _, f in pairs)
    if n_fail == 0 or n_fail == len(pairs):
        return "one_outcome"
    if min(n_fail, len(pairs) - n_fail) < min_runs:
        return "too_few"
    texts = {_text(v) if not _number(v) else repr(float(v)) for v, _ in pairs}
    if len(texts) == 1:
        return "constant"
    if len(texts) == len(pairs) and not all(_number(v) for v, _ in pairs):
        return "identifier"
    return None


def _holm(separators: list[Separator], alpha: float) -> list[Separator]:
    """Holm's step-down adjustment over every key tested, smallest adjusted p first."""
    order = sorted(range(len(separators)), key=lambda i: (separators[i].p_value,
                                                          separators[i].key))
    m = len(separators)
    out: list[Separator] = []
    running = 0.0
    for rank, i in enumerate(order):
        s = separators[i]
        running = max(running, min(1.0, (m - rank) * s.p_value))
        out.append(Separator(s.key, s.kind, s.test, s.runs, s.failed, s.p_value, running,
                             running < alpha, s.failing, s.other))
    return out


def _separators(rows: Sequence[RunRow], alpha: float, min_runs: int
                ) -> tuple[list[Separator], list[SkippedKey]]:
    judged = [r for r in rows if r.status != "unreadable"]
    keys = sorted({k for r in judged for k in r.hyperparameters})
    tested: list[Separator] = []
    skipped: list[SkippedKey] = []
    for key in keys:
        pairs = [(r.hyperparameters[key], r.status == "failed") for r in judged
                 if key in r.hyperparameters]
        pairs = [(_text(v), f) for v, f in pairs] if _label(key) else _numbers(pairs)
        reason = _skip_reason(pairs, len(judged), min_runs)
        if reason is not None:
            skipped.append(SkippedKey(key, reason, len(pairs)))
        elif all(_number(v) for v, _ in pairs):
            tested.append(_numeric_test(key, pairs))
        else:
            tested.append(_category_test(key, pairs))
    return _holm(tested, alpha), skipped


def summarize(results: Sequence[RunResult], *, alpha: float = ALPHA,
              min_runs: int = MIN_RUNS) -> SweepSummary:
    """The sweep summary of ``results`` (one per run)."""
    rows = tuple(_row(r) for r in results)
    status = Counter(r.status for r in rows)
    separators, skipped = _separators(rows, alpha, min_runs)
    return SweepSummary(runs=len(rows), failed=status["failed"], finite=status["finite"],
                        unreadable=status["unreadable"], causes=_causes(results),
                        steps=_steps(rows), separators=tuple(separators),
                        skipped=tuple(skipped), alpha=alpha, min_runs=min_runs, rows=rows)


def summary_json(summary: SweepSummary) -> dict[str, object]:
    """The summary as JSON values (``json.dumps(..., allow_nan=False)`` takes it)."""
    out = encode(summary)
    assert isinstance(out, dict)
    return out


def separators_by_key(summary: SweepSummary) -> Mapping[str, Separator]:
    return {s.key: s for s in summary.separators}
