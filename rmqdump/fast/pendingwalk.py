"""Compiled twin of the walk behind ``rmqdump pending`` (``analysis.pending.walk_pending``): the records a
:class:`~rmqdump.broker.systopics.PendingTracker` must see, from column batches.

The pure walk decodes every record (body and CRC included) and hands it to the tracker. Here each segment is
walked by the compiled kernel (CRC as asked) and only the records the tracker says can matter are decoded
(:meth:`~rmqdump.broker.systopics.PendingTracker.matters`: system topics, transaction records, topics a delivered
copy may be in; that last set grows as candidates are met, so the rest of a batch is judged again when it does);
the others are only counted. A file the kernel cannot walk to its end hands the rest of the walk back to the
pure loop (:class:`~rmqdump.fast.cqrebuild.HandOver`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rmqdump.codec.layout import TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.errors import StoreError
from rmqdump.fast.cqrebuild import HandOver
from rmqdump.fast.engine import _numpy, use_fast
from rmqdump.fast.intern import TopicIntern
from rmqdump.fast.segment_walk import FastSegmentWalk
from rmqdump.fast.topics import TopicNames

if TYPE_CHECKING:
    from rmqdump.broker.systopics import PendingTracker
    from rmqdump.fast.batch import RecordBatch
    from rmqdump.store.commitlog import CommitLog

__all__ = ["HandOver", "applies", "feed_pending"]


def applies(cl: CommitLog, use_mmap: bool) -> bool:
    """Whether the pending walk takes the compiled path."""
    segs = list(cl.segments)
    return use_mmap and bool(segs) and use_fast(sum(s.size for s in segs), segments=segs)


def feed_pending(cl: CommitLog, tracker: PendingTracker, *, check_crc: bool, max_record_size: int,
                 progress: Callable[[int], None] | None = None, batch_records: int | None = None) -> HandOver | None:
    """Feed ``tracker`` every record of the commitlog that can matter to it, in order; None when the kernel walked
    it all, else where the pure walk must take over."""
    np = _numpy()
    names = TopicNames(TopicIntern())
    columns = None
    kw = {} if batch_records is None else {"batch_records": batch_records}
    for seg in cl.segments:
        try:
            w = FastSegmentWalk(segment=seg, check_crc=check_crc, max_record_size=max_record_size, columns=columns,
                                intern=names.intern, **kw)
        except StoreError:
            w = None
        if w is None or w.size != seg.size:
            if w is not None:
                w.close()
            return HandOver(seg.start)
        with w:
            for b in w:
                if b.n:
                    _batch(np, b, tracker, names)
                    if progress is not None:
                        progress(int(b.offsets[b.n - 1]) + int(b["size"][b.n - 1]) - cl.min_offset)
            stop = w.stop
        columns = w.cols
        if stop.kind == "invalid":
            return HandOver(seg.start + stop.pos)
    return None


def _batch(np, b: RecordBatch, tracker: PendingTracker, names: TopicNames) -> None:
    tids, topics = names.of(b, np.arange(b.n))
    flags = b["sys_flag"]
    seen = -1
    fed = 0
    while True:
        known = len(tracker.copy_topics)
        matters = np.array([tracker.matters(t, TRANSACTION_NOT_TYPE) for t in topics], bool)[tids]
        matters |= (flags & TRANSACTION_TYPE_MASK) != TRANSACTION_NOT_TYPE
        rows = np.flatnonzero(matters[seen + 1:]) + seen + 1
        grew = False
        for i in rows.tolist():
            tracker.add(b.message(i, read_body=True))
            fed += 1
            seen = i
            if len(tracker.copy_topics) != known:  # a new topic a copy may be in: judge the rest again
                grew = True
                break
        if not grew:
            break
    tracker.skip(b.n - fed)
