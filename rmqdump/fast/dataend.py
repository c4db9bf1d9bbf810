"""Compiled twin of the walk behind ``info``'s end of valid data (``analysis.info.data_end``): the walk (CRC off)
from the start of the last segment holding data to where records stop, with the first V2-magic record and the
first record whose properties hold a given text met on the way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqdump.codec.layout import MESSAGE_MAGIC_CODE_V2
from rmqdump.codec.record import END_OF_DATA, Invalid
from rmqdump.errors import StoreError
from rmqdump.fast.engine import _numpy, use_fast
from rmqdump.fast.segment_walk import FastSegmentWalk

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
    where the kernel does not apply or cannot walk a file (the pure walk then answers)."""
    segs = [s for s in cl.segments if s.start + s.size > start]
    if not use_mmap or not segs or not use_fast(sum(s.size for s in segs), segments=segs):
        return None
    np = _numpy()
    end, v2, held = start, None, None
    columns = None
    kw = {} if batch_records is None else {"batch_records": batch_records}
    for seg in segs:
        try:
            w = FastSegmentWalk(segment=seg, start_pos=max(0, start - seg.start), check_crc=False, columns=columns,
                                **kw)
        except StoreError:
            return None
        with w:
            if w.size != seg.size:
                return None
            for b in w:
                if not b.n:
                    continue
                if v2 is None:
                    rows = np.flatnonzero(b["magic"][:b.n] == MESSAGE_MAGIC_CODE_V2)
                    if rows.size:
                        v2 = int(b.offsets[rows[0]])
                if held is None:
                    rows = b.holding(np.arange(b.n), needle)
                    if rows:
                        held = int(b.offsets[rows[0]])
            stop = w.stop
        columns = w.cols
        if w.records or stop.kind == "blank":
            end = seg.start + w.end_pos
        if stop.kind == "invalid":
            return DataEnd(end, stop.invalid, v2, held)
    last = segs[-1]
    return DataEnd(end, Invalid(last.end, last.name, last.size, END_OF_DATA, "end of the last commitlog segment"),
                   v2, held)
