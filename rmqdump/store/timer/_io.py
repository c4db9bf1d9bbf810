"""Bounded reads of the timer store's binary files (regular files only, never blocking)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rmqdump.disk.evidence import record_read
from rmqdump.disk.fileio import open_regular
from rmqdump.errors import StoreError


class RegularFile:
    """A regular file opened read-only: its size and positioned reads (StoreError on failure)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.fd = open_regular(self.path, follow=False)
        try:
            self.size = os.fstat(self.fd).st_size
        except OSError as e:
            os.close(self.fd)
            raise StoreError(f"cannot stat: {e.strerror}", self.path) from None
        record_read(self.path)

    def read(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (fewer at the end of the file)."""
        chunks, got = [], 0
        try:
            while got < n:
                chunk = os.pread(self.fd, min(n - got, 1 << 20), pos + got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as e:
            raise StoreError(f"read failed: {e.strerror}", self.path, pos + got) from None
        return b"".join(chunks)

    def data_chunks(self, limit: int, chunk: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """(position, bytes) of the first ``limit`` bytes, skipping holes of a sparse file (SEEK_DATA)."""
        pos = 0
        end = min(limit, self.size)
        seek_data = getattr(os, "SEEK_DATA", None)
        while pos < end:
            if seek_data is not None:
                try:
                    pos = os.lseek(self.fd, pos, seek_data)
                except OSError:  # ENXIO: only a hole is left
                    return
                if pos >= end:
                    return
                pos -= pos % 32
            data = self.read(pos, min(chunk, end - pos))
            if not data:
                return
            yield pos, data
            pos += len(data)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> RegularFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
