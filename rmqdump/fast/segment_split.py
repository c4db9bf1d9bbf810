"""One segment walked as K ranges in parallel, joined with proof: :func:`plan_ranges` picks split points
(ConsumeQueue offsets when given, else a scan for a plausible record header), each range is walked up to
the next one's start (``segment_jobs.summarize_split``, ``verify_segments``), and :func:`join_ranges` accepts a range's result only if the walk
before it ended exactly at its start (a walk from a true record boundary is deterministic); otherwise it
walks on serially from where the previous range really ended. The joined :class:`SegmentSummary` is
the serial ``summarize_segment``'s, field for field, whatever the split points were."""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqdump.codec.layout import (
    BLANK_MAGIC_CODE,
    CQ_STORE_UNIT_SIZE,
    CQ_UNIT,
    MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_POSITION,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE_V1_IPV4,
    TOTALSIZE_MAGIC,
)
from rmqdump.disk.fileio import open_read

if TYPE_CHECKING:
    from rmqdump.disk.segment import Segment

#: ``segment_jobs.SegmentSummary`` (not imported: segment_jobs imports this module)
SegmentSummary = Any

#: Segments (the part to walk) smaller than this are walked whole; tests lower it.
SPLIT_MIN_BYTES = 64 << 20
_SCAN_CHUNK = 1 << 20
_MAGICS = (MESSAGE_MAGIC_CODE.to_bytes(4, "big"), MESSAGE_MAGIC_CODE_V2.to_bytes(4, "big"))
_NEXT_OK = {MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, BLANK_MAGIC_CODE}
_HEAD = TOTALSIZE_MAGIC  # TOTALSIZE and MAGIC, the first 8 bytes of every record
_H = TOTALSIZE_MAGIC.size

#: One range: (start position in the segment, absolute end offset for the walk or None).
Range = tuple[int, "int | None"]


def plausible_header(buf, pos: int, max_record_size: int = MAX_RECORD_SIZE) -> bool:
    """A record could start at ``pos``: message MAGIC, a sane TOTALSIZE that fits, and what follows it is
    the end of the buffer, another MAGIC (message or BLANK) or unwritten zeros. A guess only."""
    size = len(buf)
    if pos < 0 or pos + _H > size:
        return False
    total, magic = _HEAD.unpack(bytes(buf[pos:pos + _H]))
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        return False
    if total < MIN_RECORD_SIZE_V1_IPV4 or total > max_record_size or pos + total > size:
        return False
    nxt = pos + total
    if nxt == size:
        return True
    if nxt + _H > size:
        return not any(bytes(buf[nxt:size]))
    ntotal, nmagic = _HEAD.unpack(bytes(buf[nxt:nxt + _H]))
    return nmagic in _NEXT_OK or (ntotal == 0 and nmagic == 0)


def find_header(buf, lo: int, hi: int, max_record_size: int = MAX_RECORD_SIZE) -> int | None:
    """The first position in ``[lo, hi)`` where :func:`plausible_header` holds, or None."""
    size = len(buf)
    pos = lo
    while pos < hi:
        end = min(hi + MESSAGE_MAGIC_CODE_POSITION + 4, size, pos + _SCAN_CHUNK + MESSAGE_MAGIC_CODE_POSITION + 4)
        chunk = bytes(buf[pos:end])
        hits = []
        for m in _MAGICS:
            i = chunk.find(m, MESSAGE_MAGIC_CODE_POSITION)
            while i >= 0:
                hits.append(pos + i - MESSAGE_MAGIC_CODE_POSITION)
                i = chunk.find(m, i + 1)
        for p in sorted(hits):
            if lo <= p < hi and plausible_header(buf, p, max_record_size):
                return p
        if end >= size:
            break
        pos += _SCAN_CHUNK
    return None


def data_end(buf, lo: int, hi: int, probe: int = 4096) -> int:
    """Roughly where written data ends in ``[lo, hi)`` (a commitlog fills from the front; the rest is
    zeros): a binary search for the last non-zero ``probe``-byte block. A guess for spreading the
    split points, nothing more."""
    a, b = lo, hi  # invariant: data reaches a; nothing known past b
    while b - a > probe:
        mid = (a + b) // 2
        if any(bytes(buf[mid:min(mid + probe, hi)])):
            a = mid
        else:
            b = mid
    return b


