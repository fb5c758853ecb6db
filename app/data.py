"""The dashboard's one door to the analyzer: discovery, analysis, replay and rule docs.

Every ``st.cache_data`` of the app lives here. A run is cached under its folder and a
fingerprint of its files (path, size and modification time of each event file, log,
checkpoint, metadata file and capture file; an object's size and ETag from the store's
listing), so a run whose files change is analysed again on the next rerun while the others
stay cached. The folder listing itself is trusted for a few seconds only (a bucket's for a
minute), which is how new and changed files are noticed. The root may be a URL
(``s3://bucket/runs``): every read goes through :mod:`analyzer.ingest.storage` and
:mod:`analyzer.ingest.safeio`, as the analysis's do.

The Fleet page's sweep summary is made from the results the runs table keeps of each run
(slim: series and histograms dropped), so it reads no file the table has not read.

The analysis is the one ``forensics analyze`` makes, by the same stages of
:mod:`analyzer.pipeline`, each cached here on its own: discover, read and locate a run,
replay its capture, then rank, which compares a failed run with the healthy runs beside
it. Findings are therefore keyed by the run and by a digest of its healthy siblings'
environments. Nothing here computes what a stage gives: pages read it off the records.

Pages paint before any replay: :func:`load_fast` gives a run read, located and ranked
without it (as ``forensics analyze --no-replay``), :func:`start_replay` queues the replay on
a background thread shared by every session, and :func:`replay_state` says when
:func:`load` has it. The runs table reads each run once (ranked alone, then beside its
siblings from the slim result, as a fleet's executor does) and shows its rows as they come.

Nothing here writes into an analysed folder: the analyzer only reads, and a replay runs
in memory. A replay imports the factories its capture names only from trusted folders
(:mod:`analyzer.trust`: ``--import-path`` folders given to ``forensics app``, folders recorded
with ``forensics trust``, the tool's own); a run whose capture names other code is analysed
without it, and the Replay page asks before running that code. The trust in force is part
of a run's fingerprint when the run has a capture, so trusting a folder re-analyses just
those runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import streamlit as st

from analyzer.capture.folder import ENV_FILE
from analyzer.errors import ForensicsError
from analyzer.model import CodeRefusal, RunResult
from analyzer.model.fleet import SweepSummary
from app import views
from app.rows import RunRow, run_row
from app.views import Growth, TagRoles

ENV_ROOT = "FORENSICS_RUNS"
DEFAULT_ROOT = "sample_runs"
LISTING_TTL_S = 3.0
REMOTE_LISTING_TTL_S = 60.0


@dataclass(frozen=True)
class RunRef:
    """A run found below the root: its display name, folder and files' fingerprint."""

    name: str
    path: str
    digest: str


@dataclass(frozen=True)
class Loaded:
    """The analysis of one run, or why it could not be made."""

    result: RunResult | None
    error: str | None = None


@dataclass(frozen=True)
class Siblings:
    """Environments (env.json) of the healthy runs beside a run, hashed by ``digest``."""

    digest: str
    envs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Facts:
    unhealthy: bool
    """Failed or unreadable: not a healthy sibling (pipeline.sibling_facts)."""
    env: Mapping[str, Any] | None


@dataclass(frozen=True)
class ReplayOutcome:
    """A replay's result (an ``analyzer.replayer.ReplayResult``), or why it failed."""

    result: Any
    error: str | None = None
    seconds: float = 0.0
    refused: CodeRefusal | None = None


def _siblings_hash(siblings: Siblings) -> str:
    return siblings.digest


_BY_DIGEST: dict[str | type[Any], Callable[[Any], Any]] = {Siblings: _siblings_hash}


def runs_root(argv: list[str] | None = None) -> str:
    """The folder to browse: ``--runs PATH`` after ``--`` on the command line, else the
    ``FORENSICS_RUNS`` environment variable, else ``sample_runs``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--runs")
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return str(known.runs or os.environ.get(ENV_ROOT) or DEFAULT_ROOT)


def import_paths(argv: list[str] | None = None) -> tuple[str, ...]:
    """Folders trusted for this session: ``--import-path DIR`` after ``--``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--import-path", action="append", default=[])
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return tuple(known.import_path)


