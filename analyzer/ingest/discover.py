"""Finding the runs below the paths a user names.

A run is a folder that directly holds event files, text logs or checkpoints (as TensorBoard
sees it, nested layouts such as ``lightning_logs/version_N/`` give one run per version).
Folders that only hold a run's side products belong to the folder above them: ``capture/``
(the flight recorder's saved steps, listed by :mod:`analyzer.capture.folder`, which owns that
format), ``checkpoints/`` and numbered save folders such as ``checkpoint-500/``. Nothing is
opened here beyond listing folders and looking at file types.

The walk is iterative and bounded, and says what it passed over, each an
:class:`IngestIssue` on the run that holds it (or, outside every run, on the discovery):

    not_followed   a symlink to a folder: not walked (a link may loop or leave the tree);
                   name its target to analyse it
    too_deep       a folder more than MAX_DEPTH levels below the path named: not walked
    not_regular    a FIFO, device or socket with a run file's name: never opened
    unreadable     a folder that cannot be listed (permissions), a broken symlink
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from analyzer.capture.folder import is_capture_container, run_step_folders
from analyzer.errors import UsageError
from analyzer.ingest.checkpoints import is_checkpoint_file
from analyzer.ingest.logs import TRAINER_STATE, is_log_file
from analyzer.ingest.metadata import is_metadata_file
from analyzer.ingest.safeio import file_kind
from analyzer.ingest.tb import event_file_order, is_event_file
from analyzer.model import IngestIssue, IssueKind, Location

_SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".venv", "venv", ".hg", ".svn"}
_ATTACHED = re.compile(
    r"checkpoints?|ckpts?|(checkpoint|ckpt|step|global_step|epoch)[-_=]?\d+", re.IGNORECASE)
MAX_DEPTH = 64
"""Folder levels walked below each path named; deeper folders are reported, not walked."""


@dataclass(frozen=True)
class RunFiles:
    """The files of one run, each list in reading order, and what discovery passed over."""

    path: str
    name: str
    event_files: tuple[str, ...] = ()
    log_files: tuple[str, ...] = ()
    checkpoint_files: tuple[str, ...] = ()
    capture_dirs: tuple[str, ...] = ()
    metadata_files: tuple[str, ...] = ()
    issues: tuple[IngestIssue, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.event_files or self.log_files or self.checkpoint_files
                    or self.capture_dirs)


@dataclass(frozen=True)
class Discovery:
    """The runs below the paths named, and what was passed over outside every run."""

    runs: tuple[RunFiles, ...]
    issues: tuple[IngestIssue, ...] = ()


def is_attached_dir(name: str) -> bool:
    return is_capture_container(name) or bool(_ATTACHED.fullmatch(name))


def is_run_file(name: str) -> bool:
    return is_event_file(name) or is_checkpoint_file(name) or is_log_file(name)


def find_runs(paths: list[str], extra_logs: Sequence[str] = ()) -> list[RunFiles]:
    """Every run below each path, in a stable order. A path that does not exist is an error.

    ``extra_logs`` are text logs whose names do not look like logs (``--log FILE``): each
    joins the run of the folder that holds it, or becomes a run of its own.
    """
    return list(discover(paths, extra_logs).runs)


def discover(paths: list[str], extra_logs: Sequence[str] = ()) -> Discovery:
    """Like :func:`find_runs`, with the issues of what was passed over outside every run."""
    runs: dict[str, RunFiles] = {}
    loose: list[IngestIssue] = []
    for root in [*paths, *extra_logs]:
        if not os.path.exists(root):
            raise UsageError(f"{root}: no such file or folder")
    for root in map(os.path.normpath, paths):  # 'runs/a/' and 'runs/a' are one folder
        if os.path.isdir(root):
            found, issues = _walk(root)
        else:
            single = _single_file_run(root)
            found, issues = ([single] if single is not None else []), []
        for run in found:
            runs.setdefault(run.path, run)
        loose += issues
    for log in extra_logs:
        folder = os.path.dirname(log) or "."
        key = next((k for k in runs if os.path.samefile(k, folder)), None)
        if key is None:
            runs[log] = RunFiles(path=folder, name=os.path.basename(log), log_files=(log,))
        elif not any(os.path.samefile(f, log) for f in runs[key].log_files):
            held = runs[key]
            runs[key] = replace(held, log_files=(*held.log_files, log))
    return Discovery(tuple(runs.values()), tuple(loose))


def _single_file_run(path: str) -> RunFiles | None:
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(folder)
    if not os.path.isfile(path):  # a FIFO, device or socket named on the command line
        kind = _special_kind(path)
        issue = _issue(path, "not_regular", f"a {kind}, not a regular file: not opened")
        return RunFiles(path=folder, name=os.path.basename(path), issues=(issue,))
    if is_event_file(path):
        return RunFiles(path=folder, name=name, event_files=(path,))
    if is_checkpoint_file(path):
        return RunFiles(path=folder, name=name, checkpoint_files=(path,))
    if is_log_file(path):
        return RunFiles(path=folder, name=os.path.basename(path), log_files=(path,))
    return None


def _issue(path: str, kind: IssueKind, message: str) -> IngestIssue:
    return IngestIssue(Location(path), kind, message)


def _special_kind(path: str) -> str:
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return "file that cannot be looked at"


@dataclass
class Listing:
    """One folder's entries, sorted, with what could not be taken as it stands."""

    folder: str
    dirs: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    issues: list[IngestIssue] = field(default_factory=list)


