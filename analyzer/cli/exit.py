"""The exit status of every ``forensics`` command, in one place, so that ``forensics
analyze`` (and ``inspect``, ``replay``) can gate a CI job the same way:

    0   EXIT_OK        every value read is finite
    1   EXIT_FOUND     something non-finite was found (whatever else happened)
    2   EXIT_ERROR     a usage error, a path that cannot be read, or nothing readable at all
    3   EXIT_INTERNAL  an internal error: a one-line message; ``--debug`` prints the traceback

Readers and the replayer return records and know nothing of these numbers; each command
turns what it got into a status with :func:`status`.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FOUND: Final = 1
EXIT_ERROR: Final = 2
EXIT_INTERNAL: Final = 3
EXIT_INTERRUPTED: Final = 130
"""Ctrl-C, as a shell reports a process ended by SIGINT."""


def status(*, nonfinite: bool, unreadable: bool = False) -> int:
    """The one rule: a non-finite value wins over anything unreadable, and a clean read of
    only finite values is 0."""
    if nonfinite:
        return EXIT_FOUND
    return EXIT_ERROR if unreadable else EXIT_OK
