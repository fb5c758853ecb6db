"""Reading one checkpoint file: choose the reader by content, never by trust.

Policy, one line per case:

* torch zip archive: layout checked first (:mod:`archive`); a refused archive is not read.
* complete archive: ``torch.load(weights_only=True, mmap=True, map_location="cpu")``.
  When it is refused for wanting other globals, the pickle is read statically instead
  and the globals are named. Nothing ever retries with ``weights_only=False``; only
  ``trust_pickle=True`` (the user's explicit choice) does that.
* archive cut off mid-save: reported ``truncated``; what was written whole is read
  statically.
* TorchScript archive: holds code; reported and read statically, never loaded.
* bare pickle (legacy ``torch.save`` or ``pickle.dump``): ``weights_only`` load when small
  enough to hold in memory, else a static read.
* safetensors: header validated, then tensors read one at a time.
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any

from analyzer.ingest.ckpt.archive import LOCAL_MAGIC, Archive, read_archive
from analyzer.ingest.ckpt.build import Draft, assemble
from analyzer.ingest.ckpt.leaves import Leaf, StaticLeaves, TorchLeaves
from analyzer.ingest.ckpt.records import CheckpointScan, StaticListing
from analyzer.ingest.ckpt.safetensors_file import leaf_of, read_header
from analyzer.ingest.ckpt.staticpickle import StaticResult, read_pickle
from analyzer.model import IngestIssue, Location

MAX_PICKLE_BYTES = 256 << 20
"""Largest pickle read into memory (a bare pickle, or data.pkl of an archive)."""

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _issue(path: str, kind: str, message: str, offset: int | None = None) -> IngestIssue:
    return IngestIssue(Location(path, offset=offset), kind, message)


def _allowed_globals() -> set[str]:
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


def _torch_load(path: str, *, trusted: bool, mmap: bool) -> Any:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=not trusted, mmap=mmap)


class _LeafPassThrough:
    """Leaf source for trees whose leaves are already :class:`Leaf` values."""

    def leaf(self, value: object) -> Leaf | None:
        return value if isinstance(value, Leaf) else None


def scan_file(path: str, *, trust_pickle: bool) -> CheckpointScan:
    size = os.path.getsize(path)
    draft = Draft(path=path, size=size, read_mode="none")
    if size == 0:
        draft.issues.append(_issue(path, "empty_file", "empty checkpoint file", 0))
        return assemble(None, _LeafPassThrough(), _with(draft, format="unknown"))
    with open(path, "rb") as handle:
        head = handle.read(16)
    if path.endswith(".safetensors") or _looks_like_safetensors(head, size):
        return _scan_safetensors(path, draft)
    if head.startswith(LOCAL_MAGIC):
        return _scan_zip(path, draft, trust_pickle=trust_pickle)
    if head[:1] == b"\x80" or head[:1] in (b"(", b"}", b"]", b"c"):
        return _scan_bare_pickle(path, draft, trust_pickle=trust_pickle)
    draft.issues.append(
        _issue(path, "bad_checkpoint", f"not a checkpoint: starts with bytes {head[:8].hex()}", 0)
    )
    return assemble(None, _LeafPassThrough(), _with(draft, format="unknown"))


def _with(draft: Draft, **changes: Any) -> Draft:
    for key, value in changes.items():
        setattr(draft, key, value)
    return draft


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    length = int.from_bytes(head[:8], "little")
    return 2 <= length <= size - 8 and head[8:9] == b"{"


def _scan_safetensors(path: str, draft: Draft) -> CheckpointScan:
    header = read_header(path, draft.size)
    draft.issues.extend(header.issues)
    root = {t.name: leaf_of(path, header, t) for t in header.tensors}
    mode = "header" if header.tensors or not header.issues else "none"
    return assemble(root, _LeafPassThrough(), _with(draft, format="safetensors", read_mode=mode))


def _read_member(path: str, archive: Archive, leaf: str) -> bytes | None:
    entry = archive.member(leaf)
    if entry is None or entry.compressed or entry.stored_size > MAX_PICKLE_BYTES:
        return None
    with open(path, "rb") as handle:
        handle.seek(entry.data_offset)
        return handle.read(entry.stored_size)


def _scan_zip(path: str, draft: Draft, *, trust_pickle: bool) -> CheckpointScan:
    archive = read_archive(path, draft.size)
    draft.issues.extend(archive.issues)
    if archive.refused:
        return assemble(None, _LeafPassThrough(), _with(draft, format="unknown"))
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
        return _scan_static(path, archive, _with(draft, format="torchscript"))
    if archive.member("data.pkl") is None:
        draft.issues.append(
            _issue(path, "bad_checkpoint", "zip archive without data.pkl: not a torch.save file")
        )
        return assemble(None, _LeafPassThrough(), _with(draft, format="unknown"))
    if not archive.complete:
        return _scan_static(path, archive, _with(draft, format="incomplete"))
    try:
        root = _torch_load(path, trusted=trust_pickle, mmap=True)
    except pickle.UnpicklingError as exc:
        return _refused(path, archive, draft, exc)
    except Exception as exc:  # torch reports archive damage with several types
        draft.issues.append(_issue(path, "bad_checkpoint", f"torch.load failed: {_short(exc)}"))
        return _scan_static(path, archive, draft)
    mode = "trusted" if trust_pickle else "weights_only"
    return assemble(root, TorchLeaves(release=True), _with(draft, read_mode=mode))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _refused(path: str, archive: Archive | None, draft: Draft, exc: Exception) -> CheckpointScan:
    """weights_only refused the file: say what it wants, then read it statically."""
    scan = _scan_static(path, archive, draft) if archive else _static_bare(path, draft)
    wanted = scan.static.globals_wanted if scan.static else ()
    names = ", ".join(wanted[:8]) + (f" and {len(wanted) - 8} more" if len(wanted) > 8 else "")
    message = (
        f"needs globals outside the weights_only allow-list ({names or _short(exc)}); "
        "read statically without running it. Use --trust-pickle only for a file you trust"
    )
    issue = _issue(path, "unsafe_checkpoint", message, 0)
    return _replace_issues(scan, (issue, *scan.issues))


def _replace_issues(scan: CheckpointScan, issues: tuple[IngestIssue, ...]) -> CheckpointScan:
    from dataclasses import replace

    return replace(scan, issues=issues)


def _scan_static(path: str, archive: Archive, draft: Draft) -> CheckpointScan:
    data = _read_member(path, archive, "data.pkl")
    if data is None:
        draft.issues.append(
            _issue(path, "bad_checkpoint", "data.pkl missing, compressed or too large to read")
        )
        return assemble(None, _LeafPassThrough(), draft)
    byteorder = _read_member(path, archive, "byteorder")
    result = read_pickle(data)
    entry = archive.member("data.pkl")
    if result.error is not None and entry is not None:
        offset = entry.data_offset + (result.error_offset or 0)
        draft.issues.append(
            _issue(
                path, "bad_checkpoint", f"data.pkl: {result.error}; kept what came before", offset
            )
        )
    leaves = StaticLeaves(path, archive, little_endian=byteorder in (None, b"little"))
    return assemble(result.root, leaves, _with(draft, read_mode="static", static=_listing(result)))


def _scan_bare_pickle(path: str, draft: Draft, *, trust_pickle: bool) -> CheckpointScan:
    if trust_pickle or draft.size <= MAX_PICKLE_BYTES:
        try:
            root = _torch_load(path, trusted=trust_pickle, mmap=False)
        except pickle.UnpicklingError as exc:
            return _refused(path, None, draft, exc)
        except Exception as exc:
            draft.issues.append(_issue(path, "bad_checkpoint", f"torch.load failed: {_short(exc)}"))
            return _static_bare(path, draft)
        mode = "trusted" if trust_pickle else "weights_only"
        return assemble(root, TorchLeaves(release=False), _with(draft, read_mode=mode))
    draft.issues.append(
        _issue(path, "unreadable", "bare pickle too large to load into memory; read statically")
    )
    return _static_bare(path, draft)


def _static_bare(path: str, draft: Draft) -> CheckpointScan:
    with open(path, "rb") as handle:
        data = handle.read(MAX_PICKLE_BYTES)
    result = read_pickle(data)
    if result.error is None and result.root == LEGACY_MAGIC:
        # Legacy torch.save: magic number, protocol, system info, then the object.
        for _ in range(3):
            result = read_pickle(data, result.end)
            if result.error is not None:
                break
    if result.error is not None:
        draft.issues.append(
            _issue(path, "bad_checkpoint", f"pickle: {result.error}", result.error_offset)
        )
    leaves = StaticLeaves(path, None, little_endian=True)
    return assemble(result.root, leaves, _with(draft, read_mode="static", static=_listing(result)))
