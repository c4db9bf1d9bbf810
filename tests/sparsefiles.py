"""Sparse files as RocketMQ creates its queue files (``setLength``), for the tests of code that skips their
holes: write one, skip where the filesystem cannot report holes, count the bytes a call reads."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def write_sparse(path: Path, size: int, pieces: dict[int, bytes], sparse: bool = True) -> Path:
    """A ``size``-byte file holding ``pieces`` (position -> bytes) and zeros: holes, or zeros written."""
    with open(path, "wb") as f:
        if not sparse:
            f.write(bytes(size))
        f.truncate(size)
        for pos, data in pieces.items():
            f.seek(pos)
            f.write(data)
    return path


def require_holes(path: Path) -> None:
    """Skip the test unless the filesystem reports ``path``'s holes (``SEEK_HOLE`` before its end)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        holes = os.lseek(fd, 0, os.SEEK_HOLE) < os.fstat(fd).st_size
    except OSError:
        holes = False
    finally:
        os.close(fd)
    if not holes:
        pytest.skip("this filesystem does not report holes (SEEK_HOLE): every byte may be data")


def count_reads(monkeypatch) -> Callable[[], int]:
    """Count the bytes ``os.pread`` and ``os.preadv`` return from now on; returns a reader of the count and
    its reset (``count(reset=True)``)."""
    read = 0
    pread, preadv = os.pread, os.preadv

    def counting(fd, n, off):
        nonlocal read
        data = pread(fd, n, off)
        read += len(data)
        return data

    def counting_v(fd, bufs, off):
        nonlocal read
        n = preadv(fd, bufs, off)
        read += n
        return n

    def count(reset: bool = False) -> int:
        nonlocal read
        n = read
        if reset:
            read = 0
        return n

    monkeypatch.setattr(os, "pread", counting)
    monkeypatch.setattr(os, "preadv", counting_v)
    return count
