"""Startup recovery of a DLedger store (``enableDLegerCommitLog``), predicted.

RocketMQ's ``DLedgerCommitLog.recover`` hands the data files to DLedger (0.3.1.2,
``DLedgerMmapFileStore.recover``): it starts at the third-from-last data file (an earlier one while that
file's first entry does not match its index unit), walks entry headers — a blank moves to the next file;
a header whose pos is not its offset, whose size is not 48 + body length, whose magic is not 1, whose
index does not follow or whose term goes back, or an entry running past its file, ends the walk — and
truncates the data files at the end of the last sound entry (``processOffset``; later files are deleted).
An index unit that disagrees with its entry does not stop it: the index is rewritten from there. No
record CRC is checked. Then ``committedIndex`` comes from ``dledger-<id>/checkpoint`` (capped at the last
entry; absent: -1) and RocketMQ reads records only up to the end of that entry (``committedPos``). Consume
queues holding offsets at or past ``processOffset`` are truncated there (``truncateDirtyLogicFiles``);
nothing is re-dispatched (4.9.8; 5.3.3 after an abnormal exit re-dispatches every record and truncates the
consume queues at an offset of its own: :func:`_abnormal_53_end`). After an abnormal exit the index files newer than the checkpoint's
index timestamp are deleted, as for other stores.
"""

from __future__ import annotations

from rmqdump.broker.recovery.consequences import (
    DEFAULT_LIST_LIMIT,
    commitlog_truncation,
    dropped_records,
    index_deletions,
)
from rmqdump.broker.recovery.inputs import VERSION_53, read_checkpoint_for_recovery
from rmqdump.broker.recovery.queues import (
    CqProblem,
    QueueState,
    consume_queue_states,
    cq_truncation,
    kept_invalid_units,
    max_phy_offset_of_consume_queue,
)
from rmqdump.broker.recovery.walk import BrokerWalk
from rmqdump.broker.redispatch import redispatch
from rmqdump.codec.dledger import DLEDGER_BODY_OFFSET, EntryHeader
from rmqdump.codec.record import Message
from rmqdump.disk.segment import Segment
from rmqdump.store.dledger.files import read_entry
from rmqdump.store.dledger.log import DLedgerCommitLog, EntryAt, index_mismatch
from rmqdump.store.root import Store

MODE_DLEDGER = "dledger"


def _first_entry(cl: DLedgerCommitLog, i: int) -> EntryHeader | None:
    seg = cl.dledger_segments[i]
    r = seg.open(True)
    try:
        ent = read_entry(r, 0)
    finally:
        r.close()
    return ent if isinstance(ent, EntryHeader) else None


def _first_entry_ok(cl: DLedgerCommitLog, i: int) -> bool:
    """The pre-check of ``recover()``: file ``i``'s first entry is sound and matches its index unit."""
    ent = _first_entry(cl, i)
    return ent is not None and index_mismatch(cl.index_unit(ent.index), EntryAt(cl.dledger_segments[i], 0, ent)) is None


def dledger_start_index(cl: DLedgerCommitLog) -> int:
    """The data file ``recover()`` starts from: the third-from-last, or the nearest earlier one whose first
    entry passes the pre-check (file 0 when none does)."""
    i = max(0, len(cl.dledger_segments) - 3)
    if cl.dledger.files_only:
        return i  # no index to check first entries against
    for j in range(i, -1, -1):
        if _first_entry_ok(cl, j):
            return j
    return 0


