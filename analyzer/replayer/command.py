"""The body of ``forensics replay``.

The CLI parses the options and hands them over; everything else (loading,
replaying, printing, writing the JSON file) happens here. Errors are raised as
:class:`analyzer.errors.ForensicsError` subclasses for the CLI to print.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from analyzer.errors import UsageError
from analyzer.replayer import format_replay, replay


def replay_command(path: str, *, device: str = "cpu", dtype: str = "as-run",
                   json_file: str | None = None, import_paths: Sequence[str] = (),
                   trust_code: bool = False, out: TextIO | None = None) -> int:
    """Replay the capture behind ``path``; print the report; return the exit status.

    1 when the replay found a non-finite value, 0 when the step stayed finite.
    ``json_file`` '-' prints the JSON instead of the text report.
    """
    stream = out if out is not None else sys.stdout
    if json_file and json_file != "-":
        _check_writable(json_file)
    result = replay(path, device=device, dtype=dtype, import_paths=import_paths,
                    trust_code=trust_code)
    data = json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"
    if json_file == "-":
        stream.write(data)
    else:
        stream.write(format_replay(result) + "\n")
        if json_file:
            with open(json_file, "w", encoding="utf-8") as fh:
                fh.write(data)
    return 1 if result.phase is not None else 0


def _check_writable(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--json {path}: folder {folder} does not exist")
