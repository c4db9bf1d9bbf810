"""Compaction-store checks (5.x ``compaction/``, :mod:`rmqdump.store.compaction`): the position checkpoint,
log/sparse-CQ file pairing (``TopicPartitionLog.sanityCheck``), damage in a log file, sparse-CQ units against
the records they address, and the compacted records against the topic's commitlog records (reached through
its consume queue): same bytes where both hold a queue offset, and no record missing that
``CompactionLog.shouldRetainMsg`` keeps (the latest body of each KEYS string up to the checkpoint's offset,
everything after it)."""

from __future__ import annotations

from rmqdump.broker.compaction_load import CompactionLoad, compaction_load
from rmqdump.codec.layout import PROPERTY_KEYS, STORE_ABORT_FILE
from rmqdump.codec.record import Message
from rmqdump.errors import RmqdumpError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.compaction import POSITION_FILE, CompactionQueue, Positions, open_compaction
from rmqdump.store.consumequeue import ConsumeQueue

_SAME = ("size", "body_crc", "body_length", "queue_id", "queue_offset", "sys_flag", "born_timestamp",
         "store_timestamp", "properties_raw", "topic_raw")


def _rel(root, p) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def _position_findings(root, pos: Positions) -> list[Finding]:
    out = []
    for p, why in pos.problems:
        rescued = pos.used is not None
        out.append(Finding(WARNING if rescued else ERROR, "compaction_position_bad", _rel(root, p), None,
                           f"{why}; " + (f"CompactionPositionMgr falls back to {pos.used.name}" if rescued else
                                         "no copy loads: every queue restarts compaction from offset -1")))
    return out


def _commitlog_records(root, q: CompactionQueue, cache) -> dict[int, Message]:
    """The topic queue's commitlog records by queue offset, through its consume queue (empty without one)."""
    try:
        cq = ConsumeQueue.open(root, q.topic, q.queue_id, strict=False)
    except RmqdumpError:
        return {}
    out = {}
    for e in cq.iter_entries():
        if e.is_valid:
            rec = cache.decode(e.commit_log_offset, check_crc=False)
            if isinstance(rec, Message) and rec.topic == q.topic and rec.queue_offset == e.queue_offset:
                out[e.queue_offset] = rec
    return out