def predict_dledger_recovery(store: Store, pred, *, use_mmap: bool = True, list_limit: int = DEFAULT_LIST_LIMIT,
                             queue_states: list[QueueState] | None = None,
                             cq_problems: list[CqProblem] | None = None, list_dropped: bool = True):
    """Fill ``pred`` (a :class:`~rmqdump.broker.recovery.prediction.RecoveryPrediction`) for a DLedger store."""
    cl = store.commitlog
    dl = cl.dledger
    abnormal = store.abort_present
    pred.mode = MODE_DLEDGER
    pred.reason = ("DLedger commitlog: DLedger's own recovery (entry headers against the index, committedIndex "
                   "from its checkpoint); " + ("abort file present" if abnormal else "no abort file"))
    if queue_states is None:
        queue_states, cq_problems = consume_queue_states(store)
    pred.load_errors += [str(p) for p in cq_problems or () if p.fatal]
    max_phy_cq = max_phy_offset_of_consume_queue(queue_states)
    pred.max_phy_offset_of_consume_queue = max_phy_cq
    checkpoint, _ = read_checkpoint_for_recovery(store)
    pred.checkpoint = checkpoint
    segs = cl.dledger_segments
    if not segs:
        pred.notes.append("no DLedger data files")
        return pred
    if segs[0] is not cl.segments[0]:
        pred.notes.append(f"mixed store: the old commitlog files are read up to dividedCommitlogOffset "
                          f"{cl.divided_offset}, where DLedger's data begins; only DLedger's files are recovered")
    start = dledger_start_index(cl)
    index_rewrite: list[str] = []

    def on_entry(e: EntryAt) -> None:
        if not index_rewrite:
            why = index_mismatch(cl.index_unit(e.header.index), e)
            if why is not None:
                index_rewrite.append(f"entry {e.header.index} at {e.offset}: {why}")

    hw = cl.header_walk(start, on_entry)
    process = hw.end
    walk = BrokerWalk(start, segs[start].start, process, records=hw.entries,
                      last_record_offset=hw.last.offset + DLEDGER_BODY_OFFSET if hw.last else None, stop=hw.stop)
    pred.walk = walk
    pred.start_file = segs[start].name
    pred.start_offset = segs[start].start
    if index_rewrite:
        pred.notes.append(f"the index disagrees from {index_rewrite[0]}; DLedger rewrites the index units from "
                          "there")
    last = hw.last.header if hw.last else None
    committed = last.index if dl.files_only and last is not None else dl.committed_index
    if dl.files_only:
        pred.notes.append("only DLedger data files given: no index, checkpoint or abort file; every entry is taken "
                          "as committed")
    begin = _ledger_begin(cl)
    committed_pos = -1
    if dl.files_only and hw.last is not None:
        committed_pos = hw.last.end
    elif last is not None and committed is not None and committed != -1 and committed >= begin:
        committed = min(committed, last.index)
        ent = cl.entry_at_index(committed)
        if ent is not None:
            committed_pos = ent.pos + ent.size
    pred.max_offset = committed_pos if committed_pos >= 0 else cl.divided_offset
    pred.notes.append(f"ledger end index {last.index if last else -1} term {last.term if last else -1}; "
                      f"committedIndex {committed if committed_pos >= 0 else -1} (checkpoint: "
                      f"{dl.committed_index}); RocketMQ reads records up to {pred.max_offset}")
    if committed_pos >= 0 and committed_pos < process:
        pred.notes.append(f"entries after committedIndex ({committed_pos}..{process}) stay on disk but RocketMQ "
                          "reads no record of them until DLedger commits them")
    pred.truncated_file, pred.deleted_commitlog_files = commitlog_truncation(cl, process)
    cq_end = process
    if abnormal and pred.version == VERSION_53:
        cq_end = _abnormal_53_end(cl, segs[-1], use_mmap)
        pred.notes.append(f"5.3.3 abnormal recovery re-dispatches every record and then truncates the consume queues "
                          f"at {cq_end}: the last data file's start plus its records' sizes without their 48-byte "
                          f"entry headers (DLedger's data ends at {process})")
        pred.redispatched = redispatch(cl, queue_states, start_index=cl.segments.index(segs[0]), end_offset=cq_end,
                                       use_mmap=use_mmap)
    pred.cq_truncated = max_phy_cq >= cq_end
    truncations = [cq_truncation(st, cq_end, pred.cq_truncated) for st in queue_states]
    pred.queues = [qt for qt in truncations if qt.count]
    pred.kept_invalid = kept_invalid_units(truncations, pred.redispatched)
    if list_dropped:
        pred.dropped = dropped_records(cl, process, use_mmap=use_mmap, list_limit=list_limit)
    idx, idx_notes = index_deletions(store, checkpoint, abnormal)
    pred.deleted_index_files = idx
    pred.notes += idx_notes
    if idx:
        pred.notes.append("DLedger's recovery re-dispatches nothing: index entries of the deleted index files are "
                          "lost")
    return pred


def _abnormal_53_end(cl: DLedgerCommitLog, last: Segment, use_mmap: bool) -> int:
    """``DLedgerCommitLog.dledgerRecoverAbnormally`` (5.3.3): no data file passes ``isMmapFileMatchedRecover`` (it
    looks for a record magic at byte 4, where an entry keeps its size), the walk reads records with
    ``checkMessageAndReturnSize`` to the first one that fails and counts each record's own size: its
    processOffset is the last file's start plus the sizes of the records read there (short of the entries'
    ends by 48 bytes per entry), and the consume queues are truncated there."""
    end = last.start
    for rec in cl.walk(start=last.start, end=last.end, check_crc=True, read_body=False, use_mmap=use_mmap):
        if not isinstance(rec, Message):
            break
        end += rec.size
    return end


def _ledger_begin(cl: DLedgerCommitLog) -> int:
    """``ledgerBeginIndex``: the index of the first data file's first entry (``reviseLedgerBeginIndex``)."""
    ent = _first_entry(cl, 0)
    return ent.index if ent is not None else 0
