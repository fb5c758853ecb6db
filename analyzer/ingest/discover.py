"""Finding the runs below the paths a user names: one run per training.

Every folder below each path is listed (names and file types only: nothing is opened);
:mod:`analyzer.ingest.layouts` then says which folders are one training, by the layouts
frameworks write (Lightning's ``lightning_logs/version_N/``, a Trainer's ``runs/<date>_<host>/``
and ``checkpoint-N/``, Accelerate's project folder, Keras' ``train/`` and ``validation/``,
torchrun's ``--log-dir`` tree, rank folders, ``tb/`` and other side folders) and otherwise
by a folder holding run files of its own; ``run_roots`` (``--run-root``) overrides it: each
such folder and everything below it is one run. A run's path is its training's root; its
files keep the folder they were found in, and the folders a framework made per restart
(``version_N``, ``attempt_N``, a Trainer's logging folder) are its ordered segments, whose
event files are read one after the other (a later one is a restart), while folders written
side by side (Keras' ``train/`` and ``validation/``, one per rank) each start a stream of
their own. From save folders (``checkpoints/``, ``checkpoint-N/`` and the like) only
checkpoints and metadata files are taken (and the latest ``trainer_state.json``); the
flight recorder's ``capture/`` folders are listed by :mod:`analyzer.capture.folder`, which
owns that format.

The walk is iterative and bounded, and says what it passed over, each an
:class:`IngestIssue` on the run that holds it (or, outside every run, on the discovery):

    not_followed   a symlink to a folder: not walked (a link may loop or leave the tree);
                   name its target to analyse it
    too_deep       a folder more than MAX_DEPTH levels below the path named: not walked
    not_regular    a FIFO, device or socket with a run file's name: never opened
    unreadable     a folder that cannot be listed (permissions), a broken symlink; in a
                   bucket, a key with an empty, ``.`` or ``..`` part (``a//b``, ``a/../b``):
                   not read, on the discovery (as a path it names another object); an
                   object whose key is also the folder of others: its folder is walked

A path may be a URL (:mod:`analyzer.ingest.storage`): its tree is listed with one recursive
listing, turned into the same folder listings a local walk makes, so that the layouts are
read the same way; an object store has no symlinks, FIFOs or devices, and folder markers
are not files. A remote run's paths are URLs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from analyzer.capture.folder import ENV_FILE, is_capture_container, run_step_folders, step_of
from analyzer.errors import UsageError
from analyzer.ingest import storage
from analyzer.ingest.checkpoints import is_checkpoint_file
from analyzer.ingest.layouts import (
    Placement,
    is_save_dir,
    natural_key,
    place,
    rank_files,
    segment_order,
)
from analyzer.ingest.logs import TRAINER_STATE, is_log_file
from analyzer.ingest.metadata import is_metadata_file
from analyzer.ingest.safeio import file_kind
from analyzer.ingest.tb import event_file_order, is_event_file
from analyzer.model import IngestIssue, IssueKind, Location
from analyzer.model.runs import FileRole, RunFile, RunLayout, RunSegment

_SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".venv", "venv", ".hg", ".svn"}
MAX_DEPTH = 64
"""Folder levels walked below each path named; deeper folders are reported, not walked."""


@dataclass(frozen=True)
class RunFiles:
    """The files of one run, each list in reading order, and what discovery passed over.

    ``folders`` are the folders its files were found in, its root first; ``segments`` the
    folders a framework made per restart or stream, in order; ``layouts`` the framework
    layouts recognised; ``stream_starts`` the event files that begin a stream written
    beside the others rather than after them (not a restart)."""

    path: str
    name: str
    event_files: tuple[str, ...] = ()
    log_files: tuple[str, ...] = ()
    checkpoint_files: tuple[str, ...] = ()
    capture_dirs: tuple[str, ...] = ()
    metadata_files: tuple[str, ...] = ()
    issues: tuple[IngestIssue, ...] = ()
    env_file: str | None = None
    folders: tuple[str, ...] = ()
    segments: tuple[RunSegment, ...] = ()
    layouts: tuple[str, ...] = ()
    stream_starts: tuple[str, ...] = ()
    listed_files: tuple[str, ...] = ()
    """Files of the training listed and not read: the ``trainer_state.json`` of a Trainer's
    earlier saves, whose history the latest one holds too."""

    @property
    def empty(self) -> bool:
        return not (self.event_files or self.log_files or self.checkpoint_files
                    or self.capture_dirs)

    def layout(self) -> RunLayout:
        """The run's files by role, each with the segment it lies in."""
        roles: list[tuple[FileRole, tuple[str, ...]]] = [
            ("events", self.event_files), ("log", self.log_files),
            ("checkpoint", self.checkpoint_files), ("metadata", self.metadata_files),
            ("capture", self.capture_dirs),
            ("env", (self.env_file,) if self.env_file else ()),
            ("listed", self.listed_files)]
        index = {seg.folder: k for k, seg in enumerate(self.segments)}
        files = tuple(RunFile(path, role, segment_index(index, path))
                      for role, paths in roles for path in paths)
        return RunLayout(root=self.path, layouts=self.layouts, segments=self.segments,
                         files=files)



