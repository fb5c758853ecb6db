"""The body of ``forensics replay`` and the hook ``forensics analyze`` calls.

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
from analyzer.replay import capture_folder, format_replay, replay
from analyzer.replay.records import ReplayResult


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


def replay_run(run_path: str, *, device: str = "cpu",
               import_paths: Sequence[str] = ()) -> ReplayResult | None:
    """For ``analyze``: the replay of the run's capture, or None when it holds none.

    Raises ForensicsError (CaptureError, ModelRebuildError, ReplayError) when a
    capture exists but cannot be replayed; the caller reports it and goes on.
    """
    if capture_folder(run_path) is None:
        return None
    return replay(run_path, device=device, import_paths=import_paths)


def _check_writable(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--json {path}: folder {folder} does not exist")
