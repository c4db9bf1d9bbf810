"""Segment access: one mapped file = one segment named by its 20-digit start offset.

Two readers share one interface: :class:`MmapReader` (default, zero-copy) and
:class:`PreadReader` (``--no-mmap``: safe on a live store, where a file truncated under a
mapping would kill the process with SIGBUS). Both hand out ``(buffer, index)`` pairs so the
decoder unpacks in place; the pread reader reuses one window buffer.
"""

from __future__ import annotations

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


def parse_file_name(name: str) -> int | None:
    """Start offset encoded in a 20-digit mapped-file name, or None if it is not one."""
    if len(name) == FILE_NAME_DIGITS and name.isascii() and name.isdigit():
        return int(name)
    return None


@dataclass(frozen=True)
class Segment:
    """One mapped file of an offset space."""

    path: Path
    start: int
    size: int  # actual size on disk
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
            self.size = os.fstat(fd).st_size
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
        self.size = os.fstat(self.fd).st_size
        self.buf = bytearray(min(window, max(self.size, 1)))
        self.win_start = 0
        self.win_len = 0

    def view(self, pos: int, n: int):
        if pos >= self.win_start and pos + n <= self.win_start + self.win_len:
            return self.buf, pos - self.win_start, n
        self.size = os.fstat(self.fd).st_size
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
