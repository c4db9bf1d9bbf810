"""The store ``checkpoint`` file (spec §10.1): read, derive, render, encode and write."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rmqdump.codec.layout import (
    CHECKPOINT,
    CHECKPOINT_FILE_SIZE,
    CHECKPOINT_MIN_TIMESTAMP_MARGIN_MS,
    STORE_CHECKPOINT_FILE,
)
from rmqdump.disk.durable import fsync_raw, open_write
from rmqdump.disk.evidence import record_read
from rmqdump.disk.fileio import open_read
from rmqdump.errors import FormatError, StoreError

#: bytes a 4.x broker reads (physic, logics, index timestamps)
CHECKPOINT_MIN_SIZE = 24


@dataclass(frozen=True)
class Checkpoint:
    """The five checkpoint fields; ``file_size`` is the size of the file they came from."""

    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    file_size: int = CHECKPOINT_FILE_SIZE

    @property
    def min_timestamp(self) -> int:
        """``getMinTimestamp``: max(0, min(physic, logics) − 3000 ms)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - CHECKPOINT_MIN_TIMESTAMP_MARGIN_MS)

    @property
    def min_timestamp_index(self) -> int:
        """``getMinTimestampIndex``: min(getMinTimestamp, indexMsgTimestamp)."""
        return min(self.min_timestamp, self.index_msg_timestamp)

    def fields(self) -> tuple[int, int, int, int, int]:
        return (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
                self.master_flushed_offset, self.confirm_phy_offset)

    def as_dict(self, iso: bool = True) -> dict[str, int | str]:
        """Named values, plus ``*_iso`` renderings of the timestamps when ``iso``."""
        d: dict[str, int | str] = {
            "physicMsgTimestamp": self.physic_msg_timestamp,
            "logicsMsgTimestamp": self.logics_msg_timestamp,
            "indexMsgTimestamp": self.index_msg_timestamp,
            "masterFlushedOffset": self.master_flushed_offset,
            "confirmPhyOffset": self.confirm_phy_offset,
            "minTimestamp": self.min_timestamp,
            "minTimestampIndex": self.min_timestamp_index,
        }
        if iso:
            for k in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp", "minTimestamp",
                      "minTimestampIndex"):
                d[k + "_iso"] = ms_to_iso(int(d[k]))
        return d


def ms_to_iso(ms: int) -> str:
    """Epoch milliseconds as UTC ISO 8601 (``2026-11-21T21:43:00.545Z``); out of range -> ``"<ms> ms"``."""
    try:
        dt = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def decode_checkpoint(data: bytes, file: str | os.PathLike | None = None) -> Checkpoint:
    """Decode checkpoint bytes; shorter files (>= 24 bytes) read missing fields as 0."""
    if len(data) < CHECKPOINT_MIN_SIZE:
        raise FormatError(f"checkpoint is {len(data)} bytes, at least {CHECKPOINT_MIN_SIZE} needed", file)
    padded = data[:CHECKPOINT.size].ljust(CHECKPOINT.size, b"\0")
    return Checkpoint(*CHECKPOINT.unpack(padded), file_size=len(data))


def checkpoint_path(store_root: str | os.PathLike) -> Path:
    return Path(store_root) / STORE_CHECKPOINT_FILE


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint file (a store root is accepted too)."""
    p = Path(path)
    if p.is_dir():
        p = checkpoint_path(p)
    try:
        fd = open_read(p, follow=False)
    except OSError as exc:
        raise StoreError(f"cannot open checkpoint: {exc.strerror}", p) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError("checkpoint is not a regular file", p)
        record_read(p)  # --evidence manifest
        data = os.pread(fd, CHECKPOINT.size, 0)
    except OSError as exc:
        raise StoreError(f"cannot read checkpoint: {exc.strerror}", p) from None
    finally:
        os.close(fd)
    cp = decode_checkpoint(data, p)
    return Checkpoint(*cp.fields(), file_size=st.st_size)


def encode_checkpoint(cp: Checkpoint, size: int = CHECKPOINT_FILE_SIZE) -> bytes:
    """The file image: the five fields, zero padded to ``size`` (4096) bytes."""
    try:
        head = CHECKPOINT.pack(*cp.fields())
    except Exception as exc:
        raise FormatError(f"cannot encode checkpoint: {exc}") from None
    return head.ljust(size, b"\0")


def write_checkpoint(path: str | os.PathLike, cp: Checkpoint, fsync: bool = True) -> None:
    """Write the 40 field bytes in place (other bytes kept), growing the file to 4096 bytes."""
    p = Path(path)
    try:
        fd = open_write(p, read=True, create=True)
    except OSError as exc:
        raise StoreError(f"cannot open checkpoint for writing: {exc.strerror}", p) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError("checkpoint is not a regular file", p)
        os.pwrite(fd, encode_checkpoint(cp, CHECKPOINT.size), 0)
        if os.fstat(fd).st_size < CHECKPOINT_FILE_SIZE:
            os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
        if fsync:
            fsync_raw(fd)
    except OSError as exc:
        raise StoreError(f"cannot write checkpoint: {exc.strerror}", p) from None
    finally:
        os.close(fd)
