"""Finding the runs below the paths a user names.

A run is a folder that directly holds event files (as TensorBoard sees it, so nested layouts
such as ``lightning_logs/version_N/`` give one run per version). Folders that only ever hold a
run's side products (``capture/``, ``checkpoints/``) belong to the folder above them.
Nothing is opened here beyond listing folders.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from analyzer.errors import UsageError
from analyzer.ingest.tb import event_file_order, is_event_file

_SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".venv", "venv", ".hg", ".svn"}
ATTACHED_DIRS = {"capture", "captures", "checkpoints", "checkpoint", "ckpt", "ckpts"}


@dataclass(frozen=True)
class RunFiles:
    """The files of one run, each list in reading order."""

    path: str
    name: str
    event_files: tuple[str, ...]


def find_runs(paths: list[str]) -> list[RunFiles]:
    """Every run below each path, in a stable order. A path that does not exist is an error."""
    runs: dict[str, RunFiles] = {}
    for root in paths:
        if not os.path.exists(root):
            raise UsageError(f"{root}: no such file or folder")
        if os.path.isfile(root):
            run = _single_file_run(root)
            if run is not None:
                runs.setdefault(run.path, run)
            continue
        for run in _walk(root):
            runs.setdefault(run.path, run)
    return list(runs.values())


def _single_file_run(path: str) -> RunFiles | None:
    if not is_event_file(path):
        return None
    folder = os.path.dirname(os.path.abspath(path))
    return RunFiles(path=folder, name=os.path.basename(folder), event_files=(path,))


def _walk(root: str) -> list[RunFiles]:
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        if os.path.basename(folder) in ATTACHED_DIRS and folder != root:
            continue
        events = sorted((os.path.join(folder, f) for f in files if is_event_file(f)),
                        key=event_file_order)
        if events:
            found.append(RunFiles(path=folder, name=_run_name(root, folder),
                                  event_files=tuple(events)))
    return found


def _run_name(root: str, folder: str) -> str:
    rel = os.path.relpath(folder, root)
    if rel == ".":
        return os.path.basename(os.path.abspath(folder)) or folder
    return rel.replace(os.sep, "/")
