"""The consume-queue entries a broker's startup recovery writes back (re-dispatch).

RocketMQ's abnormal recovery (4.9.8 and 5.3.3 ``CommitLog.recoverAbnormally``) hands every
record it walks to ``doDispatch``; 5.3.3's ``recoverNormally`` does so for records after
the consume queues' maximum physical offset. Each record then goes through
``ConsumeQueue.putMessagePositionInfo``, whose rules this module replays per queue:

- transaction half (prepared) and rollback records are not dispatched;
- skipped when ``offset + size <= maxPhysicOffset`` of the queue (already built);
- a queue without files is created at the record's queue offset (pre-blank filled);
- skipped when the queue offset is not 0 and lies before the queue's write position;
- otherwise the entry is appended at the write position (even if the record's queue
  offset lies beyond it) and becomes the queue's ``maxPhysicOffset``;
- LMQ multi-dispatch (``INNER_MULTI_DISPATCH``) puts the record into each named queue too.

Only queue ends are modelled (which entries, and where the queue ends); the bytes are the
ones the broker's dispatcher would write. 5.x BatchConsumeQueue topics are left out: the
broker dispatches them into ``batchconsumequeue/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rmqdump.broker.systopics import multi_dispatch_targets
from rmqdump.codec.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog

if TYPE_CHECKING:
    from rmqdump.disk.segment import Segment

_DISPATCHED_TYPES = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
_MULTI = b"INNER_MULTI_DISPATCH"
#: properties shorter than this cannot name multi-dispatch targets: ``INNER_MULTI_DISPATCH`` and
#: ``INNER_MULTI_QUEUE_OFFSET``, each with a separator and a value, and the separator between them
MULTI_MIN_PROPERTIES = len(_MULTI) + 2 + 1 + len(b"INNER_MULTI_QUEUE_OFFSET") + 2
#: walks of the re-dispatch take any TOTALSIZE, as ``checkMessageAndReturnSize`` does
WALK_MAX_RECORD_SIZE = (1 << 31) - 1
#: commitlog offsets listed per queue (counts are complete)
LISTED = 100


@dataclass
class QueueRedispatch:
    """Entries one consume queue gains from recovery's re-dispatch."""

    queue: str
    old_end: int  # queue offset after consume-queue recovery
    new_end: int
    count: int = 0
    commitlog_offsets: list[int] = field(default_factory=list)  # the first LISTED only
    created: bool = False  # the queue had no file: recovery creates it
    misplaced: int = 0  # entries written at a queue offset other than their record's QUEUEOFFSET
    first_misplaced: tuple[int, int, int] | None = None  # (commitlog offset, record's queue offset, written at)

    def to_dict(self) -> dict:
        return {"count": self.count, "from_queue_offset": self.old_end, "new_max_offset": self.new_end,
                "created": self.created, "commitlog_offsets": self.commitlog_offsets, "misplaced": self.misplaced,
                "first_misplaced": None if self.first_misplaced is None else dict(zip(
                    ("commitlog_offset", "record_queue_offset", "written_at"), self.first_misplaced, strict=True))}


class _Queue:
    """One queue as ``putMessagePositionInfo`` sees it: write position, maxPhysicOffset, files."""

    __slots__ = ("name", "write", "max_phy", "has_files", "out")

    def __init__(self, name: str, write: int, max_phy: int, has_files: bool):
        self.name, self.write, self.max_phy, self.has_files = name, write, max_phy, has_files
        self.out: QueueRedispatch | None = None

    def put(self, offset: int, size: int, queue_offset: int) -> None:
        if offset + size <= self.max_phy:
            return  # "Maybe try to build consume queue repeatedly"
        created = False
        if not self.has_files:
            self.has_files = created = True
            self.write = queue_offset  # a new file, pre-blank filled up to the record's queue offset
        elif queue_offset != 0 and queue_offset < self.write:
            return  # "Build consume queue repeatedly"
        if self.out is None:
            self.out = QueueRedispatch(self.name, self.write, self.write, created=created)
        if self.out.count < LISTED:
            self.out.commitlog_offsets.append(offset)
        if queue_offset != self.write:
            if not self.out.misplaced:
                self.out.first_misplaced = (offset, queue_offset, self.write)
            self.out.misplaced += 1
        self.out.count += 1
        self.write += 1
        self.out.new_end = self.write
        self.max_phy = offset + size

    def put_run(self, count: int, first_offsets: list[int], last_end: int) -> None:
        """``count`` :meth:`put` calls known to append, each at its record's own queue offset (the queue has
        files, every record ends past ``max_phy`` and their queue offsets run on from ``write``): the compiled
        twin's bulk step. ``first_offsets``: the first (up to ``LISTED``) commitlog offsets."""
        if self.out is None:
            self.out = QueueRedispatch(self.name, self.write, self.write)
        out = self.out
        room = LISTED - out.count
        if room > 0:
            out.commitlog_offsets += first_offsets[:room]
        out.count += count
        self.write += count
        out.new_end = self.write
        self.max_phy = last_end


