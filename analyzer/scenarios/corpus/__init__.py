"""The evaluation corpus: dead runs (and healthy controls) that leave no capture.

``python -m analyzer.scenarios.corpus OUT_DIR [--only NAME ...]`` trains every case of
:data:`CASES` on the CPU into ``OUT_DIR/<name>``: event files (as much as the case's
profile logs), a text log in one framework's style, checkpoints at the case's interval,
sometimes ``env.json``, and ``case.json`` (the intended cause and the half, for the
scoring; ``forensics`` does not read it). ``bench/evaluate.py`` scores the analysis on
it; docs/evaluation.md describes both. The cases of :mod:`fresh` (batch ``fresh``) were
written after the rules were tuned, and are all held out.
"""

from __future__ import annotations

from analyzer.scenarios.corpus import failing, fresh, healthy
from analyzer.scenarios.corpus.cases import BATCHES, FAMILIES, HALVES, HEALTHY, Case, split

CASES: tuple[Case, ...] = (*failing.CASES, *healthy.CASES, *fresh.CASES)
SPLIT: dict[str, str] = split(CASES)

__all__ = ["BATCHES", "CASES", "FAMILIES", "HALVES", "HEALTHY", "SPLIT", "Case", "split"]
