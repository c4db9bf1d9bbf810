"""The ConsumeQueue reader (spec §8.1, §11.5) and ConsumeQueueExt units (§8.2).

Reading is bounded in memory: files are read in chunks with ``os.pread`` and entries are
yielded one by one. Queue offsets are entry numbers (byte offset / unit size). The mapped-file
handling shared with :mod:`~rmqdump.store.consumequeue.batch` is :class:`_QueueBase`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT, STORE_CONSUMEQUEUE_DIR
from rmqdump.disk.evidence import record_read
from rmqdump.disk.fileio import open_read
from rmqdump.errors import FormatError, NotFoundError, StoreError
from rmqdump.store.consumequeue.discovery import (
    MappedFileInfo,
    infer_file_size,
    is_rocksdb_consumequeue,
    list_mapped_files,
)
from rmqdump.store.consumequeue.entries import (
    CqEntry,
    ext_real_offset,
    file_name,
    is_ext_addr,
    leading_valid_units,
    queue_offset_location,
)

#: ConsumeQueue recovery starts at the third-from-last file (``ConsumeQueue.recover``).
RECOVER_FILES_BACK = 3
#: Entries per read chunk (multiple of both unit sizes' natural alignment is not needed).
CHUNK_UNITS = 4096
#: units per read of the recovery scan (whole files of the last few, ~300,000 units each: fewer calls)
RECOVER_CHUNK_UNITS = 16384
#: ... the first of them: a queue's last file is mostly one with few units (an LMQ's), and its zeros are
#: not read beyond the first invalid unit
RECOVER_FIRST_UNITS = 256


def _open_ro(path: Path) -> int:
    try:
        fd = open_read(path, follow=False)
    except OSError as exc:
        raise StoreError(f"cannot open: {exc.strerror}", path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError("not a regular file", path)
    record_read(path)  # --evidence manifest
    return fd


def _pread(path: Path, length: int, offset: int) -> bytes:
    virtual = _virtual_read(path, length, offset)
    if virtual is not None:
        return virtual
    fd = _open_ro(path)
    try:
        return os.pread(fd, length, offset)
    except OSError as exc:
        raise StoreError(f"read failed: {exc.strerror}", path, offset) from None
    finally:
        os.close(fd)


def _iter_file_units(path: Path, unit_size: int, start_pos: int = 0, end_pos: int | None = None,
                     chunk_units: int = CHUNK_UNITS, first_units: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield (position, chunk) pairs of whole units from ``path`` in bounded chunks (of ``chunk_units``;
    ``first_units``: the first chunk's, each next one 4 x larger up to ``chunk_units``)."""
    virtual = _virtual_read(path, (1 << 62 if end_pos is None else end_pos) - start_pos, start_pos)
    if virtual is not None:  # a queue of a RocksDB consume queue
        yield from _iter_bytes_units(virtual, unit_size, start_pos, chunk_units)
        return
    fd = _open_ro(path)
    try:
        most = unit_size * chunk_units
        chunk = most if first_units is None else unit_size * min(first_units, chunk_units)
        pos = start_pos
        while end_pos is None or pos < end_pos:
            want = chunk if end_pos is None else min(chunk, end_pos - pos)
            chunk = min(chunk * 4, most)
            try:
                data = os.pread(fd, want, pos)
            except OSError as exc:
                raise StoreError(f"read failed: {exc.strerror}", path, pos) from None
            usable = len(data) - len(data) % unit_size
            if usable <= 0:
                return
            yield pos, data[:usable]
            if usable < want:
                return
            pos += usable
    finally:
        os.close(fd)


def _virtual_read(path: Path, length: int, offset: int) -> bytes | None:
    """Bytes of a RocksDB CQ queue's virtual file (:mod:`rmqdump.store.rocksdb.queue`); None for a real file."""
    from rmqdump.store.rocksdb.queue import virtual_read

    return virtual_read(path, length, offset)


def _iter_bytes_units(data: bytes, unit_size: int, start_pos: int, chunk_units: int = CHUNK_UNITS
                      ) -> Iterator[tuple[int, bytes]]:
    chunk = unit_size * chunk_units
    usable = len(data) - len(data) % unit_size
    for i in range(0, usable, chunk):
        yield start_pos + i, data[i:min(i + chunk, usable)]


