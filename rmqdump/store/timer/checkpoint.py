"""``config/timercheck`` (``TimerCheckpoint``): seven int64s at the start of a 4096-byte mapped file."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from rmqdump.codec.layout import TIMER_CHECKPOINT, TIMER_CHECKPOINT_FILE_SIZE
from rmqdump.store.timer._io import RegularFile


@dataclass(frozen=True)
class TimerCheckpoint:
    """What ``TimerCheckpoint`` reads. ``file_size``: the file's length (the broker maps 4096 bytes, so a
    shorter file reads as zeros past its end, as here)."""

    last_read_time_ms: int
    last_timer_log_flush_pos: int
    last_timer_queue_offset: int
    master_timer_queue_offset: int
    state_version: int
    data_version_timestamp: int
    data_version_counter: int
    file_size: int
    path: str

    def to_dict(self) -> dict:
        return asdict(self)


def read_timer_checkpoint(path: str | os.PathLike) -> TimerCheckpoint | None:
    """The timer checkpoint at ``path``; None if there is none (the broker then starts from zeros)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    with RegularFile(p) as f:
        data = f.read(0, TIMER_CHECKPOINT.size)
        size = f.size
    data = data.ljust(TIMER_CHECKPOINT.size, b"\0")
    return TimerCheckpoint(*TIMER_CHECKPOINT.unpack(data), file_size=size, path=str(p))


__all__ = ["TIMER_CHECKPOINT_FILE_SIZE", "TimerCheckpoint", "read_timer_checkpoint"]
