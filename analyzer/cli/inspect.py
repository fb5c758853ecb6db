"""``forensics inspect``: one checkpoint, several, or the checkpoints below a folder.

Exit status (:mod:`analyzer.cli.exit`): 0 when every file was read as a checkpoint and every
tensor read is finite; 1 when a non-finite tensor was found (whatever else happened); 2 when
a file could not be read as a checkpoint at all (read mode ``none``: not a checkpoint,
refused, empty, unreadable; or passed over by the folder walk: a FIFO, device, socket or
broken link named like one, a folder that cannot be listed) and no tensor was non-finite,
or on a usage error; 3 for an internal error.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from analyzer.cli.exit import status
from analyzer.errors import UsageError
from analyzer.model import CheckpointScan, IngestIssue

UNREAD_FILE_KINDS = ("not_regular", "unreadable")
"""Kinds of a passed-over issue that mean a file could not be read (exit status 2)."""


def expand(paths: list[str], passed: list[IngestIssue] | None = None) -> list[str]:
    """Files as given; folders replaced by the checkpoint files below them, in the order
    of discovery's one folder walk (:func:`discover.walk_tree`: iterative, to its depth
    limit, symlinked folders not followed). What the walk passed over (deeper folders,
    symlinked folders, special files and broken links named like checkpoints, folders
    that cannot be listed) is added to ``passed``."""
    from analyzer.ingest import storage

    found: list[str] = []
    for path in map(storage.normalize, paths):
        kind = _kind(path)
        if kind == "directory":
            found.extend(_below(path, passed if passed is not None else []))
        elif kind == "file":
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    if not found and not passed:
        raise UsageError("no checkpoint files found in " + ", ".join(paths))
    return found


def _kind(path: str) -> str | None:
    """"directory", "file" (anything else that is there, a FIFO included) or None; a URL
    by the listing its walk then uses."""
    from analyzer.ingest import storage

    if not storage.is_url(path):
        return "directory" if os.path.isdir(path) else "file" if os.path.lexists(path) \
            else None
    try:
        return storage.look(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be looked at: {exc.strerror or exc}") from None


def _below(root: str, passed: list[IngestIssue]) -> list[str]:
    from analyzer.ingest import storage
    from analyzer.ingest.checkpoints import is_checkpoint_file
    from analyzer.ingest.discover import is_run_file, walk_tree

    found: list[str] = []
    for listing in walk_tree(root, lambda _folder: True):
        found.extend(storage.join(listing.folder, f) for f in listing.files
                     if is_checkpoint_file(f))
        for issue in listing.issues:  # a FIFO named train.log is not inspect's business
            name = os.path.basename(issue.location.file)
            if issue.location.file == listing.folder or not is_run_file(name) or \
                    is_checkpoint_file(name):
                passed.append(issue)
    return found


def inspect_command(
    paths: list[str],
    *,
    trust_pickle: bool = False,
    as_json: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Scan and print; return the exit status. Raises UsageError for a path that does not
    exist or a folder holding no checkpoint."""
    from analyzer.ingest.checkpoints import scan_checkpoint, scan_run_checkpoints
    from analyzer.report.checkpoints import format_history, format_scan

    out = stream or sys.stdout
    passed: list[IngestIssue] = []
    files = expand(paths, passed)
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
    if passed:
        payload["passed_over"] = [issue.to_dict() for issue in passed]
        text = "\n".join([text, *(f"! passed over: {issue}" for issue in passed)])
    if as_json:
        json.dump(payload, out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        out.write(text + "\n")
    unread = any(s.read_mode == "none" for s in scans) or any(
        issue.kind in UNREAD_FILE_KINDS for issue in passed)
    return status(nonfinite=any(s.has_nonfinite for s in scans), unreadable=unread)
