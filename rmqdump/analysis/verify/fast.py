"""Compiled path of :func:`rmqdump.analysis.verify.records.verify_segment` (identical results).

The segment is walked by the fast kernel (:class:`rmqdump.fast.walk.FastSegmentWalk`, column
batches over the mapped file) and every batch goes through a second kernel (``vscan`` in
:mod:`rmqdump.fast._kernels`) that clears the records on which no check can report anything and
keeps the cross-record state compact: a topic table, one slot per topic/queue (next expected
QUEUEOFFSET, count), the previous store host/time, min/max store time, byte and record counts,
the offsets of COMMIT/ROLLBACK and half messages (numpy arrays). Any record the kernel cannot
clear - a check fires or might fire, a new topic or queue, a pending queue anomaly, a
header-outlier candidate, the first record of the file - is decoded and checked in Python by
the very same :class:`~rmqdump.analysis.verify.record_checks.RecordChecker` step as the pure path, with the
compact state synchronised around it, so findings come out identical and in the same order.
With ``keep_going`` damage is skipped with the pure walk's own resynchronisation rule.
The walk fills the derived columns (:mod:`rmqdump.fast.intern`) while a record's bytes are in the cache:
``vscan`` (and the CQ join after it) reads the record's topic id and property check from them, not from
the mapped bytes again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from rmqdump.analysis.verify.damage import _damage, _finish_tail
from rmqdump.analysis.verify.record_checks import RecordChecker, _track_damaged_record
from rmqdump.analysis.verify.result import SegmentResult, _Emitter
from rmqdump.codec.layout import (
    MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE_V2,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.record import BODY_CRC, END_OF_DATA, Invalid, Message
from rmqdump.disk.segment import Segment
from rmqdump.errors import StoreError
from rmqdump.fast import abi
from rmqdump.fast import walk as fw
from rmqdump.fast.intern import TopicIntern
from rmqdump.fast.readahead import ReadAhead
from rmqdump.store.commitlog import CommitLog, read_record

_M64 = (1 << 64) - 1
#: per thread, the column arrays of the last segment verified there: the next segment walks into them (10 MB
#: allocated per segment otherwise, which the C allocator does not always give back); ``sets``: the other
#: column sets of a read-ahead's ring
_spare = threading.local()
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_QHASH = 0x9E3779B97F4A7C15
_HALF = b"RMQ_SYS_TRANS_HALF_TOPIC"
# state slots shared with the kernel
S_PREV_LEN, S_PREV_W0, S_PREV_W1, S_PREV_PORT, S_PREV_TS, S_CAND = 0, 1, 2, 3, 4, 5
S_HAVE_TS, S_MIN_TS, S_MAX_TS, S_BYTES, S_LAST_OFF, S_NTX, S_NHALF = 6, 7, 8, 9, 10, 11, 12


def _spare_sets() -> list:
    """This thread's column sets for a read-ahead's ring, kept from segment to segment."""
    if not hasattr(_spare, "sets"):
        _spare.sets = []
    return _spare.sets


def _fnv64(b: bytes) -> int:
    h = _FNV_OFFSET
    for c in b:
        h = ((h ^ c) * _FNV_PRIME) & _M64
    return h


def _fits(v: int) -> bool:
    return _I64_MIN <= v <= _I64_MAX


class _Tables:
    """The kernel's topic table, queue slots, state and output arrays (one segment)."""

    def __init__(self, out_cap: int):
        np = self.np = fw._numpy()
        self.block = np.zeros(abi.V_BLOCK_SIZE, dtype=np.int64)
        self.state = np.zeros(16, dtype=np.int64)
        self.state[S_LAST_OFF] = -1
        self.out_cap = out_cap
        self.tx_out = np.zeros((out_cap, 4), dtype=np.int64)
        self.half_out = np.zeros(out_cap, dtype=np.int64)
        # topics
        self.topics: list[bytes] = []
        self.tid: dict[bytes, int] = {}
        self.hashes: list[int] = []
        self.arena_used = 0
        self._alloc_topics(64, 4096)
        self._rehash_topics(64)
        # queues
        self.slot_of: dict[tuple[int, int], int] = {}
        self.slot_keys: list[tuple[bytes, int]] = []
        self._alloc_queues(128)
        self._rehash_queues(256)
        b = self.block
        b[abi.V_STATE] = self.state.ctypes.data
        b[abi.V_TX_OUT] = self.tx_out.ctypes.data
        b[abi.V_HALF_OUT] = self.half_out.ctypes.data
        b[abi.V_OUT_CAP] = out_cap

    # -- topics
    def _alloc_topics(self, cap: int, arena: int) -> None:
        np = self.np
        old = getattr(self, "arena_off", None)
        n = len(self.topics)
        new = {"arena_off": np.zeros(cap, np.int64), "arena_len": np.zeros(cap, np.int64),
               "tflags": np.zeros(cap, np.int32), "tcount": np.zeros(cap, np.int64)}
        if old is not None:
            for k, a in new.items():
                a[:n] = getattr(self, k)[:n]
        for k, a in new.items():
            setattr(self, k, a)
        ar = np.zeros(arena, np.uint8)
        if old is not None:
            ar[:self.arena_used] = self.arena[:self.arena_used]
        self.arena = ar
        b = self.block
        b[abi.V_ARENA_OFF], b[abi.V_ARENA_LEN] = self.arena_off.ctypes.data, self.arena_len.ctypes.data
        b[abi.V_TFLAGS], b[abi.V_TCOUNT], b[abi.V_TOPIC_CAP] = self.tflags.ctypes.data, self.tcount.ctypes.data, cap
        b[abi.V_ARENA], b[abi.V_ARENA_SIZE] = self.arena.ctypes.data, max(arena, 1)

    def _rehash_topics(self, size: int) -> None:
        np = self.np
        self.ht_keys = np.zeros(size, np.uint64)
        self.ht_ids = np.full(size, -1, np.int32)
        mask = size - 1
        for t, h in enumerate(self.hashes):
            s = h & mask
            while self.ht_ids[s] >= 0:
                s = (s + 1) & mask
            self.ht_keys[s], self.ht_ids[s] = h, t
        b = self.block
        b[abi.V_HT_KEYS], b[abi.V_HT_IDS], b[abi.V_HT_MASK] = self.ht_keys.ctypes.data, self.ht_ids.ctypes.data, mask

    def add_topic(self, raw: bytes) -> int:
        t = len(self.topics)
        cap = self.arena_off.size
        if t >= cap or self.arena_used + len(raw) > self.arena.size:
            self._alloc_topics(cap * 2 if t >= cap else cap, max(self.arena.size * 2, self.arena_used + len(raw)))
        self.topics.append(raw)
        self.tid[raw] = t
        self.hashes.append(_fnv64(raw))
        if raw:
            self.arena[self.arena_used:self.arena_used + len(raw)] = self.np.frombuffer(raw, self.np.uint8)
        self.arena_off[t], self.arena_len[t] = self.arena_used, len(raw)
        self.arena_used += len(raw)
        self.tflags[t] = (1 if not raw or b"\x00" in raw or b"/" in raw else 0) | (2 if raw == _HALF else 0)
        if 2 * len(self.topics) > self.ht_ids.size:
            self._rehash_topics(self.ht_ids.size * 2)
        else:
            mask = self.ht_ids.size - 1
            s = self.hashes[t] & mask
            while self.ht_ids[s] >= 0:
                s = (s + 1) & mask
            self.ht_keys[s], self.ht_ids[s] = self.hashes[t], t
        return t

    # -- queues
    def _alloc_queues(self, cap: int) -> None:
        np = self.np
        n = len(self.slot_keys)
        new = {"q_next": np.zeros(cap, np.int64), "q_count": np.zeros(cap, np.int64), "q_py": np.ones(cap, np.int8)}
        for k, a in new.items():
            if hasattr(self, k):
                a[:n] = getattr(self, k)[:n]
            setattr(self, k, a)
        b = self.block
        b[abi.V_Q_NEXT], b[abi.V_Q_COUNT], b[abi.V_Q_PY] = (self.q_next.ctypes.data, self.q_count.ctypes.data,
                                                         self.q_py.ctypes.data)
        b[abi.V_QUEUE_CAP] = cap

    @staticmethod
    def _qkey(tid: int, qid: int) -> int:
        return (tid << 32) | (qid & 0xFFFFFFFF)

    def _qinsert(self, key: int, slot: int) -> None:
        mask = self.qt_slots.size - 1
        s = (((key * _QHASH) & _M64) >> 32) & mask
        while self.qt_slots[s] >= 0:
            s = (s + 1) & mask
        self.qt_keys[s], self.qt_slots[s] = key, slot

    def _rehash_queues(self, size: int) -> None:
        np = self.np
        self.qt_keys = np.zeros(size, np.int64)
        self.qt_slots = np.full(size, -1, np.int32)
        for (tid, qid), slot in self.slot_of.items():
            self._qinsert(self._qkey(tid, qid), slot)
        b = self.block
        b[abi.V_QT_KEYS], b[abi.V_QT_SLOTS], b[abi.V_QT_MASK] = (self.qt_keys.ctypes.data, self.qt_slots.ctypes.data,
                                                              size - 1)

    def add_queue(self, tid: int, qid: int, topic_raw: bytes) -> int:
        slot = len(self.slot_keys)
        if slot >= self.q_next.size:
            self._alloc_queues(self.q_next.size * 2)
        self.slot_keys.append((topic_raw, qid))
        self.slot_of[(tid, qid)] = slot
        if 2 * len(self.slot_keys) > self.qt_slots.size:
            self._rehash_queues(self.qt_slots.size * 2)
        else:
            self._qinsert(self._qkey(tid, qid), slot)
        return slot


class _FastSegment:
    """One segment verified with the kernels (see the module docstring)."""

    def __init__(self, segment: Segment, *, file_size: int | None, check_crc: bool, keep_going: bool,
                 max_record_size: int, file_label: str | None, on_message: Callable[[Message], None] | None,
                 progress: Callable[[int], None] | None, list_limit: int, max_findings_per_kind: int,
                 zero_start: bool, on_batch: Callable | None = None, read_ahead: bool = False):
        self.segment = segment
        self.read_ahead = read_ahead
        self.file_size = file_size
        self.check_crc = check_crc
        self.keep_going = keep_going
        self.max_record_size = max_record_size
        self.label = file_label or str(segment.path)
        self.on_message = on_message
        self.on_batch = on_batch if on_message is not None else None
        self.progress = progress
        self.list_limit = list_limit
        self.zero_start = zero_start
        self.res = SegmentResult(segment.name, self.label, segment.start, segment.size, end_offset=segment.start)
        self.emit = _Emitter(self.res, max_findings_per_kind)
        self.t = _Tables(fw.BATCH_RECORDS)
        self.intern = TopicIntern()  # the walks' topic table: vscan reads the derived columns, not the bytes
        self.wmap = self.intern.new_map()
        b = self.t.block
        b[abi.V_WMAP], b[abi.V_WMAP_CAP] = self.wmap.ctypes.data, self.wmap.size
        self.tx_chunks: list = []
        self.half_chunks: list = []
        self.records = 0
        self.damaged = False
        self.last: tuple[int, int] | None = None  # (offset, store time) of the last record
        self.v2: tuple | None = None  # first V2 record: (pos, size, records before it, last before it)

    # -- state synchronisation around a record checked in Python
    def _sync_in(self, chk: RecordChecker, rec: Message) -> int | None:
        s = self.t.state
        n = int(s[S_PREV_LEN])
        if n:
            raw = (int(s[S_PREV_W0]) & _M64).to_bytes(8, "little") + (int(s[S_PREV_W1]) & _M64).to_bytes(8, "little")
            chk.prev_addr, chk.prev_port = raw[:n], int(s[S_PREV_PORT])
        chk.prev_ts = int(s[S_PREV_TS])
        if s[S_HAVE_TS]:
            chk.min_ts, chk.max_ts = int(s[S_MIN_TS]), int(s[S_MAX_TS])
        slot = self._queue_slot(rec)
        if slot is not None and not self.t.q_py[slot]:
            st = self.res.queues[rec.topic_raw][rec.queue_id]
            st.next_expected, st.count = int(self.t.q_next[slot]), int(self.t.q_count[slot])
        return slot

    def _sync_out(self, chk: RecordChecker, rec: Message, slot: int | None) -> None:
        s = self.t.state
        if chk.prev_addr is not None:
            a = chk.prev_addr
            s[S_PREV_LEN] = len(a)
            a = a.ljust(16, b"\x00")
            s[S_PREV_W0] = int.from_bytes(a[:8], "little", signed=True)
            s[S_PREV_W1] = int.from_bytes(a[8:16], "little", signed=True)
            s[S_PREV_PORT] = chk.prev_port
        s[S_PREV_TS] = chk.prev_ts
        s[S_CAND] = 0 if chk.cand is None else 1
        if chk.min_ts is not None:
            s[S_HAVE_TS], s[S_MIN_TS], s[S_MAX_TS] = 1, chk.min_ts, chk.max_ts
        if rec.sys_flag & TRANSACTION_TYPE_MASK in (0, TRANSACTION_COMMIT_TYPE):
            if slot is None:
                tid = self.t.tid.get(rec.topic_raw)
                if tid is None:
                    return
                slot = self.t.add_queue(tid, rec.queue_id, rec.topic_raw)
            self._store_slot(slot, self.res.queues[rec.topic_raw][rec.queue_id])

    def _queue_slot(self, rec: Message) -> int | None:
        if rec.sys_flag & TRANSACTION_TYPE_MASK not in (0, TRANSACTION_COMMIT_TYPE):
            return None
        tid = self.t.tid.get(rec.topic_raw)
        return None if tid is None else self.t.slot_of.get((tid, rec.queue_id))

    def _store_slot(self, slot: int, st) -> None:
        t = self.t
        if st.pending is None and _fits(st.next_expected) and _fits(st.count):
            t.q_next[slot], t.q_count[slot], t.q_py[slot] = st.next_expected, st.count, 0
        else:
            t.q_py[slot] = 1  # Python holds the truth until the anomaly resolves

    def _load_slots(self) -> None:
        """Copy the kernel's queue state back into the QueueRun objects."""
        t = self.t
        for slot, (topic_raw, qid) in enumerate(t.slot_keys):
            if not t.q_py[slot]:
                st = self.res.queues[topic_raw][qid]
                st.next_expected, st.count = int(t.q_next[slot]), int(t.q_count[slot])

    # -- one batch
    def _batch(self, chk: RecordChecker, batch: fw.RecordBatch) -> None:
        res = self.res
        n = batch.n
        t = self.t
        b = t.block
        if self.damaged:
            res.intact_after_damage += n
            room = self.list_limit - len(res.intact_after_damage_offsets)
            if room > 0:
                res.intact_after_damage_offsets += batch.offsets[:room].tolist()
        b[abi.V_BUF], b[abi.V_SIZE] = batch.buf.ctypes.data, max(int(batch.buf.size), 1)
        b[abi.V_N], b[abi.V_SEG_START] = n, batch.seg_start
        for k, name in enumerate(abi.VSCAN_COLUMNS):
            b[abi.V_COLUMNS + k] = batch[name].ctypes.data
        derived = batch.intern is self.intern
        b[abi.V_DERIVED] = 1 if derived else 0
        if derived:
            b[abi.V_D_TID], b[abi.V_D_PV] = batch["walk_topic"].ctypes.data, batch["props_check"].ctypes.data
        addr = b.ctypes.data
        vscan = self._vscan
        on_message = self.on_message
        on_batch = self.on_batch
        i = delivered = 0
        while i < n:
            b[abi.V_I0] = i
            vscan(addr)
            j, code = int(b[abi.V_OUT_I]), int(b[abi.V_OUT_CODE])
            if on_message is not None and delivered < j:
                if on_batch is not None:
                    on_batch(batch, delivered, j)
                else:
                    for m in batch.messages(False, delivered, j):
                        on_message(m)
                delivered = j
            if code == 0:
                break
            if code == 1:
                t.add_topic(batch.topic_raw(j))
                i = j
                continue
            rec = batch.message(j, read_body=False)
            slot = self._sync_in(chk, rec)
            chk.message(rec)
            self._sync_out(chk, rec, slot)
            delivered = i = j + 1
        s = t.state
        if s[S_NTX]:
            self.tx_chunks.append(t.tx_out[:s[S_NTX]].copy())
            s[S_NTX] = 0
        if s[S_NHALF]:
            self.half_chunks.append(t.half_out[:s[S_NHALF]].copy())
            s[S_NHALF] = 0
        if self.v2 is None:
            v2 = fw._numpy().flatnonzero(batch["magic"] == MESSAGE_MAGIC_CODE_V2)
            if v2.size:
                k = int(v2[0])
                before = self.last if k == 0 else (batch.seg_start + int(batch["file_pos"][k - 1]),
                                                   int(batch["store_timestamp"][k - 1]))
                self.v2 = (int(batch["file_pos"][k]), int(batch["size"][k]), self.records + k, before)
        self.last = (batch.seg_start + int(batch["file_pos"][-1]), int(batch["store_timestamp"][-1]))
        self.records += n
        if self.progress is not None:
            self.progress(int(batch["file_pos"][-1]))

    def _track_damaged(self, pos: int) -> None:
        """_track_damaged_record with the queue slot synchronised around it."""
        rec = read_record(self.reader, pos, check_crc=False, read_body=False, max_record_size=self.max_record_size)
        slot = self._queue_slot(rec) if isinstance(rec, Message) else None
        if slot is not None and not self.t.q_py[slot]:
            st = self.res.queues[rec.topic_raw][rec.queue_id]
            st.next_expected, st.count = int(self.t.q_next[slot]), int(self.t.q_count[slot])
        _track_damaged_record(self.reader, pos, self.res.queues, self.max_record_size, self.zero_start)
        if slot is not None:
            self._store_slot(slot, self.res.queues[rec.topic_raw][rec.queue_id])

    def run(self) -> SegmentResult | None:
        seg = self.segment
        res = self.res
        np = fw._numpy()
        # a walk run ahead on another thread: this thread reads a batch's bytes after the walk moved on, so the
        # walk releases only the pages behind what this thread is done with (fast.readahead.ReadAhead)
        release = not self.read_ahead
        try:
            first = fw.FastSegmentWalk(segment=seg, start_pos=0, check_crc=self.check_crc,
                                       max_record_size=self.max_record_size, release_pages=release,
                                       intern=self.intern, columns=getattr(_spare, "columns", None))
        except StoreError:
            return None  # the pure path reports it in its own words
        if first.size != seg.size or first.size == 0:
            first.close()
            return None
        self.reader = reader = seg.open(True)
        chk = RecordChecker(res, self.emit, reader, self.zero_start, self.on_message)
        resync = CommitLog([seg], self.file_size or seg.size, seg.path.parent, []).walk(
            check_crc=self.check_crc, read_body=False, keep_going=True, use_mmap=True,
            max_record_size=self.max_record_size)
        end_offset = seg.start
        stop: Invalid | None = None
        w = first
        columns = first.cols
        _spare.columns = None  # this segment's until it ends
        try:
            while True:
                try:
                    for batch in ReadAhead(w, spares=_spare_sets()) if self.read_ahead else w:
                        self._batch(chk, batch)
                        end_offset = seg.start + int(batch["file_pos"][-1]) + int(batch["size"][-1])
                finally:
                    w.close()
                columns = w.cols
                st = w.stop
                if st.kind in ("blank", "end"):
                    if st.kind == "blank":
                        res.blanks += 1
                        res.blank_offset = st.offset
                        end_offset = seg.start + seg.size
                    if not self.damaged:
                        res.walk_summary = (self.check_crc, st.kind, st.pos, self.records, self.last, self.v2)
                    stop = Invalid(seg.end, seg.name, seg.size, END_OF_DATA, "end of the last commitlog segment")
                    break
                rec = st.invalid
                if not self.keep_going:
                    stop = rec
                    break
                nxt = resync._resync(seg, reader, st.pos + 1)
                if nxt is None:
                    stop = resync.with_give_up(rec)
                    break
                self.damaged = True
                _damage(self.emit, res, reader, seg.start + st.pos, seg.start + nxt, rec, followed=True)
                if rec.kind == BODY_CRC:
                    self._track_damaged(st.pos)
                w = fw.FastSegmentWalk(segment=seg, start_pos=nxt, check_crc=self.check_crc,
                                       max_record_size=self.max_record_size, columns=columns,
                                       release_pages=release, intern=self.intern)
        finally:
            _spare.columns = columns  # every batch of it was checked (and copied where kept): the next segment's
            t = self.t
            s = t.state
            res.records = self.records
            if s[S_HAVE_TS]:
                res.min_store_timestamp, res.max_store_timestamp = int(s[S_MIN_TS]), int(s[S_MAX_TS])
            res.record_bytes += int(s[S_BYTES])
            if s[S_LAST_OFF] >= 0 and (res.last_record_offset is None or s[S_LAST_OFF] > res.last_record_offset):
                res.last_record_offset = int(s[S_LAST_OFF])
            topics: Counter = Counter()
            for tid, raw in enumerate(t.topics):
                c = int(t.tcount[tid]) + res.topics.get(raw, 0)
                if c:
                    topics[raw] = c
            res.topics = topics
            if self.tx_chunks or res.tx_refs:
                parts = self.tx_chunks + ([np.array(res.tx_refs, dtype=np.int64).reshape(-1, 4)] if res.tx_refs
                                          else [])
                tx = np.concatenate(parts)
                res.tx_refs = tx[np.argsort(tx[:, 0], kind="stable")]
            if self.half_chunks:
                res.half_offsets = np.unique(np.concatenate(
                    self.half_chunks + [np.fromiter(res.half_offsets, np.int64, len(res.half_offsets))]))
            self._load_slots()
            chk.flush_queues()
            res.end_offset = max(res.end_offset, end_offset)
            try:
                if stop is not None:
                    _finish_tail(self.emit, res, reader, stop, self.keep_going)
            finally:
                reader.close()
        if self.progress is not None:
            self.progress(seg.size)
        self.emit.suppressed(self.label)
        return res

    @property
    def _vscan(self):
        return fw.backend().vscan


def verify_segment_fast(segment: Segment, *, file_size: int | None = None, check_crc: bool = True,
                        keep_going: bool = True, max_record_size: int = MAX_RECORD_SIZE,
                        file_label: str | None = None, on_message: Callable[[Message], None] | None = None,
                        progress: Callable[[int], None] | None = None, list_limit: int = 10000,
                        max_findings_per_kind: int = 1000, zero_start: bool = False,
                        on_batch: Callable | None = None, read_ahead: bool = False) -> SegmentResult | None:
    """:func:`~rmqdump.analysis.verify.records.verify_segment` through the kernels; None when they cannot
    run here or the segment cannot be mapped (the caller then takes the pure path)."""
    if not fw.fast_available() or fw.backend().vscan is None:
        return None
    return _FastSegment(segment, file_size=file_size, check_crc=check_crc, keep_going=keep_going,
                        max_record_size=max_record_size, file_label=file_label, on_message=on_message,
                        progress=progress, list_limit=list_limit, max_findings_per_kind=max_findings_per_kind,
                        zero_start=zero_start, on_batch=on_batch, read_ahead=read_ahead).run()
