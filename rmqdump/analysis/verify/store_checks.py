"""Store-level checks: consume queues ↔ commitlog, index → commitlog, checkpoint, config, abort, lock.

Each check appends :class:`~rmqdump.findings.Finding` objects to a list. File names in
findings are relative to the store root; offsets are byte positions in that file (for the
commitlog: the commitlog offset).
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from pathlib import Path

from rmqdump.broker.recovery import QueueState
from rmqdump.broker.systopics import multi_dispatch_targets, multi_dispatched_to
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, index_key_hash
from rmqdump.codec.layout import (
    CQ_STORE_UNIT_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.properties import split_keys
from rmqdump.codec.record import BODY_CRC, Invalid, Message
from rmqdump.disk.fileio import read_regular
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog, read_record
from rmqdump.store.config import MAX_CONFIG_BYTES
from rmqdump.store.consumequeue import open_batch_queues

_TAGS = b"TAGS\x01"
_SCHEDULE = SCHEDULE_TOPIC.encode()


class RecordCache:
    """Random access to commitlog records through one open reader per segment."""

    def __init__(self, cl: CommitLog, use_mmap: bool = True):
        self.cl, self.use_mmap, self.readers = cl, use_mmap, {}

    def decode(self, offset: int, check_crc: bool = True) -> Message | Invalid:
        seg = self.cl.segment_for(offset)
        if seg is None:
            return Invalid(offset, "", 0, "end_of_data", f"offset {offset} is outside every commitlog segment")
        r = self.readers.get(seg.start)
        if r is None:
            r = self.readers[seg.start] = seg.open(self.use_mmap)
        rec = read_record(r, offset - seg.start, check_crc=check_crc, read_body=False)
        if not isinstance(rec, Message):
            if isinstance(rec, Invalid):
                return rec
            return Invalid(offset, seg.name, offset - seg.start, "blank", "a BLANK (end-of-file) record")
        return rec

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
        self.readers.clear()


def _rel(root: Path | None, p: Path | str) -> str:
    p = Path(p)
    if root is not None:
        try:
            return str(p.relative_to(root))
        except ValueError:
            pass
    return str(p)


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


class CqChecker:
    """ConsumeQueue ↔ commitlog in both directions; feed it every valid record via :meth:`on_message`."""

    def __init__(self, root: Path, states: list[QueueState], cl: CommitLog, *,
                 delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS, topics: dict | None = None,
                 max_per_kind: int = 1000):
        self.root, self.cl = root, cl
        self.delay = delay_levels_ms
        self.topics = topics or {}
        self.by_topic: dict[bytes, dict[int, _Queue]] = {}
        self.queues: list[_Queue] = []
        for st in states:
            q = _Queue(st, root)
            self.queues.append(q)
            self.by_topic.setdefault(os.fsencode(st.topic), {})[st.queue_id] = q
        self.unmatched: list[tuple[int, int, bytes, int, int, str]] = []
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
        undispatched = [u for u in self.unmatched if u[0] >= dispatch_from]
        missing = [u for u in self.unmatched if u[0] < dispatch_from]
        if undispatched:
            first = undispatched[0]
            self._add(INFO, "cq_not_dispatched", f"commitlog/{first[5]}", first[0],
                      f"{len(undispatched)} record(s) from offset {first[0]} have no consume-queue entry yet; "
                      f"the broker dispatches them at its next start (from {dispatch_from})")
        # unmatched valid entries, by commitlog offset, to explain missing records
        unmatched_entries: dict[int, list[tuple[_Queue, int]]] = {}
        for q in self.queues:
            m = q.matched
            i = m.find(0)
            expired = 0
            while i >= 0:
                phys, size = q.phys[i], q.sizes[i]
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
        for off, _size, topic_raw, qid, qoff, seg_name in missing:
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


# --- index ------------------------------------------------------------------------------------------


def _own_slot_reachable(slots, hashes, prevs, count: int, chain_slot) -> bool:
    """Whether every entry on some chain is also on the chain of the slot its keyHash selects (what a query
    walks). The work is bounded (4 x the entry count); beyond it the answer is no."""
    n = len(slots)
    own = bytearray(count)
    budget = 4 * count + n
    for s, head in enumerate(slots):
        cur = head if 0 < head < count else 0
        while cur > 0:
            budget -= 1
            if budget < 0:
                return False
            if hashes[cur] % n == s:
                own[cur] = 1
            prev = prevs[cur]
            if prev >= cur or prev < 0:
                break
            cur = prev
    return all(own[i] for i in range(1, count) if chain_slot[i] != -1)


def check_index(root: Path, cl: CommitLog, cache: RecordCache, *, valid_end: int, recovery_end: int | None,
                max_per_kind: int = 1000) -> tuple[list[Finding], list[dict]]:
    """Index files → commitlog: keys, slots, chains, header counters and timestamps."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    out: list[Finding] = []
    infos: list[dict] = []
    counts: Counter = Counter()

    def add(sev, kind, file, off, detail):
        counts[kind] += 1
        if counts[kind] <= max_per_kind:
            out.append(Finding(sev, kind, file, off, detail))

    try:
        paths = list_index_files(root)
    except RmqdumpError as e:
        return [Finding(ERROR, "index_unreadable", "index", None, e.message)], infos
    sizes = Counter()
    for p in paths:
        try:
            sizes[p.stat().st_size] += 1
        except OSError:
            pass
    for n, p in enumerate(paths):
        label = f"index/{p.name}"
        if not (len(p.name) == 17 and p.name.isdigit()):
            add(WARNING, "index_file_name", label, None, "not a 17-digit yyyyMMddHHmmssSSS name")
        try:
            f = IndexFile(p, strict=False)
        except RmqdumpError as e:
            add(ERROR, "index_file_size", label, e.offset, e.message)
            continue
        with f:
            info = _check_one_index(f, label, n == 0, cl, cache, add, valid_end, recovery_end)
            infos.append(info)
    return out, infos


