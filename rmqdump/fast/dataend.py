"""Compiled twin of the walk behind ``info``'s end of valid data (``analysis.info.data_end``): the walk (CRC off)
from the start of the last segment holding data to where records stop, with the first V2-magic record and the
first record whose properties hold a given text met on the way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqdump.broker.recovery.walk import STOP_LAST_BLANK
from rmqdump.codec.layout import MESSAGE_MAGIC_CODE_V2
from rmqdump.codec.record import END_OF_DATA, Invalid
from rmqdump.fast import filewalk
from rmqdump.fast.engine import _numpy

if TYPE_CHECKING:
    from rmqdump.store.commitlog import CommitLog


@dataclass
class DataEnd:
    """The pure walk's ``end_offset`` and ``stop``, and the first V2 record and the first holding the text."""

    end_offset: int
    stop: Invalid
    first_v2: int | None
    first_holding: int | None


def data_end(cl: CommitLog, start: int, needle: bytes, use_mmap: bool = True,
             batch_records: int | None = None) -> DataEnd | None:
    """The walk of ``cl`` from ``start`` as ``cl.walk(start=start, check_crc=False, read_body=False)`` ends; None
    where the kernel does not apply or cannot map a file (the pure walk then answers)."""
    if not filewalk.applies(cl, start, None, use_mmap):
        return None
    np = _numpy()
    end, v2, held = start, None, None
    for item in filewalk.walk_files(cl, start=start, batch_records=batch_records):
        if isinstance(item, filewalk.HandOver):
            return None  # a file it cannot map (damage ends the walk at the FileEnd before)
        if isinstance(item, filewalk.FileEnd):
            seg, stop = item.segment, item.stop
            if item.records or stop.kind == "blank":
                end = seg.start + item.end_pos
            if stop.kind == "blank" and seg is cl.segments[-1]:  # RocketMQ's recovery ends before it
                return DataEnd(stop.offset, Invalid(stop.offset, seg.name, stop.pos, END_OF_DATA, STOP_LAST_BLANK),
                               v2, held)
            if stop.kind == "invalid":
                return DataEnd(end, stop.invalid, v2, held)
            continue
        if v2 is None:
            rows = np.flatnonzero(item["magic"][:item.n] == MESSAGE_MAGIC_CODE_V2)
            if rows.size:
                v2 = int(item.offsets[rows[0]])
        if held is None:
            rows = item.holding(np.arange(item.n), needle)
            if rows:
                held = int(item.offsets[rows[0]])
    last = cl.segments[-1]
    return DataEnd(end, Invalid(last.end, last.name, last.size, END_OF_DATA, "end of the last commitlog segment"),
                   v2, held)