def run_roots(argv: list[str] | None = None) -> tuple[str, ...]:
    """Folders each taken as one run with all below it: ``--run-root DIR`` after ``--``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--run-root", action="append", default=[])
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return tuple(known.run_root)


def trust_state() -> str:
    """A digest of the trust in force: this session's import paths and the folders recorded
    with ``forensics trust``."""
    from analyzer.trust import trusted_folders

    return _digest(["trust", *import_paths(), "\0", *trusted_folders()])


def trust_folder(folder: str) -> str:
    """Record ``folder`` as trusted (in the user's configuration, never in a run folder)
    and forget the fingerprints, so that the runs whose captures it unlocks are analysed
    again."""
    from analyzer.trust import trust_folder as record

    real = record(folder)
    list_runs.clear()
    st.session_state.pop(_TABLE_KEY, None)
    return real


def _digest(parts: list[str]) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    for part in parts:
        h.update(part.encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()


def root() -> str:
    """The folder or URL browsed, as the analysis names its runs (a local path absolute)."""
    from analyzer.ingest import storage

    return storage.absolute(runs_root())


def _stat_line(path: str) -> str:
    """A file's change token: its size and modification time, or an object's size and
    ETag, never its bytes."""
    from analyzer.ingest import storage

    try:
        if storage.is_url(path):
            return f"{path}\0{_object_token(path)}"
        info = os.stat(path)
    except OSError:
        return f"{path}\0missing"
    return f"{path}\0{info.st_size}\0{info.st_mtime_ns}"


def _object_token(path: str) -> str:
    """An object's size and ETag as the bucket's listing gave them, which the discovery
    makes again once a :data:`REMOTE_LISTING_TTL_S`: a fingerprint made every few seconds
    then costs no request per object (``storage.signature`` asks the store each time)."""
    from analyzer.ingest import storage

    found = storage.info(path)
    if found is None:
        return "missing"
    return f"{found.get('size') or 0}:{found.get('ETag') or found.get('LastModified') or ''}"


def _capture_files(folders: tuple[str, ...]) -> list[str]:
    from analyzer.ingest import storage
    from analyzer.ingest.discover import walk_tree

    out: list[str] = []
    for folder in folders:
        if storage.is_url(folder):
            out += _remote_files(folder)
            continue
        for listing in walk_tree(folder, lambda d: True):
            out += [os.path.join(listing.folder, f) for f in listing.files]
    return out


def _remote_files(folder: str) -> list[str]:
    """Every object below a remote folder, from the listing the store's filesystem kept of
    the discovery's (no request of its own); none when it cannot be listed."""
    from analyzer.ingest import storage

    out: list[str] = []
    stack = [folder]
    while stack:
        here = stack.pop()
        try:
            entries = storage.list_dir(here)
        except OSError:
            continue
        for name, is_dir in entries:
            (stack if is_dir else out).append(storage.join(here, name))
    return out


_PIECE = 1 << 16
"""Characters of a line read at a time, so that a line of a gigabyte costs no gigabyte."""


def text_lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of a text file opened safely (a FIFO or device is not
    opened); a line longer than _PIECE comes in pieces under one number.

    Lines end at ``\n`` only, as the log reader counts them: a progress bar redraws itself
    after a bare ``\r``, hundreds of times on one line, and those frames stay in their line.
    """
    import io

    from analyzer.ingest.safeio import open_regular

    handle, _ = open_regular(path)
    with io.TextIOWrapper(handle, encoding="utf-8", errors="replace", newline="\n") as fh:
        number = 1
        while piece := fh.readline(_PIECE):
            yield number, piece
            if piece.endswith("\n"):
                number += 1


def _discovery(root: str) -> Any:
    """The runs below ``root`` and what the walk passed over (an ``analyzer.ingest.discover.
    Discovery``), or the message of why the folder cannot be walked. A bucket's listing is
    trusted longer than a local folder's: each costs a request per thousand keys."""
    from analyzer.ingest import storage

    return _remote_discovery(root) if storage.is_url(root) else _local_discovery(root)


@st.cache_data(ttl=LISTING_TTL_S, show_spinner=False)
def _local_discovery(root: str) -> Any:
    return _discover(root)


@st.cache_data(ttl=REMOTE_LISTING_TTL_S, show_spinner=False)
def _remote_discovery(root: str) -> Any:
    return _discover(root)


def _discover(root: str) -> Any:
    from analyzer import pipeline

    try:
        return pipeline.discover(root, run_roots=run_roots())
    except ForensicsError as exc:
        return str(exc)
    except OSError as exc:
        return f"{root}: cannot be listed: {exc.strerror or exc}"


def passed_over(root: str) -> list[str]:
    """What the search for runs below ``root`` passed over outside every run (symlinked
    folders, folders too deep or that cannot be listed), one line each."""
    found = _discovery(root)
    return [] if isinstance(found, str) else [str(issue) for issue in found.issues]


@st.cache_data(ttl=LISTING_TTL_S, show_spinner=False)
def list_runs(root: str) -> list[RunRef] | str:
    """Every run below ``root`` with its fingerprint, or a message saying why there is none."""
    from analyzer.ingest import storage

    discovery = _discovery(root)
    if isinstance(discovery, str):
        return discovery
    found = discovery.runs
    if not found:
        return f"no runs (folders with event files, logs or checkpoints) found under {root}"
    refs = []
    trust = trust_state()
    for rf in found:
        # Metadata too: a changed hparams.yaml or training_args.bin changes the settings
        # the rules and the alignment use.
        files = sorted([*rf.event_files, *rf.log_files, *rf.checkpoint_files,
                        *rf.metadata_files, *_capture_files(rf.capture_dirs),
                        storage.join(rf.path, ENV_FILE)])
        lines = [_stat_line(f) for f in files] + ([trust] if rf.capture_dirs else [])
        refs.append(RunRef(rf.name, rf.path, _digest(lines)))
    return refs


@st.cache_data(max_entries=64, show_spinner=False)
def _read(path: str, digest: str) -> Loaded:
    """Read, align and locate one run: the pipeline's stages before the replay and the
    rules, which ``forensics analyze --no-replay`` makes too. Bounded: a run evicted from
    here is read again when a page needs its series."""
    from analyzer import pipeline

    try:
        found = next((f for f in pipeline.discover(path, run_roots=run_roots()).runs
                      if f.path == path), None)
        if found is None:
            return Loaded(None, f"{path}: the analysis found no run in this folder")
        return Loaded(pipeline.locate(pipeline.align(pipeline.read_run(found))))
    except ForensicsError as exc:
        return Loaded(None, str(exc))
    except Exception as exc:  # one damaged run must not take the whole dashboard down
        return Loaded(None, f"the analysis of {path} failed: {type(exc).__name__}: {exc}")


def _located(path: str, digest: str) -> Loaded:
    """The located run with the replay of its capture, waiting for the replay when it is
    not done yet."""
    from analyzer import pipeline

    loaded = _read(path, digest)
    result = loaded.result
    capture = None if result is None else capture_of(result)
    if result is None or capture is None:
        return loaded
    done = replays.wait(capture, digest, import_paths())
    return Loaded(pipeline.with_replay(result, (done.result, done.error, done.refused)))


@dataclass(frozen=True)
class _Alone:
    """What the table keeps of a run read once: its result ranked without siblings and
    slim (series and histograms dropped, as a fleet's executor keeps it), and what the
    siblings' comparison needs of it. The rules that compare it with its siblings are added
    to the slim result afterwards (``pipeline.rank_siblings``), so no run is read twice."""

    slim: Loaded
    facts: _Facts | None


@st.cache_data(max_entries=100_000, show_spinner=False)
def _alone(path: str, digest: str) -> _Alone:
    from analyzer import pipeline

    loaded = _read(path, digest)
    result = loaded.result
    if result is None:
        return _Alone(loaded, None)
    _, _, unhealthy, env = pipeline.sibling_facts(result)
    ranked = _with_rules(loaded, lambda r: pipeline.rank(r, {}))
    assert ranked.result is not None
    return _Alone(Loaded(replace(ranked.result, run=ranked.result.run.slim()), ranked.error),
                  _Facts(unhealthy, env))


def _facts(path: str, digest: str) -> _Facts | None:
    return _alone(path, digest).facts


def siblings_of(ref: RunRef, refs: list[RunRef]) -> Siblings:
    """The healthy runs in the same parent folder as ``ref``, which the rules compare with."""
    return _siblings_by_run([ref], refs)[ref.path]


_SiblingFacts = list[tuple[str, str, bool, Mapping[str, Any] | None]]
_PARENTS: dict[str, tuple[str, _SiblingFacts]] = {}
"""Per parent folder: a digest of its runs (names, folders, fingerprints) and their facts."""
_PARENTS_LOCK = threading.Lock()


def _parent_facts(parent: str, members: list[RunRef]) -> _SiblingFacts:
    """The facts (healthy or not, env.json) of the runs of one parent folder, kept for the
    process under the digest of those runs: a page that loads n runs of one folder looks
    the n runs' facts up once, not once per run (each look-up copies a cached result)."""
    key = _digest([f"{r.name}\0{r.path}\0{r.digest}" for r in members])
    with _PARENTS_LOCK:
        held = _PARENTS.get(parent)
    if held is not None and held[0] == key:
        return held[1]
    facts: _SiblingFacts = []
    for r in members:
        known = _facts(r.path, r.digest)
        if known is not None:
            facts.append((r.path, r.name, known.unhealthy, known.env))
    with _PARENTS_LOCK:
        _PARENTS[parent] = (key, facts)
    return facts


def _siblings_by_run(wanted: list[RunRef], refs: list[RunRef]) -> dict[str, Siblings]:
    from analyzer.pipeline import healthy_siblings, same_folder

    by_name = {r.name: r for r in refs}
    members: dict[str, list[RunRef]] = {}
    for r in refs:
        members.setdefault(same_folder(r.path), []).append(r)
    out = {}
    for ref in wanted:
        parent = same_folder(ref.path)
        facts = _parent_facts(parent, members.get(parent, []))
        envs = healthy_siblings(ref.path, facts)
        key = _digest([f"{n}\0{by_name[n].digest}" for n in sorted(envs)])
        out[ref.path] = Siblings(key, envs)
    return out


@st.cache_data(max_entries=100_000, show_spinner=False)
def _status(path: str, digest: str) -> str:
    from app.health import health

    kept = _alone(path, digest).slim
    return health(kept.result, kept.error).status


def status_of(ref: RunRef, refs: list[RunRef]) -> str:
    """The run's health (failed, finite, damaged or unreadable: :func:`app.health.health`)
    as its read gives it, with neither its siblings nor its replay: what Compare's healthy
    defaults need, a short text cached per run (no copy of its analysis). ``refs`` is the
    runs below the root, for the same call as :func:`load_fast`'s."""
    del refs  # health is the run's own: its siblings change its findings, not its health
    return _status(ref.path, ref.digest)


def _with_rules(loaded: Loaded, rules: Callable[[RunResult], RunResult]) -> Loaded:
    """``loaded`` with ``rules`` applied to its result (a ranking); when they fail, the
    result as it was, with the reason: the rest of the analysis is still worth showing."""
    if loaded.result is None:
        return loaded
    try:
        return Loaded(rules(loaded.result))
    except Exception as exc:
        return Loaded(loaded.result, f"the rules failed: {type(exc).__name__}: {exc}")


def _ranked(loaded: Loaded, siblings: Siblings) -> Loaded:
    from analyzer import pipeline

    return _with_rules(loaded, lambda r: pipeline.rank(r, siblings.envs))


@st.cache_data(max_entries=48, show_spinner=False, hash_funcs=_BY_DIGEST)
def _full(path: str, digest: str, siblings: Siblings) -> Loaded:
    """The located run, its capture replayed, with the rules' ranked findings."""
    return _ranked(_located(path, digest), siblings)


@st.cache_data(max_entries=48, show_spinner=False, hash_funcs=_BY_DIGEST)
def _fast(path: str, digest: str, siblings: Siblings) -> Loaded:
    """The located run with the rules' ranked findings, without its replay."""
    return _ranked(_read(path, digest), siblings)


def load(ref: RunRef, refs: list[RunRef]) -> Loaded:
    """The full analysis of one run, cached by its files' and its siblings' fingerprints;
    waits for the replay of its capture when it is not done yet."""
    return _full(ref.path, ref.digest, siblings_of(ref, refs))


def load_fast(ref: RunRef, refs: list[RunRef]) -> Loaded:
    """The analysis of one run as far as it goes without waiting for a replay: the full one
    (:func:`load`) once its replay is done, else the run read, located and ranked without
    it, as ``forensics analyze --no-replay`` gives it. A page shows this first, asks for
    the replay with :func:`start_replay` and polls :func:`replay_state`."""
    if replay_state(ref) == "done":
        return load(ref, refs)
    return _fast(ref.path, ref.digest, siblings_of(ref, refs))


def replay_state(ref: RunRef) -> str:
    """Where the replay of ``ref``'s capture stands: ``"none"``, nothing to replay (no
    capture, or the run could not be read); ``"pending"``, not done yet (queued, running,
    or not asked for: :func:`start_replay` asks); ``"done"``, :func:`load` gives the
    replayed analysis without waiting."""
    capture = _capture(ref)
    if capture is None:
        return "none"
    return "done" if replays.done(capture, ref.digest) is not None else "pending"


def start_replay(ref: RunRef) -> str:
    """Queue the replay of ``ref``'s capture in the background (one replay at a time, for
    every session), unless it is done or queued already; its :func:`replay_state` then."""
    capture = _capture(ref)
    if capture is None:
        return "none"
    if replays.done(capture, ref.digest) is not None:
        return "done"
    replays.submit(capture, ref.digest, import_paths())
    return "pending"


def replay_all(refs: list[RunRef]) -> int:
    """Queue the replay of every run of ``refs`` with a capture and wait for them all; how
    many were not done before."""
    waiting = [r for r in refs if start_replay(r) == "pending"]
    for ref in waiting:
        capture = _capture(ref)
        if capture is not None:
            replays.wait(capture, ref.digest, import_paths())
    return len(waiting)


def _capture(ref: RunRef) -> str | None:
    result = _alone(ref.path, ref.digest).slim.result
    return None if result is None else capture_of(result)


@dataclass(frozen=True)
class _Brief:
    """What the tables of every run keep of one: its row, and its result slimmed (series
    and histograms dropped, as a fleet analysis keeps it) for the sweep summary."""

    row: RunRow
    slim: Loaded


@st.cache_data(max_entries=100_000, show_spinner=False, hash_funcs=_BY_DIGEST)
def _brief(path: str, name: str, digest: str, siblings: Siblings, replayed: bool) -> _Brief:
    """A run's row and slim result: with its replay when ``replayed`` (the replay is done),
    else ranked beside its siblings without it, from what :func:`_alone` kept (no read)."""
    from analyzer import pipeline

    if replayed:
        loaded = _full(path, digest, siblings)
        done = loaded.result
        kept = loaded if done is None else Loaded(replace(done, run=done.run.slim()),
                                                  loaded.error)
        return _Brief(run_row(name, kept.result, kept.error), kept)
    kept = _alone(path, digest).slim
    if kept.error is None and siblings.envs:
        kept = _with_rules(kept, lambda r: pipeline.rank_siblings(r, siblings.envs))
    return _Brief(_row(name, kept), kept)


NOT_REPLAYED = "not replayed yet: opening the run replays it"
"""The replay cell of a run with a capture whose replay is not done."""


def _row(name: str, kept: Loaded) -> RunRow:
    row = run_row(name, kept.result, kept.error)
    if kept.result is not None and capture_of(kept.result) is not None and row.replay is None:
        row = replace(row, replay=NOT_REPLAYED)
    return row


_TABLE_KEY = "_runs_table"
PARTIAL_EVERY_S = 0.5
"""How often a table being filled is shown again, at most."""


def runs_table(refs: list[RunRef],
               progress: Callable[[int, int], None] | None = None,
               partial: Callable[[pd.DataFrame, int], None] | None = None) -> pd.DataFrame:
    """One row per run, from small cached summaries, in the order the discovery lists them.

    ``progress`` is told (runs read, runs in all) after each run; ``partial`` is given the
    table being filled and how many runs it holds read: first every run named only (status
    :data:`NOT_READ`), then with the runs read so far (each ranked without its siblings
    yet) after the first and every :data:`PARTIAL_EVERY_S` at most, so that a page shows
    rows as they come. The last table a session built is kept with a digest of every run's
    fingerprint and of the replays done, so a rerun with unchanged files costs nothing;
    otherwise each run is a cache lookup, and only changed runs are analysed again.
    """
    key = _table_key(refs)
    held = st.session_state.get(_TABLE_KEY)
    if held is not None and held[0] == key:
        return held[1]
    rows: list[dict[str, object]] = []
    if partial is not None:
        partial(_filling(rows, refs), 0)
    shown = time.monotonic()
    for i, ref in enumerate(refs):  # the expensive part, once per run and fingerprint
        alone = _alone(ref.path, ref.digest)
        if progress is not None:
            progress(i + 1, len(refs))
        if partial is None:
            continue
        rows.append(_row(ref.name, alone.slim).as_dict())
        if i + 1 < len(refs) and (i == 0 or time.monotonic() - shown >= PARTIAL_EVERY_S):
            partial(_filling(rows, refs), i + 1)
            shown = time.monotonic()
    siblings = _siblings_by_run(refs, refs)
    done = _replayed(refs)
    table = pd.DataFrame([_brief(r.path, r.name, r.digest, siblings[r.path],
                                 r.path in done).row.as_dict() for r in refs],
                         columns=RunRow.columns())
    st.session_state[_TABLE_KEY] = (key, table)
    return table


NOT_READ = "not read yet"
"""The status cell of a run the table being filled has not read yet."""


def _filling(rows: list[dict[str, object]], refs: list[RunRef]) -> pd.DataFrame:
    """The rows of the runs read so far, then one per run still to read, named only."""
    waiting = [{"run": r.name, "status": NOT_READ} for r in refs[len(rows):]]
    return pd.DataFrame(rows + waiting, columns=RunRow.columns())


def _replayed(refs: list[RunRef]) -> set[str]:
    """The paths of the runs among ``refs`` whose replay is done."""
    return {r.path for r in refs if replay_state(r) == "done"}


def _table_key(refs: list[RunRef]) -> str:
    return _digest([f"{r.name}\0{r.path}\0{r.digest}" for r in refs]
                   + [f"replays {replays.finished}"])


@dataclass(frozen=True)
class Fleet:
    """The sweep summary of every run below the root, its frames, and the runs whose
    analysis failed, which the summary cannot hold (the Runs table says why): (name,
    reason)."""

    summary: SweepSummary
    frames: Mapping[str, pd.DataFrame]
    unanalysed: tuple[tuple[str, str], ...] = ()
    ties: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """A failed run's path: the codes of its top causes, where several tie (the summary's
    rows keep the first; its cause counts count each)."""


_FLEET_KEY = "_fleet"


def fleet(refs: list[RunRef],
          progress: Callable[[int, int], None] | None = None) -> Fleet:
    """The sweep summary of ``refs``, from the results the runs table analysed and keeps
    (no file is read again), each with its replay, as ``forensics analyze --summary`` makes
    it (a replay can settle which cause comes first); the last one a session built is kept
    as the table is."""
    from analyzer.fleet.summary import summarize
    from analyzer.frames import summary_frames
    from analyzer.model import top_tie

    runs_table(refs, progress)  # analyses what no cache holds yet
    replay_all(refs)
    key = _table_key(refs)
    held: tuple[str, Fleet] | None = st.session_state.get(_FLEET_KEY)
    if held is not None and held[0] == key:
        return held[1]
    siblings = _siblings_by_run(refs, refs)
    done = _replayed(refs)
    results = []
    unanalysed = []
    for ref in refs:
        kept = _brief(ref.path, ref.name, ref.digest, siblings[ref.path],
                      ref.path in done).slim
        if kept.result is None:
            unanalysed.append((ref.name, kept.error or "not analysed"))
        else:
            results.append(kept.result)
    ties = {r.run.path: codes for r in results if r.failed
            and len(codes := tuple(f.code for f in top_tie(r.findings) if f.role == "cause")) > 1}
    summary = summarize(results)
    out = Fleet(summary, summary_frames(summary), tuple(unanalysed), ties)
    st.session_state[_FLEET_KEY] = (key, out)
    return out


_MENTION_LIMIT = 64 << 20
"""Bytes of a log searched for a NaN or Inf by text when its reader recognised none."""


@st.cache_data(max_entries=256, show_spinner=False)
def first_mention(path: str, digest: str) -> int | None:
    """The first line that mentions NaN or Inf as a word, by a plain text search."""
    import re

    word = re.compile(r"(?<![\w.])[-+]?(nan|inf|infinity)(?![\w])", re.IGNORECASE)
    read = 0
    try:
        for number, text in text_lines(path):
            if word.search(text):
                return number
            read += len(text)
            if read > _MENTION_LIMIT:
                return None
    except OSError:
        return None
    return None


def _clip(text: str, keep: int = 1000) -> str:
    """Long lines (progress bars rewrite one line thousands of times) keep both ends."""
    return text if len(text) <= 2 * keep else f"{text[:keep]} [...] {text[-keep:]}"


@st.cache_data(max_entries=256, show_spinner=False)
def log_lines(path: str, first: int, last: int, digest: str) -> list[tuple[int, str]]:
    """Lines ``first``..``last`` (1-based, inclusive) of a text file, read lazily."""
    out: dict[int, str] = {}
    try:
        for number, text in text_lines(path):
            if number > last:
                break
            if number >= first:  # a long line's pieces keep both ends
                out[number] = _clip(out.get(number, "") + text.rstrip("\r\n"))
    except OSError:
        return []
    return list(out.items())


@st.cache_data(max_entries=48, show_spinner=False)
def tag_roles(path: str, digest: str, tags: tuple[str, ...]) -> TagRoles:
    """What each tag of a run measures, and the layer a per-layer tag names."""
    return views.tag_roles(tags)


@st.cache_data(max_entries=48, show_spinner=False, hash_funcs=_BY_DIGEST)
def growth_onset(path: str, digest: str, siblings: Siblings) -> Growth | None:
    """Where the gradient norm (else the loss) began its exponential run-up to the failure,
    read off the exploding-gradients finding."""
    result = _full(path, digest, siblings).result
    return None if result is None else views.growth_of(result)


@st.cache_data(show_spinner=False)
def rule_docs(code: str) -> str | None:
    """The documentation of a rule, as ``forensics explain`` prints it."""
    try:
        from analyzer.rules import explain
    except ImportError:
        return None
    return explain(code)


@st.cache_data(show_spinner=False)
def replay_devices() -> list[str]:
    """``cpu``, and ``cuda`` when this machine has a usable CUDA device."""
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def dtype_choices() -> tuple[str, ...]:
    from analyzer.replayer import DTYPE_CHOICES

    return DTYPE_CHOICES


def capture_of(result: RunResult) -> str | None:
    """The capture a replay reads: the run's earliest, as ``forensics analyze`` takes it."""
    return result.run.captures[0] if result.run.captures else None


class _Replays:
    """The replays the analysis makes (on the CPU, in the dtype the run used), one at a time
    on a background thread, kept for the process as the caches are (every session shares
    them) under the capture and the run's fingerprint, which holds the trust in force.

    A page that needs the replayed analysis no longer waits for it before its first paint:
    it shows the analysis without the replay, queues the replay (:func:`start_replay`) and
    polls :func:`replay_state`. One at a time: a replay is CPU-bound, and two would slow
    the pages being drawn meanwhile twice as much. The run asked for last is replayed
    first: it is the page being looked at. The thread is a daemon: stopping the server
    drops a replay under way (it writes nothing). A replay holds no tensors; the oldest
    are forgotten past :attr:`KEEP`.
    """

    KEEP = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[str, str], ReplayOutcome] = {}
        self._pending: dict[tuple[str, str], Future[ReplayOutcome]] = {}
        self._queue: deque[tuple[tuple[str, str], tuple[str, ...]]] = deque()
        self._wake = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self.finished = 0
        """Replays done so far: a table made before one more is made again."""

    def done(self, capture: str, digest: str) -> ReplayOutcome | None:
        with self._lock:
            return self._done.get((capture, digest))

    def submit(self, capture: str, digest: str,
               paths: tuple[str, ...]) -> Future[ReplayOutcome]:
        key = (capture, digest)
        with self._lock:
            if key in self._done:  # finished meanwhile: never replayed twice
                ready: Future[ReplayOutcome] = Future()
                ready.set_result(self._done[key])
                return ready
            queued = self._pending.get(key)
            if queued is not None:
                return queued
            future: Future[ReplayOutcome] = Future()
            self._pending[key] = future
            self._queue.appendleft((key, paths))
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="forensics-replay",
                                                daemon=True)
                self._worker.start()
            self._wake.notify()
            return future

    def wait(self, capture: str, digest: str, paths: tuple[str, ...]) -> ReplayOutcome:
        return self.done(capture, digest) or self.submit(capture, digest, paths).result()

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every replay queued so far is done (for tests and benchmarks)."""
        with self._lock:
            queued = list(self._pending.values())
        for future in queued:
            future.result(timeout=timeout)

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._wake.wait()
                key, paths = self._queue.popleft()
            self._run(key, paths)

    def _run(self, key: tuple[str, str], paths: tuple[str, ...]) -> ReplayOutcome:
        try:
            outcome = _replay_now(key[0], "cpu", "as-run", paths)
        except BaseException as exc:  # the worker and its waiters live on
            # attempt_replay reports what it foresees; a SystemExit from the capture's code,
            # say, would otherwise end this thread with every later replay still waiting.
            outcome = ReplayOutcome(None, f"the replay failed: {type(exc).__name__}: {exc}")
        with self._lock:
            self._done[key] = outcome
            future = self._pending.pop(key, None)
            self.finished += 1
            while len(self._done) > self.KEEP:
                del self._done[next(iter(self._done))]
        if future is not None:
            future.set_result(outcome)
        return outcome


replays = _Replays()


@st.cache_data(max_entries=32, show_spinner=False)
def replay(capture: str, digest: str, device: str, dtype: str,
           trust_code: bool = False) -> ReplayOutcome:
    """Replay a captured step in memory, kept under the run's fingerprint (which holds the
    trust in force). ``trust_code`` imports the capture's code wherever it is, for this
    replay only: the Replay page passes it once the user has said so."""
    return _replay_now(capture, device, dtype, import_paths(), trust_code)


def _replay_now(capture: str, device: str, dtype: str, paths: tuple[str, ...],
                trust_code: bool = False) -> ReplayOutcome:
    """Replay a capture now, timed: the one call of the replay behind the Replay page's
    button and the background replays the analysis makes."""
    from analyzer.pipeline import attempt_replay

    start = time.monotonic()
    result, error, refused = attempt_replay(capture, device=device, dtype=dtype,
                                            import_paths=paths, trust_code=trust_code)
    return ReplayOutcome(result, error, time.monotonic() - start, refused)


def format_replay(result: Any) -> str:
    from analyzer.report.replay import format_replay as fmt

    return fmt(result)
