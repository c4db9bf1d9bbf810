"""The engine seam of ``verify``: one segment through the compiled kernels when they pay off, else
through the pure-Python reference (identical results; ``tests/test_verify_fast.py`` compares them)."""

from __future__ import annotations

from collections.abc import Callable

from rmqdump.analysis.verify.fast import verify_segment_fast
from rmqdump.analysis.verify.records import verify_segment_pure
from rmqdump.analysis.verify.result import SegmentResult
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.codec.record import Message
from rmqdump.disk.segment import Segment
from rmqdump.fast.walk import use_fast


def verify_segment(segment: Segment, *, file_size: int | None = None, check_crc: bool = True,
                   keep_going: bool = True, max_record_size: int = MAX_RECORD_SIZE, use_mmap: bool = True,
                   file_label: str | None = None, on_message: Callable[[Message], None] | None = None,
                   progress: Callable[[int], None] | None = None, list_limit: int = 10000,
                   max_findings_per_kind: int = 1000, zero_start: bool = False,
                   fast: bool | None = None, on_batch: Callable | None = None,
                   read_ahead: bool = False) -> SegmentResult:
    """Verify every record of one segment (the finding kinds: :mod:`rmqdump.analysis.verify`).

    ``fast``: walk and check with the compiled kernels (:mod:`rmqdump.analysis.verify.fast`); None =
    when they are available and the segment is big enough (``use_mmap`` only). Other arguments: see
    :func:`rmqdump.analysis.verify.records.verify_segment_pure`. ``on_batch(batch, lo, hi)``: on the compiled
    path, called instead of ``on_message`` for rows ``lo..hi-1`` of a walk batch that the record checks cleared
    (``on_message`` still gets the records they look at, in order).
    """
    kwargs = dict(file_size=file_size, check_crc=check_crc, keep_going=keep_going, max_record_size=max_record_size,
                  file_label=file_label, on_message=on_message, progress=progress, list_limit=list_limit,
                  max_findings_per_kind=max_findings_per_kind, zero_start=zero_start)
    if fast is None:
        fast = use_mmap and use_fast(segment.size, segments=(segment,))
    if fast:
        res = verify_segment_fast(segment, on_batch=on_batch, read_ahead=read_ahead, **kwargs)
        if res is not None:
            return res
    return verify_segment_pure(segment, use_mmap=use_mmap, **kwargs)
