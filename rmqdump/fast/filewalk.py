"""The commitlog's files walked one after another by the compiled walk, for the twins of pure record loops that
walk past a file's end (the CQ and index rebuilds, the key scan, pending, stats, info's end of data): column
batches, a :class:`FileEnd` after each file, and a :class:`HandOver` where the kernel stops at damage or cannot walk
a file, from which the pure walk (its own words, resynchronisation included) must go on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.errors import StoreError
from rmqdump.fast import readahead
from rmqdump.fast.batch import RecordBatch
from rmqdump.fast.engine import use_fast
from rmqdump.fast.segment_walk import FastSegmentWalk, SegmentStop

if TYPE_CHECKING:
    from rmqdump.disk.segment import Segment
    from rmqdump.fast.intern import TopicIntern
    from rmqdump.store.commitlog import CommitLog

__all__ = ["FileEnd", "HandOver", "RecordBatch", "applies", "walk_files"]


@dataclass
class HandOver:
    """The kernel stopped before ``offset`` was walked: the pure walk takes it from there."""

    offset: int


@dataclass
class FileEnd:
    """A file walked to ``stop`` (``end``, ``blank``, ``limit``, or ``invalid``: a :class:`HandOver` follows):
    ``records`` in it, valid data up to ``end_pos``."""

    segment: Segment
    stop: SegmentStop
    records: int
    end_pos: int


def applies(cl: CommitLog, start: int | None = None, end: int | None = None, use_mmap: bool = True) -> bool:
    """Whether a walk of [``start``, ``end``) takes the compiled path (every file it walks mapped, none DLedger,
    enough bytes for the engine)."""
    segs = _files(cl, start, end)
    return use_mmap and bool(segs) and use_fast(sum(s.size for s in segs), segments=segs)


def _files(cl: CommitLog, start: int | None, end: int | None) -> list[Segment]:
    """The files holding [``start``, ``end``) (None: the commitlog's first offset; its end)."""
    lo = cl.min_offset if start is None else start
    return [s for s in cl.segments if s.start + s.size > lo and (end is None or s.start < end)]


def walk_files(cl: CommitLog, *, start: int | None = None, end: int | None = None, check_crc: bool = False,
               max_record_size: int = MAX_RECORD_SIZE, intern: TopicIntern | None = None,
               batch_records: int | None = None) -> Iterator[RecordBatch | FileEnd | HandOver]:
    """Batches of the records of [``start``, ``end``) as ``cl.walk(start=, end=, check_crc=, max_record_size=)``
    meets them, file by file (one set of columns reused); a :class:`HandOver` last when the kernel stops at an
    invalid record (unwritten space included) or cannot map a file. On two CPUs or more each file is walked a batch
    ahead on a second thread (:class:`~rmqdump.fast.readahead.ReadAhead`): a batch stays as it is until the
    caller asks for the next one, as a serial loop's reused columns do. ``intern``: the derived columns'
    topic table. ``batch_records``: records per batch (tests use small batches)."""
    lo = cl.min_offset if start is None else start
    segs = _files(cl, start, end)
    ahead = readahead.wanted(segs, True)  # the walk a batch ahead on a second thread, the caller's work here
    columns = None
    spares: list = []  # the read-ahead's other column sets, from file to file
    kw = {} if batch_records is None else {"batch_records": batch_records}
    for seg in segs:
        pos = max(0, lo - seg.start)
        try:
            w = FastSegmentWalk(segment=seg, start_pos=pos, check_crc=check_crc, end_offset=end,
                                max_record_size=max_record_size, columns=columns, intern=intern,
                                release_pages=not ahead, **kw)
        except StoreError:
            w = None
        if w is None or w.size != seg.size:
            if w is not None:
                w.close()
            yield HandOver(seg.start + pos)
            return
        with w, readahead.switch_interval() if ahead else contextlib.nullcontext():
            for b in readahead.ReadAhead(w, spares=spares) if ahead else w:
                if b.n:
                    yield b
            stop = w.stop
        columns = w.cols  # the set the walk filled last: the next file's own (the ring's others are spares)
        yield FileEnd(seg, stop, w.records, w.end_pos)
        if stop.kind == "invalid":
            yield HandOver(seg.start + stop.pos)
            return
        if stop.kind == "limit":
            return
