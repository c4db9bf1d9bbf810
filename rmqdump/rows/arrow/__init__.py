"""Core -> Arrow: the record schema as a pyarrow schema and bounded record batches per segment.

A commitlog segment is the unit of work (the *split*): records never cross a segment
boundary (the end-of-file BLANK rule), so every segment is walked on its own with the
core :class:`~rmqdump.store.commitlog.Walk` and turned into :class:`pyarrow.RecordBatch` es of
at most ``batch_size`` rows / ``max_batch_bytes`` body bytes. The single-process export
and the Spark data source share this package; it imports pyarrow but never pyspark.

This module reads record batches (:func:`read_split`, :func:`record_batches`) and picks the
engine: the per-record builder of :mod:`~rmqdump.rows.arrow.columns` (the schema, the
reference) or the vectorised one of :mod:`~rmqdump.rows.arrow.fastcolumns` over the compiled
walk. The splits are in :mod:`~rmqdump.rows.arrow.splits`, ConsumeQueue and index files as
tables in :mod:`~rmqdump.rows.arrow.tables`; their public names are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pyarrow as pa

from rmqdump.codec.crc import body_crc
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.codec.record import END_OF_DATA, Blank, Message
from rmqdump.disk.segment import Segment
from rmqdump.rows.arrow.columns import COLUMNS, LINEAGE_FIELDS, RECORD_SCHEMA, _Columns, empty_batch, messages_batch
from rmqdump.rows.arrow.fastcolumns import _fast_pieces, _FastContext
from rmqdump.rows.arrow.splits import (
    SegmentReport,
    SegmentSplit,
    broker_name,
    broker_names,
    iter_splits,
    range_splits,
    segment_splits,
)
from rmqdump.rows.arrow.tables import (
    CQ_SCHEMA,
    INDEX_SCHEMA,
    IndexSplit,
    QueueSplit,
    index_splits,
    queue_splits,
    read_index,
    read_queue,
)
from rmqdump.rows.filters import RecordFilter
from rmqdump.rows.schema import BodyErrors, output_body
from rmqdump.store.commitlog import CommitLog, Skipped
from rmqdump.store.dledger.files import is_dledger_segment
from rmqdump.store.root import Store

__all__ = ["CRC_MODES", "COLUMNS", "CQ_SCHEMA", "DEFAULT_BATCH_SIZE", "DEFAULT_MAX_BATCH_BYTES", "INDEX_SCHEMA",
           "FastSplitWalk", "LINEAGE_FIELDS", "READ_AHEAD_BYTES", "RECORD_SCHEMA", "WALK_BATCH_BYTES", "IndexSplit", "QueueSplit", "SegmentReport",
           "SegmentSplit", "broker_name", "broker_names", "empty_batch", "fast_split_applies", "index_splits", "iter_splits", "messages_batch",
           "queue_splits", "range_splits", "read_index", "read_queue", "read_split", "record_batches", "segment_splits"]

DEFAULT_BATCH_SIZE = 8192
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
CRC_MODES = ("check", "flag", "off")


def read_split(split: SegmentSplit, *, batch_size: int = DEFAULT_BATCH_SIZE,
               max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, include_body: bool = False, decompress: bool = False,
               flt: RecordFilter | None = None, crc: str = "check", keep_going: bool = False, use_mmap: bool = True,
               max_record_size: int = MAX_RECORD_SIZE, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS,
               on_segment: Callable[[SegmentReport], None] | None = None,
               fast: bool | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of one segment (see :func:`record_batches` for the options).

    ``fast``: use the compiled walk (:mod:`rmqdump.fast.walk`) and build the columns from its
    batches with the compiled renderer (:func:`rmqdump.fast.render.derive`: properties, keys,
    tags, hosts, msg_id as Arrow offsets + data) and numpy, instead of one Python call per
    record — same rows (records it cannot derive identically, e.g. IPv6 hosts or undecodable
    properties, go through the per-record path in their place). Segments of at least
    ``READ_AHEAD_BYTES`` are walked on a helper thread meanwhile. None: when available and the
    segment is big enough (``fastwalk.use_fast``); never with ``keep_going``, ``crc="flag"``
    or ``use_mmap=False``.
    """
    if crc not in CRC_MODES:
        raise ValueError(f"crc must be one of {CRC_MODES}, not {crc!r}")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    needs_body = flt is not None and flt.needs_body  # body criteria: matched record by record, bodies read
    if fast_split_applies(split, fast=fast, flt=flt, crc=crc, keep_going=keep_going, use_mmap=use_mmap):
        yield from _fast_read_split(split, batch_size=batch_size, include_body=include_body, decompress=decompress,
                                    flt=flt, crc=crc, max_record_size=max_record_size,
                                    delay_levels_ms=delay_levels_ms, on_segment=on_segment)
        return
    seg = split.segment()
    cl = CommitLog([seg], seg.size, seg.path.parent, [])
    walk = cl.walk(start=seg.start + split.range_start, end=seg.end if split.range_end is None else split.range_end,
                   check_crc=crc == "check",
                   read_body=include_body or crc == "flag" or needs_body, keep_going=keep_going, use_mmap=use_mmap, max_record_size=max_record_size)
    match = None if flt is None or flt.empty else flt.match
    cols = _Columns(split.broker, split.store, split.path, delay_levels_ms)
    rows = skipped = 0
    blank = None
    ranges: list[tuple[int, int, str, str]] = []
    body_errors = BodyErrors()
    for rec in walk:
        if isinstance(rec, Message):
            if match is not None and not match(rec):
                continue
            body = rec.body
            if crc == "flag":  # like the decoder's check: None for an empty body
                crc_ok = None if rec.body_length <= 0 else body_crc(body) == rec.body_crc
            else:
                crc_ok = rec.crc_ok
            body = output_body(rec, decompress, body_errors) if include_body else None
            cols.add(rec, body, crc_ok)
            if len(cols) >= batch_size or cols.body_bytes >= max_batch_bytes:
                rows += len(cols)
                yield cols.to_batch()
        elif isinstance(rec, Blank):
            blank = rec
        elif isinstance(rec, Skipped):
            skipped += 1
            ranges.append((rec.start, rec.end, rec.reason.kind, rec.reason.detail))
    if len(cols):
        rows += len(cols)
        yield cols.to_batch()
    if on_segment is not None:
        stop = walk.stop
        if blank is not None and stop is not None and stop.offset >= seg.end:
            kind, off, detail = "blank", blank.offset, f"BLANK record of {blank.size} bytes ends the file"
        elif stop is not None and split.range_end is not None and stop.kind == END_OF_DATA \
                and stop.offset >= split.range_end:
            kind, off, detail = "limit", stop.offset, f"reached the range's end {split.range_end}"
        elif stop is not None:
            kind, off, detail = stop.kind, stop.offset, stop.detail
        else:
            kind, off, detail = "end_of_data", seg.end, "end of the segment"
        on_segment(SegmentReport(split.path, walk.records, rows, kind, off, detail, skipped, body_errors.count,
                                 tuple(body_errors.first), tuple(ranges)))