def cq_hints(store_root: str | os.PathLike, lo: int, hi: int, targets: Sequence[int]) -> list[int]:
    """For each absolute ``target``, the smallest CommitLog offset in ``[target, hi)`` that some
    ConsumeQueue unit names (a record start the broker dispatched), or -1. Binary search per queue file;
    units of zeros (unwritten tail) count as past every target. Unverified: callers prove the joins."""
    from rmqdump.errors import RmqdumpError
    from rmqdump.store.consumequeue.discovery import discover_queues, list_mapped_files

    best = [-1] * len(targets)
    try:
        queues = list(discover_queues(store_root))
    except (RmqdumpError, OSError):
        return best
    for q in queues:
        try:
            files, _ = list_mapped_files(q.path)
        except (RmqdumpError, OSError):
            continue
        for f in files:
            _file_hints(f.path, f.size // CQ_STORE_UNIT_SIZE, lo, hi, targets, best)
    return best


def _file_hints(path: Path, units: int, lo: int, hi: int, targets: Sequence[int], best: list[int]) -> None:
    try:
        fd = open_read(path, nonblock=False)
    except OSError:
        return
    big = 1 << 62

    def phys(i: int) -> int:
        raw = os.pread(fd, CQ_STORE_UNIT_SIZE, i * CQ_STORE_UNIT_SIZE)
        if len(raw) < CQ_STORE_UNIT_SIZE:
            return big
        off, size, _ = CQ_UNIT.unpack(raw)
        return big if off == 0 and size == 0 else off

    try:
        for t, target in enumerate(targets):
            a, b = 0, units
            while a < b:
                mid = (a + b) // 2
                if phys(mid) >= target:
                    b = mid
                else:
                    a = mid + 1
            if a < units:
                off = phys(a)
                if lo <= target <= off < hi and (best[t] < 0 or off < best[t]):
                    best[t] = off
    except OSError:
        pass
    finally:
        os.close(fd)


def plan_ranges(buf, seg_start: int, start_pos: int, k: int, *, end_offset: int | None = None,
                max_record_size: int = MAX_RECORD_SIZE, hints: Sequence[int] | None = None) -> list[Range]:
    """Up to ``k`` ranges covering ``[start_pos, stop)`` of a segment image, ``stop`` being its size or
    ``end_offset``'s position. Split near ``i * stop / k``: at the first ``hints`` offset (absolute, e.g.
    from :func:`cq_hints`) at or after it that looks like a header, else at the first plausible header.
    The last range ends where the serial walk would (``end_offset``); the others at the next start."""
    size = len(buf)
    stop = size if end_offset is None else min(size, max(end_offset - seg_start, 0))
    span = data_end(buf, start_pos, stop) - start_pos
    starts = [start_pos]
    hint_list = sorted(h - seg_start for h in (hints or ()) if h >= 0)
    for i in range(1, k):
        target = start_pos + span * i // k
        if target <= starts[-1]:
            continue
        bound = start_pos + span * (i + 1) // k
        cand = None
        j = bisect.bisect_left(hint_list, target)
        if j < len(hint_list) and hint_list[j] < bound and plausible_header(buf, hint_list[j], max_record_size):
            cand = hint_list[j]
        if cand is None:  # a record is never longer than max_record_size: none within that = damage or zeros
            cand = find_header(buf, target, min(bound, target + 2 * max_record_size), max_record_size)
        if cand is not None and starts[-1] < cand < stop:
            starts.append(cand)
    ends: list[int | None] = [seg_start + s for s in starts[1:]] + [end_offset]
    return list(zip(starts, ends, strict=True))


def join_ranges(ranges: Sequence[Range], results: Sequence[SegmentSummary | BaseException],
                rewalk: Callable[[int, int | None], SegmentSummary], *, prove: bool = True) -> SegmentSummary:
    """Merge range results into the serial walk's summary. Range ``i+1``'s result stands only if range
    ``i`` stopped at ``limit`` exactly on its start; if it passed it (the split was inside a record),
    ``rewalk(pos, end)`` walks on from the true position; any other stop ends the segment, as it ends the
    serial walk. ``prove=False`` (tests only) trusts every split point. An exception from a range is
    raised only if that range's result is used (the serial walk would have raised there too)."""
    parts: list[SegmentSummary] = []
    cursor = ranges[0][0]
    for i, ((start, end), res) in enumerate(zip(ranges, results, strict=True)):
        if prove and start != cursor:
            res = rewalk(cursor, end)
        if isinstance(res, BaseException):
            raise res
        parts.append(res)
        last = i == len(ranges) - 1
        if not last and prove and res.stop != "limit":
            break  # the serial walk ends here, before the split point (damage, zeros, blank, end)
        cursor = res.stop_pos
    return merge_summaries(parts)


def merge_summaries(parts: Sequence[SegmentSummary]) -> SegmentSummary:
    """One summary from consecutive walks of one segment (each starting where the previous stopped)."""
    first, last = parts[0], parts[-1]
    lows = [p.min_store_timestamp for p in parts if p.min_store_timestamp is not None]
    highs = [p.max_store_timestamp for p in parts if p.max_store_timestamp is not None]
    mism = [p.first_phys_mismatch for p in parts if p.first_phys_mismatch is not None]
    return dataclasses.replace(
        first, records=sum(p.records for p in parts), end_pos=last.end_pos, stop=last.stop, stop_pos=last.stop_pos,
        stop_detail=last.stop_detail, stop_size=last.stop_size,
        phys_mismatches=sum(p.phys_mismatches for p in parts), first_phys_mismatch=mism[0] if mism else None,
        min_store_timestamp=min(lows) if lows else None, max_store_timestamp=max(highs) if highs else None)


def split_plan(segment: Segment, start_pos: int, k: int, *, end_offset: int | None = None,
               max_record_size: int = MAX_RECORD_SIZE, store_root: str | os.PathLike | None = None,
               min_bytes: int | None = None) -> list[Range]:
    """:func:`plan_ranges` over a segment file (one range when the part to walk is below ``min_bytes``,
    default :data:`SPLIT_MIN_BYTES`). ``store_root``: take split points from its ConsumeQueue first."""
    from rmqdump.fast.segment_walk import _map

    min_bytes = SPLIT_MIN_BYTES if min_bytes is None else min_bytes
    stop = segment.size if end_offset is None else min(segment.size, end_offset - segment.start)
    if k <= 1 or stop - start_pos < max(min_bytes, 1):
        return [(start_pos, end_offset)]
    mm, buf = _map(segment)
    try:
        size = int(buf.size)
        stop = size if end_offset is None else min(size, max(end_offset - segment.start, 0))
        if stop - start_pos < max(min_bytes, 1):
            return [(start_pos, end_offset)]
        hints = None
        if store_root is not None:
            targets = [segment.start + start_pos + (stop - start_pos) * i // k for i in range(1, k)]
            hints = [h for h in cq_hints(store_root, segment.start, segment.start + stop, targets) if h >= 0]
        return plan_ranges(buf, segment.start, start_pos, k, end_offset=end_offset,
                           max_record_size=max_record_size, hints=hints)
    finally:
        del buf
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass
