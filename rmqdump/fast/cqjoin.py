"""The CommitLog ↔ ConsumeQueue join over a compiled walk's column batches, without one Python object per
record: :class:`CqJoin` holds a window of every queue's entries (a range of queue offsets per queue, see
:meth:`CqJoin.set_window`) as flat numpy columns (commitlog offset, size, tagsCode, matched) and classifies
a batch's records with one kernel call (:mod:`rmqdump.fast._cqkernels`):

``JCODE_SKIP``       PREPARED / ROLLBACK: never dispatched
``JCODE_CLEARED``    its entry points at it with the same size and tagsCode (nothing to report)
``JCODE_UNMATCHED``  no entry of its queue at its QUEUEOFFSET points at it; when that queue offset lies
                     outside the queue's window, ``gidx`` is ``-1 - queue`` (the caller looks it up)
``JCODE_PYTHON``     the Python checker must look (sizes or tagsCodes differ, delay topic, text that is
                     not valid UTF-8)

Like the other kernels it is compiled once per machine into a shared library (10-30 s, in a child
process) and loaded with ctypes; ``RMQDUMP_FAST_LIBRARY=0`` uses numba's JIT.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqdump.codec.layout import CQ_UNIT, SCHEDULE_TOPIC
from rmqdump.fast import abi
from rmqdump.fast.engine import _numpy

if TYPE_CHECKING:
    from rmqdump.fast.batch import RecordBatch

_M64 = (1 << 64) - 1
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_QHASH = 0x9E3779B97F4A7C15
_SCHEDULE = SCHEDULE_TOPIC.encode()
SCRATCH_PAIRS = 16384
_backend: Any = None
_lock = threading.Lock()


def cq_dtype():
    """numpy dtype of one ConsumeQueue unit (``CQ_UNIT``: commitlog offset, size, tagsCode; big-endian)."""
    np = _numpy()
    fmt = CQ_UNIT.format.lstrip("<>!=@")
    return np.dtype([(name, ">" + ch) for name, ch in zip(("phys", "size", "tags"), fmt, strict=True)])


def _fnv64(b: bytes) -> int:
    h = _FNV_OFFSET
    for c in b:
        h = ((h ^ c) * _FNV_PRIME) & _M64
    return h


def _abi() -> bytes:
    names = [n for n in dir(abi) if n.startswith(("J_", "JCODE_"))]
    return repr(([(n, getattr(abi, n)) for n in sorted(names)], abi.CQJOIN_COLUMNS, abi.COLUMNS)).encode()


def library_path() -> Path:
    from rmqdump.fast.engine import kernel_library_path

    here = Path(__file__)
    shared = b"".join(here.with_name(f).read_bytes() for f in ("_jsonkernels.py", "_kernels.py", "_recordkernels.py"))
    return kernel_library_path("cqjoin", "_cqkernels.py", _abi(), hashlib.sha256(shared).hexdigest())


class _Backend:
    def __init__(self, kind: str, join, info, keep=None):
        self.kind, self.join, self._keep = kind, join, keep
        block = (ctypes.c_int64 * 2)()
        info(ctypes.addressof(block))
        if block[0] != abi.J_BLOCK_SIZE:
            raise RuntimeError(f"cqjoin kernel argument block {block[0]} != {abi.J_BLOCK_SIZE}")


def backend() -> _Backend:
    """Load the kernel once per process (building the shared library the first time)."""
    global _backend
    if _backend is not None:
        return _backend
    with _lock:
        if _backend is None:
            from rmqdump.fast.engine import load_kernels

            _backend = load_kernels("rmqdump.fast._cqkernels", library_path, ("rmqdump_cqjoin", "rmqdump_cqjoin_info"),
                                    ("cqjoin_c", "info_c"), _Backend)
        return _backend


class CqJoin:
    """The kernel's topic and queue tables and a window of every queue's entries as flat columns.

    ``queues``: (topic bytes, queue id, first queue offset, entries) per queue. :meth:`set_window` loads
    queue ``k``'s entries ``lo..hi-1`` (relative to its first queue offset) at ``q_at[k]`` of the flat
    window columns; ``wmatched`` marks the window's entries a record cleared.
    """

    def __init__(self, queues: list[tuple[bytes, int, int, int]], batch_records: int):
        np = self.np = _numpy()
        self.by_topic: dict[bytes, list[tuple[int, int]]] = {}
        nq = max(len(queues), 1)
        self.g_base = np.zeros(nq, np.int64)  # first queue offset of each queue
        self.g_n = np.zeros(nq, np.int64)  # its entries
        self.q_base = np.zeros(nq, np.int64)  # the window: first queue offset, entries, place in the columns
        self.q_n = np.zeros(nq, np.int64)
        self.q_at = np.zeros(nq, np.int64)
        for k, (topic, qid, base, n) in enumerate(queues):
            self.g_base[k], self.g_n[k], self.q_base[k] = base, n, base
            self.by_topic.setdefault(topic, []).append((qid, k))
        self.set_window([])
        size = 16
        while size < 2 * len(queues):
            size *= 2
        self.qt_keys = np.zeros(size, np.int64)
        self.qt_slots = np.full(size, -1, np.int32)
        self.topics: list[bytes] = []
        self.hashes: list[int] = []
        self.limits: list[int] = []
        self.arena_used = 0
        self._alloc_topics(16, 1024)
        self._rehash(16)
        self.code = np.zeros(batch_records, np.int8)
        self.gidx = np.zeros(batch_records, np.int64)
        self.tid = np.zeros(batch_records, np.int32)
        self.scratch = np.zeros((SCRATCH_PAIRS, 4), np.int64)
        self.block = np.zeros(abi.J_BLOCK_SIZE, np.int64)
        self._intern: Any = None  # the TopicIntern whose ids wmap maps to ours
        self.wmap = np.zeros(0, np.int32)

    def set_window(self, parts: list[tuple[int, int, int, Any, Any, Any]]) -> None:
        """The window: ``(k, lo, hi, phys, sizes, tags)`` per queue (entries ``lo..hi-1`` of queue ``k``);
        queues not named have an empty window."""
        np = self.np
        total = sum(hi - lo for _, lo, hi, *_ in parts)
        self.phys = np.full(max(total, 1), -1, np.int64)
        self.sizes = np.zeros(max(total, 1), np.int32)
        self.tags = np.zeros(max(total, 1), np.int64)
        self.wmatched = np.zeros(max(total, 1), np.uint8)
        self.q_n[:] = 0
        at = 0
        for k, lo, hi, phys, sizes, tags in parts:
            n = hi - lo
            self.q_base[k], self.q_n[k], self.q_at[k] = self.g_base[k] + lo, n, at
            self.phys[at:at + n], self.sizes[at:at + n], self.tags[at:at + n] = phys, sizes, tags
            at += n

    # -- tables
    def _alloc_topics(self, cap: int, arena: int) -> None:
        np = self.np
        n = len(self.topics)
        for name, dt in (("aoff", np.int64), ("alen", np.int64), ("tflags", np.int32)):
            a = np.zeros(cap, dt)
            if hasattr(self, name):
                a[:n] = getattr(self, name)[:n]
            setattr(self, name, a)
        ar = np.zeros(arena, np.uint8)
        if hasattr(self, "arena"):
            ar[:self.arena_used] = self.arena[:self.arena_used]
        self.arena = ar

    def _rehash(self, size: int) -> None:
        np = self.np
        self.ht_keys = np.zeros(size, np.uint64)
        self.ht_ids = np.full(size, -1, np.int32)
        for t, h in enumerate(self.hashes):
            self._ht_insert(h, t)

    def _ht_insert(self, h: int, t: int) -> None:
        mask = self.ht_ids.size - 1
        s = h & mask
        while self.ht_ids[s] >= 0:
            s = (s + 1) & mask
        self.ht_keys[s], self.ht_ids[s] = h, t

    def _qinsert(self, key: int, slot: int) -> None:
        mask = self.qt_slots.size - 1
        s = (((key * _QHASH) & _M64) >> 32) & mask
        while self.qt_slots[s] >= 0:
            s = (s + 1) & mask
        self.qt_keys[s], self.qt_slots[s] = key, slot

    def add_topic(self, raw: bytes, limit: int) -> int:
        """Register a topic (its queues join the queue table); ``limit``: its queue count in topics.json."""
        t = len(self.topics)
        if t >= self.aoff.size or self.arena_used + len(raw) > self.arena.size:
            self._alloc_topics(self.aoff.size * 2, max(self.arena.size * 2, self.arena_used + len(raw)))
        self.topics.append(raw)
        self.limits.append(limit)
        h = _fnv64(raw)
        self.hashes.append(h)
        if raw:
            self.arena[self.arena_used:self.arena_used + len(raw)] = self.np.frombuffer(raw, self.np.uint8)
        self.aoff[t], self.alen[t] = self.arena_used, len(raw)
        self.arena_used += len(raw)
        self.tflags[t] = 1 if raw == _SCHEDULE else 0
        if 2 * len(self.topics) > self.ht_ids.size:
            self._rehash(self.ht_ids.size * 2)
        else:
            self._ht_insert(h, t)
        for qid, k in self.by_topic.get(raw, ()):
            if -(1 << 31) <= qid < 1 << 31:  # a record's QUEUEID is an int32: no other queue can match
                self._qinsert((t << 32) | (qid & 0xFFFFFFFF), k)
        return t

    # -- one batch
    def classify(self, batch: RecordBatch, lo: int, hi: int, new_topic) -> None:
        """Fill :attr:`code`, :attr:`gidx`, :attr:`tid` for rows ``lo..hi-1`` of ``batch``;
        ``new_topic(raw) -> limit`` is asked about every topic met for the first time."""
        b = self.block
        b[abi.J_BUF], b[abi.J_SIZE] = batch.buf.ctypes.data, max(int(batch.buf.size), 1)
        b[abi.J_N], b[abi.J_SEG_START] = hi, batch.seg_start
        for k, name in enumerate(abi.CQJOIN_COLUMNS):
            b[abi.J_COLUMNS + k] = batch[name].ctypes.data
        b[abi.J_QT_KEYS], b[abi.J_QT_SLOTS], b[abi.J_QT_MASK] = (self.qt_keys.ctypes.data, self.qt_slots.ctypes.data,
                                                              self.qt_slots.size - 1)
        b[abi.J_Q_BASE], b[abi.J_Q_N], b[abi.J_Q_AT], b[abi.J_NQ] = (self.q_base.ctypes.data, self.q_n.ctypes.data,
                                                                    self.q_at.ctypes.data, self.q_base.size)
        b[abi.J_PHYS], b[abi.J_SIZES], b[abi.J_TAGS], b[abi.J_NENTRIES] = (
            self.phys.ctypes.data, self.sizes.ctypes.data, self.tags.ctypes.data, self.phys.size)
        b[abi.J_SCRATCH], b[abi.J_SCRATCH_CAP] = self.scratch.ctypes.data, self.scratch.shape[0]
        b[abi.J_CODE], b[abi.J_GIDX], b[abi.J_TID] = self.code.ctypes.data, self.gidx.ctypes.data, self.tid.ctypes.data
        intern = getattr(batch, "intern", None)
        b[abi.J_DERIVED] = 0 if intern is None else 1
        if intern is not None:
            if intern is not self._intern:  # another walk's table: its ids are met anew
                self._intern, self.wmap = intern, intern.new_map()
            b[abi.J_D_TID], b[abi.J_D_TAGS] = batch["walk_topic"].ctypes.data, batch["tags_hash"].ctypes.data
            b[abi.J_WMAP], b[abi.J_WMAP_CAP] = self.wmap.ctypes.data, self.wmap.size
        join = backend().join
        i = lo
        while i < hi:
            b[abi.J_HT_KEYS], b[abi.J_HT_IDS], b[abi.J_HT_MASK] = (self.ht_keys.ctypes.data, self.ht_ids.ctypes.data,
                                                                  self.ht_ids.size - 1)
            b[abi.J_ARENA], b[abi.J_ARENA_SIZE] = self.arena.ctypes.data, self.arena.size
            b[abi.J_ARENA_OFF], b[abi.J_ARENA_LEN] = self.aoff.ctypes.data, self.alen.ctypes.data
            b[abi.J_TFLAGS], b[abi.J_NTOPICS] = self.tflags.ctypes.data, self.aoff.size
            b[abi.J_I0] = i
            join(b.ctypes.data)
            i = int(b[abi.J_OUT_I])
            if i < hi:
                raw = batch.topic_raw(i)
                self.add_topic(raw, new_topic(raw))