def _check_one_index(f, label: str, first_file: bool, cl: CommitLog, cache: RecordCache, add, valid_end: int,
                     recovery_end: int | None) -> dict:
    h = f.header
    geo = f.geometry
    count = h.index_count
    info = {"file": f.name, "entries": max(0, count - 1), "begin_timestamp": h.begin_timestamp,
            "end_timestamp": h.end_timestamp, "begin_phy_offset": h.begin_phy_offset,
            "end_phy_offset": h.end_phy_offset}
    if count < 0 or count > geo.index_num:
        add(ERROR, "index_header", label, 36, f"indexCount {count} outside [0, {geo.index_num}]")
        return info
    count = max(count, 1)
    slots_n = geo.hash_slot_num
    raw = _pread(f.path, slots_n * INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE)
    slots = array("i", raw[: len(raw) - len(raw) % 4])
    if array("i", [1]).tobytes()[0] == 1:
        slots.byteswap()
    prevs = array("i", [0]) * count
    hashes = array("i", [0]) * count
    # entries -> records (streamed; chains use the arrays filled here)
    entries_start = geo.entries_start
    last_phy = None
    rec = None
    keyset: set[int] = set()
    min_off = cl.min_offset
    expired = beyond = 0
    first_ts = last_ts = None
    first_phy = last_entry_phy = None
    for e in f.iter_entries():
        pos = entries_start + 20 * e.number
        prevs[e.number] = e.prev_index
        hashes[e.number] = e.key_hash
        if first_phy is None:
            first_phy = e.phy_offset
        last_entry_phy = e.phy_offset
        if e.phy_offset != last_phy:
            last_phy = e.phy_offset
            rec = None if e.phy_offset < min_off else cache.decode(e.phy_offset, check_crc=False)
            keyset = _index_hashes(rec) if isinstance(rec, Message) else set()
        if rec is None:
            expired += 1
            continue
        if not isinstance(rec, Message):
            if e.phy_offset >= valid_end or (recovery_end is not None and e.phy_offset >= recovery_end):
                beyond += 1
            else:
                add(ERROR, "index_entry_dangling", label, pos,
                    f"entry {e.number} points at {e.phy_offset}, where there is no valid record ({rec.kind})")
            continue
        if e.key_hash not in keyset:
            add(ERROR, "index_key_mismatch", label, pos,
                f"entry {e.number} keyHash {e.key_hash} matches no key of the record at {e.phy_offset} "
                f"({rec.topic}, {len(keyset)} indexed keys)")
        if rec.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
            add(ERROR, "index_key_mismatch", label, pos, f"entry {e.number} indexes a ROLLBACK record")
        ts = rec.store_timestamp
        if first_ts is None:
            first_ts = ts
        last_ts = ts
        if e.number > 1 and h.begin_timestamp > 0:
            d = ts - h.begin_timestamp
            exp = min(d // 1000, 0x7FFFFFFF) if d > 0 else 0  # putKey: seconds, 0 if negative, capped
            if e.time_diff != exp:
                add(WARNING, "index_time_mismatch", label, pos + 12,
                    f"entry {e.number} timeDiff {e.time_diff} s, record stored {exp} s after beginTimestamp")
    if expired:
        add(INFO, "index_entry_expired", label, None, f"{expired} entries point below the commitlog start {min_off}")
    if beyond:
        add(WARNING, "index_entry_beyond_end", label, None,
            f"{beyond} entries point past the end of valid commitlog data (stale after a truncation; queries "
            "re-read and drop them)")
    used = 0
    chain_slot = array("i", [-1]) * count
    irregular: list[tuple[str, int, str]] = []
    for s, head in enumerate(slots):
        if head == 0:
            continue
        if head < 0 or head >= count:
            add(WARNING, "index_slot_invalid", label, INDEX_HEADER_SIZE + 4 * s,
                f"slot {s} holds {head}, outside [1, indexCount {count}): ignored by queries")
            continue
        used += 1
        cur, seen = head, 0
        while cur > 0:
            if chain_slot[cur] == s:
                add(ERROR, "index_chain_cycle", label, entries_start + 20 * cur + 16,
                    f"chain of slot {s} revisits entry {cur}")
                break
            if chain_slot[cur] != -1:
                irregular.append(("index_chain_merge", entries_start + 20 * cur + 16,
                                  f"entry {cur} is on the chains of slots {chain_slot[cur]} and {s}"))
                break
            chain_slot[cur] = s
            if hashes[cur] % slots_n != s:
                irregular.append(("index_slot_mismatch", entries_start + 20 * cur,
                                  f"entry {cur} (keyHash {hashes[cur]}, slot {hashes[cur] % slots_n}) is on the "
                                  f"chain of slot {s}"))
            prev = prevs[cur]
            if prev == cur:  # RocketMQ's query ends a chain there (prevIndex == the entry read)
                irregular.append(("index_chain_order", entries_start + 20 * cur + 16,
                                  f"entry {cur} prevIndex {prev} points at itself"))
                break
            if prev >= cur or prev < 0 or prev >= count:
                if prev != 0:
                    add(ERROR, "index_chain_order", label, entries_start + 20 * cur + 16,
                        f"entry {cur} prevIndex {prev} does not point at an older entry")
                break
            cur = prev
            seen += 1
            if seen > count:
                break
    if irregular:
        if _own_slot_reachable(slots, hashes, prevs, count, chain_slot):
            # RocketMQ itself leaves such files after a crash: every entry is still on its own slot's chain,
            # so every query finds what it should (the extra links only cost a few hops)
            add(INFO, "index_chain_irregular", label, irregular[0][1],
                f"{len(irregular)} irregular chain link(s) (first: {irregular[0][2]}); every entry is still on "
                "its own slot's chain, so queries find every key")
        else:
            for kind, off, detail in irregular:
                add(ERROR, kind, label, off, detail)
    if used != h.hash_slot_count:  # a statistic the broker never reads back (stale slots make it drift)
        add(INFO, "index_header_mismatch", label, 32,
            f"hashSlotCount {h.hash_slot_count} but {used} slots are in use")
    unreachable = [i for i in range(1, count) if chain_slot[i] == -1]
    if unreachable:
        add(WARNING, "index_entry_unreachable", label, entries_start + 20 * unreachable[0],
            f"{len(unreachable)} entries (first #{unreachable[0]}) are on no slot chain: queries never find them")
    if first_phy is not None:
        if h.begin_phy_offset != first_phy and first_file:
            add(WARNING, "index_header_mismatch", label, 16,
                f"beginPhyOffset {h.begin_phy_offset} but the first entry points at {first_phy}")
        if h.end_phy_offset != last_entry_phy:
            add(WARNING, "index_header_mismatch", label, 24,
                f"endPhyOffset {h.end_phy_offset} but the last entry points at {last_entry_phy}")
        if first_ts is not None and h.begin_timestamp != first_ts and first_file:
            add(WARNING, "index_header_mismatch", label, 0,
                f"beginTimestamp {h.begin_timestamp} but the first indexed record was stored at {first_ts}")
        if last_ts is not None and h.end_timestamp != last_ts:
            add(WARNING, "index_header_mismatch", label, 8,
                f"endTimestamp {h.end_timestamp} but the last indexed record was stored at {last_ts}")
    return info


def _index_hashes(rec: Message) -> set[int]:
    props = rec.properties
    topic = rec.topic
    out = set()
    uk = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uk:
        out.add(index_key_hash(f"{topic}#{uk}"))
    for k in split_keys(props.get(PROPERTY_KEYS)):
        out.add(index_key_hash(f"{topic}#{k}"))
    return out


def _pread(path: Path, n: int, pos: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return os.pread(fd, n, pos)
    finally:
        os.close(fd)


# --- checkpoint, config, abort, lock ---------------------------------------------------------------


def check_checkpoint(store, checkpoint, *, max_store_ts: int | None, has_data: bool,
                     index_infos: list[dict]) -> list[Finding]:
    out: list[Finding] = []
    path = store.path("checkpoint")
    if path is None:
        out.append(Finding(WARNING, "checkpoint_missing", "checkpoint", None,
                           "no checkpoint file: abnormal recovery would start at the first commitlog file"))
        return out
    if checkpoint.file_size != 4096:
        out.append(Finding(WARNING, "checkpoint_size", "checkpoint", None,
                           f"checkpoint is {checkpoint.file_size} bytes, expected 4096"))
    cp = checkpoint
    if has_data and cp.physic_msg_timestamp == 0 and cp.logics_msg_timestamp == 0:
        out.append(Finding(INFO, "checkpoint_zero", "checkpoint", 0,
                           "checkpoint timestamps are 0 (never flushed): abnormal recovery starts at the first file"))
    if max_store_ts is not None:
        for name, pos, v in (("physicMsgTimestamp", 0, cp.physic_msg_timestamp),
                             ("logicsMsgTimestamp", 8, cp.logics_msg_timestamp)):
            if v > max_store_ts:
                out.append(Finding(WARNING, "checkpoint_ahead", "checkpoint", pos,
                                   f"{name} {v} is later than the newest valid record ({max_store_ts}): records "
                                   "that were flushed are no longer readable"))
    if cp.index_msg_timestamp and index_infos:
        if not any(i["end_timestamp"] == cp.index_msg_timestamp for i in index_infos):
            out.append(Finding(INFO, "checkpoint_index", "checkpoint", 16,
                               f"indexMsgTimestamp {cp.index_msg_timestamp} is no index file's endTimestamp"))
    return out


def check_config(root: Path) -> tuple[list[Finding], dict]:
    """Every ``config/*.json`` parses (fastjson rules); known files decode. Returns loaded topics too."""
    from rmqdump.store.config import (
        BAK_SUFFIX,
        decode_consumer_offsets,
        decode_delay_offsets,
        decode_subscription_groups,
        decode_topics,
        load_config_file,
        parse_fastjson,
    )

    out: list[Finding] = []
    loaded: dict = {}
    cdir = root / "config"
    if not cdir.is_dir():
        # the store module never writes config/ (the broker's managers do): a store without it starts fine
        out.append(Finding(INFO, "config_missing", "config", None, "no config/ directory"))
        return out, loaded
    decoders = {"topics.json": decode_topics, "consumerOffset.json": decode_consumer_offsets,
                "delayOffset.json": decode_delay_offsets, "subscriptionGroup.json": decode_subscription_groups}
    try:
        names = sorted(n for n in os.listdir(cdir) if n.endswith(".json") or n.endswith(".json" + BAK_SUFFIX))
    except OSError as e:
        return [Finding(ERROR, "config_unreadable", "config", None, e.strerror or str(e))], loaded
    for name in names:
        if name.endswith(BAK_SUFFIX):
            continue
        label = f"config/{name}"
        dec = decoders.get(name, lambda v, p: v)
        try:
            data = read_regular(cdir / name, MAX_CONFIG_BYTES + 1)
            if len(data) > MAX_CONFIG_BYTES:
                raise StoreError(f"larger than {MAX_CONFIG_BYTES} bytes; not parsed", cdir / name)
        except StoreError as e:
            out.append(Finding(ERROR, "config_unreadable", label, None, e.message))
            continue
        except OSError as e:
            out.append(Finding(ERROR, "config_unreadable", label, None, e.strerror or str(e)))
            continue
        try:
            if data.strip():
                loaded[name] = dec(parse_fastjson(data, cdir / name), cdir / name)
                continue
            err: RmqdumpError | None = None
        except RmqdumpError as e:
            err = e
        try:
            res = load_config_file(cdir / name, dec)  # the broker's fallback to <name>.bak
            loaded[name] = res.data
            ok = res.used_backup
        except RmqdumpError:
            ok = False
        if err is None:
            out.append(Finding(WARNING if ok else ERROR, "config_parse", label, None,
                               "empty file" + (" — the broker falls back to .bak" if ok else " and no usable .bak")))
        else:
            out.append(Finding(WARNING if ok else ERROR, "config_parse", label, err.offset,
                               err.message + (" — the broker falls back to .bak" if ok
                                              else " and the .bak copy is unusable too")))
    return out, loaded


def check_consumer_offsets(offsets, states: list[QueueState], cq_ends: dict[str, int]) -> list[Finding]:
    """Committed consumer offsets beyond a queue's max offset (now, and after the predicted recovery)."""
    out: list[Finding] = []
    if offsets is None:
        return out
    max_now = {f"{s.topic}/{s.queue_id}": s.max_offset for s in states}
    for topic, group, qid, off in offsets.rows():
        key = f"{topic}/{qid}"
        now = max_now.get(key)
        if now is not None and off > now:
            out.append(Finding(WARNING, "consumer_offset_ahead", "config/consumerOffset.json", None,
                               f"{topic}@{group} queue {qid}: committed offset {off} > queue max offset {now}"))
        elif key in cq_ends and off > cq_ends[key]:
            out.append(Finding(INFO, "consumer_offset_ahead", "config/consumerOffset.json", None,
                               f"{topic}@{group} queue {qid}: committed offset {off} > {cq_ends[key]}, the queue's "
                               "max offset after the predicted recovery: the broker answers OFFSET_OVERFLOW_BADLY "
                               "and corrects the consumer's offset (messages re-delivered or skipped)"))
    return out


def check_abort_lock(store) -> list[Finding]:
    out: list[Finding] = []
    root = store.root
    if store.abort_present:
        p = store.path("abort")
        try:
            content = read_regular(p, 64).decode("ascii", "replace").strip()
        except (OSError, StoreError):
            content = ""
        who = f" (PID {content})" if content.isdigit() else ""
        out.append(Finding(WARNING, "abort_present", "abort", None,
                           f"abort file present{who}: the previous broker run did not shut down cleanly; the next "
                           "start runs abnormal recovery"))
    bak = root / "abort.bak"
    if bak.is_file():
        try:
            content = bak.read_bytes()[:64].decode("ascii", "replace").strip()
        except OSError:
            content = ""
        if content:
            out.append(Finding(INFO, "abort_bak", "abort.bak", None,
                               f"abort.bak holds PID {content}: a 5.x broker crashed before its last start"))
    if store.path("lock") is not None:
        from rmqdump.broker.lock import probe_lock

        try:
            pid = probe_lock(root)
        except RmqdumpError as e:
            out.append(Finding(WARNING, "lock_unreadable", "lock", None, e.message))
            pid = None
        if pid is not None:
            out.append(Finding(WARNING, "store_in_use", "lock", 0,
                               f"the broker lock is held by PID {pid}: the store is live and may change under us"))
    return out
