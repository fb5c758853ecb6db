"""Errors a replay raises: a capture it cannot read, a model it cannot rebuild.

Both derive from :class:`analyzer.errors.ForensicsError`, so the CLI prints them
as one line; ``analyze`` catches them and reports everything else about the run.
"""

from __future__ import annotations

from analyzer.errors import ForensicsError


class CaptureError(ForensicsError):
    """A capture folder is missing a file, or a file in it is invalid or unsafe."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ModelRebuildError(ForensicsError):
    """The recorded model, loss or optimizer cannot be rebuilt from its import path.

    ``target`` is the recorded import path (``package.module:function`` or
    ``torch.optim.Adam``); ``module`` the module that failed to import, if that
    was the cause.
    """

    def __init__(self, target: str, reason: str, module: str | None = None) -> None:
        super().__init__(f"cannot rebuild {target}: {reason}")
        self.target = target
        self.reason = reason
        self.module = module


class ReplayError(ForensicsError):
    """The captured step raised an exception (not a NaN) while being replayed."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        first = str(cause).splitlines()[0] if str(cause) else ""
        super().__init__(f"the step raised {type(cause).__name__} during {phase}: {first}")
        self.phase = phase
        self.cause = cause
