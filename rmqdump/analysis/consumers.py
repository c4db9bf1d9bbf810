"""Consumer progress from ``config/consumerOffset.json`` against the ConsumeQueues (§8.1, §10.4).

``consumerOffset.json`` (fastjson, unquoted integer keys; ``.bak`` fallback as the broker
does) holds per ``topic@group`` and queue the committed *next* offset to consume. Against
the ConsumeQueue of that topic-queue (min/max offset as the broker's recovery computes them)
this gives the lag the broker's admin tools report (``max offset − committed``) and, for a
disk pulled from a dead broker, exactly which messages the group never consumed: the CQ
entries in ``[committed, max)``, decoded from the commitlog.

The broker persists consumer offsets every few seconds (``flushConsumerOffsetInterval``,
5 s by default), so after a crash the committed offsets may be slightly behind what the
consumers really processed: the unconsumed list is an upper bound (some of it may be
delivered again, never less).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rmqdump.broker.systopics import multi_dispatched_to
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.codec.record import Invalid, Message
from rmqdump.disk.segment import SegmentReader
from rmqdump.errors import RmqdumpError
from rmqdump.store.commitlog import CommitLog, read_record
from rmqdump.store.config import load_consumer_offsets
from rmqdump.store.consumequeue import ConsumeQueue, CqEntry, discover_queues, infer_store_cq_file_size

#: Columns of :meth:`QueueLag.to_dict` (the ``consumers`` command's schema).
LAG_FIELDS = ("group", "topic", "queue_id", "committed", "min_offset", "max_offset", "lag", "note")

NOTE_NO_COMMIT = "no committed offset for this queue (the group never committed here)"
NOTE_AHEAD = "committed offset is beyond the queue's max offset (queue truncated by recovery, or offsets from a newer disk)"
NOTE_BELOW_MIN = "committed offset is below the queue's min offset (older messages were deleted)"
NOTE_NO_QUEUE = "no consume queue on disk for this topic-queue"


@dataclass
class QueueLag:
    """Progress of one group on one topic-queue."""

    group: str
    topic: str
    queue_id: int
    committed: int | None
    min_offset: int | None
    max_offset: int | None
    lag: int | None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def unconsumed_range(self) -> tuple[int, int] | None:
        """Queue offsets ``[start, end)`` of messages the group has not consumed (None: nothing/unknown)."""
        if self.max_offset is None or self.min_offset is None:
            return None
        start = self.min_offset if self.committed is None else max(self.committed, self.min_offset)
        return (start, self.max_offset) if start < self.max_offset else None


@dataclass
class ConsumerReport:
    """Every (group, topic, queue) row plus where the offsets came from and what was odd."""

    rows: list[QueueLag]
    offsets_file: Path | None
    used_backup: bool = False
    problems: list[str] = field(default_factory=list)

    def total_lag(self) -> dict[str, int]:
        """Sum of positive lags per group."""
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.group] = out.get(r.group, 0) + max(r.lag or 0, 0)
        return out


def consumer_lag(store_root: str | os.PathLike, groups: tuple[str, ...] = (), topics: tuple[str, ...] = (),
                 commitlog_min_offset: int = 0) -> ConsumerReport:
    """Rows for every ``topic@group`` of consumerOffset.json (filtered by ``groups``/``topics``).

    Queues of a topic that exist on disk but have no committed offset for the group get a row
    with ``committed`` None (all their messages count as unconsumed).
    """
    root = Path(store_root)
    loaded = load_consumer_offsets(root)
    report = ConsumerReport([], loaded.path, loaded.used_backup)
    if loaded.main_error is not None:
        report.problems.append(f"main consumerOffset.json unusable ({loaded.main_error}); used {loaded.path}")
    if loaded.data is None:
        return report
    cq_size = None
    disk: dict[str, dict[int, Path]] = {}
    try:
        cq_size = infer_store_cq_file_size(root)
        for ref in discover_queues(root):
            disk.setdefault(ref.topic, {})[ref.queue_id] = ref.path
    except RmqdumpError as e:
        report.problems.append(f"consume queues: {e}")
    cache: dict[tuple[str, int], tuple[int, int] | None] = {}

    def bounds(topic: str, qid: int) -> tuple[int, int] | None:
        key = (topic, qid)
        if key not in cache:
            path = disk.get(topic, {}).get(qid)
            if path is None:
                cache[key] = None
            else:
                try:
                    q = ConsumeQueue(path, topic, qid, cq_size, strict=False)
                    report.problems.extend(q.problems)
                    cache[key] = (q.min_offset(commitlog_min_offset), q.max_offset)
                except RmqdumpError as e:
                    report.problems.append(str(e))
                    cache[key] = None
        return cache[key]

    for key, queues in sorted(loaded.data.table.items()):
        topic, group = loaded.data.split_key(key)
        if group is None:
            report.problems.append(f"offsetTable key {key!r} is not topic@group; the broker ignores it")
            continue
        if (groups and group not in groups) or (topics and topic not in topics):
            continue
        for qid in sorted(set(queues) | set(disk.get(topic, {}))):
            committed = queues.get(qid)
            b = bounds(topic, qid)
            if b is None:
                report.rows.append(QueueLag(group, topic, qid, committed, None, None, None, NOTE_NO_QUEUE))
                continue
            mn, mx = b
            if committed is None:
                lag, note = mx - mn, NOTE_NO_COMMIT
            else:
                lag = mx - committed
                note = NOTE_AHEAD if committed > mx else NOTE_BELOW_MIN if committed < mn else ""
            report.rows.append(QueueLag(group, topic, qid, committed, mn, mx, lag, note))
    report.rows.sort(key=lambda r: (r.group, r.topic, r.queue_id))
    return report


@dataclass
class Unconsumed:
    """One message a group has not consumed (``message`` is an Invalid when the CQ entry is bad)."""

    lag: QueueLag
    entry: CqEntry
    message: Message | Invalid
    problem: str = ""


def iter_unconsumed(report: ConsumerReport, store_root: str | os.PathLike, commitlog: CommitLog, *,
                    read_body: bool = True, check_crc: bool = True, use_mmap: bool = True,
                    max_record_size: int = MAX_RECORD_SIZE) -> Iterator[Unconsumed]:
    """The messages in each row's unconsumed range, in queue order, decoded from the commitlog.

    A CQ entry that is invalid, points outside the commitlog, or at a record of another
    topic/queue/offset is yielded with ``problem`` set (that is damage).
    """
    root = Path(store_root)
    cq_size = infer_store_cq_file_size(root)
    readers: dict[str, SegmentReader] = {}
    try:
        for row in report.rows:
            rng = row.unconsumed_range
            if rng is None:
                continue
            q = ConsumeQueue.open(root, row.topic, row.queue_id, cq_size, strict=False)
            for e in q.iter_entries(rng[0], rng[1]):
                if not e.is_valid:
                    yield Unconsumed(row, e, Invalid(e.commit_log_offset, "", 0, "bad_cq_entry", "invalid CQ entry"),
                                     f"invalid CQ entry at queue offset {e.queue_offset}")
                    continue
                seg = commitlog.segment_for(e.commit_log_offset)
                if seg is None:
                    yield Unconsumed(row, e, Invalid(e.commit_log_offset, "", 0, "outside", "outside the commitlog"),
                                     f"CQ entry {e.queue_offset} points at {e.commit_log_offset}, outside the commitlog")
                    continue
                r = readers.get(seg.name)
                if r is None:
                    r = readers[seg.name] = seg.open(use_mmap)
                rec = read_record(r, e.commit_log_offset - seg.start, check_crc=check_crc, read_body=read_body,
                                  max_record_size=max_record_size)
                problem = ""
                if not isinstance(rec, Message):
                    problem = f"CQ entry {e.queue_offset} -> offset {e.commit_log_offset}: " + (
                        f"{rec.kind}: {rec.detail}" if isinstance(rec, Invalid) else "a BLANK record")
                    if not isinstance(rec, Invalid):
                        rec = Invalid(e.commit_log_offset, seg.name, e.commit_log_offset - seg.start, "blank",
                                      "CQ entry points at a BLANK record")
                elif (rec.topic != row.topic or rec.queue_id != row.queue_id or rec.queue_offset != e.queue_offset
                      or rec.size != e.size) and not (
                        rec.size == e.size and multi_dispatched_to(rec, row.topic, row.queue_id, e.queue_offset)):
                    problem = (f"CQ entry {row.topic}/{row.queue_id}@{e.queue_offset} (size {e.size}) points at a "
                               f"record of {rec.topic}/{rec.queue_id}@{rec.queue_offset} (size {rec.size})")
                yield Unconsumed(row, e, rec, problem)
    finally:
        for r in readers.values():
            r.close()