def record_batches(source: str | os.PathLike | Store | CommitLog | Segment | SegmentSplit,
                   batch_size: int = DEFAULT_BATCH_SIZE, include_body: bool = False, **options
                   ) -> Iterator[pa.RecordBatch]:
    """Record batches of a store, commitlog, one segment or one split, one segment at a time.

    Options (keywords): ``decompress`` (bodies, needs ``include_body``), ``flt`` (a
    :class:`~rmqdump.rows.filters.RecordFilter`), ``crc`` (``check``: stop a segment at a body-CRC
    mismatch like ``scan``; ``flag``: keep walking and set ``crc_ok``; ``off``), ``keep_going``
    (resynchronise past damage inside a segment), ``use_mmap``, ``max_record_size``,
    ``max_batch_bytes``, ``broker`` (name for the lineage column), ``on_segment`` (called
    with a :class:`SegmentReport` after each segment).

    Every segment is walked from its first byte to its own end of valid data, independently
    of the others (the Spark split); on a healthy store this equals one ``scan`` walk.
    """
    broker = options.pop("broker", None)
    for split in iter_splits(source, broker):
        yield from read_split(split, batch_size=batch_size, include_body=include_body, **options)


def _fast_usable(split: SegmentSplit, fast: bool | None) -> bool:
    try:
        from rmqdump.fast import walk as fastwalk
    except ImportError:  # pragma: no cover - numpy missing
        return False
    if fast:
        return fastwalk.fast_available() and not is_dledger_segment(split.segment())
    return fastwalk.use_fast(split.size, segments=(split.segment(),))


#: Segments from this size are walked on a second thread while the first builds columns.
READ_AHEAD_BYTES = 64 * 1024 * 1024
#: The span of one compiled walk batch here: its mapped pages stay resident until the caller is done with it,
#: and the read-ahead walk keeps at most two batches walked (the caller's and the next one).
WALK_BATCH_BYTES = 8 * 1024 * 1024


