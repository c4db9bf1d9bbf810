"""Segment access: one mapped file = one segment named by its 20-digit start offset.

Two readers share one interface: :class:`MmapReader` (default, zero-copy) and
:class:`PreadReader` (``--no-mmap``: safe on a live store, where a file truncated under a
mapping would kill the process with SIGBUS). Both hand out ``(buffer, index)`` pairs so the
decoder unpacks in place; the pread reader reuses one window buffer.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import FILE_NAME_DIGITS
from rmqdump.disk.evidence import record_read
from rmqdump.disk.fileio import open_regular
from rmqdump.errors import StoreError

DEFAULT_WINDOW = 4 * 1024 * 1024


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: 20-digit zero-padded decimal."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


#: ``Long.MAX_VALUE``: the broker parses mapped-file names with ``Long.parseLong``
JAVA_LONG_MAX = (1 << 63) - 1


def parse_file_name(name: str) -> int | None:
    """Start offset encoded in a 20-digit mapped-file name, or None if it is not one (also when the
    digits exceed ``Long.MAX_VALUE``: see :func:`name_out_of_range`)."""
    if len(name) == FILE_NAME_DIGITS and name.isascii() and name.isdigit():
        start = int(name)
        return start if start <= JAVA_LONG_MAX else None
    return None


def name_out_of_range(name: str) -> bool:
    """A 20-digit name above ``Long.MAX_VALUE``: ``Long.parseLong`` throws on it when the broker loads."""
    return len(name) == FILE_NAME_DIGITS and name.isascii() and name.isdigit() and int(name) > JAVA_LONG_MAX


def java_parses_name(name: str) -> bool:
    """Whether ``Long.parseLong`` accepts ``name`` (ASCII digits up to ``Long.MAX_VALUE``; the broker
    loads such a file whatever its length)."""
    return name.isascii() and name.isdigit() and int(name) <= JAVA_LONG_MAX


@dataclass(frozen=True)
class Segment:
    """One mapped file of an offset space."""

    path: Path
    start: int
    size: int  # its size when listed (capped at the store's file size): readers never read past it
    name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.path.name)

    @property
    def end(self) -> int:
        return self.start + self.size

    def open(self, use_mmap: bool = True) -> SegmentReader:
        return MmapReader(self) if use_mmap and self.size > 0 else PreadReader(self)


class SegmentReader:
    """Read-only access to one segment's bytes."""

    segment: Segment
    size: int

    def view(self, pos: int, n: int) -> tuple[object, int, int]:
        """Return ``(buf, index, available)``: bytes ``[pos, pos+available)`` of the segment
        are ``buf[index:index+available]``, ``available = min(n, size - pos)``."""
        raise NotImplementedError

    def read(self, pos: int, n: int) -> bytes:
        """Copy of up to ``n`` bytes at ``pos`` (fewer at the end of the segment)."""
        buf, i, avail = self.view(pos, n)
        return bytes(memoryview(buf)[i:i + avail])

    def release(self, upto: int) -> None:
        """Hint that bytes before ``upto`` will not be read again (drops mapped pages from RSS)."""

    def next_data(self, pos: int) -> int | None:
        """The first position >= ``pos`` that may hold data (``SEEK_DATA``: holes of a sparse file are
        skipped without reading them), None when only holes remain; ``pos`` where the filesystem cannot say."""
        if pos >= self.size:
            return None
        try:
            fd = open_regular(self.segment.path)
        except StoreError:
            return pos
        try:
            nxt = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            return None if e.errno == errno.ENXIO else pos
        finally:
            os.close(fd)
        return nxt if nxt < self.size else None

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_ro(path: Path) -> int:
    fd = open_regular(path)  # O_NONBLOCK + regular-file check: a FIFO "segment" must not hang us
    record_read(path)  # --evidence manifest
    return fd


class MmapReader(SegmentReader):
    """Zero-copy reader over a read-only mapping of the whole file."""

    def __init__(self, segment: Segment):
        self.segment = segment
        self._released = 0
        fd = _open_ro(segment.path)
        try:
            self.size = min(os.fstat(fd).st_size, segment.size)
            self.mm = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ) if self.size else b""
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot map: {e}", segment.path) from None
        finally:
            os.close(fd)
        if self.size and hasattr(self.mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            try:
                self.mm.madvise(mmap.MADV_SEQUENTIAL)
            except OSError:
                pass

    def view(self, pos: int, n: int):
        avail = max(0, min(n, self.size - pos))
        return self.mm, pos, avail

    def release(self, upto: int) -> None:
        """MADV_DONTNEED the walked part: the page cache keeps the data, our RSS stays bounded."""
        end = min(upto, self.size) & ~(mmap.PAGESIZE - 1)
        if end > self._released and hasattr(mmap, "MADV_DONTNEED") and isinstance(self.mm, mmap.mmap):
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            except (OSError, ValueError):
                return
            self._released = end

    def close(self) -> None:
        if isinstance(self.mm, mmap.mmap):
            try:
                self.mm.close()
            except BufferError:  # a caller still holds a view; the mapping dies with it
                pass


class PreadReader(SegmentReader):
    """Reader through ``os.preadv`` into one reusable window buffer.

    The segment size is re-read from the open descriptor on every refill, so a file that
    shrinks under us reads as a shorter file instead of raising SIGBUS.
    """

    def __init__(self, segment: Segment, window: int = DEFAULT_WINDOW):
        self.segment = segment
        self.fd = _open_ro(segment.path)
        self.size = min(os.fstat(self.fd).st_size, segment.size)
        self.buf = bytearray(min(window, max(self.size, 1)))
        self.win_start = 0
        self.win_len = 0

    def view(self, pos: int, n: int):
        if pos >= self.win_start and pos + n <= self.win_start + self.win_len:
            return self.buf, pos - self.win_start, n
        self.size = min(os.fstat(self.fd).st_size, self.segment.size)
        want = min(n, max(0, self.size - pos))
        if want > len(self.buf):
            self.buf = bytearray(want)
        fill = min(len(self.buf), max(0, self.size - pos))
        got = os.preadv(self.fd, [memoryview(self.buf)[:fill]], pos) if fill else 0
        self.win_start, self.win_len = pos, got
        return self.buf, 0, min(want, got)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
