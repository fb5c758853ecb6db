"""The training loop every scenario runs, and what it leaves in the run folder.

The loop is a plain PyTorch loop (the step ``analyzer.capture`` documents), with a
SummaryWriter, a text log in one framework's style, periodic checkpoints and the flight
recorder. What a scenario changes is its model, loss, data, optimizer and precision; the
failure comes from training, never from the loop.

The expected first non-finite step and tag are read off what the loop logged: the first
step at which a logged scalar is non-finite, and at that step the first such tag in the
order the step computes them (loss, total grad norm, per-parameter grad norms, weight
norms). Gradients of a step a GradScaler skipped do not count: skipping them is the
scaler's job.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from analyzer.capture import Factory, FlightRecorder
from analyzer.scenarios.logstyles import STYLES, StepLog

Batch = tuple[torch.Tensor, torch.Tensor]
BatchSource = Callable[[int], Iterator[Batch]]
StepHook = Callable[[int, torch.nn.Module], None]


@dataclass(frozen=True)
class Expected:
    """What the run is known to die of; the step and tag come from the run itself."""

    layer: str | None
    op: str | None
    phase: str | None
    verdict: str | None
    cause: str | None


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    story: str
    fix: str
    model: Factory
    loss: Factory
    batches: BatchSource
    optimizer: str
    optimizer_kwargs: dict[str, Any]
    steps: int
    steps_per_epoch: int
    log_style: str
    expected: Expected | None = None
    healthy: bool = False
    benign_skips: bool = False
    dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None
    scaler: dict[str, Any] | None = None
    min_loss_scale: float | None = None
    grad_clip: float | None = None
    stop_on_nonfinite_loss: bool = True
    steps_after_failure: int = 0
    checkpoint_every: int = 10
    checkpoint_after_failure: bool = False
    hist_every: int = 5
    hist_params: tuple[str, ...] = ()
    on_step: StepHook | None = None
    seed: int = 0


@dataclass
class Outcome:
    """What the loop observed, for scenario.json and the README."""

    steps_run: int = 0
    first_nonfinite_step: int | None = None
    first_nonfinite_tag: str | None = None
    skipped_steps: list[int] = field(default_factory=list)
    stop_reason: str = "completed"
    checkpoints: list[int] = field(default_factory=list)
    capture: str | None = None
    last_loss: float = float("nan")
    grad_norms: list[float] = field(default_factory=list)


def run(sc: Scenario, out_dir: str) -> Outcome:
    """Train ``sc`` into ``out_dir/<name>`` and write its artefacts; return what happened."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = os.path.join(out_dir, sc.name)
    os.makedirs(run_dir, exist_ok=True)
    torch.manual_seed(sc.seed)
    model = sc.model.build().to(sc.dtype)
    loss_fn = sc.loss.build()
    opt_cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[sc.optimizer]
    optimizer = opt_cls(model.parameters(), **sc.optimizer_kwargs)
    scaler = torch.amp.GradScaler("cpu", **sc.scaler) if sc.scaler is not None else None
    recorder = FlightRecorder(
        run_dir, model, optimizer,
        model_factory=sc.model.path, model_kwargs=dict(sc.model.kwargs),
        loss_factory=sc.loss.path, loss_kwargs=dict(sc.loss.kwargs),
        scaler=scaler, autocast_dtype=sc.autocast_dtype, grad_clip=sc.grad_clip,
        seed=sc.seed, check_params=True,
    )  # fmt: skip
    writer = SummaryWriter(log_dir=run_dir, flush_secs=3600)
    outcome = Outcome()
    with open(os.path.join(run_dir, "train.log"), "w", encoding="utf-8", newline="") as fh:
        log = STYLES[sc.log_style](fh, sc.steps, sc.steps_per_epoch)
        log.begin(sc.title)
        try:
            _train(sc, run_dir, model, loss_fn, optimizer, scaler, recorder, writer, log, outcome)
        finally:
            writer.close()
    outcome.capture = recorder.capture_path
    if recorder.errors:
        raise RuntimeError(f"{sc.name}: flight recorder failed: {recorder.errors}")
    return outcome


