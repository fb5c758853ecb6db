"""Where a path lives: a local file or folder, or an object behind a URL (``s3://``, ``gs://``,
``memory://``, anything fsspec resolves).

This is the one place that tells the two apart. A local path keeps the code it always had
(``os.scandir``, ``os.open`` with the FIFO and symlink checks of :mod:`safeio`); fsspec is
imported only when a URL is met, so a local analysis neither needs nor loads it. A
``file://`` URL is a local path (:func:`normalize`).

For a URL:

- a tree is listed once per path named (:func:`list_tree`: one recursive ``find``, which
  the store pages, 1,000 keys a request on S3), never once per folder or file; the
  filesystem keeps that listing, so the sizes of the objects opened afterwards and the
  capture folders looked at cost no request of their own;
- an object is opened for ranged reads (:func:`open_url`): each reader asks for the block
  size that fits it (small for a zip directory or a safetensors header, larger for an
  event file it streams), so a checkpoint is never fetched whole to be listed;
- nothing is ever written, and credentials come from each filesystem's own configuration
  (for S3: the AWS environment variables, ``~/.aws``, ``AWS_ENDPOINT_URL``, fsspec's
  ``FSSPEC_S3_*`` settings).

Paths of objects keep their URL form (``s3://bucket/runs/a/train.log``) everywhere: in the
run's files, its issues and the report. :func:`parent`, :func:`name`, :func:`join` and
:func:`relative` do for both kinds what ``os.path`` does for local paths only
(``os.path.normpath("s3://b")`` is ``s3:/b``).
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from analyzer.errors import UsageError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

REMOTE_EXTRA = "pip install 'nan-forensics[remote]'"
"""What to install for URLs."""

SMALL_BLOCK = 64 << 10
"""Read-ahead for readers that seek around a file (a zip directory, a header, a pickle)."""
STREAM_BLOCK = 4 << 20
"""Read-ahead for readers that stream a file from start to end (event files, logs)."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_CHAIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::|::[A-Za-z][A-Za-z0-9+.-]*://")
"""fsspec's chaining of filesystems: ``simplecache::s3://...``, ``zip://m::s3://...``."""
_MARKER_SUFFIX = "_$folder$"  # the zero-byte key some tools write for a folder


def is_url(path: str) -> bool:
    """Whether ``path`` names an object behind a URL (any ``scheme://`` but ``file://``)."""
    if "://" not in path:  # a local path, as most are: no pattern to match
        return False
    match = _SCHEME.match(path)
    if match is None:  # a chain (refused by filesystem, with its reason) is no local path
        return _CHAIN.search(path) is not None
    return match[1].lower() != "file"


def normalize(path: str) -> str:
    """``file:///x`` becomes ``/x``; a URL loses one trailing ``/``; a local path is kept."""
    if path[:7].lower() == "file://":
        from urllib.parse import unquote

        rest = path[7:]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        return unquote(rest) or "/"
    if is_url(path) and path.endswith("/") and not path.endswith("://"):
        return path[:-1]
    return path


def _scheme_end(path: str) -> int:
    match = _SCHEME.match(path)
    return match.end() if match else 0


def parent(path: str) -> str:
    """The folder holding ``path``; a URL's parent never goes above its bucket."""
    if not is_url(path):
        return os.path.dirname(path)
    start = _scheme_end(path)
    cut = path.rstrip("/").rfind("/")
    return path if cut < start else path[:cut]


def name(path: str) -> str:
    """The last part of ``path`` (a bucket's URL: the bucket)."""
    if not is_url(path):
        return os.path.basename(path)
    return path.rstrip("/")[_scheme_end(path):].rsplit("/", 1)[-1]


def join(folder: str, child: str) -> str:
    """``child`` inside ``folder``."""
    if not is_url(folder):
        return os.path.join(folder, child)
    return folder.rstrip("/") + "/" + child


def absolute(path: str) -> str:
    """``os.path.abspath`` of a local path; a URL as it is (normalized)."""
    return normalize(path) if is_url(path) else os.path.abspath(normalize(path))


