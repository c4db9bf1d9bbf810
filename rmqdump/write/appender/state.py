"""The store before an append (:func:`inspect_store`): where the broker's recovery puts the end, the next
queue offsets, and everything that makes the tail dirty (old bytes after the end, ConsumeQueue and index
entries at or past it, a newer ``abort``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import (
    BLANK_MAGIC_CODE,
    TOTALSIZE_MAGIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.disk.extents import nonzero_chunks, nonzero_end
from rmqdump.disk.fileio import open_read
from rmqdump.disk.paths import is_safe_component
from rmqdump.errors import RmqdumpError, StoreError, UnsupportedError
from rmqdump.fast.recovery_walk import recovery_twins
from rmqdump.write.appender.geometry import _has_segments
from rmqdump.write.appender.liveness import AbortInfo, read_abort


def nonzero_span(path: str | os.PathLike, start: int, end: int) -> tuple[int, int] | None:
    """(first non-zero byte, end of the last non-zero byte) of ``path[start:end]``, or None (holes skipped
    where the filesystem reports them: :func:`~rmqdump.disk.extents.nonzero_chunks`)."""
    try:
        fd = open_read(path, follow=False, nonblock=False)
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    first = last = None
    try:
        for p, chunk in nonzero_chunks(fd, start, end):
            if first is None:
                first = p + len(chunk) - len(chunk.lstrip(b"\0"))
            last = p + nonzero_end(chunk)
    except OSError as e:
        raise StoreError(f"read failed: {e.strerror}", path) from None
    finally:
        os.close(fd)
    return None if first is None else (first, last)


def stale_after_end(path: str | os.PathLike, end: int, size: int) -> tuple[int, int] | None:
    """The non-zero bytes of ``path[end:size]`` that the commitlog's end leaves behind, or None.

    An end-of-file BLANK's header at ``end`` and nothing after it is not stale: a broker killed between
    writing that BLANK and creating the next file leaves it, its recovery ends there, and the next write at
    ``end`` (a record or a new BLANK) covers the header whole, so RocketMQ reads the same with it or zeros.
    """
    span = nonzero_span(path, end, size)
    if span is None or span[1] > end + TOTALSIZE_MAGIC.size:
        return span
    try:
        fd = open_read(path, follow=False, nonblock=False)
        try:
            head = os.pread(fd, TOTALSIZE_MAGIC.size, end)
        finally:
            os.close(fd)
    except OSError as e:
        raise StoreError(f"read failed: {e.strerror}", path, end) from None
    blank = len(head) == TOTALSIZE_MAGIC.size and TOTALSIZE_MAGIC.unpack(head)[1] == BLANK_MAGIC_CODE
    return None if blank else span


@dataclass
class QueueTail:
    """What the commitlog says about one queue in the walked range."""

    next_queue_offset: int = 0
    last_end: int = -1  # offset + size of its last dispatchable record
    records: int = 0


@dataclass
class StoreState:
    """An existing store as the appender sees it before writing."""

    root: Path
    end: int  # where the next record goes (the broker's recovered end)
    new_store: bool = False
    last_store_timestamp: int = 0
    last_store_host: str | None = None
    abort: AbortInfo | None = None
    dirty: list[str] = field(default_factory=list)  # refusal reasons (override: force)
    overwrite: list[str] = field(default_factory=list)  # old bytes an append would destroy (no override)
    starting: list[str] = field(default_factory=list)  # signs of a broker starting up (no override)
    warnings: list[str] = field(default_factory=list)
    queue_tails: dict[tuple[str, int], QueueTail] = field(default_factory=dict)
    cq_next: dict[tuple[str, int], int] = field(default_factory=dict)
    prediction: object | None = None
    broker_model_reason: str | None = None  # why predict_recovery_auto chose its model
    batch_topics: set[str] = field(default_factory=set)  # 5.x BatchCQ topics (batchconsumequeue/): not appendable


def inspect_store(root: str | os.PathLike, *, use_mmap: bool = True) -> StoreState:
    """Find where the broker's recovery would put the end, and everything that makes the tail dirty."""
    from rmqdump.broker.recovery import MODE_REFUSES, consume_queue_states, predict_recovery_auto
    from rmqdump.codec.record import END_OF_DATA, Message
    from rmqdump.store.consumequeue import batch_cq_topics, check_not_rocksdb, open_batch_queues
    from rmqdump.store.root import Store

    root = Path(root)
    if not root.is_dir():
        raise StoreError("not a directory", root)
    check_not_rocksdb(root, "append")
    if any(n.startswith("dledger-") for n in os.listdir(root)):
        raise UnsupportedError("DLedger commitlog mode: appending is not supported", root)
    abort = read_abort(root)
    if not _has_segments(root):
        st = StoreState(root, 0, new_store=True, abort=abort)
        if abort is not None:
            st.dirty.append("abort file present")
        return st
    store = Store.open(root)
    cl = store.commitlog
    states, cq_problems = consume_queue_states(store)
    pred, model_reason = predict_recovery_auto(store, queue_states=states, use_mmap=use_mmap,
                                              **recovery_twins(cl, use_mmap))
    st = StoreState(root, pred.max_offset, abort=abort, prediction=pred, broker_model_reason=model_reason)
    if abort is not None:
        st.dirty.append("abort file present: the broker did not shut down cleanly"
                        + (" (left by an interrupted rmqdump run)" if abort.ours else ""))
    if pred.mode == MODE_REFUSES:
        st.dirty.append(f"the broker would refuse to start: {pred.load_errors[0]}")
    st.warnings += [p for p in cq_problems if p not in pred.load_errors]
    stop = pred.walk.stop if pred.walk else None
    if stop is not None and stop.kind != END_OF_DATA:
        st.dirty.append(f"recovery stops at offset {stop.offset} ({stop.kind}: {stop.detail})")
    if pred.dropped.count:
        st.dirty.append(f"{pred.dropped.count} records after the end at {pred.max_offset} would be dropped by "
                        "the broker's recovery")
    # bytes after the end: stale or torn data that later records would sit next to
    seg = cl.segment_for(st.end)
    if seg is not None:
        span = stale_after_end(seg.path, st.end - seg.start, seg.size)
        if span is not None:
            st.overwrite.append(f"{span[1] - span[0]} bytes of old data after the end in {seg.name} "
                                f"(from position {span[0]})")
    for s in cl.segments:
        if s.start > st.end and nonzero_span(s.path, 0, s.size) is not None:
            st.overwrite.append(f"segment {s.name} after the end holds data (the broker would delete it)")
    for q in pred.queues:
        st.dirty.append(f"ConsumeQueue {q.queue} has {q.count} entries at or after the end")
    # walk the recovered range for queue offsets and the last record
    walk = cl.walk(start=pred.start_offset, end=st.end, check_crc=False, read_body=False, use_mmap=use_mmap)
    tails: dict[tuple[str, int], QueueTail] = {}
    for rec in walk:
        if not isinstance(rec, Message):
            continue
        st.last_store_timestamp = rec.store_timestamp
        st.last_store_host = rec.store_host
        if rec.sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            t = tails.setdefault((rec.topic, rec.queue_id), QueueTail())
            t.next_queue_offset = max(t.next_queue_offset, rec.queue_offset + 1)
            t.last_end = rec.offset + rec.size
            t.records += 1
    st.queue_tails = tails
    by_name = {(s.topic, s.queue_id): s for s in states}
    batch_queues = open_batch_queues(root)  # a BatchCQ topic is dispatched there, not into consumequeue/
    st.batch_topics = batch_cq_topics(root)
    for key, t in sorted(tails.items()):
        if not is_safe_component(key[0]):
            continue  # the broker cannot create a consume queue for this topic either
        s = by_name.get(key)
        bq = batch_queues.get(key) if s is None else None
        if bq is not None:
            st.cq_next[key] = bq.max_offset
            cq_end = bq.max_physic_end
        else:
            st.cq_next[key] = s.max_offset if s else 0
            cq_end = s.max_physic_offset if s else -1
        if t.last_end > cq_end:
            st.dirty.append(f"ConsumeQueue {key[0]}/{key[1]} lacks entries for records up to offset {t.last_end} "
                            "(dispatch had not caught up)")
    _check_index(root, st)
    if abort is not None and not abort.ours and st.last_store_timestamp and \
            abort.mtime_ms > st.last_store_timestamp + 1000:
        st.starting.append(f"abort (written {_iso(abort.mtime_ms)}) is newer than the last record (stored "
                           f"{_iso(st.last_store_timestamp)}): a broker started after the last write and may be "
                           "recovering right now (it takes the lock only after its recovery)")
    return st


def _iso(ms: int) -> str:
    from rmqdump.store.checkpoint import ms_to_iso

    return ms_to_iso(ms)


def _check_index(root: Path, st: StoreState) -> None:
    from rmqdump.store.indexfile import IndexFile, list_index_files

    files = list_index_files(root)
    if not files:
        return
    try:
        with IndexFile(files[-1], strict=False) as f:
            h = f.header
    except RmqdumpError as e:
        st.dirty.append(f"last index file unreadable: {e}")
        return
    if h.entry_count > 0 and h.end_phy_offset >= st.end:
        st.dirty.append(f"index file {files[-1].name} references offset {h.end_phy_offset}, at or after the end")
