"""Replay a captured training step and name what made its first non-finite value.

Importing this package does not import torch: the entry points below load the
instrumentation on first call, so the CLI starts fast.

    capture_folder(path)   the capture a run holds, or None (no torch needed)
    load_capture(path)     read a capture folder (or a run folder holding one)
    replay(path)           load and replay it: the library form of `forensics replay`
    replay_step(...)       replay a step from live model/optimizer/batch objects

It returns records (:class:`ReplayResult`) and prints nothing: the terminal text is
:mod:`analyzer.report.replay`, the ``forensics replay`` command :mod:`analyzer.cli.replay`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from analyzer.capture.folder import capture_of as capture_folder
from analyzer.model.replays import ReplayResult
from analyzer.replayer.dtypes import DTYPE_CHOICES
from analyzer.replayer.errors import CaptureError, ModelRebuildError, ReplayError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from analyzer.replayer.loading import Capture
    from analyzer.replayer.state import Restorable


def load_capture(path: str, *, import_paths: Sequence[str] = (),
                 trust_code: bool = False) -> Capture:
    """Read a capture; see :func:`analyzer.replayer.loading.load_capture`."""
    from analyzer.replayer.loading import load_capture as load
    from analyzer.trust import TrustPolicy

    return load(path, policy=TrustPolicy.of(import_paths, trust_code))


def replay(path: str, *, device: str = "cpu", dtype: str = "as-run",
           import_paths: Sequence[str] = (), trust_code: bool = False,
           passes: str = "auto") -> ReplayResult:
    """Load the capture at ``path`` (a capture folder or a run folder) and replay it.

    Its factories are imported only from trusted folders (:mod:`analyzer.trust`): the
    ``import_paths``, those recorded with ``forensics trust``, the tool's own, or, with
    ``trust_code``, wherever they are found. ``passes`` "all" runs every pass, "auto" those
    the result needs (:func:`analyzer.replayer.step.replay_call`).
    """
    from analyzer.replayer.run import replay_capture

    return replay_capture(path, device=device, dtype=dtype, import_paths=import_paths,
                          trust_code=trust_code, passes=passes)


def replay_step(model: nn.Module, inputs: Any, targets: Any, loss_fn: Any,
                optimizer: torch.optim.Optimizer, *, scaler: Any = None,
                autocast_dtype: torch.dtype | str | None = None, device: str = "cpu",
                dtype: torch.dtype | str | None = None, grad_clip: float | None = None,
                rng: Restorable | None = None, repeats: int = 2, expected: bool = True,
                source: str = "<in-memory>", step: int | None = None,
                notes: Sequence[str] = (), passes: str = "auto") -> ReplayResult:
    """Replay a step from live objects; see :func:`analyzer.replayer.step.replay_step`."""
    from analyzer.replayer.step import replay_step as run

    return run(model, inputs, targets, loss_fn, optimizer, scaler=scaler,
               autocast_dtype=autocast_dtype, device=device, dtype=dtype, grad_clip=grad_clip,
               rng=rng, repeats=repeats, expected=expected, source=source, step=step,
               notes=notes, passes=passes)


__all__ = [
    "DTYPE_CHOICES",
    "CaptureError",
    "ModelRebuildError",
    "ReplayError",
    "capture_folder",
    "load_capture",
    "replay",
    "replay_step",
]
