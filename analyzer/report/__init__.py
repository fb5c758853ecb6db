"""Presentation: records rendered for people and for machines. Nothing here reads a file
or computes a finding.

    text          a Report as the terminal text of ``forensics analyze``
    json          a Report as the versioned JSON document
    checkpoints   a checkpoint scan or history as the text of ``forensics inspect``
    replay        a replay result as the text of ``forensics replay``, and its one line
    summary       a SweepSummary as the text of ``forensics analyze --summary``

Inside the package, modules import the module that defines a name, never this one.
"""

from __future__ import annotations

from analyzer.report.checkpoints import format_history, format_scan
from analyzer.report.json import to_dict, to_json
from analyzer.report.replay import brief_replay, format_replay
from analyzer.report.text import format_text

__all__ = [
    "brief_replay",
    "format_history",
    "format_replay",
    "format_scan",
    "format_text",
    "to_dict",
    "to_json",
]
