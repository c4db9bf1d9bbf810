"""``store_info``: what a store holds, cheaply (no full commitlog walk)."""

from __future__ import annotations

import os
from pathlib import Path

from rmqdump.broker.recovery.walk import STOP_LAST_BLANK
from rmqdump.codec.layout import PROPERTY_CRC32
from rmqdump.codec.record import END_OF_DATA, Blank, Invalid, Message
from rmqdump.errors import FormatError, RmqdumpError, StoreError
from rmqdump.store.checkpoint import ms_to_iso, read_checkpoint
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.inventory import detect_features, take_inventory
from rmqdump.store.root import Store

_CRC32_BYTES = PROPERTY_CRC32.encode()


def data_end(cl: CommitLog, use_mmap: bool = True, seen: dict | None = None) -> tuple[int, str]:
    """End of valid data: walk (without CRC) from the start of the last segment holding data (the compiled walk of
    :mod:`rmqdump.fast.dataend` where it runs). ``seen`` collects the first V2-magic record and the first
    ``__CRC32#`` record met (their offsets)."""
    start = cl.min_offset
    for seg in reversed(cl.segments):
        if seg.size == 0:
            continue
        with seg.open(use_mmap) as r:
            head = r.read(0, 8)
        if any(head):
            start = seg.start
            break
    from rmqdump.fast.dataend import data_end as data_end_fast

    fast = data_end_fast(cl, start, _CRC32_BYTES, use_mmap)
    if fast is not None:
        if seen is not None:  # in walk order, as the pure walk meets them
            for off, name in sorted((off, name) for name, off in (("v2", fast.first_v2),
                                                                   ("crc32", fast.first_holding)) if off is not None):
                seen.setdefault(name, off)
        return fast.end_offset, f"{fast.stop.kind}: {fast.stop.detail}"
    walk = cl.walk(start=start, check_crc=False, read_body=False, use_mmap=use_mmap)
    last = None
    for rec in walk:
        last = rec
        if seen is not None and isinstance(rec, Message):
            if rec.magic_name == "v2":
                seen.setdefault("v2", rec.offset)
            if _CRC32_BYTES in rec.properties_raw:
                seen.setdefault("crc32", rec.offset)
    if isinstance(last, Blank) and walk.end_offset == cl.segments[-1].end:
        return last.offset, f"{END_OF_DATA}: {STOP_LAST_BLANK}"
    return walk.end_offset, f"{walk.stop.kind}: {walk.stop.detail}" if walk.stop else ""


def refuse_non_segment(cl: CommitLog, use_mmap: bool = True) -> None:
    """A single file without a 20-digit name is a segment only if a record starts at its first byte
    (as ``scan`` decides); anything else (a text file, an image) is a ``FormatError``, not a store."""
    if len(cl.segments) != 1 or not any(p.kind == "segment_name" for p in cl.problems):
        return
    seg = cl.segments[0]
    rec = cl.decode_at(seg.start, use_mmap=use_mmap, check_crc=False, read_body=False)
    if not isinstance(rec, Invalid) or rec.kind == END_OF_DATA:  # a record or a BLANK; empty or zero bytes
        return
    raise FormatError(f"not a RocketMQ store, commitlog directory or segment: the name is not a 20-digit offset "
                      f"and no record starts at byte 0 ({rec.kind}: {rec.detail})", seg.path, 0)


def store_info(path: str | os.PathLike, use_mmap: bool = True) -> dict:
    """A JSON-ready summary of a store; problems reading a part are reported, not raised (but a path that
    holds no commitlog at all is a :class:`FormatError`, unless it is a DLedger store root)."""
    try:
        store = Store.open(path)
    except StoreError:
        if not _dledger_root(path):
            raise
        return _root_parts({"store": str(path), "missing": ["commitlog"], "commitlog": None}, Path(path), {})
    cl = store.commitlog
    refuse_non_segment(cl, use_mmap)
    seen: dict = {}
    end, why = data_end(cl, use_mmap, seen)
    doc: dict = {
        "store": str(store.root or cl.location),
        "missing": store.missing,
        "commitlog": {
            "directory": str(cl.location),
            "file_size": cl.file_size,
            "segments": [{"file": s.name, "start": s.start, "size": s.size} for s in cl.segments],
            "min_offset": cl.min_offset,
            "max_offset": end,
            "end_reason": why,
            "bytes_on_disk": sum(s.size for s in cl.segments),
            "bytes_in_use": end - cl.min_offset,
            "problems": [f.to_dict() for f in cl.problems],
        },
    }
    if len(getattr(cl, "paths", ())) > 1:  # multi-path: which folder holds which segment
        doc["commitlog"]["folders"] = [{"directory": str(d), "segments": [s.name for s in cl.segments
                                                                          if s.path.parent == d]} for d in cl.paths]
    if store.root is None:
        return doc
    cq_problems: list = []
    doc = _root_parts(doc, store.root, seen, cq_problems)
    doc["next_start"] = _next_start(store, end, doc, cq_problems, use_mmap)
    return doc


