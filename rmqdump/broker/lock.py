"""The broker's ``lock`` file (spec §10.3): probe the holder, or take the lock ourselves.

The broker holds a POSIX record lock (``fcntl(F_SETLK)``) on byte 0 of ``STORE/lock``.
POSIX locks belong to the *process*: closing any descriptor of the file releases all of the
process's locks on it. So this module keeps one descriptor per locked file for the whole
operation, and :func:`probe_lock` never opens a second descriptor of a file this process
has locked.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import sys
import threading
import time
from pathlib import Path

from rmqdump.codec.layout import STORE_LOCK_FILE
from rmqdump.disk.durable import open_write
from rmqdump.disk.fileio import open_read
from rmqdump.errors import LockError, StoreError

#: How long :class:`StoreLock` keeps retrying when the holder vanishes mid-check.
DEFAULT_LOCK_TIMEOUT_S = 1.0

# struct flock. Linux (x86_64, aarch64, and other LP64 ABIs): short l_type, short l_whence,
# [4 pad], off_t l_start, off_t l_len, pid_t l_pid, [4 pad] = 32 bytes.
# macOS: off_t l_start, off_t l_len, pid_t l_pid, short l_type, short l_whence = 24 bytes.
if sys.platform.startswith("linux"):
    _FLOCK = struct.Struct("@hhqqi4x")

    def _pack_flock(l_type: int, start: int, length: int) -> bytes:
        return _FLOCK.pack(l_type, os.SEEK_SET, start, length, 0)

    def _unpack_flock(data: bytes) -> tuple[int, int]:
        l_type, _whence, _start, _len, pid = _FLOCK.unpack(data)
        return l_type, pid
elif sys.platform == "darwin":
    _FLOCK = struct.Struct("@qqihh")

    def _pack_flock(l_type: int, start: int, length: int) -> bytes:
        return _FLOCK.pack(start, length, 0, l_type, os.SEEK_SET)

    def _unpack_flock(data: bytes) -> tuple[int, int]:
        _start, _len, pid, l_type, _whence = _FLOCK.unpack(data)
        return l_type, pid
else:  # pragma: no cover - other platforms
    _FLOCK = None

_held_lock = threading.Lock()
#: (st_dev, st_ino) of lock files this process holds -> descriptor
_HELD: dict[tuple[int, int], int] = {}


def lock_path(store_root: str | os.PathLike) -> Path:
    return Path(store_root) / STORE_LOCK_FILE


def _open_lock(path: Path, *, write: bool = False, create: bool = False) -> int | None:
    """Open the lock file (read-only, or read-write with ``write``) without following a symlink and
    without blocking; None if it does not exist."""
    try:
        if write:
            fd = open_write(path, read=True, create=create, nonblock=True)
        else:
            fd = open_read(path, follow=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError("lock file is a symlink; refusing to follow it", path) from None
        raise LockError(f"cannot open lock file: {exc.strerror}", path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockError("lock file is not a regular file", path)
    return fd


def describe_holder(pid: int | None) -> str:
    """Who holds a lock, in words: ``process N``, or for an open-file-description lock (``F_GETLK``
    reports pid -1: the holder is a file description, not a process) ``an OFD lock of an unknown process``."""
    if pid is None or pid <= 0:
        return "an open-file-description lock of an unknown process"
    return f"process {pid}"


def getlk_holder(fd: int) -> int | None:
    """``F_GETLK`` for an exclusive lock on byte 0: the PID of a conflicting holder, or None.

    Locks held by the calling process never conflict, so they are not reported.
    """
    if _FLOCK is None:
        raise StoreError(f"F_GETLK probing is not implemented for {sys.platform}")
    try:
        res = fcntl.fcntl(fd, fcntl.F_GETLK, _pack_flock(fcntl.F_WRLCK, 0, 1))
    except OSError as exc:
        raise LockError(f"F_GETLK failed: {exc.strerror}") from None
    l_type, pid = _unpack_flock(res)
    if l_type == fcntl.F_UNLCK:
        return None
    return pid


def _held_fd(path: Path) -> int | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    with _held_lock:
        return _HELD.get((st.st_dev, st.st_ino))


def probe_lock(store_root: str | os.PathLike) -> int | None:
    """PID of the process holding the broker lock on ``STORE/lock``, or None.

    Opens the file read-only and only queries (F_GETLK); never takes the lock. Returns our
    own PID if this process holds it through :class:`StoreLock`.
    """
    path = lock_path(store_root)
    if _held_fd(path) is not None:
        return os.getpid()
    fd = _open_lock(path)
    if fd is None:
        return None
    try:
        return getlk_holder(fd)
    finally:
        os.close(fd)


class StoreLock:
    """Take the broker's own lock (exclusive ``lockf`` on byte 0 of ``STORE/lock``).

    Held on one descriptor until :meth:`release`. If another process holds it,
    :class:`LockError` names the holder's PID (within ``timeout`` seconds). The lock file
    is created if missing (``create=True``) and never followed through a symlink.
    """

    def __init__(self, store_root: str | os.PathLike, timeout: float = DEFAULT_LOCK_TIMEOUT_S, create: bool = True):
        self.path = lock_path(store_root)
        self.timeout = timeout
        self.create = create
        self.fd: int | None = None
        self._key: tuple[int, int] | None = None

    def acquire(self) -> StoreLock:
        if self.fd is not None:
            raise LockError("StoreLock already acquired", self.path, pid=os.getpid())
        if _held_fd(self.path) is not None:
            raise LockError("this process already holds the store lock", self.path, pid=os.getpid())
        fd = _open_lock(self.path, write=True, create=self.create)
        if fd is None:
            raise LockError("lock file does not exist", self.path)
        try:
            self._lock(fd)
        except BaseException:
            os.close(fd)
            raise
        st = os.fstat(fd)
        self.fd, self._key = fd, (st.st_dev, st.st_ino)
        with _held_lock:
            _HELD[self._key] = fd
        return self

    def _lock(self, fd: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
                return
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise LockError(f"cannot lock: {exc.strerror}", self.path) from None
            pid = getlk_holder(fd)
            if pid is not None:
                raise LockError(f"store is locked by {describe_holder(pid)} (a running broker?)", self.path, pid=pid)
            if time.monotonic() >= deadline:
                raise LockError("store lock is busy", self.path)
            time.sleep(0.01)

    def release(self) -> None:
        """Unlock and close the descriptor."""
        if self.fd is None:
            return
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)
        finally:
            with _held_lock:
                _HELD.pop(self._key, None)
            os.close(self.fd)
            self.fd, self._key = None, None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
