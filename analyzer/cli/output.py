"""Writing what a command produced: to standard output, quietly when the reader stopped
early, and to a JSON file named on the command line."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from analyzer.errors import ReadError, UsageError


def write_stdout(text: str | Iterable[str]) -> None:
    """Write ``text`` (or its pieces, one after the other); a reader that stopped early
    (``| head``) does not change the exit status the gate depends on: the rest goes
    nowhere."""
    try:
        for piece in [text] if isinstance(text, str) else text:
            sys.stdout.write(piece)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def check_json_target(path: str) -> None:
    """Refuse ``--json FILE`` before a long run when FILE's folder does not exist."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--json {path}: folder {folder} does not exist")


def write_json_file(path: str, text: str | Iterable[str]) -> None:
    """Write a JSON document (or its pieces, one after the other) and its final newline; a
    failure is the user's to fix (exit 2), not a traceback."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            for piece in [text] if isinstance(text, str) else text:
                fh.write(piece)
            fh.write("\n")
    except OSError as exc:
        raise ReadError(path, f"cannot write the JSON report: {exc.strerror or exc}") from None
