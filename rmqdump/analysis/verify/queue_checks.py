"""ConsumeQueue ↔ commitlog, both ways (:class:`CqChecker`): every dispatchable record has its entry (size,
tagsCode), every entry points at its record; what is left over is classified (not dispatched yet, missing,
misplaced, dangling, past the end, expired, deleted topic).

The store checks (:mod:`rmqdump.analysis.verify.queue_checks`, :mod:`~rmqdump.analysis.verify.index_checks`,
:mod:`~rmqdump.analysis.verify.meta_checks`) append :class:`~rmqdump.findings.Finding` objects to a list;
file names are relative to the store root, offsets are byte positions in that file (for the commitlog: the
commitlog offset).
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from pathlib import Path

from rmqdump.analysis.verify.record_cache import RecordCache
from rmqdump.broker.recovery import QueueState
from rmqdump.broker.systopics import multi_dispatch_targets, multi_dispatched_to
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import (
    CQ_STORE_UNIT_SIZE,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.record import BODY_CRC, Invalid, Message
from rmqdump.errors import RmqdumpError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import open_batch_queues

_TAGS = b"TAGS\x01"
_SCHEDULE = SCHEDULE_TOPIC.encode()


def expected_tags_code(msg: Message, delay_levels_ms: list[int]) -> int | None:
    """The tagsCode the dispatcher writes for ``msg`` (None if it cannot be computed)."""
    if msg.topic_raw != _SCHEDULE and _TAGS not in msg.properties_raw:
        return 0
    try:
        return msg.tags_code(delay_levels_ms)
    except RmqdumpError:
        return None


class _Queue:
    __slots__ = ("state", "label", "base", "phys", "sizes", "tags", "matched", "n", "file_names")

    def __init__(self, state: QueueState, root: Path):
        self.state = state
        self.label = f"consumequeue/{state.topic}/{state.queue_id}"
        self.base = state.first_offset
        self.phys = array("q")
        self.sizes = array("i")
        self.tags = array("q")
        end = state.max_offset
        if end > self.base:
            fill = end - self.base
            self.phys = array("q", [-1]) * fill
            self.sizes = array("i", [0]) * fill
            self.tags = array("q", [0]) * fill
            for e in state.cq.iter_entries():
                i = e.queue_offset - self.base
                if 0 <= i < fill:
                    self.phys[i], self.sizes[i], self.tags[i] = e.commit_log_offset, e.size, e.tags_code
        self.n = len(self.phys)
        self.matched = bytearray(self.n)

    def where(self, qoff: int) -> tuple[str, int]:
        """(file label, byte position) of the entry of queue offset ``qoff``."""
        fs = self.state.file_size
        logical = qoff * CQ_STORE_UNIT_SIZE
        start = logical - logical % fs
        return f"{self.label}/{start:020d}", logical % fs


class Unmatched:
    """Records no entry points at, in commitlog order: ``(offset, size, topic bytes, queue id, queue offset,
    segment name)`` tuples, or compact column chunks appended by the compiled join (:meth:`add_rows`)."""

    def __init__(self) -> None:
        self.parts: list = []
        self.n = 0

    def append(self, row: tuple) -> None:
        if not self.parts or not isinstance(self.parts[-1], list):
            self.parts.append([])
        self.parts[-1].append(row)
        self.n += 1

    def add_rows(self, offsets, sizes, topic_ids, topics: list[bytes], qids, qoffs, file: str) -> None:
        """Rows as columns (anything with ``tolist()``); ``topics[topic_ids[k]]`` is row k's topic."""
        if len(offsets):
            self.parts.append((offsets, sizes, topic_ids, topics, qids, qoffs, file))
            self.n += len(offsets)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for part in self.parts:
            if isinstance(part, list):
                yield from part
                continue
            offsets, sizes, tids, topics, qids, qoffs, file = part
            for off, size, t, qid, qoff in zip(offsets.tolist(), sizes.tolist(), tids.tolist(), qids.tolist(),
                                               qoffs.tolist(), strict=True):
                yield off, size, topics[t], qid, qoff, file


