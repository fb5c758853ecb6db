"""The zip container of ``torch.save`` files, checked before anything reads it.

Only the central directory and the 30-byte local headers are read here. An archive is
refused when its entries overlap, reach past the end of the file, or claim to unpack to
far more bytes than they hold (``torch.save`` stores entries uncompressed, so any such
claim is foreign to a checkpoint). A file cut off mid-save has no central directory: its
local headers are walked instead, to say how far the save got and to recover the
entries that were written whole (``truncated``). A central directory that points where
there is no local header (outside the file, say) is reported (``bad_checkpoint``) and
the local headers are walked the same way; entries found so are read statically, never
by ``torch.load``, whose reader would follow the bad directory.
"""

from __future__ import annotations

import itertools
import struct
import zipfile
from dataclasses import dataclass

from analyzer.ingest.ckpt.quoting import foreign, quote
from analyzer.ingest.ckpt.ranges import FileRanges
from analyzer.model import IngestIssue, Location

LOCAL_MAGIC = b"PK\x03\x04"
DESCRIPTOR_MAGIC = b"PK\x07\x08"
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
MAX_RATIO = 100
"""Declared size over stored size beyond which an entry is treated as a bomb."""
MAX_SLACK = 64 << 20


@dataclass(frozen=True)
class Entry:
    """One archive member: where its bytes start in the file and how many there are."""

    name: str
    header_offset: int
    data_offset: int
    stored_size: int
    declared_size: int
    compressed: bool
    crc: int | None = None
    """The CRC-32 the central directory gives (None for entries found by the local walk)."""


@dataclass(frozen=True)
class Archive:
    """The checked layout of a torch zip archive.

    ``complete`` is False when the entries come from walking the local headers (a file
    cut off mid-save, or a central directory that cannot be followed); they are then
    those written whole. ``truncated`` says the walk ended inside the file's last entry
    or right after a whole one, with no directory: the save was cut off. ``refused``
    means nothing in the archive may be read.
    """

    entries: dict[str, Entry]
    prefix: str
    complete: bool
    refused: bool
    issues: tuple[IngestIssue, ...]
    truncated: bool = False
    alignment: int | None = None
    """What ``.storage_alignment`` says torch aligned every storage record's bytes to."""
    misplaced: frozenset[str] = frozenset()
    """Members whose bytes, where their local header puts them, are not followed by the
    next zip structure (or the end of the file): a header altered to move them."""

    @property
    def is_torchscript(self) -> bool:
        return any(
            name == f"{self.prefix}/constants.pkl" or name.startswith(f"{self.prefix}/code/")
            for name in self.entries
        )

    def member(self, leaf: str) -> Entry | None:
        return self.entries.get(f"{self.prefix}/{leaf}")


@dataclass(frozen=True)
class _Local:
    data_offset: int
    flags: int
    method: int
    stored_size: int
    declared_size: int
    name: str


def _read_local(ranges: FileRanges, offset: int) -> _Local | None:
    """The local header at ``offset``, or None where there is none."""
    raw = ranges.read(offset, _LOCAL.size)
    if len(raw) < _LOCAL.size:
        return None
    magic, _, flags, method, _, _, _, csize, usize, nlen, xlen = _LOCAL.unpack(raw)
    if magic != LOCAL_MAGIC:
        return None
    name = ranges.read(offset + _LOCAL.size, nlen).decode("utf-8", "replace")
    return _Local(offset + _LOCAL.size + nlen + xlen, flags, method, csize, usize, name)


def _prefix(names: list[str]) -> str:
    for name in names:
        if name.endswith("/data.pkl") or name.endswith("/constants.pkl"):
            return name.rsplit("/", 1)[0]
    return names[0].split("/", 1)[0] if names else ""


def read_archive(ranges: FileRanges) -> Archive:
    """Check the archive and map its members; never raises for bad content."""
    path, size = ranges.path, ranges.size
    try:
        with zipfile.ZipFile(ranges.stream()) as archive:
            infos = archive.infolist()
    except NotImplementedError as exc:
        message = f"zip archive: {foreign(str(exc))}"
        issue = IngestIssue(Location(path, offset=0), "bad_checkpoint", message)
        return Archive({}, "", True, True, (issue,))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error):
        return _walk_locals(ranges)
    entries: dict[str, Entry] = {}
    for info in infos:
        inside = 0 <= info.header_offset < size
        local = _read_local(ranges, info.header_offset) if inside else None
        if local is None or local.name != info.filename:
            # A local header naming another file puts the entry's bytes somewhere else
            # than the directory says: neither can be trusted to say where they are.
            where = ("outside the file" if not inside else "where there is none"
                     if local is None else f"naming {quote(local.name)} instead")
            bad = IngestIssue(
                Location(path, offset=info.header_offset),
                "bad_checkpoint",
                f"zip central directory: entry {quote(info.filename)} points to a local header "
                f"{where} (offset {info.header_offset}); the entries were found from their "
                "local headers instead and read without torch.load",
            )
            return _walk_locals(ranges, directory=bad)
        entries[info.filename] = Entry(
            info.filename,
            info.header_offset,
            local.data_offset,
            info.compress_size,
            info.file_size,
            info.compress_type != zipfile.ZIP_STORED,
            info.CRC,
        )
    problem = _layout_problem(list(entries.values()), size)
    if problem is not None:
        offset, message = problem
        issue = IngestIssue(Location(path, offset=offset), "bad_checkpoint", message)
        return Archive(entries, _prefix(list(entries)), True, True, (issue,))
    prefix = _prefix(list(entries))
    return Archive(entries, prefix, True, False, (), alignment=_alignment(ranges, entries, prefix),
                   misplaced=_misplaced(ranges, entries))