def _read_ahead(walk, ahead: int = 1) -> Iterator:
    """The batches of a fastwalk segment walk, walked (and CRC-checked) on a helper thread up to
    ``ahead`` batches before the one the caller holds (it starts the next walk only once the caller
    has come back for the next batch, so at most ``ahead + 1`` batches' pages are resident): the
    kernels release the GIL, so the walk and the column building overlap. The batches are copies
    (the walk reuses its column arrays)."""
    import queue
    import threading

    q: queue.Queue = queue.Queue()
    slots = threading.Semaphore(ahead + 1)
    stop = threading.Event()
    done = object()

    def run() -> None:
        try:
            it = iter(walk)
            while True:
                while not slots.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                rb = next(it, done)
                q.put(done if rb is done else rb.copy())
                if rb is done:
                    return
        except BaseException as e:  # re-raised on the consumer's thread
            q.put(e)

    t = threading.Thread(target=run, name="rmqdump-walk", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            slots.release()  # the caller is done with that batch (and has dropped its pages)
    finally:
        stop.set()
        t.join()


class FastSplitWalk:
    """The compiled walk of one split (:mod:`rmqdump.fast.walk`): its batches, then its
    :class:`SegmentReport`. Segments of at least ``READ_AHEAD_BYTES`` are walked on a helper thread
    one batch ahead; a batch's mapped pages are dropped once the caller has taken the next one.
    Shared by the Arrow columns (:func:`read_split`) and export's compiled JSONL lines."""

    def __init__(self, split: SegmentSplit, *, crc: str, max_record_size: int):
        from rmqdump.fast import walk as fastwalk

        self.split = split
        self.seg = split.segment()
        self.ahead = split.size >= READ_AHEAD_BYTES and fastwalk.default_jobs() > 1
        # walked on another thread, a batch's bytes are read here after the walk has moved on: the walk must not
        # drop them from the mapping (they would fault back in and stay: RSS grew to the segment's size); this
        # walk drops them once the caller is done with them
        self.walk = fastwalk.walk_segment_fast(self.seg, split.range_start, check_crc=crc == "check",
                                               end_offset=split.range_end, max_record_size=max_record_size,
                                               batch_bytes=WALK_BATCH_BYTES, release_pages=not self.ahead)

    def __iter__(self) -> Iterator:
        walk = self.walk
        batches = _read_ahead(walk) if self.ahead else walk
        try:
            for rb in batches:
                yield rb
                if self.ahead and rb.n:
                    walk.release_before(int(rb["file_pos"][-1]) + int(rb["size"][-1]))
        finally:
            if batches is not walk:
                batches.close()  # stops and joins the walking thread
            walk.close()

    def report(self, rows: int, body_errors: BodyErrors) -> SegmentReport:
        """How the walk ended, with the ``rows`` the caller kept."""
        seg, walk = self.seg, self.walk
        st = walk.stop
        if st is None:
            kind, off, detail = "end_of_data", seg.end, "end of the segment"
        elif st.kind == "blank":
            kind, off, detail = "blank", st.offset, f"BLANK record of {st.blank.size} bytes ends the file"
        elif st.kind == "invalid":
            kind, off, detail = st.invalid.kind, st.invalid.offset, st.invalid.detail
        elif st.kind == "limit" and self.split.range_end is not None:
            kind, off, detail = "limit", st.offset, f"reached the range's end {self.split.range_end}"
        else:
            kind, off, detail = "end_of_data", seg.end, "end of the last commitlog segment"
        return SegmentReport(self.split.path, walk.records, rows, kind, off, detail, 0, body_errors.count,
                             tuple(body_errors.first))


def fast_split_applies(split: SegmentSplit, *, fast: bool | None = None, flt: RecordFilter | None = None,
                       crc: str = "check", keep_going: bool = False, use_mmap: bool = True) -> bool:
    """Whether :func:`read_split` takes the compiled walk for this split and these options."""
    needs_body = flt is not None and flt.needs_body  # body criteria: matched record by record, bodies read
    return fast is not False and not keep_going and crc != "flag" and use_mmap and not needs_body \
        and _fast_usable(split, fast)


def _fast_read_split(split: SegmentSplit, *, batch_size: int, include_body: bool, decompress: bool,
                     flt: RecordFilter | None, crc: str, max_record_size: int, delay_levels_ms: list[int],
                     on_segment: Callable[[SegmentReport], None] | None) -> Iterator[pa.RecordBatch]:
    ctx = _FastContext(split, delay_levels_ms)
    flt = None if flt is None or flt.empty else flt
    rows = 0
    walk = FastSplitWalk(split, crc=crc, max_record_size=max_record_size)
    for rb in walk:
        for batch in _fast_pieces(rb, ctx, include_body, decompress, flt):
            for start in range(0, batch.num_rows, batch_size):
                piece = batch.slice(start, batch_size)
                rows += piece.num_rows
                yield piece
    if on_segment is not None:
        on_segment(walk.report(rows, ctx.body_errors))