def segment_index(index: dict[str, int], path: str) -> int | None:
    """The index of the segment ``path`` lies in (``index``: each segment's folder and
    index), None when outside every segment: the folders above it are looked up, not every
    segment tried (a run may have hundreds)."""
    if not index:
        return None
    here = storage.parent(path)
    while here not in index:
        up = storage.parent(here)
        if up == here:
            return None
        here = up
    return index[here]


@dataclass(frozen=True)
class Discovery:
    """The runs below the paths named, and what was passed over outside every run."""

    runs: tuple[RunFiles, ...]
    issues: tuple[IngestIssue, ...] = ()


def is_attached_dir(name: str) -> bool:
    """A folder that is part of the run above it: a save folder or a capture folder."""
    return is_capture_container(name) or is_save_dir(name)


def is_run_file(name: str) -> bool:
    return is_event_file(name) or is_checkpoint_file(name) or is_log_file(name)


def find_runs(paths: list[str], extra_logs: Sequence[str] = (),
              run_roots: Sequence[str] = ()) -> list[RunFiles]:
    """Every run below each path, in a stable order. A path that does not exist is an error.

    ``extra_logs`` are text logs whose names do not look like logs (``--log FILE``): each
    joins the run of the folder that holds it, or becomes a run of its own. Each of
    ``run_roots`` is one run with everything below it (one outside every path is walked
    too).
    """
    return list(discover(paths, extra_logs, run_roots).runs)


def discover(paths: list[str], extra_logs: Sequence[str] = (),
             run_roots: Sequence[str] = ()) -> Discovery:
    """Like :func:`find_runs`, with the issues of what was passed over outside every run."""
    runs: dict[str, RunFiles] = {}
    loose: list[IngestIssue] = []
    paths, extra_logs, run_roots = ([storage.normalize(p) for p in group]
                                    for group in (paths, extra_logs, run_roots))
    folders = {root: _check_exists(root) for root in [*paths, *extra_logs, *run_roots]}
    for root in run_roots:
        if not folders[root]:
            raise UsageError(f"{root}: --run-root names a folder, not a file")
    forced = {storage.absolute(r) for r in run_roots}
    kinds = {_normpath(p): isdir for p, isdir in folders.items()}
    for root in _walk_roots(paths, run_roots, folders):
        if kinds[root]:
            found, issues = _walk(root, forced)
        else:
            single = _single_file_run(root)
            found, issues = ([single] if single is not None else []), []
        for run in found:
            runs.setdefault(run.path, run)
        loose += issues
    for root in folders:
        if storage.is_url(root):
            storage.forget(root)  # a folder named inside another, listed and not walked
    for log in extra_logs:
        folder = storage.parent(log) or "."
        key = next((k for k, r in runs.items()
                    if any(_same(f, folder) for f in (r.path, *r.folders))), None)
        if key is None:
            runs[log] = RunFiles(path=folder, name=storage.name(log), log_files=(log,),
                                 folders=(folder,))
        elif not any(_same(f, log) for f in runs[key].log_files):
            held = runs[key]
            runs[key] = replace(held, log_files=(*held.log_files, log))
    return Discovery(tuple(runs.values()), tuple(loose))


