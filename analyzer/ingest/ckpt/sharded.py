"""Sharded checkpoints: an index JSON naming, for every tensor, the shard file holding it.

Policy (``bad_checkpoint``): only plain file names beside the index are followed, each
once; a name that is itself an index (the index's own name, or another index, which could
lead round in a cycle) is reported once and not followed; missing shards and tensors the
shards lack are reported. An index above ``MAX_INDEX_BYTES`` is refused (``too_large``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace

from analyzer.ingest import storage
from analyzer.ingest.ckpt.quoting import foreign, quote
from analyzer.ingest.ckpt.stats import aggregate_layers
from analyzer.ingest.ckpt.tree import step_from_name
from analyzer.ingest.safeio import open_regular
from analyzer.model import IngestIssue, IssueKind, Location
from analyzer.model.checkpoints import CheckpointScan, ReadMode

MAX_INDEX_BYTES = 64 << 20
INDEX_SUFFIX = ".index.json"


def is_index(path: str) -> bool:
    """True for the name of a sharded checkpoint's index."""
    return path.lower().endswith(INDEX_SUFFIX)


def _bad(path: str, size: int, message: str, kind: IssueKind = "bad_checkpoint") -> CheckpointScan:
    issue = IngestIssue(Location(path, offset=0), kind, message)
    return CheckpointScan(path, size, "sharded", "none", files=(path,), issues=(issue,))


def read_weight_map(path: str) -> tuple[dict[str, str] | None, str | None]:
    """The index's tensor name -> shard file map, or None and why not. OSError (and
    NotRegularFile) when the file cannot be opened."""
    weight_map, problem, _ = read_index(path)
    return weight_map, problem


def read_index(path: str) -> tuple[dict[str, str] | None, str | None, int]:
    """:func:`read_weight_map`, and the index's size, from one opening of the file."""
    handle, size = open_regular(path)
    with handle:
        if size > MAX_INDEX_BYTES:
            limit = f"{MAX_INDEX_BYTES:,}-byte limit"
            return None, f"index of {size:,} bytes is above the {limit}", size
        raw = handle.read(size)
    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = foreign(str(exc), 200) or type(exc).__name__
        return None, f"index is not valid JSON: {reason}", size
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return None, "index has no 'weight_map' of tensor name -> shard file", size
    return weight_map, None, size


def scan_sharded(path: str, scan_one: Callable[[str], CheckpointScan]) -> CheckpointScan:
    """Scan each shard the index names (only files beside the index) and merge them."""
    weight_map, problem, size = read_index(path)
    if weight_map is None:
        kind: IssueKind = "too_large" if size > MAX_INDEX_BYTES else "bad_checkpoint"
        return _bad(path, size, problem or "index not read", kind)
    folder = os.path.dirname(path)
    issues: list[IngestIssue] = []
    scans: list[CheckpointScan] = []
    for shard in dict.fromkeys(weight_map.values()):
        if is_index(shard):
            itself = os.path.basename(path) == shard
            what = "itself" if itself else f"another index, {quote(shard)},"
            issues.append(
                IngestIssue(
                    Location(path),
                    "bad_checkpoint",
                    f"the index names {what} as a shard: not followed (an index holds no "
                    "tensors, and following one could go round in a cycle)",
                )
            )
            continue
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            issues.append(
                IngestIssue(
                    Location(path),
                    "bad_checkpoint",
                    f"shard {quote(shard)} is not a file name beside the index",
                )
            )
            continue
        shard_path = os.path.join(folder, shard)
        if not (storage.exists(shard_path) if storage.is_url(shard_path)
                else os.path.lexists(shard_path)):
            issues.append(
                IngestIssue(
                    Location(path),
                    "bad_checkpoint",
                    f"shard {quote(shard)} named by the index is missing",
                )
            )
            continue
        scans.append(scan_one(shard_path))
    tensors = tuple(t for s in scans for t in s.tensors)
    found = {t.name for t in tensors}
    missing = [name for name in weight_map if name not in found]
    if missing and scans:
        issues.append(
            IngestIssue(
                Location(path),
                "bad_checkpoint",
                f"{len(missing)} tensors of the index not found in their "
                f"shards, e.g. {quote(missing[0])}",
            )
        )
    modes = {s.read_mode for s in scans}
    mode: ReadMode = "none" if not scans else modes.pop() if len(modes) == 1 else "static"
    step, source = step_from_name(path)
    first = scans[0] if scans else None
    merged = CheckpointScan(
        path=path,
        size=size + sum(s.size for s in scans),
        format="sharded",
        read_mode=mode,
        step=step,
        step_source=source,
        tensors=tensors,
        layers=aggregate_layers(tensors),
        adam=tuple(a for s in scans for a in s.adam),
        scaler=next((s.scaler for s in scans if s.scaler is not None), None),
        static=first.static if first and first.read_mode == "static" else None,
        files=(path, *(f for s in scans for f in s.files)),
        issues=tuple(issues) + tuple(i for s in scans for i in s.issues),
    )
    return (
        merged
        if first is None or step is not None
        else replace(merged, step=first.step, step_source=first.step_source)
    )
