"""``forensics replay``: replay one capture, print what it found, write its JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from analyzer.cli.exit import status
from analyzer.cli.output import check_json_target, write_json_file


def replay_command(path: str, *, device: str = "cpu", dtype: str = "as-run",
                   json_file: str | None = None, import_paths: Sequence[str] = (),
                   trust_code: bool = False, run_roots: Sequence[str] = (),
                   out: TextIO | None = None) -> int:
    """Replay the capture behind ``path``; print the report; return the exit status:
    1 when the replay found a non-finite value, 0 when the step stayed finite.
    ``json_file`` '-' prints the JSON instead of the text report. A run folder without a
    ``capture/`` of its own replays the earliest capture of the run discovery groups there
    (``run_roots``: as ``analyze --run-root``)."""
    from analyzer.replayer import replay
    from analyzer.report.replay import format_replay

    stream = out if out is not None else sys.stdout
    if json_file and json_file != "-":
        check_json_target(json_file)
    result = replay(run_capture(path, run_roots), device=device, dtype=dtype,
                    import_paths=import_paths, trust_code=trust_code)
    data = json.dumps(result.to_dict(), indent=2, allow_nan=False)
    if json_file == "-":
        stream.write(data + "\n")
    else:
        stream.write(format_replay(result) + "\n")
        if json_file:
            write_json_file(json_file, data)
    return status(nonfinite=result.phase is not None)


def run_capture(path: str, run_roots: Sequence[str] = ()) -> str:
    """What to replay for ``path``: itself when it is or holds a capture, else the earliest
    complete capture of the run whose root it is (its captures may lie in a segment's
    folder), else ``path`` (the replay then says it holds none)."""
    from analyzer.capture.folder import capture_of, is_complete
    from analyzer.ingest.discover import discover

    if not os.path.isdir(path) or capture_of(path) is not None:
        return path
    here = os.path.abspath(path)
    for run in discover([path], run_roots=run_roots).runs:
        if os.path.abspath(run.path) == here:
            return next((c for c in run.capture_dirs if is_complete(c)), path)
    return path
