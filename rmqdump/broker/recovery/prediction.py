"""The prediction put together: :class:`RecoveryPrediction` (its stable JSON form) and
:func:`predict_recovery`, with :func:`predict_recovery_auto` choosing the 4.9 or 5.3 model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rmqdump.broker.recovery.consequences import (
    DEFAULT_LIST_LIMIT,
    DroppedRecords,
    commitlog_truncation,
    dropped_records,
    index_deletions,
)
from rmqdump.broker.recovery.inputs import (
    VERSION_49,
    VERSION_53,
    VERSION_AUTO,
    VERSIONS,
    abnormal_start_index,
    load_problems,
    normal_start_index,
    read_checkpoint_for_recovery,
)
from rmqdump.broker.recovery.queues import (
    CqProblem,
    QueueState,
    QueueTruncation,
    consume_queue_states,
    cq_truncation,
    kept_invalid_units,
    max_phy_offset_of_consume_queue,
)
from rmqdump.broker.recovery.start import StartFailure, start_failures
from rmqdump.broker.recovery.walk import STOP_V2_ON_49, BrokerWalk, broker_walk, cut_short
from rmqdump.broker.redispatch import QueueRedispatch, redispatch
from rmqdump.store.checkpoint import Checkpoint
from rmqdump.store.root import Store

MODE_NORMAL = "normal"
MODE_ABNORMAL = "abnormal"
MODE_REFUSES = "refuses_to_start"
MODE_EMPTY = "no_commitlog"


@dataclass
class RecoveryPrediction:
    """What the broker would do at its next start. ``to_dict`` gives the stable JSON form."""

    version: str
    mode: str
    reason: str
    start_file: str | None = None
    start_offset: int | None = None
    max_offset: int | None = None
    previous_end: int | None = None
    walk: BrokerWalk | None = None
    truncated_file: tuple[str, int] | None = None
    deleted_commitlog_files: list[str] = field(default_factory=list)
    max_phy_offset_of_consume_queue: int = -1
    cq_truncated: bool = False
    queues: list[QueueTruncation] = field(default_factory=list)
    #: queues whose truncation keeps an invalid first unit of their last file (:attr:`QueueTruncation.kept_invalid`)
    #: and that recovery dispatches nothing into (a dispatched record overwrites that unit before the truncation)
    kept_invalid: list[QueueTruncation] = field(default_factory=list)
    redispatched: list[QueueRedispatch] = field(default_factory=list)
    dropped: DroppedRecords = field(default_factory=DroppedRecords)
    deleted_index_files: list[dict] = field(default_factory=list)
    lost_index_range: tuple[int, int] | None = None
    load_errors: list[str] = field(default_factory=list)
    cut_short: str | None = None  # why the only commitlog file was cut short (:func:`cut_short`)
    #: files around the store the broker's start fails on (:mod:`rmqdump.broker.recovery.start`): config tables, timer store
    start_failures: list[StartFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checkpoint: Checkpoint | None = None

    @property
    def dropped_cq_entries(self) -> int:
        return sum(q.count for q in self.queues)

    @property
    def redispatched_cq_entries(self) -> int:
        return sum(q.count for q in self.redispatched)

    def to_dict(self) -> dict:
        stop = self.walk.stop if self.walk else None
        return {
            "version": self.version,
            "mode": self.mode,
            "reason": self.reason,
            "start_file": self.start_file,
            "start_offset": self.start_offset,
            "max_offset": self.max_offset,
            "previous_end": self.previous_end,
            "stop": None if stop is None else {"offset": stop.offset, "kind": stop.kind, "detail": stop.detail},
            "records_walked": self.walk.records if self.walk else 0,
            "truncated_file": None if self.truncated_file is None else {
                "file": self.truncated_file[0], "position": self.truncated_file[1]},
            "deleted_commitlog_files": self.deleted_commitlog_files,
            "dropped_records": self.dropped.to_dict(),
            "max_phy_offset_of_consume_queue": self.max_phy_offset_of_consume_queue,
            "cq_truncated": self.cq_truncated,
            "dropped_cq_entries": {
                "count": self.dropped_cq_entries,
                "queues": {q.queue: {"count": q.count, "from_queue_offset": q.dropped[0][0],
                                     "new_max_offset": q.end_after,
                                     "commitlog_offsets": [o for _, o in q.dropped[:100]]}
                           for q in self.queues if q.count},
            },
            "redispatched_cq_entries": {
                "count": self.redispatched_cq_entries,
                "queues": {q.queue: q.to_dict() for q in self.redispatched},
            },
            "invalid_cq_units_kept": {
                q.queue: {"queue_offset": q.kept_invalid[0], "commitlog_offset": q.kept_invalid[1],
                          "size": q.kept_invalid[2], "new_max_offset": q.new_end}
                for q in self.kept_invalid},
            "deleted_index_files": self.deleted_index_files,
            "lost_index_range": None if self.lost_index_range is None else list(self.lost_index_range),
            "load_errors": self.load_errors,
            "start_failures": [f.to_dict() for f in self.start_failures],
            "notes": self.notes,
        }


def refusal_reason(error: str, mode: str) -> str:
    """A refusing prediction's ``reason``: the first load error, and that the figures are ``mode``'s recovery."""
    return (f"{error}; the broker's load() fails and it does not start "
            f"(figures below: the {mode} recovery once that is fixed)")


def predict_recovery(store: Store, *, version: str = VERSION_49, check_crc: bool = True, use_mmap: bool = True,
                     list_limit: int = DEFAULT_LIST_LIMIT, queue_states: list[QueueState] | None = None,
                     previous_end: int | None = None, list_dropped: bool = True,
                     cq_problems: list[CqProblem] | None = None, repairable_ok: bool = False,
                     walker: Callable[..., BrokerWalk] | None = None,
                     redispatcher: Callable[..., list[QueueRedispatch]] | None = None) -> RecoveryPrediction:
    """Reproduce the broker's startup recovery on ``store`` (see the module docstring).

    ``previous_end`` (end of valid data as a plain walk sees it) only feeds the notes;
    ``queue_states`` (with their ``cq_problems``) may be passed to avoid reading the consume
    queues twice;
    ``list_dropped=False`` skips the keep-going walk that lists the dropped records;
    ``repairable_ok``: files repair deletes (a zero-length last commitlog file, a compaction pass's ``.delete``
    leftover) do not stop the start.
    ``walker``: a drop-in for :func:`broker_walk` (verify passes its compiled walk); ``redispatcher`` one for
    :func:`~rmqdump.broker.redispatch.redispatch` (verify passes its compiled twin).
    """
    if version not in VERSIONS:
        raise ValueError(f"unknown broker version model {version!r}")
    cl = store.commitlog
    abnormal = store.abort_present
    mode = MODE_ABNORMAL if abnormal else MODE_NORMAL
    reason = "abort file present: the previous run did not shut down cleanly" if abnormal else \
        "no abort file: the previous run shut down cleanly"
    pred = RecoveryPrediction(version, mode, reason, previous_end=previous_end)
    if store.root is not None:
        pred.start_failures = start_failures(store.root, version)
    if store.dledger is not None:  # DLedger's recovery, not the commitlog walk (walker: not for entries)
        from rmqdump.broker.recovery.dledger import predict_dledger_recovery

        return predict_dledger_recovery(store, pred, use_mmap=use_mmap, list_limit=list_limit,
                                        queue_states=queue_states, cq_problems=cq_problems,
                                        list_dropped=list_dropped)
    pred.load_errors = load_problems(store, version, repairable_ok)
    if queue_states is None:
        queue_states, cq_problems = consume_queue_states(store)
    pred.load_errors += [str(p) for p in cq_problems or ()
                         if p.refuses(version)]
    if pred.load_errors:
        pred.mode, pred.reason = MODE_REFUSES, refusal_reason(pred.load_errors[0], mode)
    if store.root is None:
        pred.notes.append("only commitlog files given: no abort/checkpoint/consume queues; assuming a clean exit")
    max_phy_cq = max_phy_offset_of_consume_queue(queue_states)
    pred.max_phy_offset_of_consume_queue = max_phy_cq
    checkpoint, cp_note = read_checkpoint_for_recovery(store) if store.root is not None else (Checkpoint(), None)
    pred.checkpoint = checkpoint
    if cp_note and abnormal:
        pred.notes.append(cp_note)
    if not cl.segments:
        pred.mode = MODE_EMPTY
        pred.reason = "no commitlog files: every consume queue is destroyed"
        return pred
    if abnormal:
        start, why = abnormal_start_index(cl, checkpoint.min_timestamp, version)
        pred.notes.append(f"checkpoint min timestamp {checkpoint.min_timestamp} "
                          f"(min(physic {checkpoint.physic_msg_timestamp}, logics {checkpoint.logics_msg_timestamp})"
                          f" - 3 s) selects start file {cl.segments[start].name}")
    else:
        start = normal_start_index(cl, version, max_phy_cq)
    walk = (walker or broker_walk)(cl, start, version=version, check_crc=check_crc, use_mmap=use_mmap)
    pred.walk = walk
    short = pred.cut_short = cut_short(store, walk)
    if short and not pred.load_errors:
        pred.load_errors.append(short)
        pred.mode, pred.reason = MODE_REFUSES, refusal_reason(short, mode)
    pred.notes += walk.notes
    pred.start_file = cl.segments[start].name
    pred.start_offset = cl.segments[start].start
    pred.max_offset = walk.process_offset
    pred.truncated_file, pred.deleted_commitlog_files = commitlog_truncation(cl, walk.process_offset)
    pred.cq_truncated = max_phy_cq >= walk.process_offset
    truncations = [cq_truncation(st, walk.process_offset, pred.cq_truncated) for st in queue_states]
    pred.queues = [qt for qt in truncations if qt.count]
    if abnormal or version == VERSION_53:
        from rmqdump.store.consumequeue import batch_cq_topics

        bcq = batch_cq_topics(store.root) if version == VERSION_53 and store.root is not None else frozenset()
        pred.redispatched = (redispatcher or redispatch)(
            cl, queue_states, start_index=start, end_offset=walk.process_offset,
            after=-1 if abnormal else max_phy_cq, batch_topics=bcq, use_mmap=use_mmap)
    pred.kept_invalid = kept_invalid_units(truncations, pred.redispatched)
    if list_dropped:
        pred.dropped = dropped_records(cl, walk.process_offset, use_mmap=use_mmap, list_limit=list_limit)
    idx, idx_notes = index_deletions(store, checkpoint, abnormal)
    pred.deleted_index_files = idx
    pred.notes += idx_notes
    if idx:
        lo = min(max(cl.min_offset, f["begin_phy_offset"]) for f in idx)
        if lo < pred.start_offset:
            pred.lost_index_range = (lo, pred.start_offset)
            pred.notes.append(f"index entries of records in [{lo}, {pred.start_offset}) are lost: their index "
                              f"file is deleted and re-dispatch starts at {pred.start_file}")
    if start > 0 and not abnormal and version == VERSION_49:
        pred.notes.append(f"normal recovery checks only the last three files (from {pred.start_file}); "
                          "damage in earlier files is not seen at startup")
    return pred


def predict_recovery_auto(store: Store, version: str = VERSION_AUTO, **kwargs) -> tuple[RecoveryPrediction, str | None]:
    """:func:`predict_recovery` with ``version`` ``auto``: the 4.9 model unless the store holds a file only
    a 5.x broker creates (:data:`rmqdump.broker.version.FIVE_X_ONLY_PATHS`) or the 4.9 walk meets a V2-magic
    record — only a 5.x broker writes those — then the 5.3 model. Returns (prediction, why that model;
    None when ``version`` was explicit). The appender writes V2 records only where this picks 5.3 (or
    when told the broker is 5.x), so its own writes never change the model."""
    from rmqdump.broker.version import five_x_files, five_x_files_reason

    if version != VERSION_AUTO:
        return predict_recovery(store, version=version, **kwargs), None
    files = five_x_files(store.root)
    if files:
        return predict_recovery(store, version=VERSION_53, **kwargs), five_x_files_reason(files)
    pred = predict_recovery(store, version=VERSION_49, **kwargs)
    stop = pred.walk.stop if pred.walk else None
    if stop is not None and stop.detail == STOP_V2_ON_49:
        return (predict_recovery(store, version=VERSION_53, **kwargs),
                f"5.x: a V2-magic record at {stop.offset} (written by a 5.x broker)")
    return pred, "4.9: no record or file only a 5.x broker writes (--broker-version 5.3 to model 5.x)"
