"""The guarded step as an option of the framework integrations.

Each integration takes ``guard=True`` (a :class:`~analyzer.capture.guard.StepGuard` with its
defaults) or ``guard={...}`` (StepGuard's keyword arguments: ``every``, ``check``,
``skip_nonfinite``, ``writer``, ``log_dir``), checked when the integration is built, and
calls the guard from its own hooks. The writer is the framework's TensorBoard writer where
it has one, else a SummaryWriter made in the run folder; a ``writer`` or ``log_dir`` among
the options wins. Only the main process writes: the others check, and refuse alike under
``skip_nonfinite`` (their gradients are the same all-reduced ones), without writing.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from analyzer.capture.guard import ScalarWriter, StepGuard

if TYPE_CHECKING:
    import torch

    from analyzer.capture.recorder import FlightRecorder

GuardOption = bool | Mapping[str, Any] | None
"""What ``guard=`` takes: None or False (no guard), True (defaults), or a dict of options."""


def guard_options(option: GuardOption, who: str) -> dict[str, Any] | None:
    """The guard's keyword arguments, or None for no guard. An option StepGuard does not
    take raises TypeError here, when the integration is built, not at the first step."""
    if option is None or option is False:
        return None
    if option is True:
        return {}
    if not isinstance(option, Mapping):
        raise TypeError(f"{who}: guard= takes True, False or a dict of StepGuard's keyword "
                        f"arguments, not {type(option).__name__}")
    known = [p for p in inspect.signature(StepGuard).parameters if p != "model"]
    unknown = sorted(str(k) for k in option if k not in known)
    if unknown:
        raise TypeError(f"{who}: guard={{...}}: {', '.join(unknown)} is not an option of "
                        f"StepGuard (it takes {', '.join(known)})")
    if "writer" in option and "log_dir" in option:
        raise ValueError(f"{who}: guard={{...}} takes writer or log_dir, not both")
    return dict(option)


def build_guard(model: torch.nn.Module, options: Mapping[str, Any], *,
                writer: ScalarWriter | None, log_dir: str | os.PathLike[str] | None,
                main: bool) -> StepGuard:
    """The integration's guard on ``model``: the options' own writer or log_dir, else
    ``writer`` (the framework's), else a SummaryWriter in ``log_dir``; on a process that is
    not the main one, none of them."""
    kwargs = dict(options)
    if not main:
        kwargs.pop("writer", None)
        kwargs.pop("log_dir", None)
    elif "writer" not in kwargs and "log_dir" not in kwargs:
        if writer is not None:
            kwargs["writer"] = writer
        elif log_dir is not None:
            kwargs["log_dir"] = os.fspath(log_dir)
    return StepGuard(model, **kwargs)


def drop_step(recorder: FlightRecorder) -> None:
    """Forget the recorder's open step, unchecked: the guard refused its update.

    A refused step changed no weight (every gradient was None at ``optimizer.step()``), so
    it is neither a failure to capture (the run goes on from the state it started with, and
    the analyzer reads the refusal from ``guard/skipped_steps``) nor a step a replay of a
    later capture has to re-run. Capturing it would leave a failed run's evidence in a run
    that recovered, and spend the recorder's one capture on it.
    """
    recorder.discard()
