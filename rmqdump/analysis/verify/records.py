"""Record-level verification of one commitlog segment — the reusable (parallelisable) loop.

:func:`verify_segment_pure` walks one segment by TOTALSIZE (``read_body=False``, body CRC checked
inside the decoder), checks every record and returns a :class:`SegmentResult`: findings,
statistics and the little state needed to check continuity across segments
(:func:`merge_segments`). It needs nothing but the segment file, so segments can be
verified in any order, in parallel, or on Spark executors, and merged afterwards.

The per-record checks are in :mod:`~rmqdump.analysis.verify.record_checks`, damaged ranges and
segment tails in :mod:`~rmqdump.analysis.verify.damage`, the result in
:mod:`~rmqdump.analysis.verify.result`.
"""

from __future__ import annotations

from collections.abc import Callable

from rmqdump.analysis.verify.damage import _damage, _finish_tail
from rmqdump.analysis.verify.record_checks import _HALF, RecordChecker, _track_damaged_record
from rmqdump.analysis.verify.result import SegmentResult, _Emitter
from rmqdump.codec.encoder import is_filler
from rmqdump.codec.layout import (
    MAX_RECORD_SIZE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.record import BODY_CRC, Blank, Message
from rmqdump.disk.segment import Segment
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog, Skipped


def verify_segment_pure(segment: Segment, *, file_size: int | None = None, check_crc: bool = True,
                        keep_going: bool = True, max_record_size: int = MAX_RECORD_SIZE, use_mmap: bool = True,
                        file_label: str | None = None, on_message: Callable[[Message], None] | None = None,
                        progress: Callable[[int], None] | None = None, list_limit: int = 10000,
                        max_findings_per_kind: int = 1000, zero_start: bool = False) -> SegmentResult:
    """Verify every record of one segment (see the package docstring for the finding kinds).

    ``keep_going`` resynchronises past damage (as ``scan --keep-going``) and counts the
    intact records after it; without it the loop ends at the first damage of the segment.
    ``on_message`` is called for every valid record (store-level cross checks);
    ``progress`` with the segment position every 1024 records. ``zero_start``: this is the
    first segment of a store whose commitlog starts at offset 0, so every queue starts at 0.
    The pure-Python reference; :func:`rmqdump.analysis.verify.segment.verify_segment` picks this or
    its compiled twin.
    """
    label = file_label or str(segment.path)
    res = SegmentResult(segment.name, label, segment.start, segment.size, end_offset=segment.start)
    emit = _Emitter(res, max_findings_per_kind)
    cl = CommitLog([segment], file_size or segment.size, segment.path.parent, [])
    walk = cl.walk(check_crc=check_crc, read_body=False, keep_going=keep_going, use_mmap=use_mmap,
                   max_record_size=max_record_size)
    reader = segment.open(use_mmap)
    chk = RecordChecker(res, emit, reader, zero_start, on_message)
    check = chk.message
    n = 0
    damaged = False
    try:
        for rec in walk:
            if type(rec) is Message:
                n += 1
                if damaged:
                    res.intact_after_damage += 1
                    if len(res.intact_after_damage_offsets) < list_limit:
                        res.intact_after_damage_offsets.append(rec.offset)
                check(rec)
                if progress is not None and n & 1023 == 0:
                    progress(rec.offset - segment.start)
            elif type(rec) is Blank:
                res.blanks += 1
                res.blank_offset = rec.offset
            elif isinstance(rec, Skipped):
                damaged = True
                _damage(emit, res, reader, rec.start, rec.end, rec.reason, followed=True)
                if rec.reason.kind == BODY_CRC:
                    _track_damaged_record(reader, rec.start - segment.start, res.queues, max_record_size,
                                          zero_start)
    finally:
        res.records = n
        res.min_store_timestamp, res.max_store_timestamp = chk.min_ts, chk.max_ts
        chk.flush_queues()
        res.end_offset = max(res.end_offset, walk.end_offset)
        try:
            _finish_tail(emit, res, reader, walk.stop, keep_going)
        finally:
            reader.close()
    if progress is not None:
        progress(segment.size)
    emit.suppressed(label)
    return res


def _fast_wanted(nbytes: int) -> bool:
    from rmqdump.fast import walk as fastwalk

    return fastwalk.use_fast(nbytes)


def merge_segments(results: list[SegmentResult], file_size: int, zero_start: bool = False) -> list[Finding]:
    """Findings that need neighbouring segments: queue continuity, tails, preallocation.

    ``zero_start``: the commitlog starts at offset 0, so a queue first seen in a later segment
    must start at queue offset 0.
    """
    out: list[Finding] = []
    carried: dict[bytes, dict[int, int]] = {}
    last_data = max((i for i, r in enumerate(results) if r.records or r.blanks or r.tail not in ("empty",)),
                    default=-1)
    for i, r in enumerate(results):
        for topic_raw, qd in r.queues.items():
            cd = carried.setdefault(topic_raw, {})
            for qid, st in qd.items():
                exp = cd.get(qid)
                if exp is None and zero_start and i > 0:
                    exp = 0
                if exp is not None and st.first_queue_offset != exp:
                    topic = topic_raw.decode("utf-8", "replace")
                    if st.first_queue_offset > exp:
                        out.append(Finding(WARNING, "queue_offset_gap", r.file, st.first_offset,
                                           f"{topic}/{qid}: QUEUEOFFSET jumps from {exp - 1} to "
                                           f"{st.first_queue_offset} across segments"))
                    else:
                        out.append(Finding(ERROR, "queue_offset_regression", r.file, st.first_offset,
                                           f"{topic}/{qid}: QUEUEOFFSET {st.first_queue_offset} repeats or goes "
                                           f"back (expected {exp}) across segments"))
                cd[qid] = st.next_expected
        if r.tail == "damage":
            carried = {}  # records after unresolved damage were not seen: continuity unknown
            zero_start = False
        if r.tail == "empty":
            if i > last_data:
                out.append(Finding(INFO, "preallocated_segment", r.file, r.start,
                                   "all-zero segment (pre-allocated by AllocateMappedFileService)"))
            else:
                out.append(Finding(ERROR, "empty_segment", r.file, r.start,
                                   "all-zero segment before later data: recovery stops here and deletes later "
                                   "files"))
        elif i < last_data and r.tail in ("zeros", "garbage", "full"):
            what = {"full": "ends exactly at the end of the file without a BLANK record",
                    "zeros": f"ends at {r.stop_offset} with zeros instead of a BLANK record",
                    "garbage": f"ends at {r.stop_offset} without a BLANK record"}[r.tail]
            out.append(Finding(ERROR, "missing_blank", r.file, r.stop_offset if r.tail != "full" else r.start + r.size,
                               f"segment {what}, but later segments hold data: recovery stops here"))
    return out


def check_transactions(results: list[SegmentResult], cache, min_offset: int) -> list[Finding]:
    """COMMIT/ROLLBACK records must point at an existing, earlier half message (``cache``: a RecordCache).

    A half message is a record of RMQ_SYS_TRANS_HALF_TOPIC (the broker's transactions since 4.3) or a
    PREPARED record (the 4.x store API's own transactions: PREPARED, then COMMIT/ROLLBACK in the same
    topic). Nothing in the broker reads PREPARED TRANSACTION OFFSET back (the COMMIT is dispatched and
    consumed regardless), so a pointer at anything else is a ``warning``: a damaged field, not lost data.
    """
    out: list[Finding] = []
    halves: set[int] = set()
    arrays = []
    for r in results:
        if isinstance(r.half_offsets, set):
            halves |= r.half_offsets
        else:  # the compiled path keeps them as a sorted numpy array
            arrays.append(r.half_offsets)
    sorted_halves = None
    if arrays:
        import numpy as np

        sorted_halves = np.unique(np.concatenate(arrays + [np.fromiter(halves, np.int64, len(halves))]))
    for r in results:
        refs = r.tx_refs
        if sorted_halves is not None or not isinstance(refs, list):
            import numpy as np

            refs = np.asarray(refs, dtype=np.int64).reshape(-1, 4)
            if refs.size:
                if sorted_halves is None:
                    sorted_halves = np.fromiter(sorted(halves), np.int64, len(halves))
                prepared = refs[:, 2]
                idx = np.minimum(np.searchsorted(sorted_halves, prepared), max(sorted_halves.size - 1, 0))
                ok = (sorted_halves[idx] == prepared) & (prepared < refs[:, 0]) if sorted_halves.size else \
                    np.zeros(len(refs), dtype=bool)
                refs = refs[~ok]
            refs = [tuple(int(v) for v in row) for row in refs]
        for off, _pos, prepared, tx in refs:
            name = "COMMIT" if tx == TRANSACTION_COMMIT_TYPE else "ROLLBACK"
            if sorted_halves is None and prepared in halves and prepared < off:
                continue
            if prepared < min_offset and prepared >= 0:
                out.append(Finding(INFO, "tx_half_expired", r.file, off,
                                   f"{name} record's half message at {prepared} lies in a deleted commitlog file"))
                continue
            detail = None
            if prepared >= off or prepared < 0:
                detail = f"{name} record points at {prepared}, not an earlier offset"
            else:
                h = cache.decode(prepared)
                if not isinstance(h, Message):
                    detail = f"{name} record points at {prepared}, where there is no valid record ({h.kind})"
                elif h.topic_raw != _HALF and h.sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_PREPARED_TYPE:
                    detail = (f"{name} record points at {prepared}, a {h.topic!r} record, neither a half "
                              "message nor a PREPARED record")
            if detail and tx != TRANSACTION_COMMIT_TYPE and is_filler(cache.decode(off, check_crc=False)):
                out.append(Finding(INFO, "repair_filler", r.file, off, "ROLLBACK filler record written by rmqdump "
                                   "repair over damaged bytes (they are in the repair's backup)"))
            elif detail:
                # info: RocketMQ's 4.x store API writes COMMIT/ROLLBACK records with any offset (0 when none is
                # set; records copied between stores keep theirs) and nothing in the broker reads it back
                out.append(Finding(INFO, "tx_half_missing", r.file, off, detail))
    return out
