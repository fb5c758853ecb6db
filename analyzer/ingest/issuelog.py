"""A file's read issues, bounded: a hostile file cannot fill memory with them.

Past :data:`MAX_LISTED` issues of one kind in one file, the rest are counted, and one more
issue of that kind says how many there were and between which offsets.
"""

from __future__ import annotations

from analyzer.model import IngestIssue, IssueKind, Location

MAX_LISTED = 100
"""Issues of one kind listed one by one per file; the rest are counted in one more."""


class IssueLog:
    """A file's issues, listing at most :data:`MAX_LISTED` of each kind."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._listed: list[IngestIssue] = []
        self._counts: dict[IssueKind, int] = {}
        self._more: dict[IssueKind, list[int]] = {}  # kind -> [count, first offset, last offset]

    def add(self, offset: int | None, kind: IssueKind, message: str) -> None:
        count = self._counts[kind] = self._counts.get(kind, 0) + 1
        if count <= MAX_LISTED:
            self._listed.append(IngestIssue(Location(self.path, offset=offset), kind, message))
            return
        more = self._more.setdefault(kind, [0, offset or 0, offset or 0])
        more[0] += 1
        more[2] = offset or 0

    def kinds(self) -> set[IssueKind]:
        return set(self._counts)

    def drop(self, kinds: set[IssueKind]) -> None:
        self._listed = [i for i in self._listed if i.kind not in kinds]
        for kind in kinds:
            self._counts.pop(kind, None)
            self._more.pop(kind, None)

    def issues(self) -> list[IngestIssue]:
        out = sorted(self._listed, key=lambda i: i.location.offset or 0)
        for kind, (count, first, last) in self._more.items():
            out.append(IngestIssue(Location(self.path, offset=first), kind,
                                   f"{count} more issues of this kind between offsets {first} "
                                   f"and {last}, not listed one by one"))
        return out
