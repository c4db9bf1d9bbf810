"""Consumer progress from ``config/consumerOffset.json`` against the ConsumeQueues (§8.1, §10.4).

``consumerOffset.json`` (fastjson, unquoted integer keys; ``.bak`` fallback as the broker
does) holds per ``topic@group`` and queue the committed *next* offset to consume. Against
the ConsumeQueue of that topic-queue (min/max offset as the broker's recovery computes them)
this gives the lag the broker's admin tools report (``max offset − committed``) and, for a
disk pulled from a dead broker, exactly which messages the group never consumed: the CQ
entries in ``[committed, max)``, decoded from the commitlog.

When forced deletion (disk full, ``diskMaxUsedSpaceRatio``) or expiry removed commitlog segments a group had
not consumed (apache/rocketmq #4549, #2260), the committed offset is below the queue's min offset: the
messages in ``[committed, min)`` were deleted before consumption (:class:`Deleted`). Their store times went
with the data; what the store still proves is a bound: they were stored no later than the oldest remaining
record (the broker deletes the oldest segments, and store times follow the commitlog), and no earlier than
the begin time of an index file whose first offset precedes them (when the CQ units naming their commitlog
offsets outlived the segment). ``at_risk``: the unconsumed messages stored in the oldest segment, the next
one deletion removes (never the last segment: the broker keeps the file it writes).

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
LAG_FIELDS = ("group", "topic", "queue_id", "committed", "min_offset", "max_offset", "lag", "deleted", "at_risk",
              "note", "deleted_queue_offsets", "deleted_commitlog_offsets", "deleted_stored_not_after",
              "deleted_stored_not_before", "at_risk_bytes")

NOTE_NO_COMMIT = "no committed offset for this queue (the group never committed here)"
NOTE_AHEAD = "committed offset is beyond the queue's max offset (queue truncated by recovery, or offsets from a newer disk)"
NOTE_BELOW_MIN = "committed offset is below the queue's min offset (older messages were deleted)"
NOTE_NO_QUEUE = "no consume queue on disk for this topic-queue"


@dataclass
class Deleted:
    """Messages of one queue deleted before a group consumed them: queue offsets ``[committed, min)``.

    ``commitlog_offsets``: ``[first, end)`` of those whose CQ units are still on disk (None: none are;
    ``units_left`` says how many). ``stored_not_after``: an upper bound of their store times (the oldest
    remaining record's); ``stored_not_before``: a lower bound (an index file's begin time), only when every
    deleted message's commitlog offset is known to follow that index file's first offset. Bounds, not times.
    """

    count: int
    queue_offsets: tuple[int, int]
    commitlog_offsets: tuple[int, int] | None = None
    units_left: int = 0
    stored_not_after: int | None = None
    stored_not_before: int | None = None


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
    deleted: Deleted | None = None  # messages deleted before the group consumed them
    at_risk: int | None = None  # unconsumed messages in the oldest segment (None: not computed)
    at_risk_bytes: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        dl = self.deleted
        d.update(deleted=dl.count if dl else 0 if self.min_offset is not None else None,
                 deleted_queue_offsets=list(dl.queue_offsets) if dl else None,
                 deleted_commitlog_offsets=list(dl.commitlog_offsets) if dl and dl.commitlog_offsets else None,
                 deleted_stored_not_after=dl.stored_not_after if dl else None,
                 deleted_stored_not_before=dl.stored_not_before if dl else None)
        return {k: d[k] for k in LAG_FIELDS}

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
                 commitlog_min_offset: int = 0, commitlog: CommitLog | None = None) -> ConsumerReport:
    """Rows for every ``topic@group`` of consumerOffset.json (filtered by ``groups``/``topics``).

    Queues of a topic that exist on disk but have no committed offset for the group get a row
    with ``committed`` None (all their messages count as unconsumed). With ``commitlog``, rows
    also say what was deleted before consumption (time bounds included) and what is at risk next.
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
    opened: dict[tuple[str, int], ConsumeQueue] = {}

    def bounds(topic: str, qid: int) -> tuple[int, int] | None:
        key = (topic, qid)
        if key not in cache:
            path = disk.get(topic, {}).get(qid)
            if path is None:
                cache[key] = None
            else:
                try:
                    q = opened[key] = ConsumeQueue(path, topic, qid, cq_size, strict=False)
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
    if commitlog is not None:
        _deletion_facts(report, root, commitlog, opened)
    return report