# --- ConsumeQueue reader -------------------------------------------------------------------


@dataclass
class _QueueBase:
    """Shared mapped-file handling for CQ and BCQ."""

    path: Path
    topic: str | None = None
    queue_id: int | None = None
    file_size: int | None = None
    strict: bool = True
    files: list[MappedFileInfo] = field(init=False)
    stray_files: list[Path] = field(init=False)
    problems: list[str] = field(init=False)

    unit_size = CQ_STORE_UNIT_SIZE

    def __post_init__(self) -> None:
        self._recovered: tuple[int, tuple | None] | None = None
        self.path = Path(self.path)
        self._rocks = None
        if self.unit_size == CQ_STORE_UNIT_SIZE and _in_rocksdb_cq(self.path):
            from rmqdump.store.rocksdb.queue import RocksQueue

            self._rocks = RocksQueue(self.path, self.topic, self.queue_id, self.file_size)
            self.file_size = self._rocks.file_size
            self.files, self.stray_files = self._rocks.files(), []
        else:
            self.files, self.stray_files = list_mapped_files(self.path)
        self.problems = []
        self._size_given = self.file_size is not None
        if self.file_size is None:
            self.file_size = infer_file_size(self.files, self.unit_size)
        elif self.file_size <= 0 or self.file_size % self.unit_size:
            raise FormatError(f"file size {self.file_size} is not a positive multiple of {self.unit_size}", self.path)
        self._by_start = {f.start: f for f in self.files}
        self._check_files()

    def _check_files(self) -> None:
        for f in self.files:
            if f.size != self.file_size:
                origin = "given" if self._size_given else f"inferred from {self.files[0].path.name}"
                self._problem(StoreError(f"mapped file is {f.size} bytes, expected {self.file_size} ({origin}); "
                                         "the broker refuses to load such a queue", f.path))
            if self.file_size and f.start % self.file_size:
                self._problem(StoreError(f"file start offset {f.start} is not a multiple of the file size "
                                         f"{self.file_size}", f.path))

    def _problem(self, exc: StoreError) -> None:
        if self.strict:
            raise exc
        self.problems.append(str(exc))

    def missing_files(self) -> list[tuple[int, int]]:
        """Gaps between files: (first missing byte offset, next present file start)."""
        gaps = []
        for a, b in zip(self.files, self.files[1:], strict=False):
            if b.start > a.start + self.file_size:
                gaps.append((a.start + self.file_size, b.start))
        return gaps

    def _recover_scan(self) -> tuple[int, tuple | None]:
        """``recover()``: (processOffset in bytes, last valid unit tuple) from the third-last file."""
        if not self.files:
            return 0, None
        index = max(0, len(self.files) - RECOVER_FILES_BACK)
        last_valid = None
        while True:
            f = self.files[index]
            valid_bytes, unit = self._leading_valid(f)
            if unit is not None:
                last_valid = unit
            if valid_bytes == self.file_size and index + 1 < len(self.files):
                index += 1
                continue
            return f.start + valid_bytes, last_valid

    def _leading_valid(self, f: MappedFileInfo) -> tuple[int, tuple | None]:
        raise NotImplementedError

    def _recover(self) -> tuple[int, tuple | None]:
        """``_recover_scan`` once per queue object (memoised); a RocksDB CQ's offset table."""
        if self._recovered is None:
            self._recovered = self._rocks.recovered() if self._rocks is not None else self._recover_scan()
        return self._recovered


def _in_rocksdb_cq(qdir: Path) -> bool:
    """``qdir`` is ``<root>/consumequeue/<topic>/<queueId>`` of a store whose consume queue is RocksDB."""
    return (qdir.parent.parent.name == STORE_CONSUMEQUEUE_DIR and not qdir.is_dir()
            and is_rocksdb_consumequeue(qdir.parent.parent.parent))


