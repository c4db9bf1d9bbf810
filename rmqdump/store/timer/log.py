"""``timerlog/``: mapped files of 52-byte units (``TimerLog``), walked as the broker's recovery walks them.

A file is read unit by unit from its start; it ends at the 16-byte blank (``BLANK_MAGIC_CODE`` where a unit
has its magic) or at the first bytes that are no unit (size not 52 or a magic outside ``0xF``: for the
last file, usually zeros after the last unit), as ``TimerMessageStore.recoverAndRevise`` decides.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import (
    FILE_NAME_DIGITS,
    TIMER_LOG_BLANK_MAGIC_CODE,
    TIMER_LOG_MIN_BLANK_LEN,
    TIMER_LOG_UNIT,
    TIMER_LOG_UNIT_SIZE,
    TIMER_MAGIC_DELETE,
    TIMER_MAGIC_KNOWN,
    TIMER_MAGIC_ROLL,
)
from rmqdump.disk.segment import java_parses_name
from rmqdump.errors import FormatError, StoreError
from rmqdump.store.timer._io import RegularFile

_NAME = re.compile(rf"[0-9]{{{FILE_NAME_DIGITS}}}")
_CHUNK_UNITS = 20_000  # units read per pread (~1 MiB)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True, slots=True)
class TimerUnit:
    """One timerlog unit at timerlog offset ``pos``."""

    pos: int
    size: int
    prev_pos: int
    magic: int
    curr_write_time_ms: int
    delay_time: int
    offset_py: int
    size_py: int
    topic_hash: int

    @property
    def delayed_ms(self) -> int:
        """The delivery (or roll) time the unit is filed under: currWriteTimeMs + delayTime."""
        return self.curr_write_time_ms + self.delay_time

    @property
    def roll(self) -> bool:
        return bool(self.magic & TIMER_MAGIC_ROLL)

    @property
    def delete(self) -> bool:
        return bool(self.magic & TIMER_MAGIC_DELETE)

    def to_dict(self) -> dict:
        return {"pos": self.pos, "size": self.size, "prev_pos": self.prev_pos, "magic": self.magic,
                "curr_write_time_ms": self.curr_write_time_ms, "delay_time": self.delay_time,
                "delayed_ms": self.delayed_ms, "offset_py": self.offset_py, "size_py": self.size_py,
                "topic_hash": self.topic_hash}


def decode_unit(data: bytes, pos: int, at: int = 0) -> TimerUnit:
    """The unit in ``data[at:at+52]``, filed at timerlog offset ``pos`` (no judgement)."""
    size, prev, magic, cw, delay, off, sz, th, _reserved = TIMER_LOG_UNIT.unpack_from(data, at)
    return TimerUnit(pos, size, prev, magic, cw, delay, off, sz, th)


@dataclass(frozen=True)
class LogStop:
    """Where the units of one file end: ``reason`` ``blank`` (the end-of-file blank), ``end`` (the file's
    last whole unit), ``zero`` (unwritten bytes), ``bad_size``, ``bad_magic`` or ``short`` (a unit cut by
    the end of the file); ``pos`` is the timerlog offset."""

    file: str
    pos: int
    reason: str
    detail: str = ""

    @property
    def is_damage(self) -> bool:
        return self.reason in ("bad_size", "bad_magic", "short")


@dataclass
class TimerLogFile:
    """One ``timerlog/<20-digit start offset>`` file."""

    path: Path
    start: int
    size: int

    @property
    def name(self) -> str:
        return self.path.name

    def units(self) -> tuple[list[TimerUnit], LogStop]:
        """Every unit from the file's start up to its :class:`LogStop`."""
        out: list[TimerUnit] = []
        with RegularFile(self.path) as f:
            size = f.size
            pos = 0
            while True:
                data = f.read(pos, _CHUNK_UNITS * TIMER_LOG_UNIT_SIZE)
                if not data and pos < size:
                    raise FormatError("file shrank while read", self.path, pos)
                for at in range(0, len(data), TIMER_LOG_UNIT_SIZE):
                    here = self.start + pos + at
                    left = len(data) - at
                    if left < TIMER_LOG_MIN_BLANK_LEN:
                        return out, LogStop(self.name, here, "end" if left == 0 else "short",
                                            f"{left} bytes left")
                    head = data[at:at + TIMER_LOG_MIN_BLANK_LEN]
                    magic = int.from_bytes(head[12:16], "big", signed=True)
                    if magic == TIMER_LOG_BLANK_MAGIC_CODE:
                        return out, LogStop(self.name, here, "blank")
                    if head == bytes(TIMER_LOG_MIN_BLANK_LEN):
                        return out, LogStop(self.name, here, "zero")
                    unit_size = int.from_bytes(head[:4], "big", signed=True)
                    if unit_size != TIMER_LOG_UNIT_SIZE:
                        return out, LogStop(self.name, here, "bad_size", f"unit size {unit_size}, not 52")
                    if (magic | TIMER_MAGIC_KNOWN) != TIMER_MAGIC_KNOWN:
                        return out, LogStop(self.name, here, "bad_magic", f"magic {magic:#x}")
                    if left < TIMER_LOG_UNIT_SIZE:
                        return out, LogStop(self.name, here, "short", f"a unit cut after {left} bytes")
                    out.append(decode_unit(data, here, at))
                pos += len(data)
                if pos >= size:
                    return out, LogStop(self.name, self.start + pos, "end")