def _train(
    sc: Scenario,
    run_dir: str,
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    recorder: FlightRecorder,
    writer: Any,
    log: Any,
    outcome: Outcome,
) -> None:
    names = [n for n, _ in model.named_parameters()]
    losses: list[float] = []
    batches = sc.batches(sc.seed)
    for step in range(sc.steps):
        if sc.on_step is not None:
            sc.on_step(step, model)
        x, y = next(batches)
        if x.is_floating_point():
            x = x.to(sc.dtype)
        scale_before = scaler.get_scale() if scaler is not None else None
        with recorder.step(step, x, y) as rec:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(
                "cpu",
                dtype=sc.autocast_dtype or torch.bfloat16,
                enabled=sc.autocast_dtype is not None,
            ):
                outputs = model(x)
                loss = loss_fn(outputs, y)
            rec.loss(loss)
            loss_value = float(loss.detach().float())
            if sc.stop_on_nonfinite_loss and not math.isfinite(loss_value):
                # The loop's own guard: it stops before backward, as many scripts do.
                _log_scalars(writer, step, [("train/loss", loss_value)], outcome, step_ok=True)
                log.error(step, f"Loss is {loss_value} at step {step}, stopping training.")
                outcome.stop_reason = "loss-check"
                outcome.steps_run = step + 1
                break
            if scaler is not None:
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
                scaler.unscale_(optimizer)
            else:
                loss.backward()  # type: ignore[no-untyped-call]
            grads = [p.grad for p in model.parameters()]
            per_param = [float(g.detach().float().norm()) if g is not None else 0.0 for g in grads]
            present = [g.detach() for g in grads if g is not None]
            total = float(torch.nn.utils.get_total_norm(present)) if present else 0.0
            if sc.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), sc.grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        skipped = scaler is not None and scaler.get_scale() < (scale_before or 0.0)
        lr = float(optimizer.param_groups[0]["lr"])
        scalars: list[tuple[str, float]] = [("train/loss", loss_value)]
        scalars += [("train/grad_norm", total)]
        scalars += [(f"grad_norm/{n}", v) for n, v in zip(names, per_param, strict=True)]
        with torch.no_grad():
            scalars += [
                (f"weight_norm/{n}", float(p.detach().float().norm()))
                for n, p in model.named_parameters()
            ]
        failed_before = outcome.first_nonfinite_step is not None
        _log_scalars(writer, step, scalars, outcome, step_ok=not skipped)
        writer.add_scalar("train/lr", lr, step)
        if scaler is not None:
            writer.add_scalar("amp/loss_scale", scale_before, step)
        if step % sc.hist_every == 0:
            for n, p in model.named_parameters():
                if n in sc.hist_params:
                    _histogram(writer, f"weights/{n}", p, step)
                    if p.grad is not None:
                        _histogram(writer, f"grads/{n}", p.grad, step)
        losses.append(loss_value)
        outcome.grad_norms.append(total)
        log.step(StepLog(step=step, loss=loss_value, lr=lr, grad_norm=total,
                         epoch=(step + 1) / sc.steps_per_epoch, batch_size=int(x.shape[0]),
                         loss_scale=scale_before, skipped=skipped))  # fmt: skip
        if skipped and scaler is not None:
            outcome.skipped_steps.append(step)
            log.overflow(step, scale_before, scaler.get_scale())
        outcome.steps_run = step + 1
        if _end_of_step(sc, run_dir, step, model, optimizer, scaler, log, outcome, failed_before):
            break
    else:
        log.end(outcome.steps_run, sum(losses) / max(len(losses), 1))
    outcome.last_loss = losses[-1] if losses else float("nan")


