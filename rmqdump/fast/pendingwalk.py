"""Compiled twin of the walk behind ``rmqdump pending`` (``analysis.pending.walk_pending``): the records a
:class:`~rmqdump.broker.systopics.PendingTracker` must see, from column batches.

The pure walk decodes every record (body and CRC included) and hands it to the tracker. Here each segment is
walked by the compiled kernel (CRC as asked) and only the records the tracker says can matter are decoded
(:meth:`~rmqdump.broker.systopics.PendingTracker.matters`: system topics, transaction records, topics a delivered
copy may be in; that last set grows as candidates are met, so the rest of a batch is judged again when it does);
the others are only counted. A file the kernel cannot walk to its end hands the rest of the walk back to the
pure loop (:class:`~rmqdump.fast.filewalk.HandOver`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rmqdump.codec.layout import TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.fast import filewalk
from rmqdump.fast.batch import RecordBatch
from rmqdump.fast.engine import _numpy
from rmqdump.fast.filewalk import HandOver
from rmqdump.fast.intern import TopicIntern
from rmqdump.fast.topics import TopicNames

if TYPE_CHECKING:
    from rmqdump.broker.systopics import PendingTracker
    from rmqdump.store.commitlog import CommitLog

__all__ = ["HandOver", "applies", "feed_pending"]


def applies(cl: CommitLog, use_mmap: bool) -> bool:
    """Whether the pending walk takes the compiled path."""
    return filewalk.applies(cl, use_mmap=use_mmap)


def feed_pending(cl: CommitLog, tracker: PendingTracker, *, check_crc: bool, max_record_size: int,
                 progress: Callable[[int], None] | None = None, batch_records: int | None = None) -> HandOver | None:
    """Feed ``tracker`` every record of the commitlog that can matter to it, in order; None when the kernel walked
    it all, else where the pure walk must take over."""
    np = _numpy()
    names = TopicNames(TopicIntern())
    for item in filewalk.walk_files(cl, check_crc=check_crc, max_record_size=max_record_size, intern=names.intern,
                                    batch_records=batch_records):
        if isinstance(item, HandOver):
            return item
        if isinstance(item, RecordBatch):
            _batch(np, item, tracker, names)
            if progress is not None:
                progress(int(item.offsets[item.n - 1]) + int(item["size"][item.n - 1]) - cl.min_offset)
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
