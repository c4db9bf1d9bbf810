"""ConsumeQueue units as values (spec §8.1, §8.3): the 20-byte CQ entry and the 46-byte BatchConsumeQueue
unit, their encoders, ConsumeQueueExt addresses carried in tagsCode, and where a queue offset's unit lives."""

from __future__ import annotations

import sys
from array import array
from typing import NamedTuple

from rmqdump.codec.layout import (
    BCQ_UNIT,
    CQ_EXT_MAX_ADDR,
    CQ_PRE_BLANK_SIZE,
    CQ_STORE_UNIT_SIZE,
    CQ_UNIT,
    FILE_NAME_DIGITS,
)
from rmqdump.errors import FormatError

LONG_MIN = -(1 << 63)
#: ``ConsumeQueueExt.MAX_REAL_OFFSET``
CQ_EXT_MAX_REAL_OFFSET = CQ_EXT_MAX_ADDR - LONG_MIN
#: BCQ ``compactedOffset`` value when unset (``INVALID_POS``).
BCQ_INVALID_POS = -1


def is_ext_addr(tags_code: int) -> bool:
    """``ConsumeQueueExt.isExtAddr``: the tagsCode field holds an ext-file address."""
    return tags_code <= CQ_EXT_MAX_ADDR


def ext_real_offset(address: int) -> int:
    """``ConsumeQueueExt.unDecorate``: ext address -> offset in the ext file queue."""
    return address - LONG_MIN


def ext_address(real_offset: int) -> int:
    """``ConsumeQueueExt.decorate``: ext real offset -> tagsCode address."""
    return real_offset + LONG_MIN


def is_valid_cq_unit(commit_log_offset: int, size: int) -> bool:
    """The broker's CQ validity test (``offset >= 0 && size > 0``)."""
    return commit_log_offset >= 0 and size > 0


#: below this many units a loop that stops at the first invalid unit is faster than setting up columns
_SMALL = 256


def leading_valid_units(raw: bytes, below: int | None = None) -> int:
    """How many leading whole units of ``raw`` are valid (offset >= 0, size > 0) with offset < ``below``
    (the broker's recovery test), without one object per unit where it can: numpy's columns; without numpy,
    a column test that decides the broker's own layout (such units, then zero fill), else unit by unit."""
    n = len(raw) // CQ_STORE_UNIT_SIZE
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None and n >= _SMALL:
        fmt = CQ_UNIT.format.lstrip("<>!=@")
        u = np.frombuffer(raw, np.dtype([(k, ">" + c) for k, c in zip("ost", fmt, strict=True)]), count=n)
        bad = (u["o"] < 0) | (u["s"] <= 0)
        if below is not None and below < 1 << 63:
            bad |= u["o"] >= below
        first = np.flatnonzero(bad)
        return int(first[0]) if first.size else n
    m = _valid_then_zero(raw, n, below) if n >= _SMALL else None
    if m is not None:
        return m
    k = 0
    for off, size, _ in CQ_UNIT.iter_unpack(raw[:n * CQ_STORE_UNIT_SIZE]):
        if off < 0 or size <= 0 or (below is not None and off >= below):
            break
        k += 1
    return k


def _valid_then_zero(raw: bytes, n: int, below: int | None) -> int | None:
    """The units before ``raw``'s zero fill when all of them pass the test (column arrays), else None."""
    m = -(-len(raw[:n * CQ_STORE_UNIT_SIZE].rstrip(b"\0")) // CQ_STORE_UNIT_SIZE)  # units with non-zero bytes
    if m == 0:
        return 0  # an all-zero first unit is invalid
    offs, sizes = array("q"), array("i")
    if offs.itemsize != 8 or sizes.itemsize != 4:
        return None
    ob, sb = bytearray(8 * m), bytearray(4 * m)
    end = m * CQ_STORE_UNIT_SIZE
    little = sys.byteorder == "little"
    for j in range(8):  # big-endian fields -> native arrays, a byte column at a time
        ob[(7 - j if little else j)::8] = raw[j:end:CQ_STORE_UNIT_SIZE]
    for j in range(4):
        sb[(3 - j if little else j)::4] = raw[8 + j:end:CQ_STORE_UNIT_SIZE]
    offs.frombytes(ob)
    sizes.frombytes(sb)
    if min(offs) >= 0 and min(sizes) > 0 and (below is None or max(offs) < below):
        return m  # unit m, if any, is all zero: invalid
    return None


class CqEntry(NamedTuple):
    """One 20-byte ConsumeQueue unit and its queue offset."""

    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int

    @property
    def is_valid(self) -> bool:
        return is_valid_cq_unit(self.commit_log_offset, self.size)

    @property
    def is_pre_blank(self) -> bool:
        """A ``fillPreBlank`` placeholder (offset 0, size 0x7FFFFFFF)."""
        return self.commit_log_offset == 0 and self.size == CQ_PRE_BLANK_SIZE

    @property
    def is_ext_addr(self) -> bool:
        return is_ext_addr(self.tags_code)

    @property
    def ext_real_offset(self) -> int | None:
        return ext_real_offset(self.tags_code) if is_ext_addr(self.tags_code) else None


class BcqEntry(NamedTuple):
    """One 46-byte BatchConsumeQueue unit; ``unit_index`` counts units, not messages."""

    unit_index: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_time: int
    msg_base_offset: int
    batch_size: int
    compacted_offset: int
    reserved: int

    @property
    def is_valid(self) -> bool:
        return (self.commit_log_offset >= 0 and self.size > 0
                and self.msg_base_offset >= 0 and self.batch_size > 0)

    @property
    def next_offset(self) -> int:
        """Queue offset after this unit's messages."""
        return self.msg_base_offset + self.batch_size


def encode_cq_entry(offset: int, size: int, tags_code: int) -> bytes:
    """Encode one 20-byte ConsumeQueue unit."""
    try:
        return CQ_UNIT.pack(offset, size, tags_code)
    except Exception as exc:  # struct.error for out-of-range values
        raise FormatError(f"cannot encode CQ entry ({offset}, {size}, {tags_code}): {exc}") from None


def encode_bcq_entry(offset: int, size: int, tags_code: int, store_time: int, msg_base_offset: int,
                     batch_size: int, compacted_offset: int = BCQ_INVALID_POS) -> bytes:
    """Encode one 46-byte BatchConsumeQueue unit (reserved int = 0)."""
    try:
        return BCQ_UNIT.pack(offset, size, tags_code, store_time, msg_base_offset, batch_size, compacted_offset, 0)
    except Exception as exc:
        raise FormatError(f"cannot encode BCQ entry: {exc}") from None


PRE_BLANK_ENTRY = CQ_UNIT.pack(0, CQ_PRE_BLANK_SIZE, 0)


def queue_offset_location(queue_offset: int, file_size: int, unit_size: int = CQ_STORE_UNIT_SIZE) -> tuple[int, int]:
    """(file start byte offset, position in file) of a queue offset's unit."""
    logical = queue_offset * unit_size
    pos = logical % file_size
    return logical - pos, pos


def file_name(start_offset: int) -> str:
    """Mapped-file name of a start offset (20 digits)."""
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"
