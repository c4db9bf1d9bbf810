"""Store directories for the writers: real directories only (:func:`ensure_store_dir`), real zeros over a
new file's holes (:func:`_allocate_zeros`) and a queue's next QUEUEOFFSET read from its ConsumeQueue."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rmqdump.codec.layout import STORE_CONSUMEQUEUE_DIR
from rmqdump.disk.durable import open_write
from rmqdump.disk.paths import is_safe_component
from rmqdump.errors import StoreError


def ensure_store_dir(root: Path, *parts: str, create: bool = True) -> tuple[Path, list[Path]]:
    """``root/parts...`` as real directories (never a symlink), creating missing ones.

    Returns the path and the parents whose entries changed (to fsync). Raises
    :class:`StoreError` for a symlink, a non-directory or an unsafe name. With ``create=False``
    nothing is created: the full path is still returned (every existing component checked, every
    missing one only named) — callers must not assume it exists.
    """
    path = root
    changed: list[Path] = []
    missing = False
    for part in parts:
        if not is_safe_component(part):
            raise StoreError(f"refusing unsafe directory name {part!r}", path)
        nxt = path / part
        if missing:  # below a missing directory nothing exists
            path = nxt
            continue
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if not create:
                missing = True
                path = nxt
                continue
            try:
                os.mkdir(nxt, 0o755)
            except FileExistsError:
                st = os.lstat(nxt)
            except OSError as e:
                raise StoreError(f"cannot create directory: {e.strerror}", nxt) from None
            else:
                changed.append(path)
                path = nxt
                continue
        except OSError as e:
            raise StoreError(f"cannot stat: {e.strerror}", nxt) from None
        if stat.S_ISLNK(st.st_mode):
            raise StoreError("is a symlink; refusing to follow it out of the store", nxt)
        if not stat.S_ISDIR(st.st_mode):
            raise StoreError("is not a directory", nxt)
        path = nxt
    return path, changed


def _allocate_zeros(path: Path, start: int, length: int) -> None:
    """Write real zeros over ``path[start:start + length]``, a range of a file we just created (a hole).

    The content does not change; the blocks get allocated once. The hash-slot table of a new
    index file takes random 4-byte writes: filling those into holes of a sparse file costs a
    block allocation (and extent-tree churn) per touched page at every fsync.
    """
    try:
        fd = open_write(path)
    except OSError as e:
        raise StoreError(f"cannot open index file: {e.strerror}", path) from None
    try:
        zeros = bytes(min(length, 1 << 22))
        pos, end = start, start + length
        while pos < end:
            pos += os.pwrite(fd, memoryview(zeros)[:end - pos], pos)
    except OSError as e:
        raise StoreError(f"write failed: {e.strerror}", path, pos) from None
    finally:
        os.close(fd)


def _read_next_queue_offset(root: Path, topic: str, queue_id: int, cq_file_size: int) -> int:
    """The next QUEUEOFFSET of a queue as the broker would assign it (read-only)."""
    from rmqdump.store.consumequeue import ConsumeQueue

    if not is_safe_component(topic):
        raise StoreError(f"refusing unsafe topic directory name {topic!r}", root / STORE_CONSUMEQUEUE_DIR)
    qdir = root / STORE_CONSUMEQUEUE_DIR / topic / str(queue_id)
    if not qdir.is_dir() or qdir.is_symlink():
        return 0
    return ConsumeQueue(qdir, topic, queue_id, cq_file_size).max_offset