class CqChecker:
    """ConsumeQueue ↔ commitlog in both directions; feed it every valid record via :meth:`on_message`."""

    queue_class = _Queue

    def __init__(self, root: Path, states: list[QueueState], cl: CommitLog, *,
                 delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS, topics: dict | None = None,
                 max_per_kind: int = 1000):
        self.root, self.cl = root, cl
        self.delay = delay_levels_ms
        self.topics = topics or {}
        self.by_topic: dict[bytes, dict[int, _Queue]] = {}
        self.queues: list[_Queue] = []
        for st in states:
            q = self.queue_class(st, root)
            self.queues.append(q)
            self.by_topic.setdefault(os.fsencode(st.topic), {})[st.queue_id] = q
        self.unmatched = Unmatched()
        self.findings: list[Finding] = []
        self.max_per_kind = max_per_kind
        self.counts: Counter = Counter()
        self.records_checked = 0
        self.queue_range_warned: set[tuple[bytes, int]] = set()
        # 5.x BatchCQ topics are dispatched into batchconsumequeue/ units, not consumequeue/:
        # topic -> queue id -> {commitlog offset: unit size}
        self.bcq: dict[bytes, dict[int, dict[int, int]]] = {}
        if root is not None:
            for (topic, qid), bq in open_batch_queues(root).items():
                units: dict[int, int] = {}
                try:
                    for u in bq.iter_units():
                        if u.is_valid:
                            units[u.commit_log_offset] = u.size
                except RmqdumpError:
                    pass
                self.bcq.setdefault(os.fsencode(topic), {})[qid] = units

    def _add(self, severity: str, kind: str, file: str, offset: int | None, detail: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= self.max_per_kind:
            self.findings.append(Finding(severity, kind, file, offset, detail))

    def on_message(self, msg: Message) -> None:
        tx = msg.sys_flag & TRANSACTION_TYPE_MASK
        if tx != 0 and tx != TRANSACTION_COMMIT_TYPE:
            return
        self.records_checked += 1
        qd = self.by_topic.get(msg.topic_raw)
        q = qd.get(msg.queue_id) if qd is not None else None
        if self.topics:
            self._check_queue_id(msg)
        if q is not None:
            i = msg.queue_offset - q.base
            if 0 <= i < q.n and q.phys[i] == msg.offset:
                q.matched[i] = 1
                if q.sizes[i] != msg.size:
                    f, p = q.where(msg.queue_offset)
                    self._add(ERROR, "cq_size_mismatch", f, p + 8,
                              f"entry for the record at {msg.offset} says size {q.sizes[i]}, the record is {msg.size}")
                t = q.tags[i]
                if t > -2147483649:  # not a ConsumeQueueExt address
                    exp = expected_tags_code(msg, self.delay)
                    if exp is not None and exp != t:
                        f, p = q.where(msg.queue_offset)
                        sched = msg.topic_raw == _SCHEDULE
                        self._add(WARNING if sched else ERROR, "cq_tags_mismatch", f, p + 12,
                                  f"tagsCode {t} but the record at {msg.offset} gives {exp}"
                                  + (" (delivery time: depends on the broker's messageDelayLevel)" if sched else ""))
                return
        if self.bcq:
            units = self.bcq.get(msg.topic_raw, {}).get(msg.queue_id)
            size = units.get(msg.offset) if units is not None else None
            if size is not None:  # dispatched into the BatchConsumeQueue
                if size != msg.size:
                    self._add(ERROR, "cq_size_mismatch", f"batchconsumequeue/{msg.topic}/{msg.queue_id}", None,
                              f"unit for the record at {msg.offset} says size {size}, the record is {msg.size}")
                return
        self.unmatched.append((msg.offset, msg.size, msg.topic_raw, msg.queue_id, msg.queue_offset, msg.file))

    def _check_queue_id(self, msg: Message) -> None:
        cfg = self.topics.get(msg.topic)
        if cfg is None:
            return
        limit = max(cfg.read_queue_nums, cfg.write_queue_nums)
        if msg.queue_id >= limit and (msg.topic_raw, msg.queue_id) not in self.queue_range_warned:
            self.queue_range_warned.add((msg.topic_raw, msg.queue_id))
            self._add(WARNING, "queue_id_out_of_range", f"commitlog/{msg.file}", msg.offset,
                      f"{msg.topic}: QUEUEID {msg.queue_id} >= the topic's {limit} queues in topics.json")

    def finish(self, cache: RecordCache, *, dispatch_from: int, valid_end: int, recovery_end: int | None,
               visited_end: dict[str, int] | None = None) -> list[Finding]:
        """Classify what was not matched. ``dispatch_from``: records at or after it get entries at
        the next start; ``recovery_end``: predicted commitlog end (entries past it are truncated)."""
        min_off = self.cl.min_offset
        first, undispatched = None, 0
        for u in self.unmatched:
            if u[0] >= dispatch_from:
                first = u if first is None else first
                undispatched += 1
        if first is not None:
            self._add(INFO, "cq_not_dispatched", f"commitlog/{first[5]}", first[0],
                      f"{undispatched} record(s) from offset {first[0]} have no consume-queue entry yet; "
                      f"the broker dispatches them at its next start (from {dispatch_from})")
        # unmatched valid entries, by commitlog offset, to explain missing records
        unmatched_entries: dict[int, list[tuple[_Queue, int]]] = {}
        for q in self.queues:
            m = q.matched
            i = m.find(0)
            expired = 0
            while i >= 0:
                phys, size = int(q.phys[i]), int(q.sizes[i])
                if phys >= 0 and size > 0 and not (phys == 0 and size == 0x7FFFFFFF):
                    if phys < min_off:
                        expired += 1
                    else:
                        unmatched_entries.setdefault(phys, []).append((q, i))
                elif phys != 0 or size != 0x7FFFFFFF:
                    f, p = q.where(q.base + i)
                    self._add(ERROR, "cq_hole", f, p,
                              f"invalid entry (offset {phys}, size {size}) at queue offset {q.base + i} before "
                              "later valid entries")
                i = m.find(0, i + 1)
            if expired:
                self._add(INFO, "cq_entry_expired", q.label, None,
                          f"{expired} entries point below the commitlog's first offset {min_off} (deleted files)")
            st = q.state
            if st.beyond:
                qo, po = st.beyond[0]
                f, p = q.where(qo)
                self._add(WARNING, "cq_entries_after_hole", f, p,
                          f"{len(st.beyond)} valid entries after the first invalid entry at queue offset "
                          f"{st.max_offset}: the broker's CQ recovery discards them")
        with_queues = {q.state.topic for q in self.queues}
        deleted: Counter = Counter()
        for off, _size, topic_raw, qid, qoff, seg_name in self.unmatched:
            if off >= dispatch_from:
                continue
            topic = topic_raw.decode("utf-8", "replace")
            if self.topics and topic not in self.topics and topic not in with_queues:
                deleted[topic] += 1  # an admin deleted the topic: the broker removed its queues on purpose
                continue
            elsewhere = unmatched_entries.get(off)
            if elsewhere:
                q, i = elsewhere[0]
                if q.state.topic == topic and q.state.queue_id == qid:
                    f, p = q.where(q.base + i)
                    self._add(ERROR, "cq_entry_misplaced", f, p,
                              f"entry at queue offset {q.base + i} points at the record at {off}, whose QUEUEOFFSET "
                              f"is {qoff}")
                    elsewhere.pop(0)
                    if not elsewhere:
                        del unmatched_entries[off]
                    continue
            self._add(ERROR, "cq_entry_missing", f"commitlog/{seg_name}", off,
                      f"{topic}/{qid} queue offset {qoff}: no consume-queue entry points at this record (below the "
                      f"dispatch point {dispatch_from}, so the broker will not add one): consumers never see it")
        for topic, n in sorted(deleted.items()):
            self._add(INFO, "cq_topic_deleted", "config/topics.json", None,
                      f"{n} record(s) of {topic}, a topic config/topics.json no longer lists, have no consume-queue "
                      "entries: the topic was deleted (its queues with it); the records go when their files expire")
        for phys, lst in sorted(unmatched_entries.items()):
            rec = cache.decode(phys)
            if isinstance(rec, Invalid) and rec.kind == BODY_CRC:
                # a whole record whose body is damaged (its own body_crc finding says so): the entry
                # points at it, as the broker, which serves it without a CRC check, sees it
                rec = cache.decode(phys, check_crc=False)
            for q, i in lst:
                self._classify_entry(q, i, phys, rec, valid_end, recovery_end, visited_end)
        return self.findings

    def _classify_entry(self, q: _Queue, i: int, phys: int, rec, valid_end: int, recovery_end: int | None,
                        visited_end: dict[str, int] | None) -> None:
        qoff = q.base + i
        f, p = q.where(qoff)
        st = q.state
        trunc = (" (the predicted recovery truncates it)" if recovery_end is not None and phys >= recovery_end
                 else "")
        if not isinstance(rec, Message):
            if phys >= valid_end and rec.kind in ("end_of_data", "blank"):
                self._add(ERROR, "cq_entry_beyond_end", f, p,
                          f"queue offset {qoff} points at {phys}, past the end of valid commitlog data {valid_end}"
                          + trunc)
            else:
                self._add(ERROR, "cq_entry_dangling", f, p,
                          f"queue offset {qoff} points at {phys}, where there is no valid record ({rec.kind}: "
                          f"{rec.detail})" + trunc)
            return
        tx = rec.sys_flag & TRANSACTION_TYPE_MASK
        if rec.topic != st.topic or rec.queue_id != st.queue_id:
            if multi_dispatched_to(rec, st.topic, st.queue_id, qoff):
                return  # LMQ fan-out: the same record is dispatched to every queue it lists
            if multi_dispatched_to(rec, st.topic, st.queue_id):
                offs = [o for t, _q, o in multi_dispatch_targets(rec.properties, rec.queue_id) if t == st.topic]
                self._add(ERROR, "cq_entry_misplaced", f, p,
                          f"entry at queue offset {qoff} points at the record at {phys}, multi-dispatched to "
                          f"{st.topic} at queue offset {','.join(map(str, offs))} (INNER_MULTI_QUEUE_OFFSET)")
                return
            self._add(ERROR, "cq_entry_wrong_queue", f, p,
                      f"queue offset {qoff} points at {phys}, a record of {rec.topic}/{rec.queue_id}")
            return
        if tx != 0 and tx != TRANSACTION_COMMIT_TYPE:
            self._add(ERROR, "cq_entry_wrong_queue", f, p,
                      f"queue offset {qoff} points at a {rec.transaction} record, which is never dispatched")
            return
        j = rec.queue_offset - q.base
        if 0 <= j < q.n and q.phys[j] == phys and q.matched[j]:
            self._add(ERROR, "cq_entry_duplicate", f, p,
                      f"queue offset {qoff} points at the record at {phys}, already referenced by queue offset "
                      f"{rec.queue_offset}")
            return
        if rec.queue_offset != qoff:
            self._add(ERROR, "cq_entry_misplaced", f, p,
                      f"entry at queue offset {qoff} points at the record at {phys}, whose QUEUEOFFSET is "
                      f"{rec.queue_offset}")
            return
        # a record the segment walk did not reach (it stopped at damage without --keep-going)
        if q.sizes[i] != rec.size:
            self._add(ERROR, "cq_size_mismatch", f, p + 8, f"entry says size {q.sizes[i]}, the record is {rec.size}")
