"""Reading one checkpoint file: choose the reader by content, never by name or trust.

Policy, one line per case (the issue kind in brackets):

* the file is opened once through safeio: a FIFO, device or socket is refused by its type
  before opening [``not_regular``]; nothing reads past the size it had then.
* what it holds is told by its first bytes: a zip archive, a safetensors header or a
  pickle. A name that says otherwise (a torch zip named ``.safetensors``) is reported and
  the content wins [``bad_checkpoint``]. Text, or bytes none of these start with, is not a
  checkpoint [``bad_checkpoint``, read mode ``none``]: the message says what it holds and
  its size, never quoting it (:mod:`sniff`, :mod:`quoting`).
* torch zip archive: layout checked first (:mod:`archive`), then the pickle is read
  statically and every tensor's extent checked against its record (:mod:`extents`). A
  refused archive, or one with a tensor that does not fit, is not handed to torch.
* complete archive: ``torch.load(weights_only=True, map_location="meta")``, given a stream
  over the open handle, decides whether the pickle is acceptable without reading a value;
  for what ``torch.save`` writes of a state dict its answer is known beforehand and torch
  is not run (:mod:`wopredict`), with the same result.
  When its reading and the static one put the same tensors (name, shape, dtype, record,
  offset, strides) in the same places, the static tree is scanned; when they differ,
  torch's tree is, its extents checked against torch's own storages (:mod:`metaleaves`).
  Either way the values are read from the records with ordinary reads, never through a
  memory map, so a file shrinking meanwhile gives short reads, not a fault.
* big-endian archive (``byteorder`` says ``big``): read statically and its values
  byte-swapped as read; not given to torch, whose meta-device load crashes on one. A
  ``byteorder`` naming neither order [``bad_checkpoint``]: tensors listed, values not read.
* weights_only refuses the pickle [``unsafe_checkpoint``]: the message says why (the
  globals it wants, or the pickle feature the weights_only unpickler lacks) and the pickle
  is read statically. Nothing ever retries with ``weights_only=False``; only
  ``trust_pickle=True`` (the user's explicit choice) does that, on the meta device as
  above: the pickle runs, the values are still read and checked here.
* archive cut off mid-save [``truncated``]: what was written whole is read statically.
* TorchScript archive [``unsafe_checkpoint``]: holds code; read statically, never loaded.
* bare pickle (legacy ``torch.save`` or ``pickle.dump``): ``weights_only`` load when small
  enough to hold in memory, else a static read [``too_large``]. One from which no tensor
  can be read is not a checkpoint [``bad_checkpoint``, read mode ``none``].
* safetensors: header validated (:mod:`safetensors_file`), then tensors read one at a time.
"""

from __future__ import annotations

import pickle
import pickletools
import re
import warnings
from dataclasses import replace
from typing import Any

from analyzer.ingest.ckpt import extents
from analyzer.ingest.ckpt.archive import Archive, read_archive
from analyzer.ingest.ckpt.build import Draft, assemble
from analyzer.ingest.ckpt.leaves import ByteOrder, Leaf, StaticLeaves, TorchLeaves
from analyzer.ingest.ckpt.metaleaves import MetaLeaves, readings_agree
from analyzer.ingest.ckpt.pinning import torch_pinned
from analyzer.ingest.ckpt.quoting import foreign, quote
from analyzer.ingest.ckpt.ranges import FileRanges
from analyzer.ingest.ckpt.safetensors_file import leaf_of, read_header
from analyzer.ingest.ckpt.sniff import content_of, is_text, mismatch, not_a_checkpoint, recognised
from analyzer.ingest.ckpt.staticpickle import StaticResult, read_pickle
from analyzer.ingest.ckpt.tree import walk
from analyzer.ingest.ckpt.wopredict import agrees_without_torch
from analyzer.model import IngestIssue, IssueKind, Location
from analyzer.model.checkpoints import CheckpointScan, StaticListing

MAX_PICKLE_BYTES = 256 << 20
"""Largest pickle read into memory (a bare pickle, or data.pkl of an archive)."""

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _issue(path: str, kind: IssueKind, message: str, offset: int | None = None) -> IngestIssue:
    return IngestIssue(Location(path, offset=offset), kind, message)


def _allowed_globals() -> set[str]:
    torch_pinned()
    import torch.serialization

    allowed: set[str] = set()
    try:
        from torch import _weights_only_unpickler

        allowed.update(_weights_only_unpickler._get_allowed_globals())
    except (ImportError, AttributeError):  # pragma: no cover - depends on the torch version
        pass
    for item in torch.serialization.get_safe_globals():
        target = item[0] if isinstance(item, tuple) else item
        allowed.add(f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}")
    return allowed


