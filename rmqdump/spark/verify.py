"""``rmqdump spark verify``: :func:`rmqdump.analysis.verify.verify_store` for many stores, its heavy parts on Spark.

Three stages, all on executors:

1. **Segments** (one task per commitlog segment): the record checks of
   :func:`rmqdump.analysis.verify.segment.verify_segment`, exactly as ``verify`` calls it, plus one
   compact row per dispatchable record (what ``CqChecker.on_message`` looks at).
2. **ConsumeQueue ↔ commitlog** as a DataFrame join: the records against every consume-queue
   entry the broker's CQ recovery keeps (``consume_queue_states``, one task per store).
   Only what needs a closer look reaches the driver: the offsets of records without an entry
   or with a size / tagsCode difference, of the first record of each queue, and the entries
   no record matched.
3. **Store checks** (one task per store): ``verify_store`` itself, with the segment results
   of stage 1 and a CqChecker whose entries start out matched except the unmatched ones and
   which is fed the real records at those offsets (``on_message``), so the CQ findings, the
   recovery prediction, the index / checkpoint / config checks and the report are
   ``verify``'s own — same findings.

Stage 3 hands ``verify_store`` a segment verifier and a CqChecker subclass
(``segment_verifier=`` / ``cq_checker_factory=``): a segment whose call does not match the one
made in stage 1 is simply verified again.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import MAX_RECORD_SIZE, TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.errors import RmqdumpError
from rmqdump.store.root import Store


@dataclass(frozen=True)
class _SegmentTask:
    store_idx: int
    path: str  # segment file
    start: int
    size: int
    kwargs: tuple  # verify_segment keyword arguments (sorted items, picklable)


@dataclass
class VerifyOptions:
    keep_going: bool = False
    check_crc: bool = True
    use_mmap: bool = True
    max_record_size: int = MAX_RECORD_SIZE
    version: str = "auto"
    store_checks: bool = True
    delay_levels_ms: list[int] | None = None
    list_limit: int = 10000
    max_findings_per_kind: int = 1000


def _segment_kwargs(opts: VerifyOptions, cl, root, seg, first: bool) -> dict:
    """The keyword arguments ``verify_store`` passes to ``verify_segment`` (minus callbacks)."""
    return {"file_size": cl.file_size, "check_crc": opts.check_crc, "keep_going": opts.keep_going,
            "max_record_size": opts.max_record_size, "use_mmap": opts.use_mmap,
            "file_label": f"commitlog/{seg.name}" if root is not None else seg.name,
            "list_limit": opts.list_limit, "max_findings_per_kind": opts.max_findings_per_kind,
            "zero_start": seg.start == 0 and first}


# --- stage 1: segments ------------------------------------------------------------------------------


def _segments_task(delay: list[int] | None, joined: set[int], tasks: Iterator[_SegmentTask]) -> Iterator[tuple]:
    """("seg", store, start, SegmentResult | error text) and, for the stores in ``joined``, ("rec", row) per
    dispatchable record: (store, offset, size, topic_raw, queue_id, queue_offset, the tagsCode its CQ entry
    must hold)."""
    from rmqdump.analysis.verify.queue_checks import expected_tags_code
    from rmqdump.analysis.verify.segment import verify_segment
    from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
    from rmqdump.disk.segment import Segment

    delay = delay or DEFAULT_DELAY_LEVELS_MS
    for t in tasks:
        rows: list[tuple] = []

        def on_message(m, rows=rows, store=t.store_idx) -> None:
            if store not in joined:
                return
            tx = m.sys_flag & TRANSACTION_TYPE_MASK
            if tx != 0 and tx != TRANSACTION_COMMIT_TYPE:
                return
            rows.append((store, m.offset, m.size, m.topic_raw, m.queue_id, m.queue_offset,
                         expected_tags_code(m, delay)))

        try:
            res = verify_segment(Segment(Path(t.path), t.start, t.size), on_message=on_message, **dict(t.kwargs))
        except RmqdumpError as e:
            yield ("seg", t.store_idx, t.start, str(e))
            continue
        yield ("seg", t.store_idx, t.start, res)
        for r in rows:
            yield ("rec", r)


# --- stage 2: consume-queue entries --------------------------------------------------------------


def _entries_task(stores: Iterator[tuple[int, str]]) -> Iterator[tuple]:
    """Entries of every queue as ``CqChecker`` loads them: [first offset, recovered max offset)."""
    from rmqdump.broker.recovery import consume_queue_states

    for idx, path in stores:
        try:
            states, _ = consume_queue_states(Store.open(path))
        except RmqdumpError:
            continue  # verify reports cq_unavailable and checks no queue
        for st in states:
            raw = os.fsencode(st.topic)
            base, fill = st.first_offset, st.max_offset - st.first_offset
            if fill <= 0:
                continue
            for e in st.cq.iter_entries():
                if 0 <= e.queue_offset - base < fill:
                    yield (idx, raw, st.queue_id, e.queue_offset, e.commit_log_offset, e.size, e.tags_code)


REC_DDL = "store_idx int, offset long, size int, topic_raw binary, queue_id int, queue_offset long, expected long"
ENT_DDL = "store_idx int, topic_raw binary, queue_id int, queue_offset long, phys long, esize int, etags long"


def _cq_join(recs, ents) -> tuple:
    """DataFrames (store_idx, offset) of records to replay and (store_idx, topic_raw, queue_id, queue_offset)
    of unmatched entries, and the dispatchable records per store (a dict): the per-record parts stay on the
    executors (stage 3 gets them per store through a shuffle), only the counts reach the driver."""
    from pyspark.sql import functions as F

    keys = ["store_idx", "topic_raw", "queue_id", "queue_offset"]
    e = ents.alias("e")
    r = recs.alias("r")
    on = [F.col(f"r.{k}") == F.col(f"e.{k}") for k in keys] + [F.col("r.offset") == F.col("e.phys")]
    # what CqChecker.on_message could report on, over-approximated (the replay decides):
    # no entry points at the record, or its entry's size / tagsCode differ
    look = (F.col("e.phys").isNull() | (F.col("e.esize") != F.col("r.size")) | F.col("r.expected").isNull()
            | (F.col("r.expected") != F.col("e.etags")))
    replay = r.join(e, on, "left_outer").filter(look).select("r.store_idx", "r.offset")
    # and the first record of every queue (the queue-id range check warns once per queue)
    firsts = recs.groupBy("store_idx", "topic_raw", "queue_id").agg(F.min("offset").alias("offset"))
    offsets = replay.unionByName(firsts.select("store_idx", "offset")).distinct()
    unmatched = e.join(r, on, "left_anti").select(*[F.col(f"e.{k}") for k in keys])
    counts = {row["store_idx"]: row["count"] for row in recs.groupBy("store_idx").count().collect()}
    return offsets, unmatched, counts


# --- stage 3: verify_store with the precomputed parts -------------------------------------------


@dataclass
class StoreVerdict:
    """One store's ``verify`` document, its exit code, and how many segments stage 3 had to re-verify."""

    document: dict
    exit_code: int
    reverified_segments: int = 0
    broker: str = ""  # the store's broker name (set by :func:`rmqdump.spark.jobs.verify`)


