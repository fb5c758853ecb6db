"""Analysing a folder in a test and checking that nothing was written into it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from analyzer.model import RunResult


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every entry below ``folder`` by relative path: a file's size and SHA-256; a folder,
    FIFO or other non-file by name only (``(-1, "")``: never opened)."""
    out: dict[str, tuple[int, str]] = {}
    for p in sorted(folder.rglob("*")):
        name = str(p.relative_to(folder))
        if p.is_file():
            with open(p, "rb") as fh:  # hashed as read: a gigabyte is never held whole
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            out[name] = (p.stat().st_size, digest)
        else:
            out[name] = (-1, "")
    return out


def analyse_read_only(folder: Path, **options: Any) -> RunResult:
    """The one run ``analyzer.analyze`` finds in ``folder`` (no replay unless asked),
    checking that the folder is byte for byte as it was."""
    import analyzer

    before = snapshot(folder)
    result = analyzer.analyze(str(folder), **{"replay": False, **options}).results[0]
    assert snapshot(folder) == before  # nothing written into the analysed folder
    return result


def analyse_replayed(folder: Path) -> RunResult:
    """``forensics analyze FOLDER`` as the API runs it with no option: the one run, whose
    capture must have been replayed; nothing is written."""
    import analyzer

    before = snapshot(folder)
    (result,) = analyzer.analyze(str(folder)).results  # one training, one run
    assert snapshot(folder) == before
    assert result.replay is not None, result.replay_error or result.replay_refused
    return result


def layer_and_op(result: RunResult) -> tuple[str | None, tuple[str, ...]]:
    """The layer and the op names the replay found."""
    replay = result.replay
    assert replay is not None and replay.op is not None, replay
    return replay.layer, tuple(replay.op.names)