def _check_exists(root: str) -> bool:
    """Whether ``root`` is a folder; UsageError for a path that is not there, or a URL
    whose store cannot be reached (one look at it: a store answers each over the network)."""
    if not storage.is_url(root):
        if not os.path.exists(root):
            raise UsageError(f"{root}: no such file or folder")
        return os.path.isdir(root)
    try:
        kind = storage.look(root)
    except OSError as exc:
        raise UsageError(f"{root}: cannot be looked at: {exc.strerror or exc}") from None
    if kind is None:
        raise UsageError(f"{root}: no such object or folder")
    return kind == "directory"


def _same(a: str, b: str) -> bool:
    if storage.is_url(a) or storage.is_url(b):
        return storage.normalize(a) == storage.normalize(b)
    return os.path.samefile(a, b)


def _normpath(path: str) -> str:
    return path if storage.is_url(path) else os.path.normpath(path)


def _walk_roots(paths: Sequence[str], run_roots: Sequence[str],
                folders: dict[str, bool]) -> list[str]:
    """The folders to walk: each path named once ('runs/a/' and 'runs/a' are one folder),
    the run roots outside every path, and no folder inside another (its runs are found
    from the outer one, grouped as there). ``folders``: whether each path is a folder."""
    named = list(dict.fromkeys(map(_normpath, paths)))
    dirs = {_normpath(p): isdir for p, isdir in folders.items()}
    outer = [storage.absolute(p) for p in named if dirs[p]]
    named += [_normpath(r) for r in run_roots
              if not any(storage.inside(storage.absolute(r), o) for o in outer)]
    walked = [storage.absolute(p) for p in named if dirs[p]]
    keep = []
    for path in dict.fromkeys(named):
        here = storage.absolute(path)
        if not any(o != here and storage.inside(here, o) for o in walked):
            keep.append(path)
    return keep


def _single_file_run(path: str) -> RunFiles | None:
    folder = storage.parent(storage.absolute(path))
    name = storage.name(folder)
    if not storage.isfile(path):  # a FIFO, device or socket named on the command line
        kind = _special_kind(path)
        issue = _issue(path, "not_regular", f"a {kind}, not a regular file: not opened")
        return RunFiles(path=folder, name=os.path.basename(path), issues=(issue,))
    if is_event_file(path):
        return RunFiles(path=folder, name=name, event_files=(path,))
    if is_checkpoint_file(path):
        return RunFiles(path=folder, name=name, checkpoint_files=(path,))
    if is_log_file(path):
        return RunFiles(path=folder, name=storage.name(path), log_files=(path,))
    return None


def _issue(path: str, kind: IssueKind, message: str) -> IngestIssue:
    return IngestIssue(Location(path), kind, message)


def _special_kind(path: str) -> str:
    if storage.is_url(path):
        return "folder" if storage.isdir(path) else "object that cannot be looked at"
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


def _remote_lister(root: str) -> Callable[[str], Listing]:
    """Listings of the folders below the URL ``root``, all from one listing of the tree."""
    try:
        tree = storage.list_tree(root)
    except OSError as exc:
        problem = f"folder cannot be listed: {exc.strerror or exc}"
        return lambda folder: Listing(folder, issues=[_issue(folder, "unreadable", problem)])

    def lister(folder: str) -> Listing:
        got = tree.get(folder)
        if got is None:
            return Listing(folder, issues=[_issue(folder, "unreadable",
                                                  "folder not in the store's listing")])
        odd = [_issue(url, "unreadable", why) for url, why in got.odd]
        return Listing(folder, list(got.dirs), list(got.files), odd)

    return lister


