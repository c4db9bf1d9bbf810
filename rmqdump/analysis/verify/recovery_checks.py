"""What the recovery prediction itself reports (:class:`~rmqdump.broker.recovery.RecoveryPrediction`): a
refused start, records and entries the recovery drops, entries its re-dispatch misplaces, invalid units its
consume-queue truncation keeps."""

from __future__ import annotations

from collections.abc import Callable

from rmqdump.broker.recovery import MODE_REFUSES
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE
from rmqdump.findings import ERROR, WARNING, Finding


def recovery_findings(pred, cl, seg_label: Callable) -> list[Finding]:
    """The findings of prediction ``pred`` of commitlog ``cl`` (``seg_label``: a segment's file label)."""
    out: list[Finding] = []
    for q in pred.redispatched:
        if q.misplaced:
            off, want, at = q.first_misplaced
            out.append(Finding(
                WARNING, "recovery_misplaces_cq_entries", f"consumequeue/{q.queue}", off,
                f"{pred.mode} recovery would re-dispatch {q.misplaced} record(s) of {q.queue} at other queue "
                f"offsets (the record at {off}, queue offset {want}, lands at {at}): consumers skip or "
                "re-read messages there; rebuild the queue (repair) before the broker starts"))
    for q in pred.kept_invalid:
        qoff, off, size = q.kept_invalid
        out.append(Finding(
            WARNING, "recovery_keeps_invalid_cq_unit", f"consumequeue/{q.queue}/{qoff * CQ_STORE_UNIT_SIZE:020d}", 0,
            f"{pred.mode} recovery would keep the invalid unit at queue offset {qoff} of {q.queue} (commitlog "
            f"offset {off}, size {size}; truncateDirtyLogicFiles keeps a last file's first unit unchecked): the "
            f"queue's max offset becomes {q.new_end} with an entry that is no message; repair deletes the file"))
    if pred.mode == MODE_REFUSES:
        out.append(Finding(ERROR, "recovery_refuses_start", None, None, pred.reason))
    elif pred.dropped.count or pred.deleted_commitlog_files and pred.dropped.bytes:
        d = pred.dropped
        held = next((sg for sg in cl.segments if pred.truncated_file and sg.name == pred.truncated_file[0]), None)
        cut = pred.walk.process_offset if pred.mode == "dledger" and pred.walk else pred.max_offset  # data end
        out.append(Finding(
            ERROR, "recovery_truncates", seg_label(held) if held is not None else None, cut,
            f"{pred.mode} recovery would end the commitlog at {cut} and drop {d.count} record(s) "
            f"({d.intact} intact), {pred.dropped_cq_entries} consume-queue entries"
            + (f" and delete {len(pred.deleted_commitlog_files)} file(s)" if pred.deleted_commitlog_files else "")))
    return out