def _queue_findings(root, q: CompactionQueue, pos: Positions, cache, cap: int, load: CompactionLoad) -> list[Finding]:
    out: list[Finding] = []
    where = f"{q.topic}/{q.queue_id}"
    logs, cqs = {p.name for p in q.log_files}, {p.name for p in q.cq_files}
    refused = {rel for rel, _ in load.refusals}
    unloaded = dict(load.unloaded)
    for name in sorted(logs ^ cqs):
        has = "log" if name in logs else "sparse consume queue"
        rel = _rel(root, (q.log_dir if name in logs else q.cq_dir) / name)
        if rel in load.deleted:
            continue  # the load cuts the log after the last unit: compaction_record_unindexed says what it loses
        why = next((w for d, w in unloaded.items() if rel.startswith(d + "/")), None)
        if rel in refused:
            sev, then = ERROR, ("CompactionLog's sanityCheck throws and the store's load() fails: the broker does "
                                "not start")
        elif why is not None:
            sev, then = WARNING, f"the broker does not load this queue ({why})"
        else:
            sev, then = INFO, "the broker's load ignores it"
        out.append(Finding(sev, "compaction_files_mismatch", rel, None,
                           f"{where}: a {has} file {name} without its partner: {then}"))
    recs: dict[int, tuple[str, Message]] = {}
    writing = None  # the first queue offset in the last (writing) log file: a pass compacts the files before it
    for n, p in enumerate(q.log_files):
        got, stop = q.walk_file(p)
        if n == len(q.log_files) - 1 and n and got:
            writing = min(r.queue_offset for r in got)
        for r in got:
            recs[r.offset] = (_rel(root, p), r)
        if stop is not None:
            out.append(Finding(ERROR, "compaction_log_damaged", _rel(root, p), stop.offset,
                               f"{where}: {stop.kind}: {stop.detail}; records after it are not read"))
    by_qoff = {r.queue_offset: (f, r) for f, r in recs.values()}
    for f, r in recs.values():
        if r.topic != q.topic or r.queue_id != q.queue_id or r.physical_offset != r.offset:
            out.append(Finding(ERROR, "compaction_record_misplaced", f, r.offset,
                               f"{where}: record of {r.topic}/{r.queue_id} with PHYSICALOFFSET {r.physical_offset} "
                               f"at log offset {r.offset}"))
    indexed = set()
    bad = 0
    for u in q.units():
        e = u.entry
        if u.is_end:
            continue
        hit = recs.get(e.commit_log_offset)
        r = hit[1] if hit else None
        if r is None or r.size != e.size or r.queue_offset != e.msg_base_offset:
            bad += 1
            if bad <= cap:
                what = ("no record starts there" if r is None else
                        f"the record there has size {r.size}, queue offset {r.queue_offset}")
                out.append(Finding(ERROR, "compaction_cq_dangling", _rel(root, u.file), u.index * 46,
                                   f"{where}: unit for queue offset {e.msg_base_offset} points at log offset "
                                   f"{e.commit_log_offset} size {e.size}: {what}"))
        else:
            indexed.add(r.offset)
    unindexed = [r for _, r in recs.values() if r.offset not in indexed]
    if unindexed:
        r = unindexed[0]
        out.append(Finding(WARNING, "compaction_record_unindexed", _rel(root, q.log_file_for(r.offset)), r.offset,
                           f"{where}: {len(unindexed)} record(s) without a sparse consume queue unit (first: "
                           f"queue offset {r.queue_offset}): consumers never read them, the next load truncates "
                           "the log after the last unit"))
    if cache is None:
        return out
    cl = _commitlog_records(root, q, cache)
    mism = 0
    for qoff, (f, r) in sorted(by_qoff.items()):
        c = cl.get(qoff)
        if c is not None:
            diff = [k for k in _SAME if getattr(c, k) != getattr(r, k)]
            if diff:
                mism += 1
                if mism <= cap:
                    out.append(Finding(ERROR, "compaction_record_mismatch", f, r.offset,
                                       f"{where}: queue offset {qoff} differs from the commitlog record at "
                                       f"{c.offset} in {', '.join(diff)}"))
    if not cl or not by_qoff:
        return out
    last = pos.offset(q.topic, q.queue_id)
    low, high = min(by_qoff), max(by_qoff)
    # compactAndReplace swaps the compacted files in, then persists the position: after a crash (abort left) the
    # log may be compacted past it, up to the record before the writing file's first (all of it when that file is
    # empty). A record is required only if every horizon in between keeps it (with no crash: the position).
    horizon = last
    if (root / STORE_ABORT_FILE).exists() and len(q.log_files) > 1:
        horizon = max(last, high if writing is None else writing - 1)
    latest: dict[str, int] = {}
    for qoff, c in sorted(cl.items()):
        k = c.properties.get(PROPERTY_KEYS)
        if k and k.strip() and qoff <= horizon:
            latest[k] = qoff
    missing = lost_before = lag = 0
    first = None
    for qoff, c in sorted(cl.items()):
        k = c.properties.get(PROPERTY_KEYS)
        if not (k and k.strip()) or qoff in by_qoff:
            continue
        if qoff > high:
            lag += 1
            continue
        kept = qoff > horizon or (latest.get(k) == qoff and c.body_length > 0)
        if not kept:
            continue
        if qoff < low:
            lost_before += 1
        else:
            missing += 1
            first = first if first is not None else c
    if missing:
        out.append(Finding(ERROR, "compaction_record_missing", _rel(root, q.log_dir), None,
                           f"{where}: {missing} commitlog record(s) compaction keeps are not in the compaction log "
                           f"(first: queue offset {first.queue_offset}, commitlog offset {first.offset}, KEYS "
                           f"{first.properties.get(PROPERTY_KEYS)!r}; last compacted offset {last}): consumers of "
                           "the compacted topic read an older value of those keys or none (RocketMQ 5.3.3 loses them "
                           "when a compaction pass races the dispatch; its log then shows the pass failing)"))
    if lost_before:
        out.append(Finding(WARNING, "compaction_key_missing", _rel(root, q.log_dir), None,
                           f"{where}: {lost_before} key(s) whose latest commitlog record lies before the compaction "
                           f"log's first queue offset {low} are not in it (lost, or the topic became a compaction "
                           "topic later)"))
    if lag:
        out.append(Finding(INFO, "compaction_lag", _rel(root, q.log_dir), None,
                           f"{where}: {lag} keyed commitlog record(s) after the compaction log's last queue offset "
                           f"{high} (not dispatched to it yet)"))
    return out


def check_compaction(store, cache, max_per_kind: int = 20) -> list[Finding]:
    """Findings on ``STORE/compaction`` (none without it); ``cache``: a RecordCache over the commitlog."""
    comp = open_compaction(store.root)
    if comp is None:
        return []
    root = store.root
    out = _position_findings(root, comp.positions)
    load = compaction_load(root)
    for rel, why in load.unloaded:
        out.append(Finding(WARNING, "compaction_queue_unloaded", rel, None,
                           f"the broker leaves this queue's compaction log unloaded ({why}): consumers of the "
                           "compacted topic are not served from it"))
    for q in comp.queues.values():
        try:
            out += _queue_findings(root, q, comp.positions, cache, max_per_kind, load)
        except (RmqdumpError, OSError) as e:
            out.append(Finding(ERROR, "compaction_unreadable", _rel(root, q.log_dir), None,
                               f"{q.topic}/{q.queue_id}: {e}"))
    return out


__all__ = ["POSITION_FILE", "check_compaction"]
