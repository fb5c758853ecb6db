"""Which training each folder below a path belongs to, by the layouts frameworks write.

Discovery lists every folder below the path named; this module decides, from names alone
(folder names and the names of the files each folder holds: nothing is opened), which of
them are one training. Each folder either stands for itself or *joins the folder above
it*; a training's root is the first folder up that stands for itself (never above the path
named), and the training is its root and every folder that joins it, directly or through
others. A folder joins the one above it when it is

    a save folder      ``checkpoints/``, ``ckpt/``, ``checkpoint-N/``, ``checkpoint_N/``,
                       ``step_N/``, ``epoch_N/``, ``global_stepN/`` and all below one: only
                       checkpoints and metadata are taken from them
    lightning          ``version_N/`` (a segment, in N's order) and all below it; the
                       logger's default name folder above, ``lightning_logs/``, when it is
                       the only name folder beside it (several are several experiments)
    keras              ``train/``, ``validation/`` or ``eval/`` holding event files (segments
                       written side by side)
    torchrun           ``<rank>/`` in ``attempt_N/``, ``attempt_N/`` (a segment),
                       the ``<run_id>/`` folder holding attempts
    ranks              ``rank_N/``, ``rank-N/``, ``rankN/`` (side by side)
    accelerate         a tracker's folder of event files in a project dir (one with
                       ``checkpoints/checkpoint_N/`` or a save holding ``random_states_N.pkl``)
                       or in a folder of it (a ``logging_dir``), and that folder

and, when the folder above is a training already (it holds run files or metadata itself,
another folder joins it by the rules above, it is a Trainer's ``output_dir``, with
``checkpoint-N/`` or ``training_args.bin``, or the flight recorder's folder, with its
``env.json`` or ``capture/``):

    a side folder      ``tb/``, ``tensorboard/``, ``tb_logs/``, ``logs/``, ``log/``,
                       ``events/``, ``summaries/``, ``summary/``
    a name folder      a logger's name folder of another name (one that holds nothing but
                       ``version_N/`` folders), when it is the only one there
    runs               ``runs/`` (a Trainer's and SummaryWriter's default logging folder),
                       each folder in it a segment, ordered by the writers' start times
                       that the event files' names carry
    a framework's dir  a folder holding nothing but folders that join it by the rules above
                       (a torchrun ``--log-dir`` of ``<run_id>/`` folders, a logger's
                       ``save_dir`` holding its name folder)
    a save by content  a folder holding only checkpoints and metadata
    a tracker's folder a folder of event files alone in the flight recorder's folder (its
                       ``env.json`` or ``capture/``): an ``init_trackers("name")`` below
                       ``project_dir``

Any other folder that holds event files, logs or checkpoints is a training of its own.
A ``--run-root`` folder stands for itself and takes every folder below it, whatever the
rules say.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from analyzer.capture.folder import ENV_FILE, is_capture_container
from analyzer.ingest.checkpoints import is_checkpoint_file
from analyzer.ingest.logs import is_log_file
from analyzer.ingest.metadata import is_metadata_file
from analyzer.ingest.tb import event_file_order, is_event_file

SAVE_NAMES = re.compile(
    r"checkpoints?|ckpts?|(checkpoint|ckpt|step|global_step|epoch)[-_=]?\d+", re.IGNORECASE)
SIDE_NAMES = frozenset({"tb", "tensorboard", "tb_logs", "tblogs", "tensorboard_logs", "logs",
                        "log", "events", "summaries", "summary"})
STREAM_NAMES = frozenset({"train", "validation", "eval"})
_VERSION = re.compile(r"version_(\d+)")
_ATTEMPT = re.compile(r"attempt_(\d+)")
_HF_SAVE = re.compile(r"checkpoint-\d+")
_ACCEL_SAVE = re.compile(r"checkpoint_\d+")
_RANK_DIR = re.compile(r"rank[-_]?\d+", re.IGNORECASE)
_RANK_FILE = re.compile(r"(^|[-_.])rank[-_]?\d+", re.IGNORECASE)
_ACCEL_STATE = re.compile(r"random_states_\d+\.pkl")
_HF_FILES = frozenset({"training_args.bin", "trainer_state.json"})


class Listed(Protocol):
    """A listed folder: the names of its sub-folders and of its regular files."""

    @property
    def dirs(self) -> Sequence[str]: ...

    @property
    def files(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Claim:
    """Why a folder joins the one above it: the layout that says so (None for a plain
    save or side folder), whether it starts a segment (sequential, or written side by side:
    ``parallel``), and whether it is a save (only checkpoints and metadata read)."""

    layout: str | None
    segment: bool = False
    parallel: bool = False
    save: bool = False


@dataclass(frozen=True)
class Placement:
    """Where one folder belongs: its training's root, the segment folder it lies in
    (None: none), and the claim that joined it to the folder above (None: it stands for
    itself)."""

    owner: str
    segment: str | None = None
    claim: Claim | None = None
    forced: bool = False
    """Inside a ``--run-root`` folder (the folder itself included)."""

    @property
    def save(self) -> bool:
        return self.claim is not None and self.claim.save


def is_save_dir(name: str) -> bool:
    return bool(SAVE_NAMES.fullmatch(name))


def has_run_files(listing: Listed) -> bool:
    return any(is_event_file(f) or is_log_file(f) or is_checkpoint_file(f)
               for f in listing.files)


def rank_files(listing: Listed) -> bool:
    """Whether a folder holds logs of several ranks side by side (``rank0.log``,
    ``log_rank_1.txt``)."""
    return sum(1 for f in listing.files if is_log_file(f) and _RANK_FILE.search(f)) > 1


def place(tree: Mapping[str, Listed], root: str,
          run_roots: Collection[str] = ()) -> dict[str, Placement]:
    """The placement of every folder of ``tree`` (listed from ``root``, parents before
    their sub-folders), the folders in ``run_roots`` standing for themselves with all
    below them."""
    rules = _Rules(tree)
    claims: dict[str, Claim | None] = {}
    for folder in tree:
        if folder == root or folder in run_roots:
            claims[folder] = None
            continue
        parent = os.path.dirname(folder)
        above = claims.get(parent)
        if above is not None and above.save:
            claims[folder] = Claim(above.layout, save=True)
        else:
            claims[folder] = rules.claim(folder)
    first = dict(claims)  # a training already by name rules alone: no order dependence
    for folder in tree:  # rules that ask whether the folder above is a training already
        if claims[folder] is not None or folder == root or folder in run_roots:
            continue
        parent = os.path.dirname(folder)
        above = claims.get(parent)
        if os.path.basename(parent) == "runs" and above is not None:
            claims[folder] = Claim(above.layout, segment=True)
        elif rules.anchored(parent, first):
            claims[folder] = rules.claim_beside_training(folder, first)
    out: dict[str, Placement] = {}
    for folder in tree:  # parents first: a folder's owner is its parent's when it joins
        claim = claims[folder]
        up = out.get(os.path.dirname(folder)) if folder != root else None
        if folder in run_roots:
            out[folder] = Placement(folder, forced=True)
        elif up is not None and up.forced:
            out[folder] = Placement(up.owner, folder if claim is not None and claim.segment
                                    else up.segment, claim or Claim("run-root"), forced=True)
        elif up is None or claim is None:
            out[folder] = Placement(folder)
        else:
            out[folder] = Placement(up.owner, folder if claim.segment else up.segment, claim)
    return out


def segment_order(segments: Collection[str], tree: Mapping[str, Listed]) -> list[str]:
    """Segments in the order they were written: a ``runs/`` folder's by the earliest
    writer start its event files' names carry, the others by the numbers in their names."""
    timed = {f for f in segments if os.path.basename(os.path.dirname(f)) == "runs"}
    started = dict.fromkeys(timed, math.inf)
    for folder, listing in tree.items() if timed else ():  # for the segment above it
        here = folder
        while here not in started and os.path.dirname(here) != here and here in tree:
            here = os.path.dirname(here)
        if here in started:
            stamps = [event_file_order(f)[0] for f in listing.files if is_event_file(f)]
            started[here] = min([started[here], *stamps])
    return sorted(segments, key=lambda f: (started.get(f, math.inf), natural_key(f)))


