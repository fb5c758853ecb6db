"""Opening the files of an analysed folder: regular files only, never blocking, bounded.

A folder from a stranger may hold a FIFO named ``train.log`` (opening it blocks until a
writer appears), a symlink to ``/dev/urandom`` named ``events.out.tfevents.1`` (it reads
forever) or a socket. Every reader opens through :func:`open_regular`, which looks at the
file's type before opening it (``stat`` follows symlinks, so a link to a device is seen as
the device), opens without blocking, and checks the type again on the open descriptor in
case the path was swapped in between.

Reads are bounded twice over:

- in bytes: a reader never reads past the size the file had when it was opened (a log
  still being appended to is read as it stood, and an endless file cannot be one);
- in time: :class:`Deadline` lets a reader's loop stop after a budget of seconds and keep
  what it read, for files on a storage that has stopped answering.

A URL (:func:`analyzer.ingest.storage.is_url`) is an object, not a file: it has no type to
check and cannot block, and is opened for ranged reads of the block size its reader asks
for; its size is the object's, and reads stop there as they do for a file.
"""

from __future__ import annotations

import os
import stat
import time
from typing import BinaryIO

from analyzer.ingest import storage

READ_SECONDS = 600.0
"""Default time budget for reading one file; reaching it keeps what was read."""


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a folder, not a regular file."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"a {kind}, not a regular file: not opened")
        self.path = path
        self.kind = kind
        self.strerror = str(self)


def file_kind(mode: int) -> str:
    """The file type of ``mode`` in words."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"),
                       (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def check_regular(path: str) -> os.stat_result:
    """``os.stat(path)`` when it is a regular file; NotRegularFile otherwise (OSError when
    it cannot be looked at). A URL is looked at through its store: a folder there is
    refused the same way."""
    if storage.is_url(path):
        if storage.isdir(path):
            raise NotRegularFile(path, "folder")
        st = os.stat_result((stat.S_IFREG | 0o444, 0, 0, 1, 0, 0, storage.size(path), 0, 0, 0))
        return st
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(path, file_kind(info.st_mode))
    return info


def is_regular(path: str) -> bool:
    """True when ``path`` (followed through symlinks) is a regular file."""
    if storage.is_url(path):
        return storage.isfile(path)
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: str, block_size: int = storage.STREAM_BLOCK) -> tuple[BinaryIO, int]:
    """Open a regular file for reading: the binary handle and the size it has now.

    Raises :class:`NotRegularFile` for anything else, before opening it, and OSError when
    it cannot be opened. Readers must not read past the returned size. ``block_size`` is
    the read-ahead of a URL's ranged reads (a local file ignores it).
    """
    if storage.is_url(path):
        try:
            return storage.open_url(path, block_size)
        except IsADirectoryError:
            raise NotRegularFile(path, "folder") from None
    check_regular(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped after the first look
            raise NotRegularFile(path, file_kind(info.st_mode))
        if flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return handle, int(info.st_size)


def read_regular(path: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file, at most ``limit`` of them (None: its whole size at open)."""
    handle, size = open_regular(path, storage.SMALL_BLOCK) if storage.is_url(path) else \
        open_regular(path)
    with handle:
        return handle.read(size if limit is None else min(size, limit))


class Deadline:
    """A time budget for reading one file: ``expired()`` once ``seconds`` have passed."""

    __slots__ = ("end", "seconds")

    def __init__(self, seconds: float = READ_SECONDS) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.end
