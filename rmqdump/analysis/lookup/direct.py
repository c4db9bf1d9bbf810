"""The direct lookups: the record at a commitlog offset, the one an offsetMsgId names, the one a
ConsumeQueue (or BatchConsumeQueue) entry points at."""

from __future__ import annotations

import os
from pathlib import Path

from rmqdump.analysis.lookup.result import LookupResult, _crc_warning, _describe_invalid, _open_store, read_message
from rmqdump.codec.record import Message
from rmqdump.errors import FormatError, NotFoundError
from rmqdump.store.geometry import StoreGeometry, resolve_geometry
from rmqdump.store.root import Store


def _direct(store: Store, offset: int, what: str, use_mmap: bool, geometry: StoreGeometry | None,
            source: str) -> LookupResult:
    geo = geometry or resolve_geometry(store.root, commitlog_file_size=store.commitlog.file_size, parts=())
    res = LookupResult(source=source, geometry=geo)
    cl = store.commitlog
    if cl.segment_for(offset) is None:
        last = cl.segments[-1]
        raise NotFoundError(f"{what}: offset {offset} is outside the commitlog "
                            f"[{cl.min_offset}, {last.end})")
    rec = read_message(cl, offset, use_mmap=use_mmap, max_record_size=geo.max_record_size)
    if not isinstance(rec, Message):
        seg = cl.segment_for(offset)
        raise NotFoundError(f"{what}: no record starts at offset {offset}: {_describe_invalid(rec)}",
                            seg.path if seg else None, offset - seg.start if seg else None)
    if rec.physical_offset != rec.offset:
        res.warnings.append(f"record at {rec.offset} carries PHYSICALOFFSET {rec.physical_offset} "
                            "(copied or moved bytes?)")
    w = _crc_warning(rec)
    if w:
        res.warnings.append(w)
    res.hits.append(rec)
    return res


def lookup_offset(store: Store | str | os.PathLike, offset: int, *, use_mmap: bool = True,
                  geometry: StoreGeometry | None = None) -> LookupResult:
    """The record starting at commitlog ``offset`` (NotFoundError if none starts there)."""
    if offset < 0:
        raise FormatError(f"negative commitlog offset {offset}")
    return _direct(_open_store(store), offset, "--offset", use_mmap, geometry, "offset")


def lookup_msg_id(store: Store | str | os.PathLike, msg_id: str, *, use_mmap: bool = True,
                  geometry: StoreGeometry | None = None) -> LookupResult:
    """The record an offsetMsgId names; warns when the id's store host is not this store's."""
    from rmqdump.codec.msgid import decode_offset_msg_id

    mid = decode_offset_msg_id(msg_id)  # FormatError when malformed
    st = _open_store(store)
    try:
        res = _direct(st, mid.offset, f"msg id {msg_id.strip()}", use_mmap, geometry, "msg-id")
    except NotFoundError as exc:
        first = read_message(st.commitlog, st.commitlog.min_offset, use_mmap=use_mmap)
        if isinstance(first, Message) and (first.store_addr, first.store_port) != (mid.address, mid.port):
            raise NotFoundError(f"{exc.message} (the id names store host {mid.host}; this store's records were "
                                f"stored by {first.store_host}: probably another broker's id)", exc.file,
                                exc.offset) from None
        raise
    rec = res.hits[0]
    if (rec.store_addr, rec.store_port) != (mid.address, mid.port):
        res.warnings.append(f"msg id names store host {mid.host} but the record at offset {mid.offset} was stored "
                            f"by {rec.store_host}: the id probably comes from another broker")
    return res


def lookup_queue(store: Store | str | os.PathLike, topic: str, queue_id: int, queue_offset: int, *,
                 use_mmap: bool = True, geometry: StoreGeometry | None = None) -> LookupResult:
    """The record a ConsumeQueue entry points at (BatchConsumeQueue for BatchCQ topics)."""
    st = _open_store(store)
    if st.root is None:
        raise NotFoundError("--queue needs a store root (only commitlog files were given)")
    geo = geometry or resolve_geometry(st.root, commitlog_file_size=st.commitlog.file_size, parts=())
    from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, STORE_BATCH_CONSUMEQUEUE_DIR, STORE_CONSUMEQUEUE_DIR
    from rmqdump.disk.paths import is_safe_component
    from rmqdump.store.consumequeue import BatchConsumeQueue, ConsumeQueue

    if not is_safe_component(topic):
        raise NotFoundError(f"no consume queue for topic {topic!r}: not a valid directory name")
    cq_dir = Path(st.root) / STORE_CONSUMEQUEUE_DIR / topic / str(queue_id)
    bcq_dir = Path(st.root) / STORE_BATCH_CONSUMEQUEUE_DIR / topic / str(queue_id)
    if not cq_dir.is_dir() and bcq_dir.is_dir() and not bcq_dir.is_symlink():
        bq = BatchConsumeQueue(bcq_dir, topic, queue_id)
        unit = bq.find(queue_offset)
        offset, size, what = unit.commit_log_offset, unit.size, f"batch consume queue unit {unit.unit_index}"
    else:
        cq_size = geo.cq_file_size if geo.sources.get("consumequeue") in ("broker.conf", "option") else None
        q = ConsumeQueue.open(st.root, topic, queue_id, file_size=cq_size)
        try:  # O(1): the broker's max offset (a scan of the last files) is only computed for errors
            entry = q.entry_at(queue_offset, check_max=False)
        except NotFoundError:
            entry = None
        if entry is None or not entry.is_valid or entry.is_pre_blank:
            first = q.files[0].start // CQ_STORE_UNIT_SIZE if q.files else 0
            if entry is None or queue_offset >= q.max_offset:
                raise NotFoundError(f"queue offset {queue_offset} is outside "
                                    f"[{first}, {q.max_offset})", q.path)
            kind = "a pre-blank placeholder" if entry.is_pre_blank else "invalid"
            raise NotFoundError(f"{topic}/{queue_id} queue offset {queue_offset}: entry is {kind} "
                                f"(offset {entry.commit_log_offset}, size {entry.size})", q.path)
        offset, size, what = entry.commit_log_offset, entry.size, f"consume queue {topic}/{queue_id}@{queue_offset}"
    res = _direct(st, offset, what, use_mmap, geo, "consumequeue")
    rec = res.hits[0]
    if rec.topic != topic or rec.queue_id != queue_id:
        from rmqdump.broker.systopics import multi_dispatched_to

        # an LMQ queue's entries point at records of the parent topic that list it in INNER_MULTI_DISPATCH
        if not (isinstance(rec, Message) and multi_dispatched_to(rec, topic, queue_id, queue_offset)):
            res.warnings.append(f"{what} points at offset {offset}, a record of {rec.topic}/{rec.queue_id}")
    if rec.size != size:
        res.warnings.append(f"{what} says size {size}, the record at {offset} is {rec.size} bytes")
    return res