def natural_key(text: str) -> tuple[tuple[int, str], ...]:
    """``version_10`` after ``version_9``: digits compared as numbers."""
    return tuple((int(p), "") if p.isdigit() else (-1, p)
                 for p in re.split(r"(\d+)", text) if p)


class _Rules:
    """The layout rules over one listed tree. What is asked of a folder on behalf of each
    of its sub-folders is kept, so that a folder of thousands of runs costs no more than
    its listing times a constant."""

    def __init__(self, tree: Mapping[str, Listed]) -> None:
        self.tree = tree
        self._memo: dict[tuple[str, str], bool | int] = {}

    def _kept(self, what: str, folder: str, compute: Callable[[str], bool | int]) -> bool | int:
        key = (what, folder)
        if key not in self._memo:
            self._memo[key] = compute(folder)
        return self._memo[key]

    def _dirs(self, folder: str) -> Sequence[str]:
        listing = self.tree.get(folder)
        return listing.dirs if listing is not None else ()

    def _files(self, folder: str) -> Sequence[str]:
        listing = self.tree.get(folder)
        return listing.files if listing is not None else ()

    def _events(self, folder: str) -> bool:
        return any(is_event_file(f) for f in self._files(folder))

    def claim(self, folder: str) -> Claim | None:
        """The rules that need only the folder's and its neighbours' names."""
        name, parent = os.path.basename(folder), os.path.dirname(folder)
        pname = os.path.basename(parent)
        if is_save_dir(name):
            layout = "huggingface" if _HF_SAVE.fullmatch(name) else (
                "accelerate" if self._accelerate_saves(folder) else None)
            return Claim(layout, save=True)
        if self.is_version(folder):
            return Claim("lightning", segment=True)
        if self.is_version(parent):
            return Claim("lightning")  # a logger's sub_dir
        if name == "lightning_logs" and self.is_name_folder(folder) and \
                self._name_folders(parent) == 1:
            return Claim("lightning")
        if name.lower() in STREAM_NAMES and self._events(folder):
            return Claim("keras", segment=True, parallel=True)
        if name.isdigit() and _ATTEMPT.fullmatch(pname):
            return Claim("torchrun")
        if _ATTEMPT.fullmatch(name) and self.is_attempt(folder):
            return Claim("torchrun", segment=True)
        if self.is_torchrun_run(folder):
            return Claim("torchrun")
        if _RANK_DIR.fullmatch(name) and has_run_files(self.tree[folder]):
            return Claim("ranks", segment=True, parallel=True)
        if self._tracker_dir(folder, parent):
            return Claim("accelerate")
        return None

    def claim_beside_training(self, folder: str, claims: Mapping[str, Claim | None],
                              ) -> Claim | None:
        """The rules that apply only when the folder above is a training already."""
        name, listing = os.path.basename(folder), self.tree[folder]
        if name == "runs":
            return Claim("huggingface" if self.is_trainer_output(os.path.dirname(folder))
                         else "tensorboard")
        if name.lower() in SIDE_NAMES:
            return Claim(None)
        parent = os.path.dirname(folder)
        if self._recorder_folder(parent) and not listing.dirs and listing.files and all(
                is_event_file(f) for f in listing.files):
            # A folder of event files alone in one training's folder is that training's
            # tracker (accelerate's init_trackers("name") under project_dir).
            return Claim(None)
        if self.is_name_folder(folder) and self._name_folders(parent) == 1:
            return Claim("lightning")
        made = [claims.get(os.path.join(folder, d)) for d in listing.dirs]
        if made and not listing.files and all(c is not None and c.layout and not c.save
                                              for c in made):
            # a logger's save_dir, a torchrun --log-dir: nothing but what a framework made
            return Claim(next(c.layout for c in made if c is not None))
        if listing.files and all(is_checkpoint_file(f) or is_metadata_file(f)
                                 for f in listing.files) and any(
                is_checkpoint_file(f) for f in listing.files):
            return Claim(None, save=True)
        return None

    def _recorder_folder(self, folder: str) -> bool:
        """Whether the flight recorder wrote into ``folder`` (its env.json, its capture/):
        the folder of one training."""
        listing = self.tree.get(folder)
        return listing is not None and (ENV_FILE in listing.files or any(
            is_capture_container(d) for d in listing.dirs))

    def anchored(self, folder: str, claims: Mapping[str, Claim | None]) -> bool:
        """Whether ``folder`` is a training already: it holds run files or metadata, a
        sub-folder joins it by a name rule, or it is a Trainer's output_dir."""
        return bool(self._kept("anchored", folder, lambda f: self._anchored(f, claims)))

    def _anchored(self, folder: str, claims: Mapping[str, Claim | None]) -> bool:
        listing = self.tree.get(folder)
        if listing is None:
            return False
        if has_run_files(listing) or any(is_metadata_file(f) for f in listing.files):
            return True
        if self.is_trainer_output(folder):
            return True
        # What the flight recorder writes into the folder it was given: the run folder of
        # a training, whatever logs beside it.
        if self._recorder_folder(folder):
            return True
        return any(claims.get(os.path.join(folder, d)) is not None for d in listing.dirs)

    def is_version(self, folder: str) -> bool:
        """A Lightning logger's ``version_N`` folder: its name, and something a logger or a
        ModelCheckpoint writes in it."""
        if not _VERSION.fullmatch(os.path.basename(folder)) or folder not in self.tree:
            return False
        listing = self.tree[folder]
        return bool(listing.files or listing.dirs)

    def is_name_folder(self, folder: str) -> bool:
        """A logger's name folder: ``lightning_logs/``, or one that holds nothing but
        ``version_N/`` folders."""
        listing = self.tree.get(folder)
        if listing is None or has_run_files(listing):
            return False
        versions = [d for d in listing.dirs if self.is_version(os.path.join(folder, d))]
        if not versions:
            return False
        return os.path.basename(folder) == "lightning_logs" or len(versions) == len(listing.dirs)

    def _name_folders(self, folder: str) -> int:
        return int(self._kept("names", folder, lambda f: sum(
            1 for d in self._dirs(f) if self.is_name_folder(os.path.join(f, d)))))

    def is_attempt(self, folder: str) -> bool:
        listing = self.tree[folder]
        return any(d.isdigit() for d in listing.dirs) or any(
            f.startswith("filtered_") for f in listing.files)

    def is_torchrun_run(self, folder: str) -> bool:
        """torchrun's ``<run_id>_<random>/`` folder: it holds ``attempt_N/`` folders."""
        return any(_ATTEMPT.fullmatch(d) and self.is_attempt(os.path.join(folder, d))
                   for d in self._dirs(folder) if os.path.join(folder, d) in self.tree)

    def _tracker_dir(self, folder: str, parent: str) -> bool:
        """A tracker's folder in an Accelerate project: event files in the project dir's
        ``logging_dir`` (the project dir itself by default, or a folder in it) under the
        tracker's run name, and that logging_dir."""
        if self._events(folder):
            return self.is_accelerate_project(parent) or (
                not has_run_files(self.tree[parent])
                and self.is_accelerate_project(os.path.dirname(parent)))
        return not has_run_files(self.tree[folder]) and self.is_accelerate_project(parent) \
            and any(self._events(os.path.join(folder, d)) for d in self._dirs(folder))

    def _accelerate_saves(self, folder: str) -> bool:
        return any(_ACCEL_SAVE.fullmatch(d) for d in self._dirs(folder)) or any(
            _ACCEL_STATE.fullmatch(f) for f in self._files(folder))

    def is_accelerate_project(self, folder: str) -> bool:
        """An Accelerate ``project_dir``: a save folder of ``checkpoint_N/`` folders, or one
        holding ``random_states_N.pkl``, directly inside it."""
        return bool(self._kept("accelerate", folder, self._accelerate_project))

    def _accelerate_project(self, folder: str) -> bool:
        return any(is_save_dir(d) and self._accelerate_saves(os.path.join(folder, d))
                   for d in self._dirs(folder)) or any(
            any(_ACCEL_STATE.fullmatch(f) for f in self._files(os.path.join(folder, d)))
            for d in self._dirs(folder))

    def is_trainer_output(self, folder: str) -> bool:
        """A Hugging Face Trainer's ``output_dir``: ``checkpoint-N/`` folders or the files
        only the Trainer writes."""
        return bool(self._kept("trainer", folder, self._trainer_output))

    def _trainer_output(self, folder: str) -> bool:
        return any(_HF_SAVE.fullmatch(d) for d in self._dirs(folder)) or any(
            f in _HF_FILES for f in self._files(folder))
