"""Analysing a folder in a test and checking that nothing was written into it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from analyzer.model import RunResult


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file below ``folder``: its size and SHA-256, by relative path."""
    return {str(p.relative_to(folder)): (p.stat().st_size,
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def analyse_read_only(folder: Path, **options: Any) -> RunResult:
    """The one run ``analyzer.analyze`` finds in ``folder`` (no replay unless asked),
    checking that the folder is byte for byte as it was."""
    import analyzer

    before = snapshot(folder)
    result = analyzer.analyze(str(folder), **{"replay": False, **options}).results[0]
    assert snapshot(folder) == before  # nothing written into the analysed folder
    return result
