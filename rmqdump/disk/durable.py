"""Opening files to write, and fsync: the write side of the one door to the disk.

:func:`open_write` never follows a symlink (``O_NOFOLLOW``) and raises the plain :class:`OSError`, so
each caller keeps its own message; :func:`fsync_fd`, :func:`fsync_path` and :func:`fsync_dir` raise
:class:`StoreError`, :func:`fsync_raw` the plain OSError. Read opens: :mod:`rmqdump.disk.fileio`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from rmqdump.disk.fileio import O_CLOEXEC, open_dir, open_read
from rmqdump.errors import StoreError


def open_write(path: str | os.PathLike, *, create: bool = False, exclusive: bool = False,
               truncate: bool = False, read: bool = False, nonblock: bool = False, mode: int = 0o644) -> int:
    """A descriptor for writing (``O_WRONLY``, or ``O_RDWR`` with ``read``), always ``O_NOFOLLOW|O_CLOEXEC``;
    ``create`` adds ``O_CREAT`` (with ``mode``), ``exclusive`` ``O_EXCL``, ``truncate`` ``O_TRUNC``,
    ``nonblock`` ``O_NONBLOCK``. Raises OSError."""
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_NOFOLLOW | O_CLOEXEC
    if create:
        flags |= os.O_CREAT
    if exclusive:
        flags |= os.O_EXCL
    if truncate:
        flags |= os.O_TRUNC
    if nonblock:
        flags |= os.O_NONBLOCK
    return os.open(path, flags, mode)


def open_cache_file(path: str | os.PathLike) -> int:
    """Read-write, created (0o644) if missing, symlinks followed: a file in rmqdump's own cache
    directory (the kernels' ``build.lock``), never one of a store. Raises OSError."""
    return os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)


def open_devnull() -> int:
    """``os.devnull`` for writing (``O_WRONLY``; the CLI points a broken stdout at it). Raises OSError."""
    return os.open(os.devnull, os.O_WRONLY | O_CLOEXEC)


def fsync_raw(fd: int) -> None:
    """``os.fsync``; the OSError reaches the caller (for callers with their own message)."""
    os.fsync(fd)


def fsync_fd(fd: int, what: str | os.PathLike) -> None:
    """fsync one descriptor; an error is a failure (never retried: the kernel may have dropped the data)."""
    try:
        os.fsync(fd)
    except OSError as e:
        raise StoreError(f"fsync failed: {e.strerror}; the data written since the last sync may be lost",
                         what) from None


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a regular file by path (never following a symlink)."""
    try:
        fd = open_read(path, follow=False, nonblock=False)
    except OSError as e:
        raise StoreError(f"cannot open for fsync: {e.strerror}", path) from None
    try:
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so new or removed entries in it are durable."""
    try:
        fd = open_dir(path, follow=False)
    except OSError as e:
        raise StoreError(f"cannot open directory for fsync: {e.strerror}", path) from None
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS):  # some filesystems cannot fsync directories
            raise StoreError(f"directory fsync failed: {e.strerror}", path) from None
    finally:
        os.close(fd)


@contextmanager
def atomic_file(out: Path, what: str) -> Iterator[BinaryIO]:
    """A new file at ``out`` (outside any store: a bundle, a report): written to a temporary file beside it,
    fsynced, renamed over ``out``, its directory fsynced. On any error the temporary file is removed and a
    previous ``out`` stays whole."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fd = open_write(tmp, create=True, exclusive=True)
    except OSError as e:
        raise StoreError(f"cannot create {what}: {e.strerror}", tmp) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            fsync_fd(f.fileno(), tmp)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(out.parent)
