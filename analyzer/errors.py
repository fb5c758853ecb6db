"""Errors the analyzer raises to its callers.

Damage inside a file being analysed is never raised: it becomes an
:class:`analyzer.model.IngestIssue` and reading goes on. Exceptions are for what
stops a command as a whole::

    ForensicsError              base of everything raised on purpose
     +-- UsageError             a path that does not exist, a bad option value
     +-- ReadError              a file that cannot be opened at all (permissions, a folder)
     +-- CaptureError           a capture file missing, invalid or refused by weights_only
     +-- ModelRebuildError      a capture's model, loss or optimizer cannot be rebuilt
     +-- ReplayError            the captured step raised while being replayed

The replay errors live in :mod:`analyzer.replayer.errors`, beside the code that raises them.
"""

from __future__ import annotations


class ForensicsError(Exception):
    """Base class: the CLI turns it into a one-line message and exit status 2."""


class UsageError(ForensicsError):
    """The command was asked something it cannot do."""


class ReadError(ForensicsError):
    """A file could not be opened or read at all."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