def _injected(segment_results: dict[int, object], remote_kwargs: dict[int, dict], replay: list[int],
              unmatched: list[tuple], checked: int, reverified: list | None = None, use_mmap: bool = True) -> dict:
    """``verify_store`` keywords that make it use stage-1 segment results and the stage-2 join outcome."""
    from rmqdump.analysis.verify.queue_checks import CqChecker
    from rmqdump.analysis.verify.record_cache import RecordCache
    from rmqdump.analysis.verify.segment import verify_segment as real_segment
    from rmqdump.codec.record import Message

    def verify_segment(seg, *, on_message=None, progress=None, **kwargs):
        got = segment_results.get(seg.start)
        if got is None or remote_kwargs.get(seg.start) != kwargs:
            if reverified is not None:
                reverified.append(seg.start)
            return real_segment(seg, on_message=on_message, progress=progress, **kwargs)
        if isinstance(got, str):
            raise RmqdumpError(got)
        return got

    class JoinedCqChecker(CqChecker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for q in self.queues:
                q.matched = bytearray(b"\x01") * q.n
            for topic_raw, qid, qoff in unmatched:
                q = self.by_topic.get(topic_raw, {}).get(qid)
                if q is not None and 0 <= qoff - q.base < q.n:
                    q.matched[qoff - q.base] = 0
            cache = RecordCache(self.cl, use_mmap)
            try:
                for off in replay:  # the real records, in commitlog order like the segment walk
                    msg = cache.decode(off, check_crc=False)
                    if isinstance(msg, Message):
                        self.on_message(msg)
            finally:
                cache.close()
            self.records_checked = checked

    return {"segment_verifier": verify_segment, "cq_checker_factory": JoinedCqChecker}


def _store_task(opts: VerifyOptions, groups: Iterator[tuple]) -> Iterator[tuple]:
    """Executor side, per store: its stage-1 results with its replay offsets and unmatched entries (grouped
    by store index); (store index, StoreVerdict, None) or (store index, None, error text)."""
    from rmqdump.analysis.verify import verify_store

    for idx, (item, replay_rows, unmatched_rows) in groups:
        item = list(item)
        if not item:
            continue
        path, seg_results, remote_kwargs, checked = item[0]
        replay = sorted(replay_rows)
        unmatched = list(unmatched_rows)
        again: list[int] = []
        try:
            rep = verify_store(path, keep_going=opts.keep_going, check_crc=opts.check_crc,
                               use_mmap=opts.use_mmap, max_record_size=opts.max_record_size,
                               version=opts.version, store_checks=opts.store_checks,
                               delay_levels_ms=opts.delay_levels_ms, list_limit=opts.list_limit,
                               max_findings_per_kind=opts.max_findings_per_kind,
                               **_injected(seg_results, remote_kwargs, replay, unmatched, checked, again,
                                           opts.use_mmap))
            yield (idx, StoreVerdict(rep.to_dict(), rep.exit_code, len(again)), None)
        except RmqdumpError as e:
            yield (idx, None, f"{path}: {e}")


# --- the job ----------------------------------------------------------------------------------------


def verify(spark, paths: Sequence[str], opts: VerifyOptions | None = None, progress=None) -> list[StoreVerdict]:
    """Verify every store; one :class:`StoreVerdict` per store, in the given order.

    The documents are ``VerifyReport.to_dict()`` of :func:`rmqdump.analysis.verify.verify_store`.
    """
    from pyspark import StorageLevel

    from rmqdump.spark.plumbing import _parallelize, track

    opts = opts or VerifyOptions()
    stores = [Store.open(p) for p in paths]
    seg_tasks: list[_SegmentTask] = []
    remote: dict[int, dict[int, dict]] = {}
    for i, st in enumerate(stores):
        cl = st.commitlog
        remote[i] = {}
        for seg in cl.segments:
            kw = _segment_kwargs(opts, cl, st.root, seg, seg is cl.segments[0])
            remote[i][seg.start] = kw
            seg_tasks.append(_SegmentTask(i, str(seg.path), seg.start, seg.size, tuple(sorted(kw.items()))))
    with_cq = [(i, p) for i, (p, st) in enumerate(zip(paths, stores, strict=True))
               if st.root is not None and opts.store_checks]

    with track(spark, f"rmqdump verify of {len(paths)} store(s)", progress):
        # records for the join only from stores that have one; kept on the executors' disks, not in memory
        stage1 = _parallelize(spark, seg_tasks).mapPartitions(
            functools.partial(_segments_task, opts.delay_levels_ms, {i for i, _ in with_cq})).persist(
            StorageLevel.DISK_ONLY)
        try:
            segs = stage1.filter(lambda t: t[0] == "seg").collect()
            sc = spark.sparkContext
            replay, unmatched = sc.emptyRDD(), sc.emptyRDD()
            counts: dict[int, int] = {}
            if with_cq:
                recs = spark.createDataFrame(stage1.filter(lambda t: t[0] == "rec").map(lambda t: t[1]), REC_DDL)
                ents = spark.createDataFrame(_parallelize(spark, with_cq).mapPartitions(_entries_task), ENT_DDL)
                replay_df, unmatched_df, counts = _cq_join(recs, ents)
                replay = replay_df.rdd.map(tuple)
                unmatched = unmatched_df.rdd.map(lambda r: (r[0], (bytes(r[1]), r[2], r[3])))
            results: dict[int, dict[int, object]] = {i: {} for i in range(len(stores))}
            for _, idx, start, res in segs:
                results[idx][start] = res
            items = _parallelize(spark, [(i, (p, results[i], remote[i], counts.get(i, 0)))
                                         for i, p in enumerate(paths)])
            outcomes = items.groupWith(replay, unmatched).partitionBy(max(1, len(paths))).mapPartitions(
                functools.partial(_store_task, opts)).collect()
        finally:
            stage1.unpersist()
    out: list[StoreVerdict] = []
    for _idx, verdict, error in sorted(outcomes, key=lambda o: o[0]):
        if verdict is None:
            raise RmqdumpError(f"verify failed: {error}")
        out.append(verdict)
    return out
