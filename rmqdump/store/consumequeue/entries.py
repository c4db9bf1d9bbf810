"""ConsumeQueue units as values (spec §8.1, §8.3): the 20-byte CQ entry and the 46-byte BatchConsumeQueue
unit, their encoders, ConsumeQueueExt addresses carried in tagsCode, and where a queue offset's unit lives."""

from __future__ import annotations

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
