"""The scan walk behind `rmqdump scan`: which records of a commitlog range to hand on, by which engine.

The pure walk (:meth:`rmqdump.store.commitlog.CommitLog.walk`) is the reference; the compiled walk with
its JSONL renderer (:mod:`rmqdump.fast.render`) is the fast twin for the common case (JSONL out, no
record-by-record Python work). :func:`fast_jsonl_applies` is the one place that chooses between them.
Output belongs to the caller: records go to an ``emit`` callback, compiled batches to a renderer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rmqdump.codec.record import Blank, Message
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
    no per-record Python work (``per_record``: --resolve, tag or key filters) and an input big enough
    for the engine (:func:`rmqdump.fast.engine.use_fast`)."""
    if fmt != "jsonl" or keep_going or not use_mmap or per_record or limit == 0:
        return False
    from rmqdump.fast.engine import use_fast

    segs = [s for s in cl.segments if s.end > rng.start]
    if not segs:
        return False
    stop = segs[-1].end if rng.end is None else min(rng.end, segs[-1].end)
    return use_fast(max(0, stop - rng.start))


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