def _listing(result: StaticResult) -> StaticListing:
    allowed = _allowed_globals()
    wanted = tuple(g for g in result.globals_seen if g not in allowed)
    return StaticListing(globals_wanted=wanted, globals_all=tuple(result.globals_seen))


def _torch_load(source: Any, *, trusted: bool, meta: bool = False) -> Any:
    """``torch.load`` of a stream over the open file: never a memory map, never a path
    (which torch would open again, outside the checks made on this handle)."""
    torch = torch_pinned()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(source, map_location="meta" if meta else "cpu", weights_only=not trusted)


class _LeafPassThrough:
    """Leaf source for trees whose leaves are already :class:`Leaf` values."""

    def leaf(self, value: object) -> Leaf | None:
        return value if isinstance(value, Leaf) else None


def scan_file(path: str, *, trust_pickle: bool) -> CheckpointScan:
    """One checkpoint file. Raises OSError (NotRegularFile included) when it cannot be
    opened; damage inside it becomes issues."""
    with FileRanges(path) as ranges:
        return _scan(ranges, trust_pickle=trust_pickle)


def _scan(ranges: FileRanges, *, trust_pickle: bool) -> CheckpointScan:
    path, size = ranges.path, ranges.size
    draft = Draft(path=path, size=size, read_mode="none")
    if size == 0:
        draft.issues.append(_issue(path, "empty_file", "empty checkpoint file", 0))
        return _nothing(draft)
    head = ranges.read(0, 16)
    named = "safetensors" if path.lower().endswith(".safetensors") else "torch"
    content = content_of(head, size, named == "safetensors")
    sample = ranges.read(0, 4096)
    if content == "pickle":
        # A text file may start with a protocol 0 pickle's first opcode: the name and
        # content disagree only if the pickle turns out to be one.
        scan = _scan_bare_pickle(ranges, draft, trust_pickle=trust_pickle)
        if named == "safetensors" and scan.read_mode != "none":
            issue = _issue(path, "bad_checkpoint", mismatch(named, content), 0)
            scan = replace(scan, issues=(issue, *scan.issues))
        return scan
    if content is not None and (content == "safetensors") != (named == "safetensors"):
        draft.issues.append(_issue(path, "bad_checkpoint", mismatch(named, content), 0))
    if content == "zip":
        return _scan_zip(ranges, draft, trust_pickle=trust_pickle)
    if content == "safetensors" or (named == "safetensors" and not recognised(sample)):
        return _scan_safetensors(ranges, draft)
    draft.issues.append(_issue(path, "bad_checkpoint", not_a_checkpoint(sample, size), 0))
    return _nothing(draft)


def _nothing(draft: Draft) -> CheckpointScan:
    return assemble(None, _LeafPassThrough(), _with(draft, format="unknown", read_mode="none"))


def _with(draft: Draft, **changes: Any) -> Draft:
    for key, value in changes.items():
        setattr(draft, key, value)
    return draft


def _scan_safetensors(ranges: FileRanges, draft: Draft) -> CheckpointScan:
    header = read_header(ranges)
    draft.issues.extend(header.issues)
    root = {t.name: leaf_of(ranges, header, t) for t in header.tensors}
    mode = "header" if header.tensors or not header.issues else "none"
    return assemble(root, _LeafPassThrough(), _with(draft, format="safetensors", read_mode=mode))


def _read_member(ranges: FileRanges, archive: Archive, leaf: str) -> bytes | None:
    entry = archive.member(leaf)
    if entry is None or entry.compressed or entry.stored_size > MAX_PICKLE_BYTES:
        return None
    return ranges.read(entry.data_offset, entry.stored_size)


