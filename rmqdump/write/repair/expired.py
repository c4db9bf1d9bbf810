"""Consume-queue units a rebuild cannot regenerate and must not lose: those of the store's own queues that point
into commitlog files retention deleted.

RocketMQ's retention deletes the oldest commitlog files, then each queue's files whose units all point below the
new first offset, always keeping a queue's last file: a queue's first file usually starts with such expired
units, and a queue whose records are all deleted keeps one file of them (its max offset, which consumer offsets
are checked against, and from which the next record's queue offset follows). A rebuild from the commitlog can
only put ``fillPreBlank`` placeholders there, or nothing: it would reset a fully expired queue to offset 0. So
the rebuild carries each queue's leading expired units over from the store, byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path

from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, STORE_CONSUMEQUEUE_DIR
from rmqdump.disk.durable import fsync_dir, fsync_fd, open_write
from rmqdump.disk.paths import is_safe_component
from rmqdump.errors import StoreError
from rmqdump.store.consumequeue import discover_queues, file_name, list_mapped_files
from rmqdump.store.consumequeue.entries import PRE_BLANK_ENTRY, leading_valid_units
from rmqdump.write.repair.files import _open, _pread_all, _pwrite_all
from rmqdump.write.writer import ensure_store_dir

#: units compared at once while skipping a rebuilt file's placeholders
_COMPARE_UNITS = 4096


def carry_expired_units(store_root: Path, out_root: Path, cq_file_size: int, min_offset: int) -> int:
    """Copy into the rebuilt ``out_root/consumequeue`` each store queue's leading units that point below
    ``min_offset`` (the commitlog's first offset) and come before the first unit the rebuild wrote; returns how
    many units were carried."""
    carried = 0
    if min_offset <= 0:
        return 0
    for ref in discover_queues(store_root):
        if not ref.path.is_dir() or ref.path.is_symlink() or not is_safe_component(ref.topic):
            continue
        files, _ = list_mapped_files(ref.path)
        qdir = out_root / STORE_CONSUMEQUEUE_DIR / ref.topic / str(ref.queue_id)
        stop = _first_rebuilt(qdir, cq_file_size)
        expect = None
        for f in files:
            if f.size != cq_file_size or (expect is not None and f.start != expect) or f.start % cq_file_size:
                break  # not a queue the broker loads as is, or a file missing: the expired prefix ends
            first_unit = f.start // CQ_STORE_UNIT_SIZE
            if stop is not None and first_unit >= stop:
                break
            raw = _read(f.path, cq_file_size)
            n = leading_valid_units(raw, below=min_offset)
            if stop is not None:
                n = min(n, stop - first_unit)
            if n:
                _put(qdir, out_root, ref, f.start, cq_file_size, raw[:n * CQ_STORE_UNIT_SIZE])
                carried += n
            if n * CQ_STORE_UNIT_SIZE < cq_file_size:
                break
            expect = f.start + cq_file_size
    return carried


def _first_rebuilt(qdir: Path, cq_file_size: int) -> int | None:
    """Queue offset of the first unit the rebuild wrote in ``qdir`` (past its placeholders); None: no file."""
    files, _ = list_mapped_files(qdir) if qdir.is_dir() else ([], [])
    if not files:
        return None
    raw = _read(files[0].path, cq_file_size)
    size = len(raw) - len(raw) % CQ_STORE_UNIT_SIZE
    pos, chunk = 0, PRE_BLANK_ENTRY * _COMPARE_UNITS  # the placeholders are a prefix: whole chunks, then units
    while pos + len(chunk) <= size and raw[pos:pos + len(chunk)] == chunk:
        pos += len(chunk)
    while pos < size and raw[pos:pos + CQ_STORE_UNIT_SIZE] == PRE_BLANK_ENTRY:
        pos += CQ_STORE_UNIT_SIZE
    return (files[0].start + pos) // CQ_STORE_UNIT_SIZE


def _read(path: Path, size: int) -> bytes:
    fd = _open(path)
    try:
        return _pread_all(fd, size, 0)
    finally:
        os.close(fd)


def _put(qdir: Path, out_root: Path, ref, start: int, cq_file_size: int, data: bytes) -> None:
    """Write ``data`` at the start of the rebuilt file ``start`` (made, full size, where the rebuild made none)."""
    made: list[Path] = []
    if not qdir.is_dir():
        qdir, made = ensure_store_dir(out_root, STORE_CONSUMEQUEUE_DIR, ref.topic, str(ref.queue_id))
    path = qdir / file_name(start)
    try:
        fd = open_write(path, create=True, read=True)
    except OSError as e:
        raise StoreError(f"cannot open for writing: {e.strerror}", path) from None
    try:
        if os.fstat(fd).st_size < cq_file_size:
            os.ftruncate(fd, cq_file_size)
        _pwrite_all(fd, data, 0)
        fsync_fd(fd, path)
    except OSError as e:
        raise StoreError(f"write failed: {e.strerror}", path) from None
    finally:
        os.close(fd)
    for d in made:
        fsync_dir(d)