def _misplaced(ranges: FileRanges, entries: dict[str, Entry]) -> frozenset[str]:
    # Writers put each entry's bytes right before the next local header, its data
    # descriptor or the central directory, all of which start with "PK".
    found = set()
    for entry in entries.values():
        end = entry.data_offset + entry.stored_size
        after = ranges.read(end, 2)
        if after != b"PK" and not (len(after) < 2 and b"PK".startswith(after)):
            found.add(entry.name)
    return frozenset(found)


def _alignment(ranges: FileRanges, entries: dict[str, Entry], prefix: str) -> int | None:
    entry = entries.get(f"{prefix}/.storage_alignment")
    if entry is None or entry.compressed or not 0 < entry.stored_size <= 8:
        return None
    text = ranges.read(entry.data_offset, entry.stored_size).decode("ascii", "replace")
    value = int(text) if text.isdigit() else 0
    return value if 0 < value <= 1 << 20 and value & (value - 1) == 0 else None


def _layout_problem(entries: list[Entry], size: int) -> tuple[int, str] | None:
    declared = 0
    for entry in entries:
        declared += entry.declared_size
        if entry.data_offset + entry.stored_size > size:
            return entry.header_offset, (
                f"zip entry {quote(entry.name)} claims {entry.stored_size} bytes from offset "
                f"{entry.data_offset}, past the end of the {size}-byte file; archive refused"
            )
        stored = max(entry.stored_size, 1)
        inflated = entry.declared_size > entry.stored_size
        if inflated and (not entry.compressed or entry.declared_size > MAX_RATIO * stored):
            return entry.header_offset, (
                f"zip entry {quote(entry.name)} claims {entry.declared_size} bytes but holds "
                f"{entry.stored_size}: refused before extraction (zip bomb?)"
            )
    if declared > max(4 * size, size + MAX_SLACK):
        return 0, (
            f"zip entries claim {declared} bytes in all from a {size}-byte file: refused "
            "before extraction (zip bomb?)"
        )
    ordered = sorted(entries, key=lambda e: e.header_offset)
    for before, after in itertools.pairwise(ordered):
        if before.data_offset + before.stored_size > after.header_offset:
            return after.header_offset, (
                f"zip entries {quote(before.name)} and {quote(after.name)} overlap; archive refused"
            )
    return None


def _find_descriptor(ranges: FileRanges, data_offset: int) -> tuple[int, int] | None:
    """(stored size, offset after the descriptor) of an entry written with a data
    descriptor, found by looking for a descriptor whose size field matches its position."""
    window = 1 << 20
    position = data_offset
    while position < ranges.size:
        block = ranges.read(position, window + 24)
        at = block.find(DESCRIPTOR_MAGIC)
        while at != -1 and at < window:
            stored = position + at - data_offset
            small = block[at + 8 : at + 12]
            large = block[at + 8 : at + 16]
            if len(small) == 4 and int.from_bytes(small, "little") == stored:
                return stored, position + at + 16
            if len(large) == 8 and int.from_bytes(large, "little") == stored:
                return stored, position + at + 24
            at = block.find(DESCRIPTOR_MAGIC, at + 1)
        position += window
    return None


def _walk_locals(ranges: FileRanges, directory: IngestIssue | None = None) -> Archive:
    """Follow the local headers from the start of the file. ``directory`` is the issue
    of a central directory that could not be followed; without one, there is none (the
    file was cut off mid-save)."""
    path, size = ranges.path, ranges.size
    entries: dict[str, Entry] = {}
    offset = 0
    cut_in: str | None = None
    while offset < size:
        local = _read_local(ranges, offset)
        if local is None:
            break
        stored, after = local.stored_size, local.data_offset + local.stored_size
        if local.flags & 0x08:
            found = _find_descriptor(ranges, local.data_offset)
            if found is None:
                cut_in = local.name
                break
            stored, after = found
        if local.data_offset + stored > size:
            cut_in = local.name
            break
        entries[local.name] = Entry(
            local.name, offset, local.data_offset, stored, stored, local.method != 0
        )
        offset = after
    names = list(entries)
    problem = _layout_problem(list(entries.values()), size)
    if problem is not None:  # local headers can claim bombs and overlaps too
        issue = IngestIssue(Location(path, offset=problem[0]), "bad_checkpoint", problem[1])
        issues = (directory, issue) if directory is not None else (issue,)
        return Archive(entries, _prefix(names), False, True, issues)
    aligned = _alignment(ranges, entries, _prefix(names))
    moved = _misplaced(ranges, entries)
    if directory is not None:
        if cut_in is not None:
            message = (f"the local headers describe entry {quote(cut_in)} at offset {offset} "
                       f"no further; the {len(entries)} entries before it were read")
            stop = IngestIssue(Location(path, offset=offset), "bad_checkpoint", message)
            return Archive(entries, _prefix(names), False, False, (directory, stop),
                           alignment=aligned, misplaced=moved)
        return Archive(entries, _prefix(names), False, False, (directory,), alignment=aligned,
                       misplaced=moved)
    where = f"inside entry {quote(cut_in)}" if cut_in else "after the last whole entry"
    message = (
        f"incomplete checkpoint: no zip central directory (file cut off mid-save, {size} "
        f"bytes); it ends {where}, {len(entries)} entries were written whole"
    )
    if not entries and cut_in is None:
        message = "not a readable zip archive: no central directory and no local headers"
    issue = IngestIssue(Location(path, offset=offset), "truncated", message)
    return Archive(entries, _prefix(names), False, False, (issue,), True, aligned, moved)
