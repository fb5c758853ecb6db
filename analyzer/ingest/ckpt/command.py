"""``forensics inspect``: one checkpoint, several, or the checkpoints below a folder.

Exit status, one rule: 0 when every file was read as a checkpoint and every tensor read is
finite; 1 when a non-finite tensor was found (whatever else happened); 2 when a file could
not be read as a checkpoint at all (read mode ``none``: not a checkpoint, refused, empty,
unreadable) and no tensor was non-finite, or on a usage error. 3 is the CLI's, for an
internal error.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from analyzer.errors import UsageError
from analyzer.ingest.ckpt.records import CheckpointScan

EXIT_OK, EXIT_FOUND, EXIT_ERROR = 0, 1, 2
MAX_DEPTH = 32
"""Folder levels below a given folder that are searched for checkpoints."""


def expand(paths: list[str], skipped: list[str] | None = None) -> list[str]:
    """Files as given; folders replaced by the checkpoint files below them, sorted. The
    walk is iterative and stops ``MAX_DEPTH`` levels down; symlinked folders are not
    followed. Folders left out are added to ``skipped``, with the reason."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found.extend(_below(path, skipped if skipped is not None else []))
        elif os.path.lexists(path):
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    if not found:
        raise UsageError("no checkpoint files found in " + ", ".join(paths))
    return found


def _below(root: str, skipped: list[str]) -> list[str]:
    from analyzer.ingest.checkpoints import is_checkpoint_file

    found: list[str] = []
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            skipped.append(f"{folder}: not read ({exc.strerror or exc})")
            continue
        subfolders = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subfolders.append(entry.path)
            elif entry.is_symlink() and entry.is_dir():
                skipped.append(f"{entry.path}: a symlinked folder, not followed")
            elif is_checkpoint_file(entry.name):
                found.append(entry.path)
        if subfolders and depth >= MAX_DEPTH:
            skipped.append(f"{folder}: folders below it not searched (more than "
                           f"{MAX_DEPTH} levels down)")
            continue
        stack.extend((sub, depth + 1) for sub in reversed(subfolders))
    return found


def inspect_command(
    paths: list[str],
    *,
    trust_pickle: bool = False,
    as_json: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Scan and print. Exit status: 0 when every file was read as a checkpoint and all is
    finite, 1 when a non-finite tensor was found, 2 when a file could not be read as a
    checkpoint at all (and none was non-finite). Raises UsageError for a path that does
    not exist or a folder holding no checkpoint."""
    from analyzer.ingest.checkpoints import (
        format_history,
        format_scan,
        scan_checkpoint,
        scan_run_checkpoints,
    )

    out = stream or sys.stdout
    skipped: list[str] = []
    files = expand(paths, skipped)
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
    if skipped:
        payload["not_searched"] = skipped
        text = "\n".join([text, *(f"! {line}" for line in skipped)])
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
