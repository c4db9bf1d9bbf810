"""Opening store files defensively: read-only, never blocking on FIFOs, regular files only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rmqdump.errors import StoreError

RO_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of a regular file; FIFOs, sockets and devices are refused, never read."""
    try:
        fd = os.open(path, RO_FLAGS)
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
