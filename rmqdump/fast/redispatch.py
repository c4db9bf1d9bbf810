"""Compiled twin of :func:`rmqdump.broker.redispatch.redispatch` (identical results).

The pure reference builds a :class:`~rmqdump.codec.record.Message` per record and hands it to
:class:`~rmqdump.broker.redispatch.DispatchModel`. Here the segments are walked by the compiled kernel
(:class:`~rmqdump.fast.segment_walk.FastSegmentWalk`, CRC off, the broker's size limit) and each column
batch is fed to the same model in bulk:

* records to dispatch: sysflag NOT/COMMIT, offset past ``after``, topic not a BatchCQ topic;
* each record's queue: a batch of one topic (compared in place with the first row's, word by word) and no LMQ
  targets is split by queue id with one stable sort; otherwise topic bytes are hashed per row (numpy), grouped
  exactly (a hash collision, or very long topics, fall back to a dict of topic bytes), then (topic, queue id)
  pairs mapped to the model's queues;
* LMQ multi-dispatch: only records whose properties are long enough to name targets and hold
  ``INNER_MULTI_DISPATCH`` are decoded (a ``Message`` each) for :func:`multi_dispatch_targets`;
* per queue, the puts in commitlog order: the prefix already built (``offset + size <= maxPhysicOffset``)
  is skipped, the first put goes through :meth:`_Queue.put`, and a run whose queue offsets continue the write
  position is appended in one :meth:`_Queue.put_run`; anything else (misplaced entries, gaps, a record put
  twice into one queue) goes record by record through :meth:`_Queue.put`, the reference's own rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from rmqdump.broker.redispatch import (
    _DISPATCHED_TYPES,
    _MULTI,
    MULTI_MIN_PROPERTIES,
    WALK_MAX_RECORD_SIZE,
    DispatchModel,
    QueueRedispatch,
    dispatch_segment,
    redispatch,
    redispatch_ranges,
)
from rmqdump.broker.systopics import multi_dispatch_targets
from rmqdump.codec.layout import INNER_BATCH_FLAG, TRANSACTION_TYPE_MASK
from rmqdump.errors import StoreError
from rmqdump.fast import readahead
from rmqdump.fast.batch import BATCH_RECORDS
from rmqdump.fast.engine import _numpy, fast_available, use_fast
from rmqdump.fast.segment_walk import FastSegmentWalk
from rmqdump.fast.topics import _topic_groups

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.fast.batch import RecordBatch
    from rmqdump.store.commitlog import CommitLog



def redispatch_fast(cl: CommitLog, states: Iterable, *, start_index: int, end_offset: int, after: int = -1,
                    batch_topics: set[str] | frozenset[str] = frozenset(),
                    use_mmap: bool = True, batch_records: int = BATCH_RECORDS) -> list[QueueRedispatch]:
    """:func:`~rmqdump.broker.redispatch.redispatch` over column batches; the pure walk where the kernels
    cannot run (no numba/numpy, ``use_mmap`` off, DLedger data files) or a file cannot be mapped.
    ``batch_records``: records per column batch (tests use small batches)."""
    ranges = redispatch_ranges(cl, start_index, end_offset, after)
    if not use_mmap or not fast_available() or not use_fast(0, 0, segments=[s for s, _ in ranges]):
        return redispatch(cl, states, start_index=start_index, end_offset=end_offset, after=after,
                          batch_topics=batch_topics, use_mmap=use_mmap)
    model = DispatchModel(states, batch_topics)
    feed = _Feeder(model, after)
    columns = None
    spares: list = []  # the read-ahead's other column sets, from segment to segment
    ahead = readahead.wanted([s for s, _ in ranges], use_mmap)  # the walk a batch ahead, the model here
    for seg, stop in ranges:
        try:
            w = FastSegmentWalk(segment=seg, check_crc=False, end_offset=stop, max_record_size=WALK_MAX_RECORD_SIZE,
                                batch_records=batch_records, columns=columns, release_pages=not ahead)
        except StoreError:
            w = None
        if w is None or w.size != seg.size:  # the pure walk reports it in its own words
            if w is not None:
                w.close()
            dispatch_segment(model, cl, seg, stop, after, use_mmap)
            continue
        with w, readahead.switch_interval() if ahead else contextlib.nullcontext():
            for batch in readahead.ReadAhead(w, spares=spares) if ahead else w:
                feed.batch(batch)
        columns = w.cols  # the set the walk filled last: the next segment's own (the ring's others are spares)
    return model.result()


class _Feeder:
    """Column batches into a :class:`DispatchModel` (see the module docstring)."""

    def __init__(self, model: DispatchModel, after: int):
        self.model = model
        self.after = after
        self.np = _numpy()

    def batch(self, b: RecordBatch) -> None:
        np = self.np
        offsets = b.offsets
        keep = _dispatched(np, b["sys_flag"])
        if self.after >= 0:
            keep &= offsets > self.after
        rows = np.flatnonzero(keep)
        if not rows.size:
            return
        tids, raws = _topic_groups(b, rows)
        held = None
        if len(raws) == 1:
            topic = raws[0].decode("utf-8", "replace")
            if topic in self.model.batch_topics:
                return
            held = _multi_rows(b, rows)
            if not held:
                self._one_topic(b, rows, offsets, topic)
                return
        qids = b["queue_id"][rows]
        # (topic, queue id) pairs -> the model's queues (-1: a BatchCQ topic, not dispatched)
        pair = (tids.astype(np.int64) << 32) | (qids.astype(np.int64) & 0xFFFFFFFF)
        upairs, pfirst, pinv = np.unique(pair, return_index=True, return_inverse=True)
        pinv = pinv.reshape(-1)
        queues: list = []
        index: dict[int, int] = {}
        pq = np.empty(upairs.size, np.int64)
        topics = [raw.decode("utf-8", "replace") for raw in raws]
        for p in range(upairs.size):
            topic = topics[int(upairs[p]) >> 32]
            if topic in self.model.batch_topics:
                pq[p] = -1
                continue
            q = self.model.queue(topic, int(qids[pfirst[p]]))
            pq[p] = index.setdefault(id(q), len(queues))
            if pq[p] == len(queues):
                queues.append(q)
        qi = pq[pinv]
        live = qi >= 0
        rows, qi = rows[live], qi[live]
        if not rows.size:
            return
        sizes = b["size"][rows].astype(np.int64)
        qoffs = b["queue_offset"][rows]
        offs = offsets[rows]
        order = rows.astype(np.int64) << 16
        extra = self._multi(b, rows, queues, index, held)
        if extra:
            e = np.array(extra, dtype=np.int64).reshape(-1, 5)
            qi, offs, sizes, qoffs, order = (np.concatenate((a, e[:, k])) for k, a in
                                             enumerate((qi, offs, sizes, qoffs, order)))
        perm = np.lexsort((order, qi))
        qi, offs, sizes, qoffs = qi[perm], offs[perm], sizes[perm], qoffs[perm]
        cuts = np.flatnonzero(qi[1:] != qi[:-1]) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), qi.size], strict=True):
            _put_all(queues[int(qi[lo])], offs[lo:hi], sizes[lo:hi], qoffs[lo:hi])

    def _one_topic(self, b: RecordBatch, rows: np.ndarray, offsets: np.ndarray, topic: str) -> None:
        """``rows`` all of ``topic`` (not a BatchCQ topic), none naming LMQ targets: one stable sort by queue id
        keeps each queue's rows in commitlog order."""
        np = self.np
        qids = b["queue_id"][rows]
        offs, sizes, qoffs = offsets[rows], b["size"][rows].astype(np.int64), b["queue_offset"][rows]
        q0 = int(qids[0])
        if bool((qids == q0).all()):
            _put_all(self.model.queue(topic, q0), offs, sizes, qoffs)
            return
        lo, hi = int(qids.min()), int(qids.max())
        keys = qids.astype(np.int16) if -(1 << 15) <= lo and hi < 1 << 15 else qids  # int16: a radix sort
        perm = np.argsort(keys, kind="stable")
        qids, offs, sizes, qoffs = qids[perm], offs[perm], sizes[perm], qoffs[perm]
        cuts = (np.flatnonzero(qids[1:] != qids[:-1]) + 1).tolist()
        for a, z in zip([0, *cuts], [*cuts, qids.size], strict=True):
            _put_all(self.model.queue(topic, int(qids[a])), offs[a:z], sizes[a:z], qoffs[a:z])

    def _multi(self, b: RecordBatch, rows: np.ndarray, queues: list, index: dict[int, int],
               held: list[int] | None = None) -> list[tuple]:
        """The extra puts of LMQ multi-dispatch: (queue index, offset, size, queue offset, order) rows.
        ``held``: :func:`_multi_rows` of ``rows`` when already known."""
        out: list[tuple] = []
        for i in _multi_rows(b, rows) if held is None else held:
            rec = b.message(int(i), read_body=False)
            for j, (name, qid, qoff) in enumerate(multi_dispatch_targets(rec.properties, rec.queue_id)):
                q = self.model.queue(name, qid)
                k = index.setdefault(id(q), len(queues))
                if k == len(queues):
                    queues.append(q)
                out.append((k, rec.offset, rec.size, qoff, (int(i) << 16) + 1 + j))
        return out


