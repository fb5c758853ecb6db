"""Sharded checkpoints: an index JSON naming, for every tensor, the shard file holding it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace

from analyzer.ingest.ckpt.records import CheckpointScan, ReadMode
from analyzer.ingest.ckpt.stats import aggregate_layers
from analyzer.ingest.ckpt.tree import step_from_name
from analyzer.model import IngestIssue, Location

MAX_INDEX_BYTES = 64 << 20


def _bad(path: str, size: int, message: str) -> CheckpointScan:
    issue = IngestIssue(Location(path, offset=0), "bad_checkpoint", message)
    return CheckpointScan(path, size, "sharded", "none", files=(path,), issues=(issue,))


def scan_sharded(path: str, scan_one: Callable[[str], CheckpointScan]) -> CheckpointScan:
    """Scan each shard the index names (only files beside the index) and merge them."""
    size = os.path.getsize(path)
    if size > MAX_INDEX_BYTES:
        return _bad(path, size, f"index of {size} bytes is too large for an index")
    try:
        with open(path, "rb") as handle:
            index = json.loads(handle.read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _bad(path, size, f"index is not valid JSON: {exc}")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return _bad(path, size, "index has no 'weight_map' of tensor name -> shard file")
    folder = os.path.dirname(path)
    issues: list[IngestIssue] = []
    scans: list[CheckpointScan] = []
    for shard in dict.fromkeys(weight_map.values()):
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            issues.append(
                IngestIssue(
                    Location(path),
                    "bad_checkpoint",
                    f"shard {shard!r} is not a file name beside the index",
                )
            )
            continue
        shard_path = os.path.join(folder, shard)
        if not os.path.isfile(shard_path):
            issues.append(
                IngestIssue(
                    Location(path),
                    "bad_checkpoint",
                    f"shard {shard!r} named by the index is missing",
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
                f"shards, e.g. {missing[0]!r}",
            )
        )
    modes = {s.read_mode for s in scans}
    mode: ReadMode = "none" if not scans else modes.pop() if len(modes) == 1 else "static"
    step = step_from_name(path)
    first = scans[0] if scans else None
    merged = CheckpointScan(
        path=path,
        size=size + sum(s.size for s in scans),
        format="sharded",
        read_mode=mode,
        step=step,
        step_source="file name" if step is not None else None,
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
