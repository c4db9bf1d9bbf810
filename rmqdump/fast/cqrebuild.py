"""Compiled twin of the walk behind ``repair --rebuild-cq`` (``write.repair.queues.rebuild_consume_queues``):
the ConsumeQueue units the broker's dispatcher writes for each record, from column batches.

The pure reference decodes a :class:`~rmqdump.codec.record.Message` per record and puts its units one by
one. Here each segment is walked by the compiled kernel (CRC off, the topic table on, so each batch carries
its topic ids and the Java hash of its TAGS) and a batch becomes :class:`QueueUnits`: per queue, its units in
commitlog order. Only records the columns cannot settle are decoded: ``SCHEDULE_TOPIC_XXXX`` (the tagsCode is
the delivery time), TAGS that are not ASCII, and LMQ multi-dispatch. A file the kernel cannot walk to its end
(damage, no mapping) hands the rest of the walk back to the pure loop (:class:`HandOver`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rmqdump.broker.redispatch import _MULTI, MULTI_MIN_PROPERTIES
from rmqdump.broker.systopics import multi_dispatch_targets
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, INNER_BATCH_FLAG, SCHEDULE_TOPIC
from rmqdump.fast import filewalk
from rmqdump.fast.abi import NOT_ASCII
from rmqdump.fast.batch import RecordBatch
from rmqdump.fast.engine import _numpy
from rmqdump.fast.filewalk import HandOver
from rmqdump.fast.intern import TopicIntern
from rmqdump.fast.redispatch import _dispatched
from rmqdump.fast.topics import TopicNames
from rmqdump.store.consumequeue.entries import encode_cq_entry

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.store.commitlog import CommitLog
    from rmqdump.store.consumequeue import ConsumeQueueWriter

_ROW = 16  # a unit's order key: its record's row << _ROW, plus 1 + j for the record's j-th LMQ target


@dataclass
class QueueUnits:
    """One batch's units. Queue ``k`` is ``keys[k]`` (topic, queue id); its units are rows ``cuts[k]`` to
    ``cuts[k + 1]`` of the arrays, in commitlog order; ``first[k]`` is its first unit's order key."""

    keys: list[tuple[str, int]]
    first: list[int]
    cuts: list[int]
    offsets: np.ndarray
    sizes: np.ndarray
    tags: np.ndarray
    queue_offsets: np.ndarray
    batch_topic_records: dict[str, int] = field(default_factory=dict)  # BatchCQ records, per topic

    def queue(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        a, z = self.cuts[k], self.cuts[k + 1]
        return self.offsets[a:z], self.sizes[a:z], self.tags[a:z], self.queue_offsets[a:z]


def applies(cl: CommitLog, end: int | None, use_mmap: bool) -> bool:
    """Whether the rebuild's walk takes the compiled path (every segment it walks mapped, none DLedger)."""
    return filewalk.applies(cl, None, end, use_mmap)


def dispatch_units(cl: CommitLog, *, end: int | None = None, batch_topics: set[str] | frozenset[str] = frozenset(),
                   delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS,
                   batch_records: int | None = None) -> Iterator[QueueUnits | HandOver]:
    """The units of the records in [min offset, ``end``), batch by batch; a :class:`HandOver` last when the
    kernel could not walk it all. ``batch_records``: records per batch (tests use small batches)."""
    intern = TopicIntern()
    feed = _Feed(intern, batch_topics, delay_levels_ms)
    for item in filewalk.walk_files(cl, end=end, intern=intern, batch_records=batch_records):
        if isinstance(item, HandOver):
            yield item
        elif isinstance(item, RecordBatch):
            units = feed.batch(item)
            if units is not None:
                yield units


class _Feed:
    """Record batches into :class:`QueueUnits` (the pure loop's rules, row by row where the columns cannot)."""

    def __init__(self, intern: TopicIntern, batch_topics, delay_levels_ms: list[int]):
        self.np = _numpy()
        self.topics = TopicNames(intern)
        self.batch_topics = batch_topics
        self.delay_levels_ms = delay_levels_ms

    def batch(self, b: RecordBatch) -> QueueUnits | None:
        np = self.np
        rows = np.flatnonzero(_dispatched(np, b["sys_flag"]))
        if not rows.size:
            return None
        tids, names = self.topics.of(b, rows)
        skipped: dict[str, int] = {}
        batch_t = np.array([n in self.batch_topics for n in names], bool)
        out_batch = batch_t[tids] | ((b["sys_flag"][rows] & INNER_BATCH_FLAG) != 0)
        if out_batch.any():
            for t, c in enumerate(np.bincount(tids[out_batch], minlength=len(names)).tolist()):
                if c:
                    skipped[names[t]] = c
            rows, tids = rows[~out_batch], tids[~out_batch]
        tags = b["tags_hash"][rows].astype(np.int64)
        sched = np.array([n == SCHEDULE_TOPIC for n in names], bool)
        look = sched[tids] | (tags == NOT_ASCII)
        multi = rows[b["properties_length"][rows] >= MULTI_MIN_PROPERTIES]
        if multi.size:
            held = np.zeros(b.n, bool)
            held[b.holding(multi, _MULTI)] = True
            look |= held[rows]
        extra: list[tuple] = []  # LMQ units: topic, queue id, offset, size, tagsCode, queue offset, order key
        for at in np.flatnonzero(look).tolist():
            i = int(rows[at])
            rec = b.message(i, read_body=False)
            # no ValueError: the walk refuses a delay-topic record whose DELAY Integer.parseInt would reject (an
            # invalid record, so the pure loop takes over there), and every such DELAY parses
            code = dispatch_tags_code(rec.topic, rec.properties, rec.store_timestamp, self.delay_levels_ms)
            if not -(1 << 63) <= code < 1 << 63:  # a delivery time past a long: the unit cannot be encoded
                encode_cq_entry(rec.offset, rec.size, code)  # FormatError, the pure rebuild's
            tags[at] = code
            if _MULTI in rec.properties_raw:
                for j, (name, qid, qoff) in enumerate(multi_dispatch_targets(rec.properties, rec.queue_id)):
                    extra.append((name, qid, rec.offset, rec.size, int(tags[at]), qoff, (i << _ROW) + 1 + j))
        return self._units(b, rows, tids, names, tags, extra, skipped)

    def _units(self, b: RecordBatch, rows, tids, names: list[str], tags, extra: list,
               skipped: dict[str, int]) -> QueueUnits:
        np = self.np
        qids = b["queue_id"][rows]
        pair = (tids << 32) | (qids.astype(np.int64) & 0xFFFFFFFF)
        upairs, pfirst, pinv = np.unique(pair, return_index=True, return_inverse=True)
        keys = [(names[int(p) >> 32], int(qids[f])) for p, f in zip(upairs.tolist(), pfirst.tolist(), strict=True)]
        index = {k: n for n, k in enumerate(keys)}
        qi = pinv.reshape(-1).astype(np.int64)
        offs = b.offsets[rows].astype(np.int64)
        sizes = b["size"][rows].astype(np.int64)
        qoffs = b["queue_offset"][rows].astype(np.int64)
        order = rows.astype(np.int64) << _ROW
        if extra:
            e = np.array([(index.setdefault((t, q), len(index)), *rest) for t, q, *rest in extra], np.int64)
            keys = list(index)
            qi, offs, sizes, tags, qoffs, order = (np.concatenate((a, e[:, k])) for k, a in
                                                   enumerate((qi, offs, sizes, tags, qoffs, order)))
        perm = np.lexsort((order, qi))
        qi = qi[perm]
        cuts = [0, *(np.flatnonzero(qi[1:] != qi[:-1]) + 1).tolist(), int(qi.size)] if qi.size else [0]
        order = order[perm]
        return QueueUnits(keys=[keys[int(qi[a])] for a in cuts[:-1]], first=[int(order[a]) for a in cuts[:-1]],
                          cuts=cuts, offsets=offs[perm], sizes=sizes[perm], tags=tags[perm], queue_offsets=qoffs[perm],
                          batch_topic_records=skipped)


def put_units(w: ConsumeQueueWriter, offs: np.ndarray, sizes: np.ndarray, tags: np.ndarray,
              qoffs: np.ndarray) -> None:
    """``w.put_message_position_info`` for each unit in order, the same bytes. After the first unit past the
    queue's maxPhysicOffset (which creates the queue's file, pre-blank filled, if it has none), a run that
    provably appends (ends rising, queue offsets continuing the write position) is encoded at once; anything
    else goes through the writer's own rule unit by unit."""
    np = _numpy()
    n = int(offs.size)
    ends = offs + sizes
    k = 0
    if n > 1 and bool((ends[1:] > ends[:-1]).all()):
        k = int(np.searchsorted(ends, w.max_physic_offset, side="right"))  # already built: skipped
        if k < n:
            w.put_message_position_info(int(offs[k]), int(sizes[k]), int(tags[k]), int(qoffs[k]))
            k += 1
        m = n - k
        q0 = w.next_queue_offset
        if m and bool((qoffs[k:] == np.arange(q0, q0 + m, dtype=np.int64)).all()):
            units = np.empty(m, _unit_dtype(np))
            units["phys"], units["size"], units["tags"] = offs[k:], sizes[k:], tags[k:]
            w.append_encoded(units.tobytes(), int(ends[-1]))
            return
    flat = np.stack((offs[k:], sizes[k:], tags[k:], qoffs[k:]), axis=1).reshape(-1).tolist()
    w.put_many(flat)


def _unit_dtype(np):
    dt = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])
    assert dt.itemsize == CQ_STORE_UNIT_SIZE
    return dt