def relative(path: str, folder: str) -> str:
    """``path`` relative to ``folder`` with ``/`` separators (``.`` for the folder itself)."""
    if not is_url(path):
        return os.path.relpath(path, folder).replace(os.sep, "/")
    base = folder.rstrip("/")
    if path == base:
        return "."
    if path.startswith(base + "/"):
        return path[len(base) + 1:]
    raise ValueError(f"{path} is not inside {folder}")


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (both absolute or both URLs)."""
    sep = "/" if is_url(folder) else os.sep
    return path == folder or path.startswith(folder.rstrip(sep) + sep)


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem serving ``url`` and the path it knows the object by.

    Raises UsageError, naming what to install, when fsspec (or the filesystem of that
    scheme, such as s3fs or gcsfs) is missing, and for fsspec's chained URLs: a chain
    may copy objects to a local cache (``simplecache::``, ``blockcache::``) or fetch an
    archive to read a member (``zip://m::s3://...``), so its reads are neither bounded
    nor write-free as this module promises. A ``::`` inside a key is part of the key
    (fsspec's own parser would cut the key there and read another object)."""
    if _CHAIN.search(url):
        raise UsageError(f"{url}: fsspec's chained URLs are not read (a chain may cache "
                         "objects on local disk or fetch an archive whole): name the "
                         "folder or object by its own URL, such as s3://bucket/key")
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"{url}: reading a URL needs fsspec: {REMOTE_EXTRA}") from None
    match = _SCHEME.match(url)
    try:
        cls = fsspec.get_filesystem_class(match[1] if match else "file")
    except ImportError as exc:
        raise UsageError(f"{url}: {exc}; for s3:// {REMOTE_EXTRA}") from None
    except ValueError as exc:  # a scheme no filesystem is registered for
        raise UsageError(f"{url}: {exc}") from None
    fs = cls(**cls._get_kwargs_from_urls(url))
    return fs, cast(str, cls._strip_protocol(url))


def _url_of(fs: AbstractFileSystem, url: str, path: str) -> str:
    """The URL of ``path`` on ``fs``, in the scheme ``url`` was written with."""
    scheme = url[:_scheme_end(url)]
    stripped = cast(str, fs._strip_protocol(path))
    return scheme + stripped.lstrip("/") if scheme else str(fs.unstrip_protocol(stripped))


_USERINFO = re.compile(r"(?<=://)[^/\s@\"'<>]+@")
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{16}\b")


def redact(text: str) -> str:
    """``text`` without the credentials a client's message may hold: the ``user:pass@`` of
    an endpoint's URL and AWS access key ids."""
    return _KEY_ID.sub("***", _USERINFO.sub("***@", text))