def walk_tree(root: str, descend: Callable[[str], bool]) -> Iterator[Listing]:
    """Every folder below ``root`` (root first, then depth first in name order) for which
    ``descend`` holds, iteratively: a deep tree costs no recursion. Folders below
    MAX_DEPTH are reported on the listing of their parent and not walked. A URL's tree is
    listed once, up front."""
    lister = _remote_lister(root) if storage.is_url(root) else _list
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        listing = lister(folder)
        dirs = [d for d in listing.dirs
                if not _skipped_dir(d) and descend(storage.join(folder, d))]
        if dirs and depth >= MAX_DEPTH:
            listing.issues.append(_issue(folder, "too_deep",
                                         f"{len(dirs)} sub-folder(s) more than {MAX_DEPTH} "
                                         "levels below the path named: not walked"))
            dirs = []
        yield listing
        stack += [(storage.join(folder, d), depth + 1) for d in reversed(dirs)]


def _walk(root: str, forced: set[str]) -> tuple[list[RunFiles], list[IngestIssue]]:
    """The runs below ``root`` (``forced``: the absolute paths of --run-root folders) and
    what was passed over outside every run: the whole tree listed, then each folder placed
    in its training (:func:`analyzer.ingest.layouts.place`)."""
    tree = {listing.folder: listing for listing in
            walk_tree(root, lambda d: not is_capture_container(storage.name(d)))}
    said = (storage.ODD_PART, storage.SHADOWED)
    odd = [i for i in tree[root].issues if i.message in said] if root in tree else []
    if odd:  # passed over outside every run, as the store's keys, not the root's damage
        tree[root].issues = [i for i in tree[root].issues if i.message not in said]
    roots = {f for f in tree if storage.absolute(f) in forced} if forced else set()
    placements = place(tree, root, roots)
    groups: dict[str, list[str]] = {}
    for folder, placed in placements.items():
        groups.setdefault(placed.owner, []).append(folder)
    runs: dict[str, RunFiles] = {}
    leftover: list[tuple[str, tuple[IngestIssue, ...]]] = []
    for owner, members in groups.items():
        run, own = _gather(root, owner, members, tree, placements)
        if not run.empty or own:
            runs[owner] = run
        elif run.issues:
            leftover.append((owner, run.issues))
    loose: list[IngestIssue] = odd
    for owner, issues in leftover:
        holder = _enclosing(runs, owner)
        if holder is None:
            loose += issues
        else:
            runs[holder] = replace(runs[holder], issues=runs[holder].issues + issues)
    return list(runs.values()), loose


def _enclosing(runs: dict[str, RunFiles], folder: str) -> str | None:
    """The nearest run folder above ``folder``."""
    here = folder
    while True:
        up = storage.parent(here)
        if up == here:
            return None
        if up in runs:
            return up
        here = up


@dataclass
class _Gathered:
    events: list[tuple[int, tuple[int, str], str]] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    metadata: list[str] = field(default_factory=list)
    captures: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    issues: list[IngestIssue] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    layouts: set[str] = field(default_factory=set)