def _next_start(store: Store, end: int, doc: dict, cq_problems: list, use_mmap: bool) -> dict:
    """The broker's next start without its recovery walk (``verify`` has the walked figures)."""
    from rmqdump.broker.recovery.cost import next_start, quick_prediction
    from rmqdump.fast.recovery_walk import recovery_twins

    max_cq = max((q["max_physic_offset"] for q in doc["consume_queues"]["queues"]), default=-1)
    try:
        pred = quick_prediction(store, end, max_cq, cq_problems, recovery_twins(store.commitlog, use_mmap).get("walker"))
    except RmqdumpError as e:
        return {"estimated": False, "why_not": str(e)}
    if pred is None:
        return {"estimated": False, "why_not": "not estimated for DLedger stores (DLedger's own recovery)"}
    return next_start(pred, store, exact=False)


def _dledger_root(path: str | os.PathLike) -> bool:
    """A directory with a ``dledger-<id>/`` folder (DLedger mode keeps no ``commitlog/``)."""
    try:
        with os.scandir(path) as it:
            return any(e.name.startswith("dledger-") and e.is_dir(follow_symlinks=False) for e in it)
    except OSError:
        return False


def _root_parts(doc: dict, root: Path, seen: dict, cq_problems: list | None = None) -> dict:
    """The parts under a store root; the queue folders' load problems are added to ``cq_problems``."""
    doc["consume_queues"] = _queues(root, [] if cq_problems is None else cq_problems)
    doc["index_files"] = _index_files(root)
    doc["checkpoint"] = _checkpoint(root)
    doc["abort"] = (root / "abort").exists()
    doc["lock"] = _lock(root)
    doc["config"] = _config(root)
    doc["controller"] = _controller(root)
    doc["inventory"], doc["features"] = _inventory(root, doc, seen)
    return doc


