"""``forensics inspect``: one checkpoint, several, or the checkpoints below a folder."""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from analyzer.errors import UsageError
from analyzer.ingest.ckpt.records import CheckpointScan

EXIT_OK, EXIT_FOUND, EXIT_ERROR = 0, 1, 2


def expand(paths: list[str]) -> list[str]:
    """Files as given; folders replaced by the checkpoint files below them, sorted."""
    from analyzer.ingest.checkpoints import is_checkpoint_file

    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                found.extend(
                    os.path.join(folder, f) for f in sorted(files) if is_checkpoint_file(f)
                )
        elif os.path.exists(path):
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    if not found:
        raise UsageError("no checkpoint files found in " + ", ".join(paths))
    return found


def inspect_command(
    paths: list[str],
    *,
    trust_pickle: bool = False,
    as_json: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Scan and print; the exit status follows the CLI's: 1 when a non-finite tensor was
    found, 2 when a file could not be read at all, else 0. Raises UsageError for a
    path that does not exist."""
    from analyzer.ingest.checkpoints import (
        format_history,
        format_scan,
        scan_checkpoint,
        scan_run_checkpoints,
    )

    out = stream or sys.stdout
    files = expand(paths)
    if len(files) == 1:
        scan = scan_checkpoint(files[0], trust_pickle=trust_pickle)
        scans: tuple[CheckpointScan, ...] = (scan,)
        payload: dict[str, object] = {"checkpoint": scan.to_dict()}
        text = format_scan(scan)
    else:
        history = scan_run_checkpoints(files, trust_pickle=trust_pickle)
        scans = history.scans
        payload = {"checkpoints": history.to_dict()}
        text = "\n\n".join([*(format_scan(s) for s in scans), format_history(history)])
    if as_json:
        json.dump(payload, out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        out.write(text + "\n")
    if any(s.has_nonfinite for s in scans):
        return EXIT_FOUND
    if any(s.read_mode == "none" for s in scans):
        return EXIT_ERROR
    return EXIT_OK
