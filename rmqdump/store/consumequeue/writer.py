"""The ConsumeQueue writer: appends CQ units to one queue directory like the broker's
``putMessagePositionInfo`` (spec §11.5)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT
from rmqdump.disk.durable import fsync_raw, open_write
from rmqdump.disk.fileio import open_dir
from rmqdump.errors import FormatError, StoreError
from rmqdump.store.consumequeue.entries import PRE_BLANK_ENTRY, encode_cq_entry, file_name
from rmqdump.store.consumequeue.reader import CHUNK_UNITS, ConsumeQueue


class ConsumeQueueWriter:
    """Appends CQ units to one queue dir, creating full-size zero-filled files as needed.

    Mirrors ``putMessagePositionInfo``: the write position starts at the recovered end of
    the queue; a queue created for a non-zero first offset is pre-blank filled. Call
    :meth:`fsync` before relying on the data; :meth:`close` does not sync.
    """

    def __init__(self, queue_dir: str | os.PathLike, file_size: int):
        if file_size <= 0 or file_size % CQ_STORE_UNIT_SIZE:
            raise FormatError(f"file size {file_size} is not a positive multiple of {CQ_STORE_UNIT_SIZE}")
        self.path = Path(queue_dir)
        self.file_size = file_size
        self.path.mkdir(parents=True, exist_ok=True)
        reader = ConsumeQueue(self.path, file_size=file_size)
        self.write_offset = reader._recover()[0]  # bytes
        self.max_physic_offset = reader.max_physic_offset
        self._has_files = bool(reader.files)
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._dir_dirty = True  # the directory may have unsynced entries: fsynced once, then after a file is created

    @property
    def next_queue_offset(self) -> int:
        return self.write_offset // CQ_STORE_UNIT_SIZE

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is not None:
            return fd
        path = self.path / file_name(start)
        try:
            fd = open_write(path, read=True, create=True, exclusive=True)
            self._dir_dirty = True
            os.ftruncate(fd, self.file_size)
        except FileExistsError:
            fd = open_write(path, read=True)
            if os.fstat(fd).st_size != self.file_size:
                os.close(fd)
                raise StoreError(f"existing file is not {self.file_size} bytes", path) from None
        except OSError as exc:
            raise StoreError(f"cannot create: {exc.strerror}", path) from None
        self._fds[start] = fd
        self._has_files = True
        return fd

    def _write_at(self, logical: int, data: bytes) -> None:
        start, pos = logical - logical % self.file_size, logical % self.file_size
        try:
            os.pwrite(self._fd(start), data, pos)
        except OSError as exc:
            raise StoreError(f"write failed: {exc.strerror}", self.path / file_name(start), pos) from None
        self._dirty.add(start)

    def append(self, offset: int, size: int, tags_code: int) -> int:
        """Append one unit at the write position; returns its queue offset."""
        data = encode_cq_entry(offset, size, tags_code)
        q = self.next_queue_offset
        self._write_at(self.write_offset, data)
        self.write_offset += CQ_STORE_UNIT_SIZE
        self.max_physic_offset = offset + size
        return q

    def put_message_position_info(self, offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """The broker's write rule; False when the unit is skipped (already built / duplicate)."""
        if offset + size <= self.max_physic_offset:
            return False
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        if not self._has_files and expect != 0:
            self._fill_pre_blank(expect)
        if expect < self.write_offset:
            return False
        self.append(offset, size, tags_code)
        return True

    def put_many(self, units: Sequence[int]) -> int:
        """:meth:`put_message_position_info` for many units, one ``pwrite`` per file touched.

        ``units`` is flat: offset, size, tagsCode, queue offset, offset, ... Same bytes and
        the same skips as the one-unit calls in order; returns how many units were written.
        """
        n = len(units)
        i = first = 0
        if not self._has_files:  # a new queue: the first unit decides the pre-blank fill
            while i < n and not self._has_files:
                first += self.put_message_position_info(units[i], units[i + 1], units[i + 2], units[i + 3])
                i += 4
        start = self.write_offset
        w = start
        maxp = self.max_physic_offset
        out = bytearray()
        pack = CQ_UNIT.pack
        try:
            while i < n:
                offset, size, tags_code, queue_offset = units[i:i + 4]
                i += 4
                if offset + size <= maxp or queue_offset * CQ_STORE_UNIT_SIZE < w:
                    continue
                out += pack(offset, size, tags_code)
                w += CQ_STORE_UNIT_SIZE
                maxp = offset + size
        except Exception:  # struct.error: the one-unit encoder names the unit
            encode_cq_entry(offset, size, tags_code)
            raise
        self.append_encoded(out, maxp)
        return first + (w - start) // CQ_STORE_UNIT_SIZE

    def append_encoded(self, units: bytes | bytearray, max_physic_offset: int) -> None:
        """Write encoded units at the write position, one ``pwrite`` per file touched; the caller has
        applied the write rule to each (none is skipped) and ``max_physic_offset`` is the last one's end."""
        if len(units) % CQ_STORE_UNIT_SIZE:
            raise FormatError(f"{len(units)} bytes are not whole {CQ_STORE_UNIT_SIZE}-byte units")
        view = memoryview(units)
        pos = self.write_offset
        while view:
            chunk = view[:self.file_size - pos % self.file_size]
            self._write_at(pos, chunk)
            view = view[len(chunk):]
            pos += len(chunk)
        if units:
            self.write_offset = pos
            self.max_physic_offset = max_physic_offset

    def _fill_pre_blank(self, expect: int) -> None:
        start = expect - expect % self.file_size
        self.write_offset = start
        self._fd(start)
        count = (expect - start) // CQ_STORE_UNIT_SIZE
        for i in range(0, count, CHUNK_UNITS):
            n = min(CHUNK_UNITS, count - i)
            self._write_at(self.write_offset, PRE_BLANK_ENTRY * n)
            self.write_offset += n * CQ_STORE_UNIT_SIZE

    def fsync(self) -> None:
        """fsync every file written to, and the queue directory if a file was created in it."""
        for start in sorted(self._dirty):
            fsync_raw(self._fds[start])
        self._dirty.clear()
        if not self._dir_dirty:
            return
        self._dir_dirty = False
        dfd = open_dir(self.path)
        try:
            fsync_raw(dfd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(dfd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> ConsumeQueueWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
