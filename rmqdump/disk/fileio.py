"""Opening files to read, defensively: read-only, never blocking on FIFOs, regular files only.

The read side of the one door to the disk (write opens and fsync: :mod:`rmqdump.disk.durable`).
:func:`open_read` and :func:`open_dir` raise the plain :class:`OSError` so each caller keeps its
own message; :func:`open_regular` and :func:`read_regular` raise :class:`StoreError`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rmqdump.errors import StoreError

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
RO_FLAGS = os.O_RDONLY | os.O_NONBLOCK | O_CLOEXEC


def open_read(path: str | os.PathLike, *, follow: bool = True, nonblock: bool = True) -> int:
    """A read-only descriptor (``O_RDONLY|O_CLOEXEC``); ``follow=False`` adds ``O_NOFOLLOW`` (a symlink
    fails with ELOOP), ``nonblock`` ``O_NONBLOCK`` (a FIFO never blocks the open). Raises OSError."""
    flags = os.O_RDONLY | O_CLOEXEC
    if nonblock:
        flags |= os.O_NONBLOCK
    if not follow:
        flags |= os.O_NOFOLLOW
    return os.open(path, flags)


def open_dir(path: str | os.PathLike, *, follow: bool = True) -> int:
    """A read-only descriptor of a directory (``O_RDONLY|O_DIRECTORY|O_CLOEXEC``, to fsync it);
    ``follow=False`` adds ``O_NOFOLLOW``. Raises OSError."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | O_CLOEXEC
    if not follow:
        flags |= os.O_NOFOLLOW
    return os.open(path, flags)


def open_regular(path: str | os.PathLike, *, follow: bool = True) -> int:
    """A read-only, non-blocking descriptor of a regular file; FIFOs, sockets and devices are refused,
    never read (StoreError); ``follow=False`` refuses a symlink too."""
    try:
        fd = open_read(path, follow=follow)
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise StoreError(f"cannot stat: {e.strerror}", path) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StoreError(f"not a regular file ({stat.filemode(st.st_mode)}); not read", path)
    return fd


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file (bounded memory whatever the file claims)."""
    fd = open_regular(path)
    try:
        chunks, got = [], 0
        while got < limit:
            chunk = os.read(fd, min(1 << 20, limit - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise StoreError(f"read failed: {e.strerror}", Path(path)) from None
    finally:
        os.close(fd)
