"""``timerwheel`` (``TimerWheel``): 2 x 604,800 slots of 32 bytes, one file of 38,707,200 bytes.

Slot ``i`` holds time ``timeMs / precisionMs`` (the broker's "delayed time" of the slot), the timerlog
offsets of the first and last unit filed under it, a count and an unused magic. Slot index =
``(timeMs / precisionMs) % 1,209,600``; a slot answers for time ``t`` only if its first field equals
``t / precisionMs``. Only non-zero slots are returned (a healthy wheel is almost all zeros, often sparse).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import TIMER_SLOT, TIMER_SLOT_SIZE, TIMER_WHEEL_SIZE, TIMER_WHEEL_SLOTS
from rmqdump.store.timer._io import RegularFile

_ZERO_SLOT = bytes(TIMER_SLOT_SIZE)


@dataclass(frozen=True, slots=True)
class Slot:
    """Slot ``index`` as stored; ``time_units`` = timeMs / precisionMs."""

    index: int
    time_units: int
    first_pos: int
    last_pos: int
    num: int
    magic: int

    def time_ms(self, precision_ms: int) -> int:
        return self.time_units * precision_ms

    def to_dict(self, precision_ms: int) -> dict:
        return {"index": self.index, "time_ms": self.time_ms(precision_ms), "first_pos": self.first_pos,
                "last_pos": self.last_pos, "num": self.num, "magic": self.magic}


def decode_slot(data: bytes, index: int, at: int = 0) -> Slot:
    return Slot(index, *TIMER_SLOT.unpack_from(data, at))


def slot_index(time_ms: int, precision_ms: int) -> int:
    """``TimerWheel.getSlotIndex`` (Java's truncating division on the non-negative times it sees)."""
    return int(time_ms / precision_ms if time_ms < 0 else time_ms // precision_ms) % TIMER_WHEEL_SLOTS


@dataclass
class TimerWheelFile:
    """The non-zero slots of a ``timerwheel`` file; ``size`` its length (the broker refuses any non-zero
    length but 38,707,200)."""

    path: Path
    size: int
    slots: dict[int, Slot] = field(default_factory=dict)

    @property
    def size_ok(self) -> bool:
        return self.size in (0, TIMER_WHEEL_SIZE)


def read_wheel(path: str | os.PathLike) -> TimerWheelFile | None:
    """Non-zero slots of the wheel at ``path`` (at most the first 38,707,200 bytes are read; holes skipped);
    None if there is no wheel file (the broker creates a zero one)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    with RegularFile(p) as f:
        wheel = TimerWheelFile(p, f.size)
        for pos, data in f.data_chunks(TIMER_WHEEL_SIZE):
            if data.count(0) == len(data):
                continue
            for at in range(0, len(data) - TIMER_SLOT_SIZE + 1, TIMER_SLOT_SIZE):
                if data[at:at + TIMER_SLOT_SIZE] != _ZERO_SLOT:
                    idx = (pos + at) // TIMER_SLOT_SIZE
                    wheel.slots[idx] = decode_slot(data, idx, at)
    return wheel


__all__ = ["Slot", "TimerWheelFile", "decode_slot", "read_wheel", "slot_index"]