def _call(url: str, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with whatever the store or its client raises as an OSError
    (a refused connection, a denied request), so that readers report it as they would a
    local file's; its words never carry credentials (:func:`redact`)."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        said = str(exc)
        if redact(said) == said:
            raise
        clean = redact(exc.strerror or said)
        try:
            raised: OSError = type(exc)(exc.errno, clean) if exc.errno is not None else \
                type(exc)(clean)
        except Exception:
            raised = OSError(clean)
        raise raised from None
    except UsageError:
        raise
    except Exception as exc:
        raise OSError(redact(f"{type(exc).__name__}: {exc}")) from None


def info(path: str, *, fresh: bool = False) -> dict[str, Any] | None:
    """What the store says of the object or folder at ``path`` (None: nothing there), from
    the listing the filesystem keeps when there is one, else (or when ``fresh``) asked."""
    fs, key = filesystem(path)
    try:
        if fresh:
            fs.invalidate_cache(key)
        return cast(dict[str, Any], _call(path, "cannot look at", fs.info, key))
    except FileNotFoundError:
        return None


def _seen(path: str) -> dict[str, Any] | None:
    """:func:`info`, with a store that cannot be asked taken as nothing there (what
    ``os.path.exists`` does with a path it cannot stat)."""
    try:
        return info(path)
    except OSError:
        return None


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(normalize(path))
    return _seen(path) is not None


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(normalize(path))
    found = _seen(path)
    return found is not None and found.get("type") == "directory"


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(normalize(path))
    found = _seen(path)
    return found is not None and found.get("type") == "file" and not _is_marker(path, found)


def size(path: str) -> int:
    """The size in bytes; OSError when it cannot be looked at."""
    if not is_url(path):
        return os.path.getsize(normalize(path))
    found = info(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such object")
    return int(found.get("size") or 0)


def signature(path: str) -> str:
    """A cheap token that changes when the file does: size and modification time locally,
    size and ETag (or modification time) for an object, asked of the store each time (a
    long-lived caller must see a change); empty when it cannot be looked at."""
    try:
        if not is_url(path):
            st = os.stat(normalize(path))
            return f"{st.st_size}:{st.st_mtime_ns}"
        found = info(path, fresh=True)
    except OSError:
        return ""
    if found is None:
        return ""
    tag = found.get("ETag") or found.get("etag") or found.get("LastModified") or \
        found.get("mtime") or found.get("updated") or ""
    return f"{found.get('size') or 0}:{tag}"


def open_url(url: str, block_size: int = SMALL_BLOCK) -> tuple[BinaryIO, int]:
    """An object opened for ranged reads, and its size (from the listing when the tree was
    listed). FileNotFoundError when it is gone, IsADirectoryError for a folder,
    PermissionError when the store refuses, OSError for anything else the store says."""
    fs, key = filesystem(url)
    found = info(url)
    if found is None:
        raise FileNotFoundError(2, "no such object", url)
    if found.get("type") == "directory":
        raise IsADirectoryError(21, "a folder, not an object", url)
    known = int(found.get("size") or 0)
    try:  # the size known saves the filesystem a look of its own
        handle = _call(url, "cannot open", fs.open, key, "rb", block_size=block_size,
                       size=known)
    except TypeError:  # a filesystem whose files take no size
        handle = _call(url, "cannot open", fs.open, key, "rb", block_size=block_size)
    return cast(BinaryIO, _Guarded(handle, url)), known


class _Guarded(io.RawIOBase):
    """A remote file as a raw binary stream (so that any io wrapper takes it) whose read
    errors are OSErrors, as a local file's are."""

    def __init__(self, handle: Any, url: str) -> None:
        super().__init__()
        self._handle = handle
        self._url = url

    def read(self, n: int | None = -1) -> bytes:
        return cast(bytes, _call(self._url, "cannot read", self._handle.read,
                                 -1 if n is None else n))

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, view: Any) -> int:
        return cast(int, _call(self._url, "cannot read", self._handle.readinto, view))

    def seek(self, offset: int, whence: int = 0) -> int:
        return cast(int, self._handle.seek(offset, whence))

    def tell(self) -> int:
        return cast(int, self._handle.tell())

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


@dataclass
class Folder:
    """One listed folder of a remote tree: sub-folder names and object names, sorted."""

    dirs: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    odd: list[tuple[str, str]] = field(default_factory=list)
    """On the root's folder only: the objects not placed in the tree, each a URL and why
    (:data:`ODD_PART`, :data:`SHADOWED`)."""


def _is_marker(name_: str, entry: dict[str, Any]) -> bool:
    """A key that stands for a folder: ``a/`` or ``a_$folder$``, both empty."""
    return (name_.endswith("/") or name_.endswith(_MARKER_SUFFIX)) and \
        not int(entry.get("size") or 0)


_LOOKED: dict[str, dict[str, dict[str, Any]]] = {}
"""The listing :func:`look` made of a folder, until :func:`list_tree` takes it."""


def _find(url: str) -> tuple[AbstractFileSystem, str, dict[str, dict[str, Any]]]:
    fs, key = filesystem(url)
    fs.invalidate_cache(key)  # a listing of an earlier analysis may be stale
    found = cast(dict[str, dict[str, Any]],
                 _call(url, "cannot list", fs.find, key, detail=True))
    return fs, cast(str, fs._strip_protocol(key)).rstrip("/"), found


def look(url: str) -> str | None:
    """What the URL names: ``"directory"``, ``"file"`` or None (nothing there), from the
    one recursive listing that :func:`list_tree` then uses (no look of its own: a store
    answers each over the network). OSError when the store cannot be listed."""
    fs, base, found = _find(url)
    if not found:
        return None
    if len(found) == 1:
        (name_, entry), = found.items()
        if cast(str, fs._strip_protocol(name_)).rstrip("/") == base and \
                entry.get("type") == "file" and not _is_marker(name_, entry):
            return "file"
    _LOOKED[url] = found
    return "directory"


def forget(url: str) -> None:
    """Drop the listing :func:`look` kept of ``url`` (a folder named but not walked)."""
    _LOOKED.pop(url, None)


def list_tree(root: str) -> dict[str, Folder]:
    """Every folder below the URL ``root`` (itself included), from one recursive listing
    (the one :func:`look` made, when it looked at ``root``).

    Folders are the common prefixes of the keys (a store has no folders of its own);
    folder markers (empty ``a/`` or ``a_$folder$`` keys) are not files. Raises OSError when
    the store cannot be listed."""
    kept = _LOOKED.pop(root, None)
    if kept is None:
        fs, base, found = _find(root)
    else:
        fs, key = filesystem(root)
        base, found = cast(str, fs._strip_protocol(key)).rstrip("/"), kept
    tree: dict[str, Folder] = {base: Folder()}
    files: list[str] = []
    odd: list[str] = []
    for path, entry in found.items():
        path = cast(str, fs._strip_protocol(path))
        if _odd_key(path, base, entry):
            if entry.get("type") != "directory" and not _is_marker(path, entry):
                odd.append(_url_of(fs, root, path))
            continue
        if _is_marker(path, entry):
            path = path.removesuffix(_MARKER_SUFFIX).rstrip("/")
            if path and path != base:
                tree.setdefault(path, Folder())
        elif entry.get("type") == "directory":
            tree.setdefault(path.rstrip("/"), Folder())
        elif path != base:
            files.append(path)
    shadowed: list[str] = []
    above = {p[:i] for p in files for i in range(len(p)) if p[i] == "/"}
    for path in files:
        if path not in tree and path not in above:
            _folder_of(tree, base, path).files.append(path.rsplit("/", 1)[-1])
        else:  # an object also a prefix of others is a folder; the object is said
            shadowed.append(_url_of(fs, root, path))
    for path in [p for p in tree if p != base]:
        _folder_of(tree, base, path).dirs.append(path.rsplit("/", 1)[-1])
    for folder in tree.values():
        folder.dirs = sorted(set(folder.dirs))
        folder.files = sorted(set(folder.files) - set(folder.dirs))
    tree[base].odd = sorted([(url, ODD_PART) for url in odd] +
                            [(url, SHADOWED) for url in shadowed])
    return {_url_of(fs, root, path): folder for path, folder in tree.items()}


ODD_PART = "a key with an empty, '.' or '..' part: not read (as a path it names another " \
    "object)"
SHADOWED = "an object whose key is also the folder of other keys: not read (a path cannot " \
    "be both; its folder is walked)"


def _odd_key(path: str, base: str, entry: dict[str, Any]) -> bool:
    """Whether the key ``path`` has an empty, ``.`` or ``..`` part below ``base``: as a path
    it would name another object (``a/../b`` is ``b``, ``a//b`` lists as a folder ``a/``
    that the URL ``a`` names too), so it is not walked but reported."""
    if not path.startswith(base + "/"):
        return False
    rest = path[len(base) + 1:]
    if _is_marker(path, entry) or entry.get("type") == "directory":
        rest = rest.removesuffix(_MARKER_SUFFIX)
        rest = rest[:-1] if rest.endswith("/") else rest
    return any(part in ("", ".", "..") for part in rest.split("/"))


def _folder_of(tree: dict[str, Folder], base: str, path: str) -> Folder:
    """The folder holding ``path``, made (with those between it and ``base``) if missing."""
    up = path.rsplit("/", 1)[0]
    if up not in tree:
        tree[up] = Folder()
        if up != base and "/" in up and up.startswith(base + "/"):
            _folder_of(tree, base, up).dirs.append(up.rsplit("/", 1)[-1])
    return tree[up]


def prime(url: str) -> None:
    """Have the filesystem list the tree below the URL ``url`` once, when it does not hold
    that listing yet (a worker process that did not do the discovery): the objects opened
    afterwards then cost no request each for their size. What cannot be listed is left to
    the reads to report."""
    fs, key = filesystem(url)
    key = cast(str, fs._strip_protocol(key)).rstrip("/")
    if key in fs.dircache:
        return
    try:
        fs.find(key, withdirs=True)
    except Exception:  # the reads that follow say what is wrong, per file
        return


def list_dir(url: str) -> list[tuple[str, bool]]:
    """The entries of one remote folder (name, is a folder), served from the listing the
    filesystem keeps when the tree above was listed. OSError when it cannot be listed."""
    fs, key = filesystem(url)
    entries = cast(list[dict[str, Any]],
                   _call(url, "cannot list", fs.ls, key, detail=True))
    out: list[tuple[str, bool]] = []
    for entry in entries:
        path = cast(str, fs._strip_protocol(entry["name"]))
        if path.rstrip("/") == cast(str, fs._strip_protocol(key)).rstrip("/"):
            continue
        if _is_marker(path, entry):
            continue
        out.append((path.rstrip("/").rsplit("/", 1)[-1], entry.get("type") == "directory"))
    return sorted(out)