def _inventory(root: Path, doc: dict, seen: dict) -> tuple[dict, list[dict]]:
    """Every entry under the root named (read / present, not read / unknown) and the broker features shown."""
    from rmqdump.store.consumequeue import batch_cq_topics

    inv = take_inventory(root)
    v2 = f"V2 record at commitlog offset {seen['v2']}" if "v2" in seen else None
    if v2 is None:
        long_topics = [q["topic"] for q in doc["consume_queues"]["queues"]
                       if len(q["topic"].encode("utf-16-le", "surrogatepass")) // 2 > 127]
        if long_topics:
            v2 = f"consume queue of a topic over 127 UTF-16 units ({len(long_topics[0])} chars)"
    crc = f"__CRC32# in the record at commitlog offset {seen['crc32']}" if "crc32" in seen else None
    return inv.to_dict(), detect_features(inv, batch_topics=batch_cq_topics(root), v2=v2, crc32=crc)


def _queues(root: Path, problems: list) -> dict:
    """The consume queues' summary; what their folders hold that the broker's load meets goes to ``problems``
    (:class:`~rmqdump.broker.recovery.queues.CqProblem`, as verify's recovery prediction finds them)."""
    from rmqdump.broker.recovery.queues import CqProblem, batch_cq_problems, queue_file_problems
    from rmqdump.store.consumequeue import ConsumeQueue, discover_queues, infer_store_cq_file_size

    out: dict = {"queues": [], "errors": []}
    try:
        size = infer_store_cq_file_size(root)
        out["file_size"] = size
        for ref in discover_queues(root):
            label = f"consumequeue/{ref.topic}/{ref.queue_id}"
            try:
                q = ConsumeQueue(ref.path, ref.topic, ref.queue_id, size, strict=False)
                problems += queue_file_problems(label, q)
                out["queues"].append({"topic": ref.topic, "queue_id": ref.queue_id, "files": len(q.files),
                                      "min_offset": q.min_offset(), "max_offset": q.max_offset,
                                      "max_physic_offset": q.max_physic_offset, "problems": q.problems})
            except RmqdumpError as e:
                problems.append(CqProblem(label, e.message, True))
                out["errors"].append(str(e))
    except RmqdumpError as e:
        out["errors"].append(str(e))
    problems += batch_cq_problems(root)
    out["queues"].sort(key=lambda q: (q["topic"], q["queue_id"]))
    return out


def _index_files(root: Path) -> list[dict]:
    from rmqdump.store.indexfile import IndexFile, list_index_files

    out = []
    for p in list_index_files(root):
        try:
            with IndexFile(p, strict=False) as f:
                h = f.header
                out.append({"file": p.name, "size": f.size, "hash_slots": f.geometry.hash_slot_num,
                            "max_entries": f.geometry.index_num, "begin_timestamp": h.begin_timestamp,
                            "end_timestamp": h.end_timestamp, "begin_phy_offset": h.begin_phy_offset,
                            "end_phy_offset": h.end_phy_offset, "hash_slot_count": h.hash_slot_count,
                            "index_count": h.index_count, "entries": h.entry_count})
        except RmqdumpError as e:
            out.append({"file": p.name, "error": str(e)})
    return out


def _checkpoint(root: Path) -> dict | None:
    p = root / "checkpoint"
    if not p.exists():
        return None
    try:
        cp = read_checkpoint(p)
    except RmqdumpError as e:
        return {"error": str(e)}
    return {"physic_msg_timestamp": cp.physic_msg_timestamp, "physic_msg_time": _iso(cp.physic_msg_timestamp),
            "logics_msg_timestamp": cp.logics_msg_timestamp, "logics_msg_time": _iso(cp.logics_msg_timestamp),
            "index_msg_timestamp": cp.index_msg_timestamp, "index_msg_time": _iso(cp.index_msg_timestamp),
            "master_flushed_offset": cp.master_flushed_offset, "confirm_phy_offset": cp.confirm_phy_offset}


def _iso(ms: int) -> str | None:
    return ms_to_iso(ms) if ms > 0 else None


def _lock(root: Path) -> dict:
    from rmqdump.broker.lock import probe_lock

    p = root / "lock"
    if not p.exists():
        return {"present": False, "held_by_pid": None}
    try:
        return {"present": True, "held_by_pid": probe_lock(root)}
    except RmqdumpError as e:
        return {"present": True, "held_by_pid": None, "error": str(e)}


def _config(root: Path) -> dict:
    from rmqdump.store.config import load_consumer_offsets, load_delay_offsets, load_topics

    out: dict = {}
    for name, loader, count in (
        ("topics", load_topics, len),
        ("consumer_offsets", load_consumer_offsets, lambda v: len(v.rows())),
        ("delay_offsets", load_delay_offsets, len),
    ):
        try:
            loaded = loader(root)
            out[name] = {"file": str(loaded.path) if loaded.path else None,
                         "entries": count(loaded.data) if loaded.data is not None else None,
                         "from_backup": loaded.used_backup,
                         "main_error": str(loaded.main_error) if loaded.main_error else None}
        except RmqdumpError as e:
            out[name] = {"error": str(e)}
    return out


def _controller(root: Path) -> dict | None:
    """Controller-mode metadata: the epochs the broker would load and ``brokerIdentity`` (None: neither)."""
    from rmqdump.store.epoch import read_broker_identity, read_epochs

    ep, ident = read_epochs(root), read_broker_identity(root)
    if ep is None and ident is None:
        return None
    out: dict = {"broker_identity": ident, "epochs": None}
    if ep is not None:
        out["epochs"] = [{"epoch": e.epoch, "start_offset": e.start_offset, "end_offset": e.end_offset}
                         for e in ep.epochs]
        out["epoch_file"] = ep.used.path.name if ep.used is not None else None
        out["epoch_load_error"] = ep.load_error
        out["epoch_file_problems"] = {f.path.name: f.fatal or f.io_error for f in (ep.main, ep.bak)
                                      if f is not None and not f.ok}
    return out