def _dispatched(np, sys_flag: np.ndarray) -> np.ndarray:
    """Per row: is its transaction type one the dispatcher builds queues for (NOT or COMMIT)?"""
    tx = sys_flag & TRANSACTION_TYPE_MASK
    if 0 in _DISPATCHED_TYPES and not tx.any():  # the usual batch: no transaction records at all
        return np.ones(tx.size, bool)
    keep = tx == _DISPATCHED_TYPES[0]
    for t in _DISPATCHED_TYPES[1:]:
        keep |= tx == t
    return keep


def _multi_rows(b: RecordBatch, rows: np.ndarray) -> list[int]:
    """The records among ``rows`` whose properties are long enough to name LMQ targets and hold them."""
    cand = rows[b["properties_length"][rows] >= MULTI_MIN_PROPERTIES]
    return b.holding(cand, _MULTI) if cand.size else []


def _put_all(q, offs: np.ndarray, sizes: np.ndarray, qoffs: np.ndarray) -> None:
    """One queue's puts, in commitlog order (see the module docstring)."""
    np = _numpy()
    ends = offs + sizes
    if ends.size > 1 and not bool((ends[1:] > ends[:-1]).all()):  # one record put twice: the reference
        for o, s, qo in zip(offs.tolist(), sizes.tolist(), qoffs.tolist(), strict=True):
            q.put(o, s, qo)
        return
    k = int(np.searchsorted(ends, q.max_phy, side="right"))  # already built: skipped
    if k == ends.size:
        return
    q.put(int(offs[k]), int(sizes[k]), int(qoffs[k]))
    k += 1
    n = ends.size - k
    if not n:
        return
    if q.has_files and bool((qoffs[k:] == np.arange(q.write, q.write + n, dtype=np.int64)).all()):
        q.put_run(n, offs[k:k + 100].tolist(), int(ends[-1]))
        return
    for o, s, qo in zip(offs[k:].tolist(), sizes[k:].tolist(), qoffs[k:].tolist(), strict=True):
        q.put(o, s, qo)