def _end_of_step(
    sc: Scenario,
    run_dir: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    log: Any,
    outcome: Outcome,
    failed_before: bool,
) -> bool:
    """Checkpoint as the run's policy says; return True when the run stops here."""
    first = outcome.first_nonfinite_step
    failed = first is not None
    periodic = (step + 1) % sc.checkpoint_every == 0
    if periodic and (not failed or sc.checkpoint_after_failure):
        _checkpoint(run_dir, step, model, optimizer, scaler, log, outcome)
    elif failed and not failed_before and sc.checkpoint_after_failure:
        # Saved right after the failure, so it holds the non-finite weights.
        _checkpoint(run_dir, step, model, optimizer, scaler, log, outcome)
    too_small = sc.min_loss_scale is not None and scaler is not None
    if too_small and scaler.get_scale() < sc.min_loss_scale:  # type: ignore[operator,union-attr]
        log.error(step, "Current loss scale already at minimum - cannot decrease scale "
                        "anymore. Exiting run.")  # fmt: skip
        outcome.stop_reason = "min-loss-scale"
        return True
    if (
        first is not None
        and not sc.stop_on_nonfinite_loss
        and step >= first + sc.steps_after_failure
    ):
        # Runs without a loss check of their own are stopped by hand (or by an
        # early-stopping callback) a few steps after the loss went bad.
        outcome.stop_reason = "stopped-by-user"
        log.stopped(step, "train_loss is not finite")
        return True
    return False


def _log_scalars(
    writer: Any, step: int, scalars: list[tuple[str, float]], outcome: Outcome, *, step_ok: bool
) -> None:
    for tag, value in scalars:
        writer.add_scalar(tag, value, step)
        if outcome.first_nonfinite_step is not None or math.isfinite(value):
            continue
        if not step_ok and (tag.startswith("grad_norm/") or tag == "train/grad_norm"):
            continue
        outcome.first_nonfinite_step = step
        outcome.first_nonfinite_tag = tag


def _histogram(writer: Any, tag: str, tensor: torch.Tensor, step: int) -> None:
    # SummaryWriter refuses a tensor with no finite value at all ("The histogram is
    # empty"); a run that logs histograms loses that point, as real runs do.
    values = tensor.detach().float()
    if bool(values.isfinite().any()):
        # Its sum of squares overflows for huge values; inf is the honest statistic.
        with np.errstate(over="ignore", invalid="ignore"):
            writer.add_histogram(tag, values, step)


def _checkpoint(
    run_dir: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    log: Any,
    outcome: Outcome,
) -> None:
    folder = os.path.join(run_dir, "checkpoints")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step_{step}.pt")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    torch.save(state, path)
    outcome.checkpoints.append(step)
    log.checkpoint(step, os.path.relpath(path, run_dir))