def _list(folder: str) -> Listing:
    """List ``folder``: real sub-folders, regular files, and issues for symlinked folders,
    special files with a run file's name, broken links and a folder that cannot be read."""
    out = Listing(folder)
    try:
        with os.scandir(folder) as entries:
            items = sorted(entries, key=lambda e: e.name)
    except OSError as exc:
        out.issues.append(_issue(folder, "unreadable",
                                 f"folder cannot be listed: {exc.strerror or exc}"))
        return out
    for entry in items:
        try:
            is_dir = entry.is_dir()  # follows a symlink
            is_file = entry.is_file()
            is_link = entry.is_symlink()
        except OSError:
            is_dir = is_file = is_link = False
        if is_dir and is_link:
            if not _skipped_dir(entry.name):
                out.issues.append(_issue(entry.path, "not_followed",
                                         f"symlink to the folder {os.path.realpath(entry.path)}"
                                         ": not walked; name the folder itself to analyse it"))
        elif is_dir:
            out.dirs.append(entry.name)
        elif is_file:
            out.files.append(entry.name)
        elif is_run_file(entry.name):
            kind = "broken symlink" if is_link and not os.path.exists(entry.path) else None
            if kind is not None:
                out.issues.append(_issue(entry.path, "unreadable",
                                         f"broken symlink to {os.readlink(entry.path)}"))
            else:
                out.issues.append(_issue(entry.path, "not_regular",
                                         f"a {_special_kind(entry.path)}, not a regular file: "
                                         "not opened"))
    return out


def _skipped_dir(name: str) -> bool:
    return name in _SKIP_DIRS or name.startswith(".")


def walk_tree(root: str, descend: Callable[[str], bool]) -> Iterator[Listing]:
    """Every folder below ``root`` (root first, then depth first in name order) for which
    ``descend`` holds, iteratively: a deep tree costs no recursion. Folders below
    MAX_DEPTH are reported on the listing of their parent and not walked."""
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        listing = _list(folder)
        dirs = [d for d in listing.dirs
                if not _skipped_dir(d) and descend(os.path.join(folder, d))]
        if dirs and depth >= MAX_DEPTH:
            listing.issues.append(_issue(folder, "too_deep",
                                         f"{len(dirs)} sub-folder(s) more than {MAX_DEPTH} "
                                         "levels below the path named: not walked"))
            dirs = []
        yield listing
        stack += [(os.path.join(folder, d), depth + 1) for d in reversed(dirs)]


def _walk(root: str) -> tuple[list[RunFiles], list[IngestIssue]]:
    runs: dict[str, RunFiles] = {}
    loose: list[IngestIssue] = []
    for listing in walk_tree(root, lambda d: not is_attached_dir(os.path.basename(d))):
        run = _run_in(root, listing)
        own = [i for i in run.issues if i.kind in ("not_regular",) or
               (i.kind == "unreadable" and is_run_file(i.location.file))]
        if not run.empty or own:
            runs[run.path] = run
            continue
        holder = _enclosing(runs, listing.folder)
        if holder is None:
            loose += run.issues
        else:
            runs[holder] = replace(runs[holder], issues=runs[holder].issues + run.issues)
    return list(runs.values()), loose


def _enclosing(runs: dict[str, RunFiles], folder: str) -> str | None:
    """The nearest run folder above ``folder``, among those found so far."""
    here = folder
    while True:
        up = os.path.dirname(here)
        if up == here:
            return None
        if up in runs:
            return up
        here = up


def _run_in(root: str, listing: Listing) -> RunFiles:
    folder, files = listing.folder, listing.files
    issues = list(listing.issues)
    events = sorted((os.path.join(folder, f) for f in files if is_event_file(f)),
                    key=event_file_order)
    checkpoints = [os.path.join(folder, f) for f in files if is_checkpoint_file(f)]
    logs = [os.path.join(folder, f) for f in files if is_log_file(f)]
    metadata = [os.path.join(folder, f) for f in files if is_metadata_file(f)]
    captures, more = run_step_folders(folder, listing.dirs)
    issues += more
    states: list[str] = []
    for d in listing.dirs:
        if not is_attached_dir(d) or is_capture_container(d):
            continue
        sub = os.path.join(folder, d)
        found, meta, more = _checkpoints_below(sub)
        checkpoints += found
        metadata += meta
        issues += more
        if os.path.isfile(os.path.join(sub, TRAINER_STATE)):
            states.append(os.path.join(sub, TRAINER_STATE))
    if states and not any(os.path.basename(f) == TRAINER_STATE for f in logs):
        # Each Trainer save holds the whole log history so far: the latest one is enough.
        logs.append(max(states, key=_save_number))
    return RunFiles(path=folder, name=_run_name(root, folder), event_files=tuple(events),
                    log_files=tuple(logs), checkpoint_files=tuple(checkpoints),
                    capture_dirs=tuple(captures), metadata_files=tuple(metadata),
                    issues=tuple(issues))


def _save_number(path: str) -> int:
    digits = re.findall(r"\d+", os.path.basename(os.path.dirname(path)))
    return int(digits[-1]) if digits else -1


def _checkpoints_below(folder: str) -> tuple[list[str], list[str], list[IngestIssue]]:
    """The checkpoints and the metadata files below a save folder, and what was passed over."""
    out: list[str] = []
    meta: list[str] = []
    issues: list[IngestIssue] = []
    for listing in walk_tree(folder, lambda d: True):
        out += [os.path.join(listing.folder, f) for f in listing.files
                if is_checkpoint_file(f)]
        meta += [os.path.join(listing.folder, f) for f in listing.files
                 if is_metadata_file(f)]
        issues += [i for i in listing.issues
                   if i.kind != "not_regular" or is_checkpoint_file(i.location.file)]
    return out, meta, issues


def _run_name(root: str, folder: str) -> str:
    rel = os.path.relpath(folder, root)
    if rel == ".":
        return os.path.basename(os.path.abspath(folder)) or folder
    return rel.replace(os.sep, "/")