def dispatch_candidates(cl: CommitLog, start: int, end: int, built: dict[tuple[str, int], int], *,
                        use_mmap: bool = True, batch_records: int = BATCH_RECORDS) -> Iterator:
    """The records of ``[start, end)`` a replay of the broker's dispatch must look at, in commitlog order, as
    the pure walk (``cl.walk(start=, end=, check_crc=False, read_body=False)``) yields them, minus those it would
    skip unseen: a record whose own queue is in ``built`` with ``offset + size <= built[queue]`` (that queue's
    ``maxPhysicOffset``, which only grows), not an inner batch, not naming LMQ targets, and records whose
    transaction type is never dispatched. Every other record (``Message``; a :class:`Blank` never) comes out.
    A file the kernels cannot walk cleanly (damage, no mapping, DLedger) hands over to the pure walk from that
    file on, which then yields everything it yields."""
    segs = [s for s in cl.segments if s.start + s.size > start]
    if not use_mmap or not segs or not use_fast(sum(s.size for s in segs), segments=segs):
        yield from cl.walk(start=start, end=end, check_crc=False, read_body=False, use_mmap=use_mmap)
        return
    np = _numpy()  # only now: the base install (no fast extra) has no numpy
    columns = None
    for seg in segs:
        pos = max(0, start - seg.start)
        try:
            w = FastSegmentWalk(segment=seg, start_pos=pos, check_crc=False, end_offset=end,
                                batch_records=batch_records, columns=columns)
        except StoreError:
            w = None
        if w is None or w.size != seg.size:
            if w is not None:
                w.close()
            yield from cl.walk(start=max(start, seg.start), end=end, check_crc=False, read_body=False,
                               use_mmap=use_mmap)
            return
        columns = w.cols
        with w:
            for b in w:
                for i in _candidates(np, b, built):
                    yield b.message(i, read_body=False)
            stop = w.stop
        if stop.kind == "invalid":  # the pure walk's own words from this file on (it stops there)
            yield from cl.walk(start=max(start, seg.start + stop.pos), end=end, check_crc=False, read_body=False,
                               use_mmap=use_mmap)
            return
        if stop.kind == "limit":
            return


def _candidates(np, b: RecordBatch, built: dict[tuple[str, int], int]) -> list[int]:
    """Rows of ``b`` :func:`dispatch_candidates` hands on."""
    rows = np.flatnonzero(_dispatched(np, b["sys_flag"]))
    if not rows.size:
        return []
    qids = b["queue_id"][rows]
    tids, raws = _topic_groups(b, rows)
    topics = [raw.decode("utf-8", "replace") for raw in raws]
    pair = (tids.astype(np.int64) << 32) | (qids.astype(np.int64) & 0xFFFFFFFF)
    upairs, pinv = np.unique(pair, return_inverse=True)
    pinv = pinv.reshape(-1)
    lim = np.array([built.get((topics[p >> 32], _int32(p & 0xFFFFFFFF)), -1) for p in upairs.tolist()],
                   dtype=np.int64)
    limit = lim[pinv]  # -1: no queue skips the record
    ends = b.offsets[rows] + b["size"][rows].astype(np.int64)
    need = (limit < 0) | (ends > limit) | ((b["sys_flag"][rows] & INNER_BATCH_FLAG) != 0)
    cand = rows[~need & (b["properties_length"][rows] >= MULTI_MIN_PROPERTIES)]
    if cand.size:
        multi = np.zeros(b.n, bool)
        multi[b.holding(cand, _MULTI)] = True
        need |= multi[rows]
    return rows[need].tolist()


def _int32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v
