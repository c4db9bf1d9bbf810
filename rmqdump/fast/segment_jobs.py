"""Whole-segment jobs and parallelism: :func:`summarize_segment` (verify's per-segment step),
:func:`verify_segments` (in threads: the kernel releases the GIL; a large segment as several ranges when
there are fewer segments than jobs), :func:`summarize_split`, :func:`default_jobs` and
:func:`parallel_segment_map` (any picklable function, in processes)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.fast.engine import backend
from rmqdump.fast.segment_walk import walk_segment_fast

if TYPE_CHECKING:
    from rmqdump.disk.segment import Segment


@dataclass
class SegmentSummary:
    """What walking one segment found (picklable; one per segment for verify-like commands)."""

    file: str
    start: int  # segment start offset
    size: int
    start_pos: int
    records: int
    end_pos: int  # segment position after the last valid record (size after a BLANK)
    stop: str  # "end", "blank", "limit" or an Invalid kind
    stop_pos: int
    stop_detail: str
    stop_size: int  # the invalid record's TOTALSIZE when usable, else -1
    phys_mismatches: int
    first_phys_mismatch: int | None
    min_store_timestamp: int | None
    max_store_timestamp: int | None

    @property
    def stop_offset(self) -> int:
        return self.start + self.stop_pos


def summarize_segment(segment: Segment, start_pos: int = 0, check_crc: bool = True, end_offset: int | None = None,
                      max_record_size: int = MAX_RECORD_SIZE) -> SegmentSummary:
    """Walk one segment with the fast kernel and summarise it (verify's per-segment step)."""
    lo = hi = None
    with walk_segment_fast(segment, start_pos, check_crc, end_offset=end_offset,
                           max_record_size=max_record_size) as w:
        for b in w:
            ts = b["store_timestamp"]
            bmin, bmax = int(ts.min()), int(ts.max())
            lo = bmin if lo is None else min(lo, bmin)
            hi = bmax if hi is None else max(hi, bmax)
        st = w.stop
        inv = st.invalid
        return SegmentSummary(
            file=segment.name, start=segment.start, size=w.size, start_pos=start_pos, records=w.records,
            end_pos=w.end_pos, stop=inv.kind if inv is not None else st.kind, stop_pos=st.pos,
            stop_detail=inv.detail if inv is not None else "", stop_size=inv.size if inv is not None else -1,
            phys_mismatches=w.phys_mismatches, first_phys_mismatch=w.first_phys_mismatch,
            min_store_timestamp=lo, max_store_timestamp=hi)


def verify_segments(segments: Sequence[Segment], *, jobs: int = 1, check_crc: bool = True,
                    start: int | None = None, end: int | None = None,
                    max_record_size: int = MAX_RECORD_SIZE, store_root: str | os.PathLike | None = None,
                    split_min_bytes: int | None = None) -> list[SegmentSummary]:
    """:func:`summarize_segment` over every segment (from ``start``, up to ``end``), ``jobs`` at a
    time in threads (the kernel releases the GIL). Combine in order: the commitlog's valid data
    ends at the first summary whose ``stop`` is an Invalid kind.

    With fewer segments than ``jobs``, a segment of at least ``split_min_bytes`` (default
    ``segment_split.SPLIT_MIN_BYTES``) is walked as several ranges at once and joined with proof
    (:mod:`rmqdump.fast.segment_split`; split points from ``store_root``'s ConsumeQueue when given):
    the summaries are the serial walk's."""
    segs = [s for s in segments if start is None or s.start + s.size > start]
    args = [(s, max(0, start - s.start) if start is not None else 0) for s in segs]
    backend()  # load once, before the threads start

    def one(a):
        return summarize_segment(a[0], a[1], check_crc, end, max_record_size)

    if jobs <= 1 or not args:
        return [one(a) for a in args]
    if len(args) >= jobs:
        if len(args) == 1:
            return [one(a) for a in args]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(jobs, len(args))) as ex:
            return list(ex.map(one, args))
    return _verify_split(args, jobs, check_crc, end, max_record_size, store_root, split_min_bytes)


def summarize_split(segment: Segment, start_pos: int = 0, check_crc: bool = True, end_offset: int | None = None,
                    max_record_size: int = MAX_RECORD_SIZE, *, k: int = 2, store_root: str | os.PathLike | None = None,
                    min_bytes: int | None = None, prove: bool = True) -> SegmentSummary:
    """:func:`summarize_segment` of one segment walked as ``k`` ranges in ``k`` threads and joined with
    proof (:mod:`rmqdump.fast.segment_split`): the same summary as the serial walk's."""
    return _verify_split([(segment, start_pos)], k, check_crc, end_offset, max_record_size, store_root,
                         min_bytes, prove)[0]


def _verify_split(args: list, jobs: int, check_crc: bool, end: int | None, max_record_size: int,
                  store_root: str | os.PathLike | None, split_min_bytes: int | None,
                  prove: bool = True) -> list[SegmentSummary]:
    """Fewer segments than jobs: split each large one into ranges, walk all ranges in one pool, join."""
    from concurrent.futures import ThreadPoolExecutor

    from rmqdump.fast.segment_split import join_ranges, split_plan

    k = -(-jobs // len(args))
    plans = [split_plan(s, pos, k, end_offset=end, max_record_size=max_record_size, store_root=store_root,
                        min_bytes=split_min_bytes) for s, pos in args]
    tasks = [(s, r) for (s, _), plan in zip(args, plans, strict=True) for r in plan]

    def walk(t):
        try:
            return summarize_segment(t[0], t[1][0], check_crc, t[1][1], max_record_size)
        except Exception as e:  # noqa: BLE001 - raised by the join if the serial walk would reach it
            return e

    backend()
    if len(tasks) == 1:
        results = [walk(tasks[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(jobs, len(tasks))) as ex:
            results = list(ex.map(walk, tasks))
    out, i = [], 0
    for (seg, _), plan in zip(args, plans, strict=True):
        part = results[i:i + len(plan)]
        i += len(plan)
        out.append(join_ranges(plan, part, lambda pos, e, seg=seg: summarize_segment(
            seg, pos, check_crc, e, max_record_size), prove=prove))
    return out


def default_jobs() -> int:
    """CPUs this process may use: its CPU affinity, capped by ``$OMP_NUM_THREADS`` (which Spark
    sets to a task's ``spark.task.cpus``, so a task's threads keep to its share)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    try:
        cap = int(os.environ.get("OMP_NUM_THREADS", "0"))
    except ValueError:
        cap = 0
    return max(1, min(n, cap) if cap > 0 else n)


def parallel_segment_map(func: Callable[[Segment], Any], segments: Iterable[Segment], jobs: int | None = None, *,
                         threads: bool = False) -> list:
    """``[func(s) for s in segments]``, ``jobs`` at a time, results in segment order.

    Processes (``forkserver`` context where available, else ``spawn``) by default, so ``func``
    must be a picklable module-level function and its result picklable; ``threads=True`` for
    functions that release the GIL (compiled kernels). ``jobs`` None = all CPUs; <= 1 runs inline.
    """
    segs = list(segments)
    jobs = default_jobs() if jobs is None else jobs
    if jobs <= 1 or len(segs) <= 1:
        return [func(s) for s in segs]
    workers = min(jobs, len(segs))
    if threads:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as ex:
            return list(ex.map(func, segs))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as ex:
        return list(ex.map(func, segs))