def write_description(sc: Scenario, out_dir: str, outcome: Outcome) -> None:
    """scenario.json (for tests) and README.md (for people), from the run's outcome."""
    run_dir = os.path.join(out_dir, sc.name)
    exp = sc.expected
    failing = outcome.first_nonfinite_step is not None
    data = {
        "scenario": sc.name,
        "healthy": sc.healthy,
        "benign_skips": sc.benign_skips,
        "expected": {
            "first_nonfinite_step": outcome.first_nonfinite_step,
            "tag": outcome.first_nonfinite_tag,
            "layer": exp.layer if exp and failing else None,
            "op": exp.op if exp and failing else None,
            "phase": exp.phase if exp and failing else None,
            "verdict": exp.verdict if exp and failing else None,
            "cause": exp.cause if exp and failing else None,
        },
        "skipped_steps": outcome.skipped_steps,
        "steps_run": outcome.steps_run,
        "stop_reason": outcome.stop_reason,
        "checkpoints": outcome.checkpoints,
        "capture": os.path.relpath(outcome.capture, run_dir) if outcome.capture else None,
        "log_style": sc.log_style,
        "seed": sc.seed,
        "grad_norm_step0": _json_number(outcome.grad_norms[0]) if outcome.grad_norms else None,
    }
    with open(os.path.join(run_dir, "scenario.json"), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    with open(os.path.join(run_dir, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(_readme(sc, outcome, data))


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def _readme(sc: Scenario, outcome: Outcome, data: dict[str, Any]) -> str:
    exp = data["expected"]
    lines = [f"# {sc.name}: {sc.title}", "", sc.story, ""]
    if outcome.first_nonfinite_step is None:
        lines.append(f"Expected: no non-finite value; the run completes {outcome.steps_run} steps.")
        if outcome.skipped_steps:
            steps = ", ".join(str(s) for s in outcome.skipped_steps)
            lines.append(
                f"The GradScaler skipped steps {steps} for overflow (the gradient norms logged "
                "there are infinite) and recovered: these are skips, not a failure."
            )
    else:
        where = f"in layer `{exp['layer']}`" if exp["layer"] else "outside any module (in the loss)"
        lines += [
            f"- First non-finite step: **{exp['first_nonfinite_step']}** "
            f"(first tag: `{exp['tag']}`); last finite step: "
            f"{exp['first_nonfinite_step'] - 1 if exp['first_nonfinite_step'] else 'none'}.",
            f"- Where: `{exp['op']}` {where}, during the {exp['phase']} "
            f"{'step' if exp['phase'] == 'update' else 'pass'}.",
            f"- Verdict: {exp['verdict']}; root cause: `{exp['cause']}`.",
            f"- Fix: {sc.fix}",
        ]
    finite = [g for g in outcome.grad_norms if math.isfinite(g)]
    if finite:
        lines.append(
            f"- Total gradient norm: {outcome.grad_norms[0]:.3g} at step 0, largest finite "
            f"{max(finite):.3g}."
        )
    lines += [
        "",
        f"Log style: {sc.log_style} (`train.log`). Steps run: {outcome.steps_run} "
        f"(stop: {outcome.stop_reason}). Checkpoints at steps: "
        f"{', '.join(str(c) for c in outcome.checkpoints) or 'none'}.",
        f"Capture: `{data['capture']}`." if data["capture"] else "Capture: none.",
        "",
        "Made by `python -m analyzer.scenarios sample_runs --only " + sc.name + "`.",
        "",
    ]
    return "\n".join(lines)


def write_index(out_dir: str, scenarios: tuple[Scenario, ...]) -> None:
    """README.md of the whole folder: one row per run present, from its scenario.json."""
    rows = [
        "# Sample runs",
        "",
        "Real CPU training runs, seeded, made by `python -m analyzer.scenarios sample_runs` "
        "(`make samples`). Each folder holds event files, `train.log`, `checkpoints/`, "
        "`env.json`, the flight recorder's `capture/step_<N>/` when it failed, a README.md and "
        "`scenario.json` (what the run is known to have died of, for tests).",
        "",
        "The first non-finite step is the earliest step with a non-finite logged scalar; the "
        "tag is the first such tag at that step in the order a step computes them: "
        "`train/loss`, `train/grad_norm`, `grad_norm/<param>`, `weight_norm/<param>`. "
        "Gradient norms of steps a GradScaler skipped do not count.",
        "",
        "| run | first non-finite step | tag | where | cause | log style |",
        "|---|---|---|---|---|---|",
    ]
    for sc in scenarios:
        path = os.path.join(out_dir, sc.name, "scenario.json")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as fh:
            info = json.load(fh)
        exp = info["expected"]
        if exp["first_nonfinite_step"] is None:
            note = "healthy, GradScaler skips at steps " if info["skipped_steps"] else "healthy"
            if info["skipped_steps"]:
                note += ", ".join(str(s) for s in info["skipped_steps"])
            rows.append(f"| `{sc.name}` | none | | | {note} | {sc.log_style} |")
            continue
        place = f"in `{exp['layer']}`" if exp["layer"] else "in the loss function"
        where = f"`{exp['op']}` {place} ({exp['phase']})"
        rows.append(
            f"| `{sc.name}` | {exp['first_nonfinite_step']} | `{exp['tag']}` | {where} | "
            f"`{exp['cause']}` | {sc.log_style} |"
        )
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")
