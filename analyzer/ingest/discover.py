"""Finding the runs below the paths a user names.

A run is a folder that directly holds event files, text logs or checkpoints (as TensorBoard
sees it, nested layouts such as ``lightning_logs/version_N/`` give one run per version).
Folders that only hold a run's side products belong to the folder above them: ``capture/``
(the flight recorder's saved steps), ``checkpoints/`` and numbered save folders such as
``checkpoint-500/``. Nothing is opened here beyond listing folders.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from analyzer.errors import UsageError
from analyzer.ingest.checkpoints import is_checkpoint_file
from analyzer.ingest.logs import TRAINER_STATE, is_log_file
from analyzer.ingest.tb import event_file_order, is_event_file

_SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".venv", "venv", ".hg", ".svn"}
CAPTURE_DIRS = {"capture", "captures"}
_ATTACHED = re.compile(
    r"checkpoints?|ckpts?|(checkpoint|ckpt|step|global_step|epoch)[-_=]?\d+", re.IGNORECASE)


@dataclass(frozen=True)
class RunFiles:
    """The files of one run, each list in reading order."""

    path: str
    name: str
    event_files: tuple[str, ...] = ()
    log_files: tuple[str, ...] = ()
    checkpoint_files: tuple[str, ...] = ()
    capture_dirs: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.event_files or self.log_files or self.checkpoint_files
                    or self.capture_dirs)


def is_attached_dir(name: str) -> bool:
    return name.lower() in CAPTURE_DIRS or bool(_ATTACHED.fullmatch(name))


def find_runs(paths: list[str], extra_logs: Sequence[str] = ()) -> list[RunFiles]:
    """Every run below each path, in a stable order. A path that does not exist is an error.

    ``extra_logs`` are text logs whose names do not look like logs (``--log FILE``): each
    joins the run of the folder that holds it, or becomes a run of its own.
    """
    runs: dict[str, RunFiles] = {}
    for root in [*paths, *extra_logs]:
        if not os.path.exists(root):
            raise UsageError(f"{root}: no such file or folder")
    for root in paths:
        found = [_single_file_run(root)] if os.path.isfile(root) else _walk(root)
        for run in found:
            if run is not None:
                runs.setdefault(run.path, run)
    for log in extra_logs:
        folder = os.path.dirname(log) or "."
        key = next((k for k in runs if os.path.samefile(k, folder)), None)
        if key is None:
            runs[log] = RunFiles(path=folder, name=os.path.basename(log), log_files=(log,))
        elif not any(os.path.samefile(f, log) for f in runs[key].log_files):
            held = runs[key]
            runs[key] = replace(held, log_files=(*held.log_files, log))
    return list(runs.values())


def _single_file_run(path: str) -> RunFiles | None:
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(folder)
    if is_event_file(path):
        return RunFiles(path=folder, name=name, event_files=(path,))
    if is_checkpoint_file(path):
        return RunFiles(path=folder, name=name, checkpoint_files=(path,))
    if is_log_file(path):
        return RunFiles(path=folder, name=os.path.basename(path), log_files=(path,))
    return None


def _walk(root: str) -> list[RunFiles]:
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        if folder != root and is_attached_dir(os.path.basename(folder)):
            dirs[:] = []  # its contents were gathered by the run above it
            continue
        run = _run_in(root, folder, dirs, files)
        if not run.empty:
            found.append(run)
    return found


def _run_in(root: str, folder: str, dirs: list[str], files: list[str]) -> RunFiles:
    events = sorted((os.path.join(folder, f) for f in files if is_event_file(f)),
                    key=event_file_order)
    checkpoints = [os.path.join(folder, f) for f in sorted(files) if is_checkpoint_file(f)]
    logs = [os.path.join(folder, f) for f in sorted(files) if is_log_file(f)]
    captures: list[str] = []
    states: list[str] = []
    for d in dirs:
        if not is_attached_dir(d):
            continue
        sub = os.path.join(folder, d)
        if d.lower() in CAPTURE_DIRS:
            captures += sorted(os.path.join(sub, c) for c in os.listdir(sub)
                               if os.path.isdir(os.path.join(sub, c)))
        else:
            checkpoints += _checkpoints_below(sub)
            if os.path.isfile(os.path.join(sub, TRAINER_STATE)):
                states.append(os.path.join(sub, TRAINER_STATE))
    if states and not any(os.path.basename(f) == TRAINER_STATE for f in logs):
        # Each Trainer save holds the whole log history so far: the latest one is enough.
        logs.append(max(states, key=_save_number))
    return RunFiles(path=folder, name=_run_name(root, folder), event_files=tuple(events),
                    log_files=tuple(logs), checkpoint_files=tuple(checkpoints),
                    capture_dirs=tuple(captures))


def _save_number(path: str) -> int:
    digits = re.findall(r"\d+", os.path.basename(os.path.dirname(path)))
    return int(digits[-1]) if digits else -1


def _checkpoints_below(folder: str) -> list[str]:
    out = []
    for sub, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        out += [os.path.join(sub, f) for f in sorted(files) if is_checkpoint_file(f)]
    return out


def _run_name(root: str, folder: str) -> str:
    rel = os.path.relpath(folder, root)
    if rel == ".":
        return os.path.basename(os.path.abspath(folder)) or folder
    return rel.replace(os.sep, "/")
