"""Where something is in a file, and the damage met while reading it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from analyzer.model.jsonform import encode


@dataclass(frozen=True)
class Location:
    """A place in a file: a byte offset for binary files, a 1-based line for text."""

    file: str
    offset: int | None = None
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The one JSON shape of a location, wherever a report holds one."""
        return encode(self)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.offset is not None:
            return f"{self.file}@{self.offset}"
        return self.file


IssueKind = Literal[
    "empty_file",
    "not_event_file",
    "truncated",
    "zero_tail",
    "zero_run",
    "bad_length_crc",
    "bad_payload_crc",
    "absurd_length",
    "not_an_event",
    "unreadable",
    "bad_line",
    "long_line",
    "not_text",
    "bad_json",
    "bad_step",
    "unsafe_checkpoint",
    "bad_checkpoint",
    "not_regular",
    "read_limit",
    "too_large",
    "bad_record",
    "not_followed",
    "too_deep",
]
"""Each kind has one written policy, in the docstring of the module that reports it.
``not_regular`` (a FIFO, device or socket: refused before opening), ``read_limit`` (a read
stopped at its byte or time budget; what came before is kept), ``too_large`` (refused by a
size limit before anything was allocated), ``bad_record`` (a record framed intact whose
contents are malformed: skipped), ``not_followed`` (a symlinked folder, not walked) and
``too_deep`` (a folder below the walk's depth limit, not walked) are shared by readers."""


@dataclass(frozen=True)
class IngestIssue:
    """Damage met while reading. Reading goes on; the issue says what was lost."""

    location: Location
    kind: IssueKind
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The one JSON shape of a read issue, wherever a report holds one."""
        return encode(self)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return f"{self.location}: {self.kind}: {self.message}"
