"""Optimizer state that does not belong to the parameters it was loaded for, after a resume."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import numpy as np

from analyzer.model import CheckpointScan, Evidence, Finding, Location, TensorRecord
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_ckpt import model_parameters, optimizer_entry
from analyzer.wording import relative_path

_FLAT = re.compile(r"base_optimizer_state|fp32|flat|partition", re.IGNORECASE)
"""Optimizer wrappers that keep one flat state for many parameters (DeepSpeed, apex)."""
PER_PARAMETER = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                           "square_avg", "acc_delta", "sum", "grad_avg", "ax", "eta"})
"""Optimizer state entries shaped like their parameter (Adam, SGD, RMSprop, Adadelta,
Adagrad, ASGD); ``step`` and other scalars are not."""
AFTER_RESUME = 10
"""Steps after a resume within which a failure is blamed on what the resume loaded."""
JUMP = 3.0
"""How many times the last loss before the resume the first loss after it must be."""


def _shape(t: TensorRecord) -> str:
    return "x".join(str(n) for n in t.shape) or "scalar"


def _parameters(scan: CheckpointScan) -> list[TensorRecord]:
    # A scalar parameter (a learnable temperature, CLIP's logit_scale) is a parameter too.
    return [t for t in model_parameters(scan) if "float" in t.dtype or "bfloat" in t.dtype]


def _states(scan: CheckpointScan) -> dict[str, dict[int, TensorRecord]]:
    """Per optimizer (the name before ``state.``), one shaped state entry per index."""
    out: dict[str, dict[int, TensorRecord]] = {}
    for t in scan.tensors:
        if t.group != "optimizer":
            continue
        entry = optimizer_entry(t.name)
        if entry is None or entry[2] not in PER_PARAMETER or _FLAT.search(entry[0]):
            continue
        out.setdefault(entry[0], {}).setdefault(entry[1], t)
    return out


def unmatched(scan: CheckpointScan) -> list[tuple[TensorRecord, str]]:
    """Optimizer state entries no parameter of the same file can own: a shape none has, or
    more entries of a shape than parameters of it (per optimizer). Order is not checked:
    parameter groups (weights with decay, then biases and norms without) reorder the state
    legitimately."""
    params = _parameters(scan)
    if not params or (scan.meta is not None and scan.meta.framework == "deepspeed"):
        return []  # DeepSpeed's ZeRO keeps flat partitions, shaped like no one parameter
    have = Counter(_shape(p) for p in params)
    out: list[tuple[TensorRecord, str]] = []
    for states in _states(scan).values():
        need = Counter(_shape(t) for t in states.values())
        for index in sorted(states):
            t = states[index]
            shape = _shape(t)
            if have[shape] == 0:
                out.append((t, f"shape {shape}, which no parameter of the model has"))
            elif need[shape] > have[shape]:
                out.append((t, f"one of {need[shape]} states of shape {shape} for "
                               f"{have[shape]} parameters of that shape"))
                need[shape] = have[shape]  # say it once per shape
    return out


def _from_checkpoints(ev: RunEvidence) -> Iterable[Evidence]:
    history = ev.result.run.checkpoints
    if history is None:
        return
    for scan in history.scans:
        bad = unmatched(scan)
        if not bad:
            continue
        first, why = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        when = f" (step {scan.step})" if scan.step is not None else ""
        yield Evidence(f"checkpoint {relative_path(scan.path, ev.result.run.path)}{when}: "
                       f"optimizer state {first.name} has {why}{more}: it was saved for "
                       "other parameters", location=Location(scan.path), step=scan.step,
                       subject=first.name, tensor=first.name)


def _after_resume(ev: RunEvidence) -> list[Evidence]:
    """A failure within a few steps of a resume whose first loss jumped above the loss
    before it."""
    step, loss = ev.failure_step, ev.loss
    if step is None or loss is None:
        return []
    restarts = [e for e in ev.events("restart") if e.step is not None and e.step <= step]
    if not restarts:
        return []
    resume = max(restarts, key=lambda e: e.step or 0)
    at = int(resume.step or 0)
    if at <= 0 or step - at > AFTER_RESUME:
        return []
    before = loss.before(at)
    after_mask = (loss.steps >= at) & (loss.steps < step)
    if len(before) < 3 or not np.any(after_mask):
        return []
    last_before = float(before.values[-1])
    # The loaded state acts at the first update: the loss it shows is the second one after
    # the resume (the first was computed by the weights as saved).
    first_after = float(np.max(loss.values[after_mask][:2]))
    if not (np.isfinite(last_before) and np.isfinite(first_after)) or last_before <= 0:
        return []
    if first_after < JUMP * last_before:
        return []
    jump = first_after / last_before
    return [Evidence(f"the run resumed at step {at} ({resume.message}) and failed at step "
                     f"{step}; its loss went from {last_before:.4g} before the resume to "
                     f"{first_after:.4g} within two steps after it, x{jump:.3g}",
                     location=resume.location, step=at, subject=loss.tag, value=first_after,
                     ratio=jump)]


@rule("NF210", "optimizer-state-mismatch",
      "optimizer state that does not match the parameters after a resume",
      needs=("checkpoints", "loss"))
def optimizer_state_mismatch(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    A resumed run whose optimizer state belongs to other parameters: the model changed
    between save and resume (a resized embedding, a layer added or reordered) or the
    optimizer was built over a different parameter list, and `optimizer.load_state_dict`
    mapped the saved state by position.

    ## Why it produces NaN/Inf
    `Optimizer.load_state_dict` pairs saved states with the current parameters by their
    index and checks only the count of parameters per group, never their shapes. A state
    of another shape makes the first step raise; one of the same shape but another
    parameter's gives Adam a second moment of the wrong magnitude, or momentum another
    layer's velocity, and the first updates after the resume are far from the ones the
    run was making: the loss jumps at the resume and can run away within a few steps.

    ## Evidence
    A checkpoint whose per-parameter optimizer state (Adam's `exp_avg`, SGD's
    `momentum_buffer`, ...) has a shape no parameter of the model in the same file has, or
    more states of a shape than parameters of it (high: those states cannot be this
    model's). Else (low: a learning-rate schedule or a scaler that was not restored look
    alike) a failure within 10 steps of a resume (a new event file, a step going back)
    where one of the first two losses after it was at least 3 times the last loss before it.

    ## Fix
    Rebuild exactly the model and the parameter groups that were saved, load the model
    first, and check before loading the optimizer:
    ```python
    model.load_state_dict(ckpt["model"])
    optimizer = build_optimizer(model)                 # same groups, same order as saved
    saved = ckpt["optimizer"]
    for group, params in zip(saved["param_groups"], optimizer.param_groups):
        assert len(group["params"]) == len(params["params"])
    for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        s = saved["state"].get(i, {})
        assert "exp_avg" not in s or s["exp_avg"].shape == p.shape, i
    optimizer.load_state_dict(saved)
    # when the model changed on purpose: start the optimizer fresh (and warm up again)
    ```

    ## Known false positives
    A checkpoint that saves only some of the model's parameters beside the whole
    optimizer state (an adapter's weights with the base model's optimizer); an FSDP
    optimizer state saved flat (`use_orig_params=False`), whose states are shaped like the
    flattened shards, not the parameters (DeepSpeed's flat partitions are left out); after a
    resume, a loss that jumps for another reason (a new data shard, a schedule restarted).
    """
    if not ev.failed:
        return []
    evidence = list(_from_checkpoints(ev))
    if evidence:
        return [r.finding("high", evidence + _after_resume(ev), 0.9)]
    resumed = _after_resume(ev)
    if resumed:
        resumed.append(Evidence("not seen: the checkpoint the run resumed from beside its "
                                "model, whose optimizer state would show the mismatch"))
        return [r.finding("low", resumed, 0.3)]
    return []


RULES = (optimizer_state_mismatch,)