def _gather(root: str, owner: str, members: list[str], tree: dict[str, Listing],
            placements: dict[str, Placement]) -> tuple[RunFiles, bool]:
    """The run of the training at ``owner`` from its member folders (walk order), and
    whether a run file of its own was passed over (a FIFO named like one: still a run)."""
    segments = _segments(owner, members, tree, placements)
    rank = {seg.folder: k for k, seg in enumerate(segments)}
    got = _Gathered()
    own = False
    for folder in members:
        listing, placed = tree[folder], placements[folder]
        if placed.claim is not None and placed.claim.layout is not None:
            got.layouts.add(placed.claim.layout)
        paths = [storage.join(folder, f) for f in listing.files]
        if placed.save:
            _gather_save(got, paths, listing)
            continue
        got.events += [(rank.get(placed.segment or "", -1), event_file_order(p), p)
                       for p in paths if is_event_file(p)]
        got.logs += [p for p in paths if is_log_file(p)]
        got.checkpoints += [p for p in paths if is_checkpoint_file(p)]
        got.metadata += [p for p in paths if is_metadata_file(p)]
        captures, more = run_step_folders(folder, listing.dirs)
        got.captures += captures
        got.issues += listing.issues + more
        own = own or any(i.kind == "not_regular" or
                         (i.kind == "unreadable" and is_run_file(i.location.file))
                         for i in listing.issues)
        if paths or captures:
            got.folders.append(folder)
        if rank_files(listing):
            got.layouts.add("ranks")
    listed = got.states
    if got.states and not any(os.path.basename(f) == TRAINER_STATE for f in got.logs):
        # Each Trainer save holds the whole log history so far: the latest one is enough.
        latest = max(got.states, key=_save_number)
        got.logs.append(latest)
        listed = sorted((f for f in got.states if f != latest), key=_save_number)
    if placements[owner].forced:
        got.layouts.add("run-root")
    events = [p for _, _, p in sorted(got.events)]
    captures = sorted(got.captures, key=lambda p: (step_of(os.path.basename(p)) or 0, p)) \
        if len({storage.parent(c) for c in got.captures}) > 1 else got.captures
    env = storage.join(owner, ENV_FILE) if ENV_FILE in tree[owner].files else None
    run = RunFiles(path=owner, name=_run_name(root, owner), event_files=tuple(events),
                   log_files=tuple(got.logs), checkpoint_files=tuple(got.checkpoints),
                   capture_dirs=tuple(captures), metadata_files=tuple(got.metadata),
                   issues=tuple(got.issues), env_file=env,
                   folders=tuple(dict.fromkeys([owner, *got.folders])), segments=segments,
                   layouts=tuple(sorted(got.layouts)),
                   stream_starts=_stream_starts(events, segments),
                   listed_files=tuple(listed))
    return run, own


def _gather_save(got: _Gathered, paths: list[str], listing: Listing) -> None:
    """A save folder's part: its checkpoints, metadata and Trainer state, and what was
    passed over there (a special file counts only with a checkpoint's name)."""
    got.checkpoints += [p for p in paths if is_checkpoint_file(p)]
    got.metadata += [p for p in paths if is_metadata_file(p)]
    got.states += [p for p in paths if os.path.basename(p) == TRAINER_STATE]
    got.issues += [i for i in listing.issues
                   if i.kind != "not_regular" or is_checkpoint_file(i.location.file)]
    if any(is_checkpoint_file(p) or is_metadata_file(p) for p in paths):
        got.folders.append(listing.folder)


def _segments(owner: str, members: list[str], tree: dict[str, Listing],
              placements: dict[str, Placement]) -> tuple[RunSegment, ...]:
    """The run's segments: those written one after the other in order, then those
    written side by side."""
    found = {placements[f].segment for f in members} - {None}
    folders = [f for f in found if f is not None]
    parallel = {f for f in folders if (c := placements[f].claim) is not None and c.parallel}
    ordered = segment_order([f for f in folders if f not in parallel], tree) + sorted(
        parallel, key=natural_key)
    return tuple(RunSegment(f, storage.relative(f, owner), f in parallel)
                 for f in ordered)


def _stream_starts(events: list[str], segments: tuple[RunSegment, ...]) -> tuple[str, ...]:
    """The first event file of each folder (or segment) outside the run's ordered
    segments: a writer beside the others, not a restart of one."""
    seen: set[str] = set()
    starts: list[str] = []
    index = {seg.folder: k for k, seg in enumerate(segments)}
    for path in events:
        k = segment_index(index, path)
        seg = None if k is None else segments[k]
        key = seg.folder if seg is not None else storage.parent(path)
        if key in seen:
            continue
        seen.add(key)
        if seg is None or seg.parallel:
            starts.append(path)
    return tuple(starts[1:]) if starts and starts[0] == events[0] else tuple(starts)


def _save_number(path: str) -> int:
    digits = re.findall(r"\d+", os.path.basename(os.path.dirname(path)))
    return int(digits[-1]) if digits else -1


def _run_name(root: str, folder: str) -> str:
    rel = storage.relative(folder, root)
    if rel == ".":
        return storage.name(storage.absolute(folder)) or folder
    return rel
