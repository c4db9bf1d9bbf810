"""Planning-time pruning for ``format("rocketmq")``: which commitlog segments a query can skip.

A segment is skipped only when no row it would give can pass the query's filters:

* **broker / store / segment** equal to (or IN) given values: splits of other stores are not read;
* **offset** ranges (``<``, ``<=``, ``>``, ``>=``, ``=``, IN; the ``fromOffset``/``toOffset`` options):
  a segment's records lie in ``[start, start + size)``, its start offset being its file name;
* **topic / queue_id** (equal or IN; the ``topic``/``queueId`` options): from the consume queues
  (``consumequeue/`` and ``batchconsumequeue/``; LMQ queues do not count), and only for a segment they
  account for completely: their entries tile it back to back from its first byte to its end (the file's
  end, its BLANK end record, or unwritten space when the walk does not step past damage). Any record
  without an entry (a deleted topic or queue directory, a CQ hole or lag, a transaction half the broker
  never dispatched, a DLedger file) breaks the tiling and the segment is read. ``prune=false`` reads
  every segment.

Skipping is an optimisation only: Spark still applies every filter to the rows read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rmqdump.codec.layout import BCQ_STORE_UNIT_SIZE, BCQ_UNIT, CQ_STORE_UNIT_SIZE, CQ_UNIT
from rmqdump.codec.record import END_OF_DATA, Blank, Invalid
from rmqdump.disk.fileio import open_regular
from rmqdump.errors import RmqdumpError
from rmqdump.rows.arrow import SegmentSplit
from rmqdump.store.commitlog import read_record
from rmqdump.store.root import Store

LMQ_PREFIX = "%LMQ%"
_NO_BOUND = 1 << 63


@dataclass
class Pruning:
    """What the filters say about the rows wanted (None: no constraint)."""

    brokers: set[str] | None = None
    stores: set[str] | None = None
    segments: set[str] | None = None
    lo: int = 0  # offset >= lo
    hi: int = _NO_BOUND  # offset < hi
    offsets: set[int] | None = None  # offset IN
    topics: set[str] | None = None
    queues: set[int] | None = None
    by_queues: bool = True  # may use the consume queues
    keep_going: bool = False  # the walk steps past damage (unwritten space does not end a segment)
    pushed: list[str] = field(default_factory=list)  # what was understood (for explain / tests)

    @staticmethod
    def _narrow(current: set | None, values) -> set:
        new = set(values)
        return new if current is None else current & new

    def equal(self, column: str, values: list) -> bool:
        """Record ``column IN values`` (one value: equality); False when the column is not one pruned on."""
        if any(v is None for v in values):
            return False
        if column in ("broker", "store", "segment", "topic") and all(isinstance(v, str) for v in values):
            if column == "topic" and any("\ufffd" in v for v in values):
                return False  # may stand for undecodable topic bytes
            attr = {"broker": "brokers", "store": "stores", "segment": "segments", "topic": "topics"}[column]
            setattr(self, attr, self._narrow(getattr(self, attr), values))
        elif column in ("offset", "queue_id") and all(isinstance(v, int) and not isinstance(v, bool)
                                                      for v in values):
            if column == "offset":
                self.offsets = self._narrow(self.offsets, values)
            else:
                self.queues = self._narrow(self.queues, values)
        else:
            return False
        self.pushed.append(f"{column} in {sorted(values)}")
        return True

    def bound(self, op: str, value) -> bool:
        """Record ``offset op value`` (op one of < <= > >=)."""
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if op == "<":
            self.hi = min(self.hi, value)
        elif op == "<=":
            self.hi = min(self.hi, value + 1)
        elif op == ">":
            self.lo = max(self.lo, value + 1)
        elif op == ">=":
            self.lo = max(self.lo, value)
        else:
            return False
        self.pushed.append(f"offset {op} {value}")
        return True

    def _in_range(self, s: SegmentSplit) -> bool:
        end = s.start + max(s.size, 0)
        if end <= self.lo or s.start >= self.hi or self.hi <= self.lo:
            return False
        return self.offsets is None or any(s.start <= o < end and self.lo <= o < self.hi for o in self.offsets)

    def apply(self, splits: list[SegmentSplit]) -> list[SegmentSplit]:
        """The splits a query with these constraints has to read (in order)."""
        keep = [s for s in splits if (self.brokers is None or s.broker in self.brokers)
                and (self.stores is None or s.store in self.stores)
                and (self.segments is None or s.path in self.segments) and self._in_range(s)]
        if not self.by_queues or (self.topics is None and self.queues is None):
            return keep
        out: list[SegmentSplit] = []
        by_store: dict[str, list[SegmentSplit]] = {}
        for s in keep:
            by_store.setdefault(s.store, []).append(s)
        skip: set[tuple[str, int]] = set()
        for store, mine in by_store.items():
            try:
                cov = coverage(store, self.keep_going)
            except (RmqdumpError, OSError):
                continue  # no consume queues to go by: read every segment
            for s in mine:
                if cov.holds_none(s.start, self.topics, self.queues):
                    skip.add((s.store, s.start))
        out = [s for s in keep if (s.store, s.start) not in skip]
        return out


@dataclass
class Coverage:
    """Per commitlog segment (by start): whether the consume queues account for every record in it, and
    the queues (indexes into ``queues``) with an entry there."""

    queues: list[tuple[str, int]]
    complete: dict[int, bool]
    held: dict[int, np.ndarray]

    def holds_none(self, start: int, topics: set[str] | None, queues: set[int] | None) -> bool:
        """True when the segment at ``start`` provably holds no record of the topics / queue ids."""
        if not self.complete.get(start, False):
            return False
        return not any((topics is None or self.queues[q][0] in topics) and (queues is None or self.queues[q][1] in queues)
                       for q in self.held.get(start, ()))


def _dtype(unit) -> np.dtype:
    fmt = unit.format.lstrip("<>!=@")
    return np.dtype([(f"f{i}", ">" + ch) for i, ch in enumerate(fmt)])


def _read_units(queue, end: int, unit_size: int, dtype: np.dtype) -> np.ndarray:
    """The units of a queue below byte ``end`` (its recovered end: the broker's view), as a structured array."""
    parts = []
    for f in queue.files:
        n = min(f.size, queue.file_size or 0, max(0, end - f.start))
        n -= n % unit_size
        if n <= 0:
            continue
        fd = open_regular(f.path)
        try:
            data = os.pread(fd, n, 0)
        finally:
            os.close(fd)
        parts.append(np.frombuffer(data[:len(data) - len(data) % unit_size], dtype))
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def _queue_units(root: Path) -> tuple[list[tuple[str, int]], np.ndarray, np.ndarray, np.ndarray]:
    """(queues, offsets, sizes, queue index) of every valid unit of every (batch) consume queue, LMQ aside."""
    from rmqdump.store.consumequeue import ConsumeQueue, discover_queues, infer_store_cq_file_size
    from rmqdump.store.consumequeue.batch import BatchConsumeQueue

    queues: list[tuple[str, int]] = []
    offs, sizes, qidx = [], [], []
    for batch, cls, usize, unit in ((False, ConsumeQueue, CQ_STORE_UNIT_SIZE, CQ_UNIT),
                                    (True, BatchConsumeQueue, BCQ_STORE_UNIT_SIZE, BCQ_UNIT)):
        size = infer_store_cq_file_size(root, batch=batch)
        dt = _dtype(unit)
        for ref in discover_queues(root, batch=batch):
            if ref.topic.startswith(LMQ_PREFIX):
                continue  # LMQ entries point at records of other topics
            q = cls(ref.path, ref.topic, ref.queue_id, size, strict=False)
            end = (q.unit_count_end if batch else q.max_offset) * usize
            u = _read_units(q, end, usize, dt)
            valid = (u["f0"] >= 0) & (u["f1"] > 0)
            if batch:
                valid &= (u["f4"] >= 0) & (u["f5"] > 0)
            queues.append((ref.topic, ref.queue_id))
            offs.append(u["f0"][valid].astype(np.int64))
            sizes.append(u["f1"][valid].astype(np.int64))
            qidx.append(np.full(int(valid.sum()), len(queues) - 1, np.int32))
    if not queues:
        return queues, np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int32)
    return queues, np.concatenate(offs), np.concatenate(sizes), np.concatenate(qidx)