def _scan_zip(ranges: FileRanges, draft: Draft, *, trust_pickle: bool) -> CheckpointScan:
    path = ranges.path
    archive = read_archive(ranges)
    draft.issues.extend(archive.issues)
    if archive.refused:
        return _nothing(draft)
    if archive.is_torchscript:
        draft.issues.append(
            _issue(
                path,
                "unsafe_checkpoint",
                "TorchScript archive: it holds code and is not loaded; its tensors are "
                "listed from the pickle without running it",
                0,
            )
        )
        return _scan_static(ranges, archive, _with(draft, format="torchscript"))
    if archive.member("data.pkl") is None:
        draft.issues.append(
            _issue(path, "bad_checkpoint", "zip archive without data.pkl: not a torch.save file")
        )
        return _nothing(draft)
    if not archive.complete:
        fmt = "incomplete" if archive.truncated else None
        return _scan_static(ranges, archive, _with(draft, format=fmt))
    parsed = _parse_data_pkl(ranges, archive)
    if parsed is None or parsed.error is not None:
        return _scan_static(ranges, archive, draft, parsed)
    if extents.problems(parsed, archive):
        return _scan_static(ranges, archive, draft, parsed)  # which reports them
    if _byteorder(ranges, archive) != "little":
        # torch.load on the meta device byte-swaps meta storages and crashes the process;
        # a byteorder it does not know makes it quote the record. Neither reaches torch.
        return _scan_static(ranges, archive, draft, parsed)
    if not trust_pickle and agrees_without_torch(parsed, archive, ranges):
        leaves = StaticLeaves(ranges, archive, order="little")
        return assemble(parsed.root, leaves, _with(draft, read_mode="weights_only"))
    try:
        meta = _torch_load(ranges.stream(), trusted=trust_pickle, meta=True)
    except pickle.UnpicklingError as exc:
        if trust_pickle:
            draft.issues.append(_issue(path, "bad_checkpoint", f"torch.load failed: {_short(exc)}"))
            return _scan_static(ranges, archive, draft, parsed)
        return _refused(ranges, archive, draft, exc, parsed)
    except Exception as exc:  # torch reports archive damage with several types
        draft.issues.append(_issue(path, "bad_checkpoint", f"torch.load failed: {_short(exc)}"))
        return _scan_static(ranges, archive, draft, parsed)
    mode = "trusted" if trust_pickle else "weights_only"
    if readings_agree(meta, parsed.root, archive):
        leaves = StaticLeaves(ranges, archive, order="little")
        return assemble(parsed.root, leaves, _with(draft, read_mode=mode))
    # The readings differ: torch's is the one that counts, its extents checked in turn.
    meta_leaves = MetaLeaves(ranges, archive)
    for _ in walk(meta, "", meta_leaves):
        pass
    draft.issues.extend(_extent_issues(path, meta_leaves.problems))
    return assemble(meta, meta_leaves, _with(draft, read_mode=mode))


def _byteorder(ranges: FileRanges, archive: Archive) -> ByteOrder | None:
    """The byte order of the archive's values: little without a record (as torch
    assumes), None for a record that names neither order."""
    if archive.member("byteorder") is None:
        return "little"
    data = _read_member(ranges, archive, "byteorder")
    return "little" if data == b"little" else "big" if data == b"big" else None


def _parse_data_pkl(ranges: FileRanges, archive: Archive) -> StaticResult | None:
    data = _read_member(ranges, archive, "data.pkl")
    return None if data is None else read_pickle(data)


def _extent_issues(path: str, unfit: list[extents.Problem]) -> list[IngestIssue]:
    issues = [
        _issue(path, "bad_checkpoint", f"{p.message}; its tensors are not scanned", p.offset)
        for p in unfit[: extents.MAX_ISSUES]
    ]
    if len(unfit) > extents.MAX_ISSUES:
        more = len(unfit) - extents.MAX_ISSUES
        issues.append(_issue(path, "bad_checkpoint", f"{more} more storages or views that "
                             "do not fit their records; their tensors are not scanned"))
    return issues


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {foreign(str(exc))}"[:300]


# Searched with re's own cache: compiled on the first refusal, not at every start-up.
_WO_REASON = r"WeightsUnpickler error:\s*(.*?)\s*(?:\n\s*\n|$)"
_OPERAND = r"Unsupported operand (\d+)"
_OPCODES = {op.code: op.name for op in pickletools.opcodes}


def weights_only_reason(exc: BaseException) -> str:
    """What torch's weights_only unpickler objected to, in one line."""
    text = str(exc)
    found = re.search(_WO_REASON, text, re.S)
    reason = foreign(" ".join(found.group(1).split())) if found else _short(exc)
    operand = re.search(_OPERAND, reason)
    if operand is not None:
        code = int(operand.group(1))
        name = _OPCODES.get(chr(code)) if code < 256 else None
        if name is not None:
            reason += f" (the pickle opcode {name}, which the weights_only unpickler lacks)"
    return reason[:300]


