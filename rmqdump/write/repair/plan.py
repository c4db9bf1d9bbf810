"""The repair plan: :func:`plan_repair` reads the store and puts the changes of every concern together."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import (
    CHECKPOINT,
    STORE_CHECKPOINT_FILE,
    STORE_COMMITLOG_DIR,
    STORE_INDEX_DIR,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.disk.guard import refuse_inside
from rmqdump.errors import FormatError, RmqdumpError, StoreError
from rmqdump.fast.recovery_walk import recovery_twins
from rmqdump.store.consumequeue import batch_cq_topics
from rmqdump.write.repair.config import config_changes
from rmqdump.write.repair.files import _blank, _nonzero_pieces, _open, _pread_all, _size
from rmqdump.write.repair.index import _full_index_end_ts, _index_changes, _rebuild_index_changes, build_index_files
from rmqdump.write.repair.model import SALVAGE_CHOICES, Change, RepairPlan
from rmqdump.write.repair.queues import _cq_changes, _rebuild_cq_changes, rebuild_consume_queues
from rmqdump.write.repair.salvage import (
    _entries_into,
    _filler_outcome,
    _recrc,
    _regrow_plan,
    _salvage_choices,
    _span_pieces,
    _store_ts_before,
    _tombstone_properties,
    analyse_tail,
    filler_record,
    tombstone_record,
)
from rmqdump.write.writer import ensure_store_dir


def _compaction_leftovers(root: Path, plan: RepairPlan) -> None:
    """Delete the ``<offset>.delete`` files compaction passes left (RocketMQ 5.x's load fails on their names; the
    pass meant to destroy them once their replacement was in place); the backup keeps their bytes."""
    from rmqdump.store.compaction import DELETE_SUFFIX, left_for_deletion, stray_files

    for p in stray_files(root):
        if not left_for_deletion(p):
            continue
        rel = p.relative_to(root).as_posix()
        replaced = p.with_name(p.name[:-len(DELETE_SUFFIX)]).exists()
        why = ("a compaction pass's leftover (" + ("its replacement is in place" if replaced else
               "no file of its offset is in place: the pass failed before moving one in") +
               "); RocketMQ 5.x refuses to load a store holding it")
        plan.changes.append(Change("delete", rel, group="compaction", why=why))
        plan.step("compaction", "delete", file=rel, replaced=replaced, detail=why)
    from rmqdump.broker.compaction_load import compaction_load

    for rel, why in compaction_load(root, skip_leftovers=True).unloaded:
        plan.warnings.append(f"{rel}: the broker leaves this compaction queue unloaded ({why}); repair leaves it "
                             "as it is")


def plan_repair(store_path: str | os.PathLike, *, salvage: str | None = None, rebuild_cq: bool = False,
                rebuild_index: bool = False, use_mmap: bool = True, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS,
                name_clock=None, cq_file_size: int | None = None,
                commitlog_file_size: int | None = None, restore_config: bool = False) -> RepairPlan:
    """The repair plan for a store (reads only; staged index files go to a temp dir). ``restore_config``: also
    restore unusable ``config/*.json`` from their ``.bak`` (:mod:`rmqdump.write.repair.config`). ``cq_file_size``: the
    broker's mappedFileSizeConsumeQueue, needed only when no ConsumeQueue file of the store tells it;
    ``commitlog_file_size``: the broker's mappedFileSizeCommitLog, needed only when the store's only
    commitlog file was cut short (the file is restored to that length)."""
    from rmqdump.broker.recovery import (
        MODE_ABNORMAL,
        MODE_EMPTY,
        MODE_NORMAL,
        MODE_REFUSES,
        VERSION_49,
        consume_queue_states,
        cq_truncation,
        predict_recovery_auto,
    )
    from rmqdump.broker.recovery.queues import STRAY_MESSAGE, SUBFOLDER_MESSAGE
    from rmqdump.codec.msgid import format_host
    from rmqdump.store.consumequeue import check_not_rocksdb, infer_store_cq_file_size
    from rmqdump.store.indexfile import IndexFile, infer_geometry, list_index_files
    from rmqdump.store.root import Store
    from rmqdump.write.appender import nonzero_span, read_abort, stale_after_end, store_geometry

    if salvage is not None and salvage not in SALVAGE_CHOICES:
        raise RmqdumpError(f"unknown salvage choice {salvage!r} (choose {', '.join(SALVAGE_CHOICES)})")
    root = Path(store_path)
    from rmqdump.store.dledger.files import refuse_dledger

    refuse_dledger(root, "repair")
    store = Store.open(root)
    if store.root is None:
        raise StoreError("repair needs a store root (with commitlog/, consumequeue/, index/ ...)", root)
    root = store.root
    check_not_rocksdb(root, "repair")
    cl = store.commitlog
    plan = RepairPlan(root, salvage=salvage)
    abort = read_abort(root)
    plan.abort_present = abort is not None
    config_changes(root, plan, restore_config)
    states, cq_problems = consume_queue_states(store)
    # a zero-length last segment (a crash between creating and extending it) holds nothing and a compaction
    # pass's ".delete" leftover was to be destroyed: both are deleted (_compaction_leftovers)
    pred, model = predict_recovery_auto(store, queue_states=states, use_mmap=use_mmap, repairable_ok=True,
                                        **recovery_twins(cl, use_mmap))
    plan.prediction = pred
    if pred.version != VERSION_49:
        plan.warnings.append(f"recovery modelled as broker {pred.version}.x: {model}")
    plan.mode, plan.reason = pred.mode, pred.reason
    plan.warnings += cq_problems
    refusing = [p for p in cq_problems if p.refuses(pred.version)]
    if refusing and pred.mode != MODE_REFUSES:  # the prediction leaves them out, so that they stay repairable
        plan.reason += (f"; today the broker's load() fails on {refusing[0].file} ({refusing[0].message})"
                        + (f" and {len(refusing) - 1} more file(s)" if len(refusing) > 1 else ""))
    strays = [p for p in cq_problems if p.message in (STRAY_MESSAGE, SUBFOLDER_MESSAGE) and p.refuses(pred.version)]
    if strays:  # not a file RocketMQ leaves: the user's to move (repair fixes files of the wrong size)
        plan.blocked = (f"{strays[0].file}: not a mapped file (a folder, or a name that is no offset): the "
                        "broker's load fails on it and the broker does not start; move it out of the store (repair "
                        "removes only files RocketMQ itself leaves behind)"
                        + (f"; {len(strays) - 1} more such file(s)" if len(strays) > 1 else ""))
        return plan
    if pred.start_failures and plan.blocked is None:  # files around the store: the broker does not start
        f = pred.start_failures[0]
        plan.blocked = (f"{f.file}: {f.reason}: the broker does not start whatever else is repaired; rmqdump does not "
                        "repair this file (restore it from another replica, or move a file RocketMQ did not write "
                        "out of the store)" + (f"; {len(pred.start_failures) - 1} more such file(s)"
                                              if len(pred.start_failures) > 1 else ""))
        return plan
    regrow = None  # (segment, its restored length): a commitlog file cut short where recovery ends
    if pred.mode == MODE_REFUSES and pred.walk is not None and cl.segments:
        regrow, why_not = _regrow_plan(store, pred, commitlog_file_size, pred.cut_short)
        if why_not:
            plan.blocked = why_not
            return plan
        if regrow is not None:
            plan.mode = MODE_ABNORMAL if store.abort_present else MODE_NORMAL
            plan.reason = "; ".join(pred.load_errors)
    if pred.mode in (MODE_REFUSES, MODE_EMPTY) and regrow is None:
        plan.blocked = pred.reason
        return plan
    cq_file_size = cq_file_size if cq_file_size is not None else infer_store_cq_file_size(root)
    cq_size_known = cq_file_size is not None
    geo = store_geometry(root, cq_file_size=cq_file_size)
    X = pred.max_offset
    plan.broker_end = X

    # -- commitlog -------------------------------------------------------------------------------------
    tail = analyse_tail(cl, X, use_mmap)
    records_after = [t for t in tail if t.kind == "record"]
    plan.broker_would_lose = len(records_after)
    walked_before = pred.walk.records if pred.walk else 0
    host = "127.0.0.1:10911"
    last_ts = pred.walk.last_store_timestamp if pred.walk else 0
    if pred.walk and pred.walk.last_record_offset is not None:
        m = cl.decode_at(pred.walk.last_record_offset, check_crc=False, read_body=False)
        if hasattr(m, "store_addr"):
            host = format_host(m.store_addr, m.store_port)
    fillers: list[tuple[int, int, str]] = []
    end = X
    kept_after = 0
    if records_after:
        plan.salvage_needed = True
        plan.choices = _salvage_choices(cl, tail, X)
        chosen = salvage
        if chosen is None and abort is not None and abort.by_append:
            # rmqdump's appender held back the first bytes of its unfinished batch: what lies after the end
            # was never acknowledged, so cutting it off loses nothing anyone was told is stored
            chosen = plan.salvage = "truncate"
            who = abort.content.decode(errors="replace").strip()
            plan.warnings.append(f"abort was left by an interrupted rmqdump run ({who}): the {len(records_after)} "
                                 "records after the end were never acknowledged; truncating them (--salvage filler "
                                 "keeps them)")
        if chosen is None:
            plan.blocked = (f"{len(records_after)} intact records lie after damage at {X}: choose --salvage "
                            "truncate (lose them, as the broker would), filler (keep them; damaged spans become "
                            "filler records) or recrc (also keep records whose only fault is the body CRC)")
            chosen = "truncate"  # show the truncate outcome in the plan
        if chosen in ("filler", "recrc"):
            end, fillers, kept_after = _filler_outcome(cl, tail, X)
    plan.end = end
    plan.records_kept = walked_before + kept_after
    plan.records_lost = len(records_after) - kept_after
    plan.step("commitlog", "end", offset=end, broker_end=X,
              detail=(f"recovery stops at {X}: {pred.walk.stop.kind}: {pred.walk.stop.detail}"
                      if pred.walk and pred.walk.stop else ""))
    prev_ts = last_ts
    neutralised: list[tuple[int, int]] = []
    pointing = _entries_into(states, [(a, b) for a, b, _ in fillers])
    tombstoned: set[int] = set()
    filler_offsets: set[int] = set()
    recrced: set[int] = set()  # damaged spans kept as records by a CRC rewrite (not neutralised)
    for start, stop, kind in fillers:
        seg = cl.segment_for(start)
        rel = f"{STORE_COMMITLOG_DIR}/{seg.name}"
        ts = _store_ts_before(tail, start) or prev_ts
        fixed = _recrc(cl, start, stop) if plan.salvage == "recrc" else None
        if fixed is not None:
            pos, crc_bytes, what = fixed
            plan.changes.append(Change("write", rel, offset=pos - seg.start, length=4, data=crc_bytes,
                                       group="commitlog", why=what))
            plan.step("commitlog", "recrc", offset=start, length=stop - start, kind=kind, detail=what)
            plan.records_kept += 1  # the record stays (its CRC rewritten): recovery and scan count it
            recrced.add(start)
            continue
        neutralised.append((start, stop))
        pieces = _span_pieces(start, stop, pointing.get((start, stop), []), stop == seg.end)
        if pieces is None:
            pieces = [("blank" if stop == seg.end else "filler", start, stop, None)]
        for what_kind, a, b, e in pieces:
            if what_kind == "tombstone":
                (_o, _s, topic, qid, qoff), lmq = e
                props = _tombstone_properties(cl, a, b - a, topic, lmq)
                try:
                    data = tombstone_record(a, b - a, topic, qid, qoff, ts, host, f"({kind})", props)
                except FormatError:  # the record is too small for its topic and properties: a plain filler
                    data = filler_record(a, b - a, ts, host, f"({kind})")
                    what = f"ROLLBACK filler record over {b - a} damaged bytes ({kind})"
                    filler_offsets.add(a)
                    plan.records_written += 1
                    plan.changes.append(Change("write", rel, offset=a - seg.start, length=len(data), data=data,
                                               group="commitlog", why=what))
                    plan.step("commitlog", "neutralise", offset=a, length=b - a, kind=kind, detail=what)
                    continue
                what = f"tombstone for {topic}/{qid} queue offset {qoff} over {b - a} damaged bytes ({kind})"
                tombstoned.add(a)
                plan.records_written += 1
            elif what_kind == "blank":
                data = _blank(b - a)
                what = f"end-of-file BLANK over {b - a} damaged bytes ({kind})"
            else:
                data = filler_record(a, b - a, ts, host, f"({kind})")
                what = f"ROLLBACK filler record over {b - a} damaged bytes ({kind})"
                filler_offsets.add(a)
                plan.records_written += 1
            plan.changes.append(Change("write", rel, offset=a - seg.start, length=len(data), data=data,
                                       group="commitlog", why=what))
            plan.step("commitlog", "neutralise", offset=a, length=b - a, kind=kind, detail=what)
    seg = cl.segment_for(end)
    if regrow is not None:
        seg, size = regrow
        rel = f"{STORE_COMMITLOG_DIR}/{seg.name}"
        fd = _open(seg.path)
        try:
            final = bytearray(_pread_all(fd, end - seg.start, 0))
        finally:
            os.close(fd)
        final.extend(bytes(size - len(final)))
        why = (f"{seg.size} bytes: cut short; restored to the broker's file size {size}, holding its records "
               f"up to {end}")
        plan.changes += [Change("delete", rel, group="commitlog", why=why),
                         Change("create", rel, size=size, pieces=_nonzero_pieces(final), group="commitlog",
                                why=why)]
        plan.step("commitlog", "regrow", file=seg.name, size=size, detail=why)
        seg = None
    if seg is not None:
        span = stale_after_end(seg.path, end - seg.start, seg.size)
        if span is not None:
            a, b = span
            rel = f"{STORE_COMMITLOG_DIR}/{seg.name}"
            plan.changes.append(Change("write", rel, offset=a, length=b - a, group="commitlog",
                                       why=f"zero the bytes after the end {end}"))
            plan.step("commitlog", "truncate", offset=end, file=seg.name, position=end - seg.start,
                      zero_from=seg.start + a, zero_bytes=b - a)
    for s in cl.segments:
        if s.start > end or (s.size == 0 and s is cl.segments[-1]):
            has_data = nonzero_span(s.path, 0, s.size) is not None
            why = ("zero-length last segment: a crash between creating and extending it" if s.size == 0 else
                   "segment after the end" + ("" if has_data else " (all zeros)"))
            plan.changes.append(Change("delete", f"{STORE_COMMITLOG_DIR}/{s.name}", group="commitlog", why=why))
            plan.step("commitlog", "delete", file=s.name, has_data=has_data)
    for (a, _b), entries in pointing.items():
        if a in recrced:
            continue  # the record is kept: its ConsumeQueue entry still points at it
        for off, _sz, topic, qid, qoff in entries:
            if off not in tombstoned:
                plan.warnings.append(f"ConsumeQueue {topic}/{qid} queue offset {qoff} points at neutralised bytes "
                                     f"at {off}: consumers are served the filler record there")

    # -- consume queues ------------------------------------------------------------------------------
    if rebuild_cq:
        plan.step("consumequeue", "rebuild", detail="regenerate every consume queue from the commitlog")
        plan.changes += _rebuild_cq_changes(cl, root, geo.cq_file_size, end, plan, use_mmap, delay_levels_ms)
    else:
        plan.changes += _cq_changes(cl, root, states, geo.cq_file_size, pred, end, plan, use_mmap, delay_levels_ms,
                                    filler_offsets, cq_truncation)
    if not cq_size_known and any(c.op == "create" and c.group == "consumequeue" for c in plan.changes):
        # a file of another size than the broker's mappedFileSizeConsumeQueue makes its load() fail
        plan.blocked = ("no ConsumeQueue file of this store tells the broker's ConsumeQueue file size "
                        "(mappedFileSizeConsumeQueue), and a file of the wrong size stops the broker from "
                        "starting: pass --cq-file-size (the default is 6000000)")

    # -- index -------------------------------------------------------------------------------------------
    files = []
    for p in list_index_files(root):
        if _size(p) == 0:  # a crash between creating and extending it: holds nothing
            plan.changes.append(Change("delete", f"{STORE_INDEX_DIR}/{p.name}", group="index",
                                       why="zero-length index file: a crash between creating and extending it"))
            plan.step("index", "delete", file=p.name, entries=0)
        else:
            files.append(p)
    full_end_ts = 0
    if rebuild_index or files:
        stage = Path(tempfile.mkdtemp(prefix="rmqdump-repair-"))
        plan.stage_dir = stage
        headers = []
        for p in files:
            try:
                with IndexFile(p, geo.index_slots, geo.index_entries, strict=False) as f:
                    headers.append(f.header)
            except RmqdumpError as e:
                plan.warnings.append(f"index/{p.name}: unreadable ({e.message}); it is rebuilt")
                headers.append(None)
        if rebuild_index:
            plan.changes += _rebuild_index_changes(cl, root, files, geo, end, plan, stage, name_clock, use_mmap)
        else:
            plan.changes += _index_changes(cl, root, files, headers, geo, end, plan, stage, name_clock, use_mmap,
                                           infer_geometry, neutralised, _interrupted_by(abort))
        full_end_ts = _full_index_end_ts(root, plan, geo)

    _compaction_leftovers(root, plan)
    if plan.changes:
        from rmqdump.write.repair.timer import timer_warnings

        plan.warnings += timer_warnings(root, end, neutralised)

    # -- checkpoint -----------------------------------------------------------------------------------
    _checkpoint_change(root, cl, end, plan, full_end_ts, use_mmap)
    if abort is not None:
        plan.step("abort", "remove", detail="the repaired store is consistent: the broker runs its normal recovery"
                  + (" (abort was left by an interrupted rmqdump run)" if abort.ours else ""))
    if abort is not None and not abort.ours and pred.walk and abort.mtime_ms > last_ts + 1000 and last_ts:
        plan.warnings.append("abort is newer than the last record: a broker started after the last write — make "
                             "sure it is stopped (rmqdump also checks the lock and open files)")
    if plan.broker_would_lose and plan.salvage == "filler":
        plan.step("outcome", "salvage", detail=f"keeps {kept_after} of the {plan.broker_would_lose} intact records "
                  "the broker's recovery would delete")
    return plan


def _interrupted_by(abort) -> str | None:
    """What the ``abort`` marker of an interrupted rmqdump write says (None: no such marker)."""
    if abort is None or not abort.ours:
        return None
    return abort.content.decode("utf-8", "replace").strip()[:80]


def rebuild_to(store_path: str | os.PathLike, out_dir: str | os.PathLike, *, cq: bool, index: bool,
               use_mmap: bool = True) -> dict:
    """Regenerate consume queues and/or index files from the commitlog into ``out_dir`` (store untouched)."""
    from rmqdump.broker.recovery import predict_recovery_auto
    from rmqdump.store.root import Store
    from rmqdump.write.appender import store_geometry

    store = Store.open(store_path)
    if store.root is None:
        raise StoreError("rebuild needs a store root", store_path)
    out = refuse_inside(out_dir, [store.root], "--to")
    if out.exists() and any(out.iterdir()):
        raise StoreError("--to directory is not empty", out)
    out.mkdir(parents=True, exist_ok=True)
    geo = store_geometry(store.root)
    pred, _ = predict_recovery_auto(store, use_mmap=use_mmap, **recovery_twins(store.commitlog, use_mmap))
    end = pred.max_offset
    doc: dict = {"store": str(store.root), "to": str(out), "end": end, "warnings": []}
    if cq:
        doc["consumequeue_files"] = len(rebuild_consume_queues(store.commitlog, out, geo.cq_file_size, end=end,
                                                               use_mmap=use_mmap, warnings=doc["warnings"],
                                                               batch_topics=batch_cq_topics(store.root),
                                                               expired_from=store.root))
    if index:
        idir, _ = ensure_store_dir(out, STORE_INDEX_DIR)
        from rmqdump.store.indexfile import list_index_files

        names = [p.name for p in list_index_files(store.root)]
        made = build_index_files(store.commitlog, idir, geo.index_slots, geo.index_entries,
                                 start=store.commitlog.min_offset, end=end, first_name=names[0] if names else None,
                                 taken_names=set(names), use_mmap=use_mmap)
        doc["index_files"] = [p.name for p in made]
    return doc


def _checkpoint_change(root: Path, cl, end: int, plan: RepairPlan, full_index_ts: int, use_mmap: bool) -> None:
    """Lower checkpoint timestamps that point past the repaired data (never raise them)."""
    from rmqdump.codec.record import Message
    from rmqdump.store.checkpoint import Checkpoint, read_checkpoint

    path = root / STORE_CHECKPOINT_FILE
    try:
        old = read_checkpoint(path)
    except StoreError:
        return
    except FormatError:
        return  # shorter than its fields (a kill between creating and writing it): the broker reads zeros
    last_ts = last_cq_ts = 0
    pred = plan.prediction
    start = pred.start_offset if pred is not None and pred.start_offset is not None else cl.min_offset
    for rec in cl.walk(start=start, end=end, check_crc=False, read_body=False, use_mmap=use_mmap):
        if isinstance(rec, Message):
            last_ts = max(last_ts, rec.store_timestamp)
            if rec.sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
                last_cq_ts = max(last_cq_ts, rec.store_timestamp)
    new = Checkpoint(min(old.physic_msg_timestamp, last_ts) if last_ts else old.physic_msg_timestamp,
                     min(old.logics_msg_timestamp, last_cq_ts) if last_cq_ts else old.logics_msg_timestamp,
                     min(old.index_msg_timestamp, full_index_ts), old.master_flushed_offset, old.confirm_phy_offset)
    if new.fields() == old.fields():
        return
    data = CHECKPOINT.pack(*new.fields())[:old.file_size] if old.file_size < CHECKPOINT.size else \
        CHECKPOINT.pack(*new.fields())
    plan.changes.append(Change("write", STORE_CHECKPOINT_FILE, offset=0, length=len(data), data=data,
                               group="checkpoint", why="timestamps past the repaired data"))
    plan.step("checkpoint", "fix", before=old.as_dict(iso=False), after=new.as_dict(iso=False))