_COVERAGE: dict[tuple, Coverage] = {}


def coverage(store: str, keep_going: bool = False) -> Coverage:
    """Which segments of ``store`` its consume queues account for (see the module docstring)."""
    st = Store.open(store)
    if st.root is None:
        raise RmqdumpError("no consume queues beside a bare commitlog", store)
    cl = st.commitlog
    segs = cl.segments
    stamp = (store, keep_going, tuple((s.start, s.size) for s in segs))
    got = _COVERAGE.get(stamp)
    if got is not None:
        return got
    queues, offs, sizes, qidx = _queue_units(st.root)
    order = np.argsort(offs, kind="stable")
    offs, sizes, qidx = offs[order], sizes[order], qidx[order]
    starts = np.array([s.start for s in segs], np.int64)
    seg_of = np.searchsorted(starts, offs, side="right") - 1
    complete: dict[int, bool] = {}
    held: dict[int, np.ndarray] = {}
    for i, seg in enumerate(segs):
        a, b = np.searchsorted(seg_of, [i, i + 1])
        o, z = offs[a:b], sizes[a:b]
        held[seg.start] = np.unique(qidx[a:b])
        complete[seg.start] = _tiles(seg, o, z, keep_going)
    cov = Coverage(queues, complete, held)
    _COVERAGE.clear()  # one store's worth at a time in a planner process
    _COVERAGE[stamp] = cov
    return cov


def _tiles(seg, offs: np.ndarray, sizes: np.ndarray, keep_going: bool) -> bool:
    """Whether entries (sorted by offset) account for every record of ``seg``: back to back from its start
    (entries of one record in several queues must agree on its size), then nothing more to read."""
    seg_end = seg.start + seg.size
    if len(offs):
        first = np.r_[True, offs[1:] != offs[:-1]]  # one record, several queues: the same size
        dup = ~first
        if dup.any() and not np.array_equal(sizes[dup], sizes[np.flatnonzero(first)[np.cumsum(first)[dup] - 1]]):
            return False
        o, z = offs[first], sizes[first]
        if o[0] != seg.start or not np.array_equal(o[1:], o[:-1] + z[:-1]):
            return False
        end = int(o[-1] + z[-1])
    else:
        end = seg.start
    if end == seg_end:
        return True
    if end > seg_end:
        return False
    with seg.open(False) as r:  # the walk's own verdict on what follows the last entry
        rec = read_record(r, end - seg.start, check_crc=False, read_body=False)
    if isinstance(rec, Blank):
        return True
    return isinstance(rec, Invalid) and rec.kind == END_OF_DATA and not keep_going