class ConsumeQueue(_QueueBase):
    """Reader of one ``consumequeue/<topic>/<queueId>/`` directory (§8.1).

    ``strict`` (default) raises :class:`StoreError` for files the broker would refuse
    (wrong size, misaligned name); with ``strict=False`` they are listed in ``problems``
    and read as far as their bytes go.
    """

    unit_size = CQ_STORE_UNIT_SIZE

    @classmethod
    def open(cls, store_root: str | os.PathLike, topic: str, queue_id: int, file_size: int | None = None,
             strict: bool = True) -> ConsumeQueue:
        """Open a queue of a store by topic and queue id (NotFoundError if it has no directory or, in a
        RocksDB consume queue, no unit)."""
        if "/" in topic or topic in ("", ".", "..") or "\0" in topic:
            raise NotFoundError(f"invalid topic name {topic!r}")
        qdir = Path(store_root) / STORE_CONSUMEQUEUE_DIR / topic / str(queue_id)
        if is_rocksdb_consumequeue(store_root):
            q = cls(qdir, topic, queue_id, file_size, strict)
            if not q.files:
                raise NotFoundError(f"no consume queue for {topic}/{queue_id} in the RocksDB consume queue", qdir)
            return q
        if not qdir.is_dir() or qdir.is_symlink():
            raise NotFoundError(f"no consume queue for {topic}/{queue_id}", qdir)
        return cls(qdir, topic, queue_id, file_size, strict)

    # -- recovery view --------------------------------------------------------------------
    def _leading_valid(self, f: MappedFileInfo) -> tuple[int, tuple | None]:
        last = None
        valid_end = 0
        for pos, chunk in _iter_file_units(f.path, CQ_STORE_UNIT_SIZE, 0, self.file_size, RECOVER_CHUNK_UNITS,
                                           RECOVER_FIRST_UNITS):
            m = leading_valid_units(chunk)
            if m:
                last = CQ_UNIT.unpack_from(chunk, (m - 1) * CQ_STORE_UNIT_SIZE)
            if m * CQ_STORE_UNIT_SIZE < len(chunk):
                return pos + m * CQ_STORE_UNIT_SIZE, last
            valid_end = pos + len(chunk)
        return valid_end, last

    @property
    def max_offset(self) -> int:
        """``getMaxOffsetInQueue`` after the broker's recovery (start of last file + valid bytes) / 20."""
        return self._recover()[0] // CQ_STORE_UNIT_SIZE

    @property
    def max_physic_offset(self) -> int:
        """``maxPhysicOffset`` the recovery leaves: offset + size of the last valid entry, −1 if none."""
        last = self._recover()[1]
        return -1 if last is None else last[0] + last[1]

    @property
    def truncated_files(self) -> list[MappedFileInfo]:
        """Files the broker's recovery would delete (they start after the recovered end)."""
        end = self._recover()[0]
        return [f for f in self.files if f.start > end]

    def min_offset(self, commit_log_min_offset: int = 0) -> int:
        """``correctMinOffset``: first entry of the first file with offset >= commitlog min.

        Only the readable (valid) part of the first file is scanned; if nothing qualifies
        the broker keeps its initial value, 0.
        """
        if self._rocks is not None:
            return self._rocks.min_offset(commit_log_min_offset)
        if not self.files:
            return 0
        first = self.files[0]
        readable = min(self.file_size, max(0, self._recover()[0] - first.start))
        for pos, chunk in _iter_file_units(first.path, CQ_STORE_UNIT_SIZE, 0, readable):
            for i, (off, _size, _tags) in enumerate(CQ_UNIT.iter_unpack(chunk)):
                if off >= commit_log_min_offset:
                    return (first.start + pos + i * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
        return 0

    # -- entries ---------------------------------------------------------------------------
    def entry_at(self, queue_offset: int, check_max: bool = True) -> CqEntry:
        """The entry at ``queue_offset`` in O(1). NotFoundError outside [0, max) or with no file."""
        if queue_offset < 0:
            raise NotFoundError(f"negative queue offset {queue_offset}", self.path)
        if check_max and queue_offset >= self.max_offset:
            raise NotFoundError(f"queue offset {queue_offset} >= max offset {self.max_offset}", self.path)
        if not self.file_size:
            raise NotFoundError("queue has no files", self.path)
        start, pos = queue_offset_location(queue_offset, self.file_size)
        f = self._by_start.get(start)
        if f is None:
            raise NotFoundError(f"no file {file_name(start)} for queue offset {queue_offset}", self.path)
        data = _pread(f.path, CQ_STORE_UNIT_SIZE, pos)
        if len(data) < CQ_STORE_UNIT_SIZE:
            raise FormatError(f"file ends inside the entry of queue offset {queue_offset}", f.path, pos)
        return CqEntry(queue_offset, *CQ_UNIT.unpack(data))

    def iter_raw(self, start: int = 0) -> Iterator[CqEntry]:
        """Every unit of every file (valid or not), from queue offset ``start``, in file order."""
        for base, chunk in self.raw_chunks(start):
            for i, unit in enumerate(CQ_UNIT.iter_unpack(chunk)):
                yield CqEntry(base + i, *unit)

    def raw_chunks(self, start: int = 0, chunk_units: int = CHUNK_UNITS) -> Iterator[tuple[int, bytes]]:
        """The bytes behind :meth:`iter_raw`: (queue offset of the first unit, whole units), in bounded chunks."""
        for f in self.files:
            file_end = f.start + min(f.size, self.file_size)
            begin = max(start * CQ_STORE_UNIT_SIZE, f.start)
            if begin >= file_end:
                continue
            for pos, chunk in _iter_file_units(f.path, CQ_STORE_UNIT_SIZE, begin - f.start, self.file_size,
                                               chunk_units):
                yield (f.start + pos) // CQ_STORE_UNIT_SIZE, chunk

    def iter_entries(self, start: int | None = None, stop: int | None = None) -> Iterator[CqEntry]:
        """Entries in [start, stop) clipped to [first file start, max_offset): the broker's view.

        Invalid units inside that range (possible only before the recovery window) are
        yielded too; check ``entry.is_valid``.
        """
        for base, chunk in self.entry_chunks(start, stop):
            for i, unit in enumerate(CQ_UNIT.iter_unpack(chunk)):
                yield CqEntry(base + i, *unit)

    def entry_chunks(self, start: int | None = None, stop: int | None = None,
                     chunk_units: int = CHUNK_UNITS) -> Iterator[tuple[int, bytes]]:
        """The bytes behind :meth:`iter_entries`: (queue offset of the first unit, whole units), bounded chunks."""
        end = self.max_offset if stop is None else min(stop, self.max_offset)
        first = self.files[0].start // CQ_STORE_UNIT_SIZE if self.files else 0
        if self._rocks is not None:  # a RocksDB queue starts at its first unit, not at its first file's start
            first = max(first, self._rocks.start)
        begin = first if start is None else max(start, first)
        if begin >= end:
            return
        for base, chunk in self.raw_chunks(begin, chunk_units):
            if base >= end:
                return
            yield base, chunk[:(end - base) * CQ_STORE_UNIT_SIZE]

    def holes(self) -> Iterator[CqEntry]:
        """Invalid units below ``max_offset`` (never produced by a healthy broker)."""
        return (e for e in self.iter_entries() if not e.is_valid)

    def entries(self) -> list[CqEntry]:
        """All entries of :meth:`iter_entries` as a list (only when asked)."""
        return list(self.iter_entries())


# --- ConsumeQueueExt units (optional) ---------------------------------------------------------


class CqExtUnit(NamedTuple):
    """One ConsumeQueueExt unit (§8.2)."""

    size: int
    tags_code: int
    msg_store_time: int
    bitmap: bytes


def read_ext_unit(ext_queue_dir: str | os.PathLike, address_or_offset: int, file_size: int) -> CqExtUnit:
    """Read the ext unit at a CQ ext address (or already un-decorated real offset)."""
    real = ext_real_offset(address_or_offset) if is_ext_addr(address_or_offset) else address_or_offset
    start, pos = real - real % file_size, real % file_size
    path = Path(ext_queue_dir) / file_name(start)
    head = _pread(path, 20, pos)
    if len(head) < 20:
        raise FormatError("ext unit header past end of file", path, pos)
    size = int.from_bytes(head[0:2], "big", signed=True)
    tags = int.from_bytes(head[2:10], "big", signed=True)
    store_time = int.from_bytes(head[10:18], "big", signed=True)
    bitmap_size = int.from_bytes(head[18:20], "big", signed=True)
    if size < 20 or bitmap_size < 0 or size != 20 + bitmap_size:
        raise FormatError(f"bad ext unit (size {size}, bitmap {bitmap_size})", path, pos)
    bitmap = _pread(path, bitmap_size, pos + 20) if bitmap_size else b""
    if len(bitmap) < bitmap_size:
        raise FormatError("ext unit bitmap past end of file", path, pos)
    return CqExtUnit(size, tags, store_time, bitmap)