class DispatchModel:
    """Every consume queue of a store, fed records in commitlog order."""

    def __init__(self, states: Iterable, batch_topics: set[str] | frozenset[str] = frozenset()):
        self.queues: dict[tuple[str, int], _Queue] = {}
        for s in states:
            self.queues[(s.topic, s.queue_id)] = _Queue(s.name, s.max_offset, s.max_physic_offset, bool(s.files))
        self.batch_topics = batch_topics

    def queue(self, topic: str, queue_id: int) -> _Queue:
        q = self.queues.get((topic, queue_id))
        if q is None:
            q = self.queues[(topic, queue_id)] = _Queue(f"{topic}/{queue_id}", 0, -1, False)
        return q

    def dispatch(self, rec: Message) -> None:
        """``CommitLogDispatcherBuildConsumeQueue.dispatch`` for one record."""
        if rec.sys_flag & TRANSACTION_TYPE_MASK not in _DISPATCHED_TYPES or rec.topic in self.batch_topics:
            return
        self.queue(rec.topic, rec.queue_id).put(rec.offset, rec.size, rec.queue_offset)
        if _MULTI in rec.properties_raw:
            for name, qid, qoff in multi_dispatch_targets(rec.properties, rec.queue_id):
                self.queue(name, qid).put(rec.offset, rec.size, qoff)

    def result(self) -> list[QueueRedispatch]:
        return sorted((q.out for q in self.queues.values() if q.out is not None), key=lambda r: r.queue)


def redispatch_ranges(cl: CommitLog, start_index: int, end_offset: int, after: int) -> list[tuple[Segment, int]]:
    """The (segment, walk end) pairs :func:`redispatch` walks: segment by segment from ``start_index`` up to
    ``end_offset``, leaving out segments that end at or before ``after``."""
    out = []
    for seg in cl.segments[start_index:]:
        if seg.start >= end_offset:
            break
        stop = min(seg.end, end_offset)
        if stop > after:
            out.append((seg, stop))
    return out


def dispatch_segment(model: DispatchModel, cl: CommitLog, seg: Segment, stop: int, after: int,
                     use_mmap: bool = True) -> None:
    """Feed ``model`` the records of ``seg`` before ``stop`` whose offset is greater than ``after``."""
    walk = cl.walk(start=seg.start, end=stop, check_crc=False, read_body=False, use_mmap=use_mmap,
                   max_record_size=WALK_MAX_RECORD_SIZE)
    for rec in walk:
        if isinstance(rec, Message):
            if rec.offset > after:
                model.dispatch(rec)
        else:
            break  # a BLANK: the rest of this file is not records


def redispatch(cl: CommitLog, states: Iterable, *, start_index: int, end_offset: int, after: int = -1,
               batch_topics: set[str] | frozenset[str] = frozenset(), use_mmap: bool = True) -> list[QueueRedispatch]:
    """The entries recovery re-dispatches for the records in [segment ``start_index``, ``end_offset``)
    whose commitlog offset is greater than ``after`` (5.3.3 normal recovery: the consume queues'
    maximum physical offset; abnormal recovery: −1, every record).

    ``states``: the queues after consume-queue recovery (``recovery.QueueState``).
    The walk is per segment up to the recovery end, so a BLANK the broker accepts (whatever its
    size field says) never hides the next file's records. The pure reference; its compiled twin is
    :func:`rmqdump.fast.redispatch.redispatch_fast` (column batches, identical results).
    """
    model = DispatchModel(states, batch_topics)
    for seg, stop in redispatch_ranges(cl, start_index, end_offset, after):
        dispatch_segment(model, cl, seg, stop, after, use_mmap)
    return model.result()
