"""File helpers of the repair: whole reads and writes, copies of data extents, hashes, byte diffs."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from rmqdump.disk.durable import open_write
from rmqdump.disk.extents import nonzero_chunks
from rmqdump.disk.fileio import open_read
from rmqdump.errors import StoreError
from rmqdump.write.repair.model import _CHUNK


def _open(path: Path, flags: int = os.O_RDONLY) -> int:
    """``flags`` O_RDONLY or O_RDWR; never through a symlink, a regular file only (StoreError)."""
    if flags not in (os.O_RDONLY, os.O_RDWR):
        raise ValueError(f"_open: flags must be O_RDONLY or O_RDWR, not {flags:#o}")
    try:
        fd = open_write(path, read=True) if flags == os.O_RDWR else open_read(path, follow=False, nonblock=False)
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError("not a regular file", path)
    return fd


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < length:
        chunk = os.pread(fd, min(_CHUNK, length - len(out)), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def sha256_range(path: Path, offset: int, length: int) -> str:
    h = hashlib.sha256()
    fd = _open(path)
    try:
        done = 0
        while done < length:
            chunk = os.pread(fd, min(_CHUNK, length - done), offset + done)
            if not chunk:
                raise StoreError(f"file ends inside the range [{offset}, {offset + length})", path)
            h.update(chunk)
            done += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_range(path, 0, os.stat(path, follow_symlinks=False).st_size)


def _zero_sha(length: int) -> str:
    h = hashlib.sha256()
    z = bytes(min(_CHUNK, length))
    done = 0
    while done < length:
        n = min(len(z), length - done)
        h.update(z[:n])
        done += n
    return h.hexdigest()


def _copy_extents(src: Path, dst_fd: int) -> None:
    """Copy the non-zero chunks of ``src`` into ``dst_fd`` at the same positions."""
    fd = _open(src)
    try:
        for p, chunk in nonzero_chunks(fd, 0, os.fstat(fd).st_size):
            _pwrite_all(dst_fd, chunk, p)
    finally:
        os.close(fd)


def diff_files(original: Path, staged: Path, unit: int = 4096) -> list[tuple[int, bytes]]:
    """Byte ranges (offset, new bytes) where ``staged`` differs from ``original`` (same size)."""
    out: list[tuple[int, bytes]] = []
    fa, fb = _open(original), _open(staged)
    try:
        size = os.fstat(fa).st_size
        if os.fstat(fb).st_size != size:
            raise StoreError("staged file differs in size", staged)
        pos = 0
        while pos < size:
            n = min(_CHUNK, size - pos)
            a, b = os.pread(fa, n, pos), os.pread(fb, n, pos)
            if a != b:
                for i in range(0, n, unit):
                    if a[i:i + unit] != b[i:i + unit]:
                        piece = b[i:i + unit]
                        if out and out[-1][0] + len(out[-1][1]) == pos + i:
                            out[-1] = (out[-1][0], out[-1][1] + piece)
                        else:
                            out.append((pos + i, piece))
            pos += n
    finally:
        os.close(fa)
        os.close(fb)
    return out


def _writes_from_overlay(original: bytes, base: int, final: bytes, unit: int) -> list[tuple[int, bytes]]:
    """Ranges where ``final`` differs from ``original`` (both starting at file position ``base``)."""
    out: list[tuple[int, bytes]] = []
    for i in range(0, len(final), unit):
        if original[i:i + unit] != final[i:i + unit]:
            piece = final[i:i + unit]
            if out and out[-1][0] + len(out[-1][1]) == base + i:
                out[-1] = (out[-1][0], out[-1][1] + piece)
            else:
                out.append((base + i, piece))
    return out


def _nonzero_pieces(buf: bytearray, unit: int = 4096) -> list[tuple[int, bytes]]:
    """The ``unit``-aligned runs of ``buf`` holding a non-zero byte, as (offset, bytes)."""
    runs: list[list[int]] = []
    view = memoryview(buf)
    zeros = bytes(unit)
    for off in range(0, len(buf), unit):
        chunk = view[off:off + unit]
        if chunk == zeros[:len(chunk)]:
            continue
        if runs and runs[-1][1] == off:
            runs[-1][1] = min(off + unit, len(buf))
        else:
            runs.append([off, min(off + unit, len(buf))])
    return [(a, bytes(view[a:b])) for a, b in runs]


def _merge_units(units: dict[int, bytes]) -> list[tuple[int, bytes]]:
    pieces: list[tuple[int, bytes]] = []
    for pos in sorted(units):
        if pieces and pieces[-1][0] + len(pieces[-1][1]) == pos:
            pieces[-1] = (pieces[-1][0], pieces[-1][1] + units[pos])
        else:
            pieces.append((pos, units[pos]))
    return pieces


def _size(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError as e:
        raise StoreError(f"cannot stat: {e.strerror}", path) from None


def _blank(length: int) -> bytes:
    from rmqdump.codec.encoder import encode_blank

    return encode_blank(length)