def _refused(
    ranges: FileRanges,
    archive: Archive | None,
    draft: Draft,
    exc: Exception,
    parsed: StaticResult | None = None,
) -> CheckpointScan:
    """weights_only refused the file: say why, then read it statically."""
    path = ranges.path
    if archive is not None:
        scan = _scan_static(ranges, archive, draft, parsed)
    else:
        scan = _static_bare(ranges, draft)
    if scan.read_mode == "none":
        return scan  # not a pickle at all: its issue says so
    wanted = scan.static.globals_wanted if scan.static else ()
    if wanted:
        names = ", ".join(quote(g).strip("'") for g in wanted[:8])
        names += f" and {len(wanted) - 8} more" if len(wanted) > 8 else ""
        message = (
            f"needs globals outside the weights_only allow-list ({names}); read statically "
            "without running it. Use --trust-pickle only for a file you trust"
        )
    else:
        message = (
            f"torch.load(weights_only=True) refused it: {weights_only_reason(exc)}; read "
            "statically, nothing run"
        )
    issue = _issue(path, "unsafe_checkpoint", message, 0)
    return replace(scan, issues=(issue, *scan.issues))


def _scan_static(
    ranges: FileRanges, archive: Archive, draft: Draft, parsed: StaticResult | None = None
) -> CheckpointScan:
    path = ranges.path
    result = parsed if parsed is not None else _parse_data_pkl(ranges, archive)
    if result is None:
        draft.issues.append(
            _issue(path, "bad_checkpoint", "data.pkl missing, compressed or too large to read")
        )
        return assemble(None, _LeafPassThrough(), draft)
    entry = archive.member("data.pkl")
    if result.error is not None and entry is not None:
        offset = entry.data_offset + (result.error_offset or 0)
        draft.issues.append(
            _issue(
                path, "bad_checkpoint", f"data.pkl: {result.error}; kept what came before", offset
            )
        )
    draft.issues.extend(_extent_issues(path, extents.problems(result, archive)))
    order = _byteorder(ranges, archive)
    if order is None:
        entry = archive.member("byteorder")
        draft.issues.append(_issue(path, "bad_checkpoint", "the byteorder record names neither "
                                   "'little' nor 'big': values not read",
                                   entry.data_offset if entry else None))
    leaves = StaticLeaves(ranges, archive, order=order)
    mode = "none" if result.error is not None and not result.tensors else "static"
    return assemble(result.root, leaves, _with(draft, read_mode=mode, static=_listing(result)))


def _scan_bare_pickle(ranges: FileRanges, draft: Draft, *, trust_pickle: bool) -> CheckpointScan:
    path = ranges.path
    if trust_pickle or draft.size <= MAX_PICKLE_BYTES:
        try:
            root = _torch_load(ranges.stream(), trusted=trust_pickle)
        except pickle.UnpicklingError as exc:
            return _refused(ranges, None, draft, exc)
        except Exception as exc:
            draft.issues.append(_issue(path, "bad_checkpoint", f"torch.load failed: {_short(exc)}"))
            return _static_bare(ranges, draft)
        mode = "trusted" if trust_pickle else "weights_only"
        return assemble(root, TorchLeaves(), _with(draft, read_mode=mode))
    draft.issues.append(
        _issue(path, "too_large", "bare pickle too large to load into memory; read statically")
    )
    return _static_bare(ranges, draft)


def _static_bare(ranges: FileRanges, draft: Draft) -> CheckpointScan:
    path = ranges.path
    data = ranges.read(0, MAX_PICKLE_BYTES)
    result = read_pickle(data)
    if result.error is None and result.root == LEGACY_MAGIC:
        # Legacy torch.save: magic number, protocol, system info, then the object.
        for _ in range(3):
            result = read_pickle(data, result.end)
            if result.error is not None:
                break
    if result.error is not None and not result.tensors:
        message = _not_a_pickle(data, draft.size, result)
        draft.issues.append(_issue(path, "bad_checkpoint", message, 0))
        return _nothing(draft)
    if result.error is not None:
        draft.issues.append(
            _issue(path, "bad_checkpoint", f"pickle: {result.error}", result.error_offset)
        )
    leaves = StaticLeaves(None, None, order="little")
    return assemble(result.root, leaves, _with(draft, read_mode="static", static=_listing(result)))


def _not_a_pickle(data: bytes, size: int, result: StaticResult) -> str:
    if is_text(data[:4096]):
        return not_a_checkpoint(data[:4096], size)
    return (f"not a checkpoint: no tensor could be read from it as a pickle ({result.error} "
            f"at byte {result.error_offset or 0})")
