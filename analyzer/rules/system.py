"""Outside the model: non-determinism or faulty hardware, and a drifted environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from analyzer.model import Evidence, Finding
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.wording import step_words

ENV_KEYS = ("torch", "cuda", "cudnn", "numpy", "python", "blas", "lapack",
            "deterministic_algorithms", "cudnn_deterministic", "cudnn_benchmark", "device_name",
            "driver")


@rule("NF501", "nondeterminism-or-hardware", "non-deterministic failure (or a hardware fault)",
      needs=("replay", "ranks"))
def nondeterminism(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A failure that does not reproduce: replaying the captured step twice in the run's own
    configuration gives different results, or the step is finite on replay although it
    failed in the run; or one data-parallel rank went non-finite while the others, on the
    same step, did not.

    ## Why it produces NaN/Inf
    Non-deterministic kernels (atomics in scatter/index_add, cuDNN algorithm choice), race
    conditions in custom kernels, or a faulty GPU (bad memory, overheating) can produce a
    NaN that the same inputs do not produce again.

    ## Evidence
    The differential replay's verdict (`not-reproducible`) with its passes, or per-rank
    series in the logs where a single rank failed first.

    ## Fix
    Make the step deterministic and replay it again; then test the hardware:
    ```python
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment
    ```
    Replay the capture on another GPU (`forensics replay RUN --device cuda`) and run the
    vendor's memory and stress diagnostics on the suspect one.

    ## Known false positives
    A capture taken in a cheaper every-N-steps mode replays from older state and may not
    reach the failure; the replay's notes say when that is the case.
    """
    evidence: list[Evidence] = []
    replay = ev.replay
    if replay is not None and replay.verdict.kind == "not-reproducible":
        evidence.append(Evidence(f"differential replay: {replay.verdict.summary}",
                                 step=replay.step))
        evidence.append(Evidence(f"hypothesis: {replay.verdict.hypothesis}; next: "
                                 f"{replay.verdict.next_check}"))
    lone = _lone_rank(ev)
    if lone is not None:
        evidence.append(lone)
    if not evidence or not ev.failed:
        return []
    return [r.finding("medium" if len(evidence) > 1 else "low", evidence, 0.4)]


def _lone_rank(ev: RunEvidence) -> Evidence | None:
    first: dict[int, int] = {}
    for series in ev.result.run.global_series:
        if series.rank is None:
            continue
        bad = np.flatnonzero(~np.isfinite(series.values))
        if bad.size:
            step = int(series.steps[bad[0]])
            first[series.rank] = min(step, first.get(series.rank, step))
    ranks = {s.rank for s in ev.result.run.global_series if s.rank is not None}
    if not first or len(ranks) < 2:
        return None
    earliest = min(first.values())
    lone = [k for k, v in first.items() if v == earliest]
    if len(lone) == 1 and len(first) < len(ranks):
        return Evidence(f"rank {lone[0]} went non-finite {step_words(earliest, form='at')}; "
                        f"{len(ranks) - len(first)} other rank(s) stayed finite",
                        step=earliest, subject="ranks")
    return None


@rule("NF502", "environment-drift", "environment differs from a healthy run",
      needs=("siblings",))
def environment_drift(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A failed run whose environment (torch, CUDA, cuDNN, numpy versions, the BLAS library,
    deterministic flags, the GPU) differs from a healthy run in the same folder.

    ## Why it produces NaN/Inf
    Different library versions change kernels and defaults: a new cuDNN picks another
    convolution algorithm, MKL and OpenBLAS round reductions differently, a numpy/torch
    pair mismatch breaks data loading, TF32 or determinism defaults change. A model at the
    edge of stability can tip over on the new numbers.

    ## Evidence
    `env.json` of this run (written by the flight recorder at start, or the capture's
    environment) and of healthy sibling runs: the keys whose values differ.

    ## Fix
    Pin the environment and record it with every run:
    ```python
    from analyzer.capture import write_env
    write_env(run_dir, seed=seed)      # env.json: versions, BLAS, flags
    # pin versions in requirements / environment.yml, e.g. torch==2.3.1 numpy==1.26.4
    ```

    ## Known false positives
    A healthy sibling that differs in harmless ways (the platform string, a patch release):
    the finding lists every difference and its confidence stays low.
    """
    if not ev.failed or ev.env is None:
        return []
    diffs: list[Evidence] = []
    for name, other in ev.siblings.items():
        changed = _differences(ev.env, other)
        if changed:
            diffs.append(Evidence(f"differs from healthy run {name}: {'; '.join(changed)}",
                                  subject=name))
    if not diffs:
        return []
    return [r.finding("low", diffs, 0.2)]


def _differences(mine: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    return [f"{k} {mine.get(k)!r} vs {other.get(k)!r}" for k in ENV_KEYS
            if k in mine and k in other and mine.get(k) != other.get(k)]


RULES = (nondeterminism, environment_drift)
