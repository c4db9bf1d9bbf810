"""What the broker still owes, behind `rmqdump pending`: one walk of the commitlog through
:class:`rmqdump.broker.systopics.PendingTracker` (delayed, transaction half, timer and PREPARED records),
judged against ``config/delayOffset.json`` when the store has one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rmqdump.broker.systopics import PendingTracker
from rmqdump.codec.record import END_OF_DATA, Invalid, Message
from rmqdump.store.commitlog import CommitLog, Skipped


@dataclass
class PendingWalk:
    """The tracked system records (``candidates``, every state) and how the walk went."""

    candidates: list
    records: int  # records walked
    skipped: list[Skipped] = field(default_factory=list)  # damaged ranges walked past
    stop: Invalid | None = None  # where the walk stopped at damage (None: end of data)

    @property
    def damage(self) -> int:
        return len(self.skipped) + (self.stop is not None)


def walk_pending(cl: CommitLog, delay_offsets: dict | None, *, check_crc: bool = True, use_mmap: bool = True,
                 max_record_size: int, on_skipped: Callable[[Skipped], None] | None = None,
                 progress: Callable[[int], None] | None = None) -> PendingWalk:
    """Walk the whole commitlog past damage and track every system record to its state (the compiled walk of
    :mod:`rmqdump.fast.pendingwalk` where it runs; the pure walk takes over at damage).

    ``delay_offsets``: ``config/delayOffset.json`` as :func:`rmqdump.store.config.load_delay_offsets`
    reads it (None: the store has none; delayed messages are then judged by delivered copies only).
    """
    tracker = PendingTracker(delay_offsets)
    start = cl.min_offset
    if use_mmap and cl.segments:
        from rmqdump.fast import pendingwalk

        if pendingwalk.applies(cl, use_mmap):
            handed = pendingwalk.feed_pending(cl, tracker, check_crc=check_crc, max_record_size=max_record_size,
                                              progress=progress)
            if handed is None:
                return PendingWalk(tracker.finish(), tracker.records)
            start = handed.offset
    walk = cl.walk(start=start, check_crc=check_crc, read_body=True, keep_going=True, use_mmap=use_mmap,
                   max_record_size=max_record_size)
    skipped: list[Skipped] = []
    for n, rec in enumerate(walk):
        if progress is not None and n & 1023 == 0:
            progress(walk.end_offset - cl.min_offset)
        if isinstance(rec, Message):
            tracker.add(rec)
        elif isinstance(rec, Skipped):
            skipped.append(rec)
            if on_skipped is not None:
                on_skipped(rec)
    stop = walk.stop if walk.stop is not None and walk.stop.kind != END_OF_DATA else None
    return PendingWalk(tracker.finish(), tracker.records, skipped, stop)
