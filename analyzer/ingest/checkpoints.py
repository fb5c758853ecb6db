"""Checkpoint forensics: which tensors and layers of a checkpoint are non-finite or
running away, read safely and tensor by tensor.

Nothing here runs code from a checkpoint unless the caller passes ``trust_pickle=True``.
``torch`` is imported only when a checkpoint is actually scanned.

    is_checkpoint_file(path)               a file name a checkpoint would have
    scan_checkpoint(path)                  one file (or a sharded index) -> CheckpointScan
    scan_run_checkpoints(paths)            a run's saves in step order -> CheckpointHistory
    checkpoint_incident(history)           the first non-finite save as a model.Incident
    scan.to_dict() / history.to_dict()     JSON-ready values (the records are analyzer.model's)
"""

from __future__ import annotations

import os
from collections.abc import Callable

from analyzer.ingest import storage
from analyzer.ingest.ckpt.history import build_history, checkpoint_incident
from analyzer.ingest.ckpt.quoting import foreign
from analyzer.ingest.metadata import is_metadata_file
from analyzer.ingest.safeio import NotRegularFile, is_regular
from analyzer.model import CheckpointHistory, CheckpointScan, IngestIssue, IssueKind, Location

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "checkpoint_incident",
    "is_checkpoint_file",
    "scan_checkpoint",
    "scan_run_checkpoints",
]

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")


def is_checkpoint_file(path: str) -> bool:
    """True for names checkpoints carry, including sharded indexes such as
    ``model.safetensors.index.json`` and ``pytorch_model.bin.index.json``."""
    name = os.path.basename(path).lower()
    if is_metadata_file(name):  # saved beside the weights, read as run metadata
        return False
    if name.endswith((".safetensors.index.json", ".bin.index.json", ".pt.index.json")):
        return True
    return name.endswith(CHECKPOINT_SUFFIXES)


def scan_checkpoint(path: str, *, trust_pickle: bool = False) -> CheckpointScan:
    """Scan one checkpoint. Never raises for bad input: problems are ``scan.issues``.

    ``trust_pickle=True`` lets a pickle that needs globals outside the ``weights_only``
    allow-list run; it is never turned on automatically.
    """
    from analyzer.ingest.ckpt.sharded import is_index, scan_sharded

    if storage.isdir(path):
        return _failed(path, "a folder, not a checkpoint file")
    if is_index(path):  # each shard has its guard, the index its own
        return _guarded(path, lambda: scan_sharded(path, lambda s: _scan_one(s, trust_pickle)))
    return _scan_one(path, trust_pickle)


def _scan_one(path: str, trust_pickle: bool) -> CheckpointScan:
    """One checkpoint file (never an index)."""
    from analyzer.ingest.ckpt.pinning import single_threaded
    from analyzer.ingest.ckpt.scan import scan_file

    def scan() -> CheckpointScan:
        with single_threaded():
            return scan_file(path, trust_pickle=trust_pickle)

    return _guarded(path, scan)


def _guarded(path: str, scan: Callable[[], CheckpointScan]) -> CheckpointScan:
    """The last guard: whatever a damaged file makes a reader raise becomes an issue."""
    try:
        return scan()
    except NotRegularFile as exc:
        return _failed(path, str(exc), "not_regular")
    except OSError as exc:
        return _failed(path, exc.strerror or str(exc))
    except Exception as exc:  # a damaged file must not stop the analysis
        return _failed(path, f"{type(exc).__name__}: {foreign(str(exc))}")


def _failed(path: str, reason: str, kind: IssueKind = "unreadable") -> CheckpointScan:
    try:
        size = storage.size(path) if is_regular(path) else 0
    except OSError:
        size = 0
    issue = IngestIssue(Location(path), kind, reason)
    return CheckpointScan(path, size, "unknown", "none", files=(path,), issues=(issue,))


def scan_run_checkpoints(paths: list[str], *, trust_pickle: bool = False) -> CheckpointHistory:
    """Scan a run's checkpoints and order them by step (file name order when a save has
    no step). Shards named by an index in ``paths`` are read through that index."""
    return build_history(paths, lambda p: scan_checkpoint(p, trust_pickle=trust_pickle))
