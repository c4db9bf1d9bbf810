"""The broker's startup recovery walk (:func:`rmqdump.broker.recovery.broker_walk`) through the compiled
kernel: identical :class:`~rmqdump.broker.recovery.BrokerWalk`, the pure walk where the kernels cannot run.
verify passes the per-segment summaries of its own walk; repair, the appender and ``timer`` call it as is."""

from __future__ import annotations

from rmqdump.codec.layout import INT32, MESSAGE_MAGIC_CODE_V2
from rmqdump.errors import StoreError
from rmqdump.fast import walk as fw
from rmqdump.store.commitlog import CommitLog


def broker_walk_fast(cl: CommitLog, start_index: int, *, version: str = "4.9", check_crc: bool = True,
                     use_mmap: bool = True, summaries: dict[int, tuple] | None = None):
    """:func:`rmqdump.broker.recovery.broker_walk` with the compiled walk (identical :class:`BrokerWalk`);
    the pure walk when the kernels cannot run or a file cannot be mapped.

    ``summaries``: segment start -> :attr:`SegmentResult.walk_summary` of files verify already
    walked cleanly (a clean walk under verify's size limit is the broker's walk under its larger
    one); those files are not read again.
    """
    from rmqdump.broker import recovery as R

    segs = cl.segments
    if not segs or not use_mmap or not fw.fast_available():
        return _PURE_BROKER_WALK(cl, start_index, version=version, check_crc=check_crc, use_mmap=use_mmap)
    np = fw._numpy()
    first = segs[start_index]
    w = R.BrokerWalk(start_index, first.start, first.start)
    index = start_index
    while True:
        seg = segs[index]
        summ = summaries.get(seg.start) if summaries else None
        if summ is not None and summ[0] == check_crc:
            _, kind, pos, records, last, v2 = summ
            if v2 is not None and version == R.VERSION_49:
                vpos, vsize, records, last = v2
            if records:
                w.records += records
                w.last_record_offset, w.last_store_timestamp = last
            if v2 is not None and version == R.VERSION_49:
                return w.halt(seg, vpos, R.STOP_V2_ON_49, vsize)
            if kind == "end":
                return w.halt(seg, pos, R.STOP_NO_BLANK)
            index += 1
            if index >= len(segs):
                return w.halt(seg, pos, R.STOP_LAST_BLANK)
            continue
        try:
            fsw = fw.FastSegmentWalk(segment=seg, check_crc=check_crc, max_record_size=R.BROKER_MAX_RECORD_SIZE)
        except StoreError:
            return _PURE_BROKER_WALK(cl, start_index, version=version, check_crc=check_crc, use_mmap=use_mmap)
        with fsw:
            size = fsw.size
            for b in fsw:
                k = b.n
                if version == R.VERSION_49:
                    v2 = np.flatnonzero(b["magic"] == MESSAGE_MAGIC_CODE_V2)
                    if v2.size:
                        k = int(v2[0])
                if k:
                    w.records += k
                    w.last_record_offset = seg.start + int(b["file_pos"][k - 1])
                    w.last_store_timestamp = int(b["store_timestamp"][k - 1])
                if k < b.n:  # V2 magic on a 4.9 broker
                    return w.halt(seg, int(b["file_pos"][k]), R.STOP_V2_ON_49, int(b["size"][k]))
            st = fsw.stop
            pos = st.pos
            if st.kind == "end":
                return w.halt(seg, pos, R.STOP_NO_BLANK)
            if st.kind != "blank":
                rec = st.invalid
                overruns = False
                if rec.kind == R.BAD_BLANK and pos + INT32.size <= size:  # its TOTALSIZE
                    overruns = INT32.unpack_from(fsw.buf, pos)[0] > size - pos
                if R.broker_verdict(rec, version, overruns) != "blank":
                    w.process_offset = seg.start + pos
                    w.stop = rec
                    return w
                w.notes.append(f"BLANK at {rec.offset} accepted although {rec.detail}")
        index += 1
        if index >= len(segs):
            return w.halt(seg, pos, R.STOP_LAST_BLANK)
            return w


def _PURE_BROKER_WALK(*args, **kwargs):
    from rmqdump.broker.recovery import broker_walk

    return broker_walk(*args, **kwargs)


def recovery_twins(cl: CommitLog, use_mmap: bool = True) -> dict:
    """``walker=``/``redispatcher=`` for :func:`~rmqdump.broker.recovery.predict_recovery` where the compiled
    path applies to this commitlog (``fast.engine.use_fast`` on its size; never for DLedger data files), else
    nothing (the pure walks). For callers without verify's per-segment summaries: repair, append, timer."""
    from rmqdump.fast.engine import use_fast
    from rmqdump.fast.redispatch import redispatch_fast

    segs = cl.segments
    if not use_mmap or not segs or not use_fast(sum(s.size for s in segs), segments=segs):
        return {}
    return {"walker": broker_walk_fast, "redispatcher": redispatch_fast}
