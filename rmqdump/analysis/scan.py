"""The scan walk behind `rmqdump scan`: which records of a commitlog range to hand on, by which engine.

The pure walk (:meth:`rmqdump.store.commitlog.CommitLog.walk`) is the reference; the compiled walk with
its JSONL renderer (:mod:`rmqdump.fast.render`) is the fast twin for the common case (JSONL out, no
record-by-record Python work). :func:`fast_jsonl_applies` is the one place that chooses between them.
Output belongs to the caller: records go to an ``emit`` callback, compiled batches to a renderer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rmqdump.codec.record import END_OF_DATA, Blank, Message
from rmqdump.store.commitlog import CommitLog, Skipped


@dataclass
class ScanRange:
    """The commitlog bytes a scan covers: ``[start, end)`` (``end`` None: to the end of data)."""

    start: int
    end: int | None
    total: int  # bytes of the segments the walk may touch (for a progress bar)


def scan_range(cl: CommitLog, from_offset: int | None, to_offset: int | None, max_bytes: int | None) -> ScanRange:
    """``--from-offset/--to-offset/--max-bytes`` as one range."""
    start = from_offset if from_offset is not None else cl.min_offset
    end = to_offset
    if max_bytes is not None:
        end = min(end, start + max_bytes) if end is not None else start + max_bytes
    return ScanRange(start, end, sum(s.size for s in cl.segments if s.end > start))


@dataclass
class ScanResult:
    """How a scan ended: the walk (its ``stop`` verdict and ``records`` count), whether the record
    limit ended it, and how many damaged ranges ``keep_going`` skipped."""

    walk: object
    limited: bool = False
    skipped: int = 0


def fast_jsonl_applies(cl: CommitLog, rng: ScanRange, *, fmt: str, keep_going: bool, use_mmap: bool,
                       per_record: bool, limit: int | None) -> bool:
    """Whether the compiled walk renders this scan: JSONL out, mapped segments, no resynchronisation,
    no per-record Python work (``per_record``: --resolve) and an input big enough
    for the engine (:func:`rmqdump.fast.engine.use_fast`)."""
    if fmt != "jsonl" or keep_going or not use_mmap or per_record or limit == 0:
        return False
    from rmqdump.fast.engine import use_fast

    segs = [s for s in cl.segments if s.end > rng.start]
    if not segs:
        return False
    stop = segs[-1].end if rng.end is None else min(rng.end, segs[-1].end)
    return use_fast(max(0, stop - rng.start), segments=segs)


def scan_pure(cl: CommitLog, rng: ScanRange, emit: Callable[[Message], bool], *, check_crc: bool, read_body: bool,
              keep_going: bool, use_mmap: bool, max_record_size: int, limit: int | None,
              on_skipped: Callable[[Skipped], None] | None = None,
              progress: Callable[[int], None] | None = None) -> ScanResult:
    """Walk ``rng`` record by record; ``emit`` returns True when the caller's limit is reached."""
    walk = cl.walk(start=rng.start, end=rng.end, check_crc=check_crc, read_body=read_body, keep_going=keep_going,
                   use_mmap=use_mmap, max_record_size=max_record_size)
    res = ScanResult(walk)
    if limit == 0:
        res.limited = True
        return res
    for n, rec in enumerate(walk):
        if progress is not None and n & 1023 == 0:
            progress(max(0, walk.end_offset - rng.start))
        if isinstance(rec, Message):
            if emit(rec):
                res.limited = True
                break
        elif isinstance(rec, Skipped):
            res.skipped += 1
            if on_skipped is not None:
                on_skipped(rec)
        elif isinstance(rec, Blank):
            continue
    return res


def scan_fast(cl: CommitLog, rng: ScanRange, renderer, flt, *, check_crc: bool, read_body: bool,
              max_record_size: int, limit: int | None, progress: Callable[[int], None] | None = None) -> ScanResult:
    """Walk ``rng`` with the compiled walk and hand each batch to ``renderer`` (a
    :class:`rmqdump.fast.render.JsonlRenderer`), keeping the rows ``flt.batch_mask`` selects."""
    from rmqdump.fast.walk import FastWalk, RecordBatch

    walk = FastWalk(cl, start=rng.start, end=rng.end, check_crc=check_crc, read_body=read_body,
                    max_record_size=max_record_size)
    res = ScanResult(walk)
    for item in walk.batches():
        if not isinstance(item, RecordBatch):
            continue
        select = None if flt is None or flt.empty else flt.batch_mask(item)
        renderer.write_batch(item, select, None if limit is None else limit - renderer.count)
        if progress is not None:
            progress(max(0, walk.end_offset - rng.start))
        if limit is not None and renderer.count >= limit:
            res.limited = True
            break
    return res