@dataclass
class TimerLog:
    """The ``timerlog/`` directory: its files in offset order and the problems of their names and sizes."""

    path: Path
    files: list[TimerLogFile] = field(default_factory=list)
    file_size: int | None = None
    problems: list[tuple[str, int | None, str]] = field(default_factory=list)  # (file, offset, detail)
    refusals: list[str] = field(default_factory=list)  # files of problems on which the broker's load fails

    @classmethod
    def open(cls, path: str | os.PathLike) -> TimerLog:
        p = Path(path)
        log = cls(p)
        try:
            names = sorted(os.listdir(p))
        except OSError as e:
            raise StoreError(f"cannot list: {e.strerror}", p) from None
        for i, n in enumerate(names):
            fp = p / n
            if not _NAME.fullmatch(n):
                if not java_parses_name(n) and fp.is_file() and not (i == len(names) - 1 and _size(fp) == 0):
                    # MappedFileQueue.load: its size differs (load() false) or Long.parseLong throws
                    log.problems.append((n, None, "not a timerlog file name: the broker's MappedFileQueue.load "
                                                  "fails on it (its size differs, or Long.parseLong throws): "
                                                  "TimerMessageStore.load() fails and the broker does not start"))
                    log.refusals.append(n)
                continue
            if fp.is_symlink() or not fp.is_file():
                log.problems.append((n, None, "not a regular file; not read"))
                continue
            log.files.append(TimerLogFile(fp, int(n), fp.stat().st_size))
        sizes = sorted({f.size for f in log.files})
        if sizes:
            log.file_size = max(sizes, key=lambda s: sum(f.size == s for f in log.files))
        for i, f in enumerate(log.files):
            if f.size != log.file_size:
                log.problems.append((f.name, None, f"{f.size} bytes where the other timerlog files have "
                                                   f"{log.file_size}: the broker's MappedFileQueue.load fails "
                                                   "(TimerMessageStore.load() fails and the broker does not "
                                                   "start)"))
                log.refusals.append(f.name)
            elif log.file_size and f.start != log.files[0].start + i * log.file_size:
                log.problems.append((f.name, None, f"starts at {f.start}, expected "
                                                   f"{log.files[0].start + i * log.file_size} (a gap or overlap)"))
        return log

    def file_for(self, pos: int) -> TimerLogFile | None:
        for f in self.files:
            if f.start <= pos < f.start + f.size:
                return f
        return None

    def walk(self) -> Iterator[tuple[TimerLogFile, list[TimerUnit], LogStop]]:
        """Each file with its units and where they stop."""
        for f in self.files:
            units, stop = f.units()
            yield f, units, stop


__all__ = ["LogStop", "TimerLog", "TimerLogFile", "TimerUnit", "decode_unit"]
