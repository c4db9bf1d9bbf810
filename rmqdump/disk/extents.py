"""Where a file may hold non-zero bytes: its data extents (``SEEK_DATA``/``SEEK_HOLE`` skip the holes of a
sparse file without reading them) and, inside them, the chunks that are not all zeros.

RocketMQ creates its mapped files sparse (``setLength``): a consume-queue file of 300,000 units with a few
entries is one 4 KiB block of data. Reading such a file's zeros costs its whole length per file; asking the
filesystem costs two system calls. Where the filesystem cannot say, the whole range is data.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

#: bytes per read while looking for non-zero bytes (one reused comparison buffer of this size)
CHUNK = 1 << 20
#: ``CHUNK`` zero bytes (the comparison buffer; the evidence hash feeds holes from it)
ZEROS = bytes(CHUNK)


def data_extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(first, end) byte ranges of ``fd`` within [start, end) that may hold data, in order."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno != errno.ENXIO:  # the filesystem cannot say: all of it may be data
                yield pos, end
            return  # ENXIO: only a hole remains
        if data >= end:
            return
        try:
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        except OSError:
            hole = end
        hole = min(max(hole, data + 1), end)
        yield max(data, pos), hole
        pos = hole


def is_zero(chunk: bytes) -> bool:
    """All bytes zero: a memcmp against zeros (~30 x faster than ``count(0)`` or ``strip``)."""
    n = len(chunk)
    if n > CHUNK:
        return all(is_zero(chunk[i:i + CHUNK]) for i in range(0, n, CHUNK))
    return chunk == (ZEROS if n == CHUNK else ZEROS[:n])


def nonzero_end(data: bytes) -> int:
    """Length of ``data`` without its trailing zeros: zero blocks skipped from the end (64 KiB, then 4 KiB,
    each a memcmp), the last non-zero block stripped."""
    end = len(data)
    for step in (65536, 4096):
        while end > 0 and is_zero(data[max(0, end - step):end]):
            end = max(0, end - step)
    lo = max(0, end - 4096)
    return lo + len(data[lo:end].rstrip(b"\0"))


def nonzero_chunks(fd: int, start: int, end: int, chunk: int = CHUNK) -> Iterator[tuple[int, bytes]]:
    """(position, bytes) of the chunks of ``fd[start:end]``'s data extents that hold a non-zero byte; reads
    stop at the end of the file. Chunks are ``chunk`` bytes from each extent's start (the last shorter)."""
    for a, b in data_extents(fd, start, end):
        p = a
        while p < b:
            data = os.pread(fd, min(chunk, b - p), p)
            if not data:
                return
            if not is_zero(data):
                yield p, data
            p += len(data)