def _first_store_time(commitlog: CommitLog) -> int | None:
    """Store time of the oldest remaining record (None: no record)."""
    try:
        for rec in commitlog.walk(start=commitlog.min_offset, check_crc=False, read_body=False):
            if isinstance(rec, Message):
                return rec.store_timestamp
            if isinstance(rec, Invalid):
                return None
    except RmqdumpError:
        return None
    return None


def _index_begins(root: Path) -> list[tuple[int, int]]:
    """(beginPhyOffset, beginTimestamp) of every index file whose header says it holds entries."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    out = []
    try:
        paths = list_index_files(root)
    except RmqdumpError:
        return out
    for p in paths:
        try:
            with IndexFile(p, strict=False) as f:
                h = f.header
                if h.begin_timestamp > 0 and h.begin_phy_offset >= 0 and f.index_count > 1:
                    out.append((h.begin_phy_offset, h.begin_timestamp))
        except RmqdumpError:
            continue
    return out


def _deletion_facts(report: ConsumerReport, root: Path, commitlog: CommitLog,
                    queues: dict[tuple[str, int], ConsumeQueue]) -> None:
    """Fill ``deleted``, ``at_risk`` and ``at_risk_bytes`` of every row with a consume queue."""
    below = [r for r in report.rows if r.committed is not None and r.min_offset is not None
             and r.committed < r.min_offset]
    below_ids = {id(r) for r in below}
    oldest_ts = _first_store_time(commitlog) if below else None
    begins = _index_begins(root) if below else []
    segs = commitlog.segments
    risk_end = segs[0].end if len(segs) > 1 else None  # the broker never deletes the file it writes
    for r in report.rows:
        q = queues.get((r.topic, r.queue_id))
        if q is None or r.min_offset is None:
            continue
        try:
            if id(r) in below_ids:
                r.deleted = _deleted(r, q, commitlog.min_offset, oldest_ts, begins)
            r.at_risk, r.at_risk_bytes = _at_risk(r, q, risk_end)
        except RmqdumpError as e:
            report.problems.append(f"{r.topic}/{r.queue_id}: {e}")


def _deleted(r: QueueLag, q: ConsumeQueue, cl_min: int, oldest_ts: int | None,
             begins: list[tuple[int, int]]) -> Deleted:
    d = Deleted(r.min_offset - r.committed, (r.committed, r.min_offset), stored_not_after=oldest_ts)
    first = last = None
    first_qoff = None
    for e in q.iter_raw(r.committed):  # the units below min that outlived their commitlog segment
        if e.queue_offset >= r.min_offset:
            break
        if not e.is_valid or e.commit_log_offset >= cl_min:
            continue
        if first is None:
            first, first_qoff = e, e.queue_offset
        last = e
        d.units_left += 1
    if first is not None:
        d.commitlog_offsets = (first.commit_log_offset, last.commit_log_offset + last.size)
        if first_qoff == r.committed:  # every deleted message's offset is at or after first's
            lows = [ts for phy, ts in begins if phy <= first.commit_log_offset]
            d.stored_not_before = max(lows) if lows else None
    return d


def _at_risk(r: QueueLag, q: ConsumeQueue, risk_end: int | None) -> tuple[int, int]:
    """Unconsumed messages (count, bytes) of the row stored before ``risk_end`` (the oldest segment's end)."""
    rng = r.unconsumed_range
    if rng is None or risk_end is None:
        return 0, 0
    lo, hi = rng
    while lo < hi:  # CQ units' commitlog offsets grow with the queue offset: the first unit past the segment
        mid = (lo + hi) // 2
        e = q.entry_at(mid, check_max=False)
        if e.is_valid and e.commit_log_offset < risk_end:
            lo = mid + 1
        else:
            hi = mid
    n = lo - rng[0]
    return n, sum(e.size for e in q.iter_entries(rng[0], lo) if e.is_valid) if n else 0


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