@dataclass
class StartHint:
    """Where records lie around a ``--from-offset`` at which the scan found none. ``inside``: the offset
    falls inside a record or BLANK (or after damage), so no scan can start there: an error, not an end."""

    text: str
    inside: bool
    file: object = None
    file_pos: int | None = None


def start_hint(cl: CommitLog, rng: ScanRange, walk, skipped: int, *, use_mmap: bool = True,
               max_record_size: int | None = None) -> StartHint | None:
    """For a scan that yielded nothing at its ``--from-offset`` N: where the records are. Past the end of data,
    where they end (a walk of the last segment holding data); else the nearest record starts around N, by a
    walk of N's segment from its first byte (segments start with a record) up to N, headers only (no CRC, no
    body). Bounded by one segment each. None when N is a record start or the end of the records, or the scan
    did yield records."""
    n = rng.start
    stop = walk.stop
    if stop is None or walk.records or skipped or stop.offset != n:
        return None
    if stop.kind == END_OF_DATA:
        end = _records_end(cl, use_mmap, max_record_size)
        if n >= end:
            return StartHint(f"offset {n} is past the end of the records (they end at {end})", False) \
                if n > end else None
    seg = cl.segment_for(n)
    if seg is None or n == seg.start:
        return None
    found, prev, probe = _record_around(cl, seg, n, use_mmap, max_record_size)
    if found is not None:
        start, size, blank = found
        if start == n:
            return None
        what = "the end-of-file BLANK" if blank else "the record"
        return StartHint(f"offset {n} is inside {what} at {start} (size {size}); records start at {start} and "
                         f"{start + size}", True, seg.path, n - seg.start)
    bad = probe.stop
    if bad is not None and bad.kind == END_OF_DATA:
        if probe.end_offset == n:
            return None
        return StartHint(f"offset {n} is unwritten space: the records of {seg.name} end at {probe.end_offset}, "
                         "later segments hold more", False)
    before = f"; the last record before it starts at {prev}" if prev is not None else ""
    why = f" ({stop.kind}: {stop.detail})" if stop.kind != END_OF_DATA else ""
    return StartHint(f"no record starts at offset {n}{why}; walking {seg.name} from its first byte stops at "
                     f"damage at {bad.offset} ({bad.kind}) before reaching it{before}", True, seg.path, n - seg.start)


def _records_end(cl: CommitLog, use_mmap: bool, max_record_size: int | None) -> int:
    """Where the records end: a walk of the last segment whose first bytes are not zero."""
    for seg in reversed(cl.segments):
        if seg.size == 0:
            continue
        with seg.open(use_mmap) as r:
            if any(r.read(0, 8)):
                return _record_around(cl, seg, seg.end, use_mmap, max_record_size)[2].end_offset
    return cl.min_offset


def _record_around(cl: CommitLog, seg, n: int, use_mmap: bool, max_record_size: int | None):
    """Walk ``seg`` from its first byte up to offset ``n`` (headers only; the compiled walk when the engine
    takes a job this size): ((start, size, is_blank) of the record or BLANK holding ``n``, or None; the start
    of the last record before it, or None; the walk, for its ``stop`` and ``end_offset``)."""
    from rmqdump.fast.engine import use_fast

    kw = {} if max_record_size is None else {"max_record_size": max_record_size}
    prev = None
    if use_mmap and use_fast(n - seg.start, segments=(seg,)):
        import numpy as np

        from rmqdump.fast.walk import FastWalk, RecordBatch

        probe = FastWalk(cl, start=seg.start, end=n + 1, check_crc=False, read_body=False, **kw)
        for item in probe.batches():
            if isinstance(item, RecordBatch):
                starts = item["file_pos"].astype("int64") + seg.start
                ends = starts + item["size"]
                hit = int(np.searchsorted(ends, n, side="right"))
                if hit < item.n:
                    return (int(starts[hit]), int(item["size"][hit]), False), prev, probe
                prev = int(starts[-1])
            elif item.offset + item.size > n:
                return (item.offset, item.size, True), prev, probe
        return None, prev, probe
    probe = cl.walk(start=seg.start, end=n + 1, check_crc=False, read_body=False, use_mmap=use_mmap, **kw)
    for rec in probe:
        if isinstance(rec, (Message, Blank)) and rec.offset + rec.size > n:
            return (rec.offset, rec.size, isinstance(rec, Blank)), prev, probe
        if isinstance(rec, Message):
            prev = rec.offset
    return None, prev, probe
