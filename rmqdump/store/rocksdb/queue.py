"""One queue of a RocksDB consume queue seen as the file CQ's mapped files, so every file-CQ reader,
check and lookup works on it unchanged (:class:`~rmqdump.store.consumequeue.ConsumeQueue` asks here).

A queue ``consumequeue/<topic>/<queueId>`` has no directory in a RocksDB store. Its units are laid out as
the file CQ would hold them: virtual files of the queue's file size (``mappedFileSizeConsumeQueue``,
300,000 units by default), named by their start offset, each unit the first 20 bytes of its RocksDB value
(commitLogOffset, size, tagsCode), zeros where a key is missing, the last file ending after its last unit.
Reads of those paths are served from the database (:func:`virtual_read`), one file at a time.

What differs from a file CQ is the broker's view, taken from the offset table as
``RocksDBConsumeQueueStore`` does: the max offset is the ``max`` entry's cqOffset + 1 (no scan; units past
it are the ones its recovery drops), the min offset the ``min`` entry's cqOffset, moved past units whose
commitlog offset is below the commitlog minimum (``correctMinCqOffset``).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, MAPPED_FILE_SIZE_CONSUME_QUEUE
from rmqdump.store.consumequeue.discovery import MappedFileInfo
from rmqdump.store.consumequeue.entries import file_name
from rmqdump.store.rocksdb.cq import FILE_UNIT_SIZE, RocksConsumeQueues, queue_prefix

_SOURCES: weakref.WeakValueDictionary[str, RocksQueue] = weakref.WeakValueDictionary()
_STORES: dict[str, RocksConsumeQueues] = {}


def _store(root: Path) -> RocksConsumeQueues:
    key = os.path.realpath(root)
    rq = _STORES.get(key)
    if rq is None:
        rq = _STORES[key] = RocksConsumeQueues(root)
    return rq


class RocksQueue:
    """The units of one queue of a RocksDB CQ, as virtual mapped files (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, topic: str | None, queue_id: int | None, file_size: int | None):
        self.path = Path(path)
        self.topic = topic if topic is not None else self.path.parent.name
        self.queue_id = queue_id if queue_id is not None else int(self.path.name)
        self.file_size = file_size or MAPPED_FILE_SIZE_CONSUME_QUEUE
        self.store = _store(self.path.parent.parent.parent)
        self.first, self.max = self.store.bounds(self.topic, self.queue_id)
        prefix = queue_prefix(self.topic, self.queue_id)
        first_key = self.store.db.seek_keys("default", prefix)
        last_key = self.store.db.last_key_before("default", prefix + b"\xff" * 8)
        n = len(prefix) + 8
        self.lowest = int.from_bytes(first_key[-8:], "big") if first_key and first_key[:-8] == prefix and \
            len(first_key) == n else None
        self.highest = int.from_bytes(last_key[-8:], "big") if last_key and last_key[:-8] == prefix and \
            len(last_key) == n else None
        self._cached: tuple[int, bytes] | None = None

    @property
    def start(self) -> int:
        """The first unit's cqOffset (the offset table's min when the queue has no unit)."""
        return self.lowest if self.lowest is not None else self.first

    def files(self) -> list[MappedFileInfo]:
        """The virtual files covering every unit and the offset table's range."""
        per = self.file_size // CQ_STORE_UNIT_SIZE
        lo = min(x for x in (self.first, self.lowest) if x is not None)
        hi = max(self.max, (self.highest + 1) if self.highest is not None else 0)
        if hi <= lo:
            return []
        out = []
        for i in range(lo // per, (hi - 1) // per + 1):
            start = i * self.file_size
            p = self.path / file_name(start)
            _SOURCES[os.fspath(p)] = self
            out.append(MappedFileInfo(start, p, self.file_size))
        return out

    def file_bytes(self, start: int) -> bytes:
        """The bytes of the virtual file at byte ``start``: its units up to its last present one."""
        if self._cached is not None and self._cached[0] == start:
            return self._cached[1]
        per = self.file_size // CQ_STORE_UNIT_SIZE
        base = start // CQ_STORE_UNIT_SIZE
        run = self.store.contiguous_values(self.topic, self.queue_id, base, base + per)
        if run is not None:  # no key missing: one join
            first, values = run
            data = bytes((first - base) * CQ_STORE_UNIT_SIZE) + b"".join([v[:FILE_UNIT_SIZE] for v in values])
        else:
            buf = bytearray()
            for off, value in self.store.unit_rows(self.topic, self.queue_id, base, base + per):
                pos = (off - base) * CQ_STORE_UNIT_SIZE
                if pos > len(buf):
                    buf.extend(bytes(pos - len(buf)))
                buf.extend(value[:FILE_UNIT_SIZE])
            data = bytes(buf)
        self._cached = (start, data)
        return data

    def unit(self, cq_offset: int) -> tuple[int, int, int] | None:
        """(commitLogOffset, size, tagsCode) of a unit, None if it has no key."""
        for _, v in self.store.units(self.topic, self.queue_id, cq_offset, cq_offset + 1):
            return (int.from_bytes(v[:8], "big", signed=True), int.from_bytes(v[8:12], "big", signed=True),
                    int.from_bytes(v[12:20], "big", signed=True))
        return None

    def recovered(self) -> tuple[int, tuple | None]:
        """(max offset in bytes, the unit at max - 1): the broker's view from the offset table."""
        last = self.unit(self.max - 1) if self.max > 0 else None
        return self.max * CQ_STORE_UNIT_SIZE, last

    def min_offset(self, commit_log_min_offset: int = 0) -> int:
        """``getMinOffsetInQueue``: the ``min`` entry, past units below the commitlog minimum."""
        for off, v in self.store.units(self.topic, self.queue_id, self.first, self.max):
            if int.from_bytes(v[:8], "big", signed=True) >= commit_log_min_offset:
                return off
        return self.first if self.max <= self.first else self.max


def virtual_read(path: str | os.PathLike, length: int, offset: int) -> bytes | None:
    """``pread`` of a virtual CQ file; None if ``path`` is no virtual file (a real file: read it)."""
    src = _SOURCES.get(os.fspath(path))
    if src is None:
        return None
    start = int(Path(path).name)
    return src.file_bytes(start)[offset:offset + length]


def close_stores() -> None:
    """Forget the opened RocksDB consume queues (tests; the databases stay open until close_all)."""
    _STORES.clear()
