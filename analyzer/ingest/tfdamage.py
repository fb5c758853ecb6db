"""What the issues of a damaged stretch of an event file say.

:mod:`analyzer.ingest.tfrecord` decides where a stretch begins and ends, and which kind it
is; the words are here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analyzer.ingest.tfwalk import HEADER
from analyzer.model import IssueKind

DamageKind = IssueKind | Literal["unchecked"]
"""A read issue's kind, or ``unchecked``: a stretch that begins at a record the check
budget could not afford to check, summed up in one ``read_limit`` issue per file."""


@dataclass
class Damage:
    """A stretch of the file where no record could be trusted, still being scanned."""

    start: int
    kind: DamageKind
    length: int | None  # the length its header claims, when the header checks
    counted: int  # file offset up to which its bytes were looked at for zeros
    last_nonzero: int  # file offset of the last nonzero byte looked at (< start: none)
    passed: int  # the budget's count of unchecked records when it began


def what(damage: Damage, resumed: bool) -> str:
    """What went wrong at the start of a damaged stretch; ``resumed``: a valid record
    follows it."""
    if damage.kind == "bad_payload_crc":
        return "record payload CRC mismatch, so its length is not trusted either"
    if damage.kind == "absurd_length":
        return f"record claims {damage.length} bytes, more than any event record holds"
    if damage.kind == "truncated" and resumed:
        return (f"record cut off: its header claims {damage.length} payload bytes, but a "
                "valid record starts before their end (a writer stopped mid-record and "
                "another wrote after it)")
    if damage.kind == "truncated":
        return f"record cut off: its header claims {damage.length} payload bytes"
    return "record header CRC mismatch"


def at_end(damage: Damage, skipped: int) -> str:
    """The message for damage that runs to the end of the file."""
    n = damage.length
    if damage.kind == "truncated" and n is None:
        return (f"file ends inside a record header ({skipped} of {HEADER} bytes); "
                "everything before it was read")
    if damage.kind == "truncated" and n is not None:
        present = skipped - HEADER
        if present > n:
            return (f"last record cut off in its CRC: all {n} payload bytes and {present - n} "
                    "of 4 CRC bytes present; everything before it was read")
        return (f"last record cut off: {max(present, 0)} of {n} payload bytes present; "
                "everything before it was read")
    return f"{what(damage, False)}; no valid record after it, last {skipped} bytes skipped"
