"""``rmqdump verify``: what is damaged, what the broker would throw away, what can be saved.

:func:`verify_store` runs the record checks of every commitlog segment
(:func:`~rmqdump.analysis.verify.segment.verify_segment`, reusable per segment / in parallel), the
store checks (``queue_checks``, ``index_checks``, ``meta_checks``) and the recovery prediction
(:mod:`rmqdump.broker.recovery`), and returns a :class:`VerifyReport`.

Findings: ``{severity, kind, file, offset, detail}``. ``file`` is relative to the store
root (``commitlog/00000000000000262144``, ``consumequeue/T/0/00000000000000000000``,
``index/…``, ``checkpoint``, ``config/…``); ``offset`` is the **commitlog offset** for
commitlog findings and the byte position inside the file for every other file (None for
whole-file facts).

Finding kinds (stable identifiers):

Commitlog records — damage that stops the broker's recovery walk (all ``error``):
  ``body_crc``             masked CRC-32 of the body differs from BODYCRC (CRC 0 of an empty body is valid)
  ``bad_magic``            unknown MAGICCODE where a record must start
  ``bad_totalsize``        TOTALSIZE below the smallest record or above the size limit
  ``truncated``            the record runs past the end of the file
  ``length_mismatch``      TOTALSIZE disagrees with BODYLEN/TOPICLEN/PROPERTIESLEN
  ``bad_field``            a field the broker cannot parse (negative topic length, bad DELAY)
  ``bad_blank``            BLANK whose TOTALSIZE is not the distance to the end of the file
  ``torn_record``          sane header, zero-filled tail: an incomplete write (crash)
  ``zeroed_range``         zero bytes where a record must start, with intact records after them
Commitlog records — damage the broker *accepts* (listed again under ``recovery.accepted_damaged``):
  ``torn_properties`` (error)   properties end in a run of NULs (the body CRC does not cover them)
  ``properties_nul`` (error)    NUL bytes inside the properties
  ``properties_malformed`` (warning)  a pair without key or value: the broker silently drops it
  ``properties_encoding`` (warning)   properties are not valid UTF-8
  ``record_crc`` (error)        5.2+ ``__CRC32#`` whole-record CRC mismatch / malformed
  ``physical_offset_mismatch`` (error)  PHYSICALOFFSET field ≠ the record's position
  ``queue_offset_outlier`` (error)      one record's QUEUEOFFSET breaks a sequence that resumes after it
  ``queue_offset_regression`` (error)   QUEUEOFFSET repeats or goes back (two records, one CQ slot)
  ``queue_offset_gap`` (warning)        QUEUEOFFSET jumps forward
  ``bad_topic`` (error)         empty topic or one holding NUL or '/'
  ``tx_half_missing`` (info)    COMMIT/ROLLBACK record whose PREPARED TRANSACTION OFFSET is neither a half
                              message nor a PREPARED record (RocketMQ's 4.x store API writes any offset, copies
                              keep theirs); the broker never reads the field back
  ``tx_half_expired`` (info)    …whose half message lies in a deleted file
  ``repair_filler`` (info)      a ROLLBACK filler written by ``rmqdump repair --salvage filler``
  ``tx_queue_offset`` / ``tx_unexpected_prepared_offset`` (warning)  transaction fields the broker never writes
  ``sysflag_unknown_bits``, ``bad_timestamp``, ``bad_host``, ``bad_field``, ``empty_body_crc``,
  ``bad_compression``, ``header_outlier`` (warning)  fields nothing in the broker validates (``header_outlier``:
                              one record's STORETIMESTAMP far from both neighbours'; store hosts are not compared)
Commitlog segments:
  ``stray_file`` / ``zero_length_segment`` / ``segment_size`` / ``segment_gap`` / ``segment_alignment`` /
  ``segment_name``  (from discovery; sizes and zero-length files stop a 4.9 broker from starting)
  ``segment_duplicate`` (error)  multi-path (``--commitlog-path``): one segment name in two folders;
  ``commitlog_path_missing`` (warning) a given folder does not exist; ``commitlog_path_unread`` (warning)
                              another root-level folder holds segments the command was not told to read
  ``missing_blank`` (error)     a segment ends without a BLANK although later segments hold data
  ``empty_segment`` (error)     an all-zero segment before segments with data
  ``preallocated_segment`` (info)  trailing all-zero segment (normal)
  ``data_after_end`` (warning)  non-zero bytes after the end of valid data with no intact record in them
  ``segment_unreadable`` (error)  a segment could not be opened or mapped
  ``findings_suppressed`` (info)  more findings of a kind than listed
Consume queues:
  ``cq_entry_missing``, ``cq_entry_misplaced``, ``cq_entry_duplicate``, ``cq_entry_dangling``,
  ``cq_entry_wrong_queue``, ``cq_entry_beyond_end``, ``cq_size_mismatch``, ``cq_hole`` (error);
  ``cq_tags_mismatch`` (error; warning on SCHEDULE_TOPIC_XXXX), ``cq_entries_after_hole``,
  ``queue_id_out_of_range`` (warning); ``cq_not_dispatched``, ``cq_entry_expired`` (info);
  ``cq_file`` (error: wrong file size or stray file — a 4.9 broker refuses to start; warning: missing
  files, misaligned names),
  ``cq_unavailable``, ``cq_topic_deleted`` (info: records of a topic config/topics.json no longer lists).
  A 5.x BatchCQ topic's records are dispatched by ``batchconsumequeue/`` units
  (a unit whose size differs from its record: ``cq_size_mismatch``); an entry of an LMQ queue
  (``%LMQ%…``) may point at a record of another topic that lists the queue in INNER_MULTI_DISPATCH,
  at the queue offset INNER_MULTI_QUEUE_OFFSET gives (another offset: ``cq_entry_misplaced``)
Index files:
  ``index_key_mismatch``, ``index_slot_mismatch``, ``index_chain_cycle``, ``index_chain_merge``,
  ``index_chain_order``, ``index_entry_dangling``, ``index_header``, ``index_file_size``,
  ``index_unreadable`` (error); ``index_header_mismatch``, ``index_time_mismatch``, ``index_slot_invalid``,
  ``index_entry_unreachable``, ``index_entry_beyond_end``, ``index_file_name`` (warning);
  ``index_entry_expired``, ``index_chain_irregular`` (info: chains that merge or pass through
  another slot's entries while every entry stays on its own slot's chain, as RocketMQ leaves them after a crash)
Checkpoint, config, abort, lock:
  ``checkpoint_missing``, ``checkpoint_size``, ``checkpoint_ahead`` (warning); ``checkpoint_zero``,
  ``checkpoint_index`` (info); ``config_parse`` (error; warning when the broker falls back to .bak),
  ``config_unreadable`` (error), ``consumer_offset_ahead`` (warning); ``config_missing`` (info: the broker
  starts without config/);
  ``abort_present``, ``lock_unreadable``, ``store_in_use`` (warning); ``abort_bak`` (info)
5.x timer store (``timer_checks``; what the broker's TimerMessageStore does at the next start):
  ``timer_unit_beyond_commitlog`` (error: a unit to deliver whose record is past the recovered commitlog end,
  apache/rocketmq #10668), ``timer_unit_bad_record``, ``timer_wheel_size``, ``timer_log_files``,
  ``timer_unreadable`` (error); ``timer_unit_orphaned``, ``timer_slot_dangling``, ``timer_chain_loop``,
  ``timer_chain_crosses_slot``, ``timer_log_damaged``, ``timer_checkpoint_ahead``, ``timer_read_time_ahead``, ``timer_enqueued_again`` (warning);
  ``timer_metrics_mismatch``, ``timer_slot_first`` (info)
DLedger commitlog (``dledger-<id>/``; records are walked inside their entries, a damaged record in a sound entry
does not end the walk):
  ``dledger_entry`` (error)  an entry header DLedger's recovery stops at (magic, size, pos, index, term)
  ``dledger_index_mismatch``, ``dledger_index_file`` (error)  an index unit that disagrees with its entry (DLedger
                              rewrites the index from there); an index file of another size (DLedger's load fails)
  ``dledger_checkpoint``, ``dledger_currterm``, ``dledger_text_file`` (warning; ``dledger_currterm`` info when the
                              file is absent)  checkpoint unreadable, currterm missing or behind the entries
  ``dledger_uncommitted`` (info)  entries after committedIndex (-1 when no checkpoint was flushed yet): RocketMQ
                              reads none of their records yet
Controller-mode epochs (``epoch_checks``; ``epochFileCheckpoint`` + ``.bak``, read as CheckpointFile.read does):
  ``epoch_file_bad`` (error; warning when the .bak rescues it)  count or CRC32 line wrong;
  ``epoch_load_fails`` (error)  the broker's epoch load throws; ``epoch_order``, ``epoch_past_end`` (warning)
  epochs out of order, an epoch starting past the commitlog's valid end; ``epoch_unconfirmed_records``
  (warning) records after the checkpoint's confirmPhyOffset (a truncated slave's stale bytes, #10666);
  ``epoch_bak_bad``, ``epoch_bak_differs`` (info)
5.x compaction store (``compaction_checks``; ``compaction/``: compacted records, sparse CQ, position-checkpoint):
  ``compaction_files_mismatch`` (error when the broker's load fails on it: see ``broker.compaction_load``;
  warning when the broker leaves the queue unloaded; info when the load ignores it), ``compaction_log_damaged``,
  ``compaction_record_misplaced``,
  ``compaction_cq_dangling``, ``compaction_record_mismatch`` (differs from the commitlog record of its queue
  offset), ``compaction_record_missing`` (a record compaction keeps is absent), ``compaction_unreadable``
  (error); ``compaction_position_bad`` (error; warning when the .bak rescues it), ``compaction_record_unindexed``,
  ``compaction_key_missing``, ``compaction_queue_unloaded`` (warning: the broker's load skips the queue: no
  ``compactionCq`` folder, a file of another size); ``compaction_lag`` (info)
Recovery:
  ``recovery_truncates`` (error)  the broker would drop records at startup
  ``recovery_refuses_start`` (error)  the broker's load() would fail
  ``recovery_misplaces_cq_entries`` (warning)  recovery's re-dispatch would write entries at other queue
  offsets than their records' (5.3.3 normal recovery after lost consume-queue files)
  ``recovery_keeps_invalid_cq_unit`` (warning)  the consume-queue truncation would keep the unwritten first
  unit of a queue's last file as an entry (a crash between creating the file and writing it)
  ``recovery_unpredictable`` (warning)  the prediction could not be made
  A DLedger store's prediction has mode ``dledger`` (:mod:`rmqdump.broker.recovery.dledger`).

The JSON document (:meth:`VerifyReport.to_dict`, ``--format json``):
  ``findings``   list of ``{severity, kind, file, offset, detail}``, errors first
  ``recovery``   ``{version, mode, reason, start_file, start_offset, max_offset, previous_end, stop,
                 records_walked, truncated_file, deleted_commitlog_files,
                 dropped_records: {count, intact, damaged, bytes, first_offset, offsets, offsets_truncated,
                 topics, damaged_ranges}, max_phy_offset_of_consume_queue, cq_truncated,
                 dropped_cq_entries: {count, queues: {"topic/qid": {count, from_queue_offset, new_max_offset,
                 commitlog_offsets}}}, redispatched_cq_entries: {count, queues: {"topic/qid": {count,
                 from_queue_offset, new_max_offset, created, commitlog_offsets, misplaced, first_misplaced}}},
                 invalid_cq_units_kept: {"topic/qid": {queue_offset, commitlog_offset, size, new_max_offset}},
                 deleted_index_files: [{file, end_timestamp, begin_phy_offset,
                 end_phy_offset, entries}], lost_index_range, load_errors, start_failures: [{file, reason,
                 stage}], notes, accepted_damaged,
                 unchecked_damage, version_notes}``
  ``salvage``    with ``--keep-going``: ``{first_damage, intact_records_after_damage, first_intact_offsets,
                 damaged_ranges, broker_would_drop_intact}``, else null
  ``segments``   per-segment statistics; ``index_files`` per-index-file headers
  ``summary``    ``{status, errors, warnings, infos, by_kind, segments, records, blanks, record_bytes,
                 valid_end, first_damage, consume_queues, cq_records_checked, index_files, predicted_mode,
                 predicted_max_offset, keep_going, broker_model, broker_model_reason}``
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from rmqdump.analysis.verify.compaction_checks import check_compaction
from rmqdump.analysis.verify.epoch_checks import check_epochs
from rmqdump.analysis.verify.index_checks import check_index
from rmqdump.analysis.verify.meta_checks import (
    check_abort_lock,
    check_checkpoint,
    check_config,
    check_consumer_offsets,
)
from rmqdump.analysis.verify.queue_checks import CqChecker
from rmqdump.analysis.verify.record_cache import RecordCache
from rmqdump.analysis.verify.records import _fast_wanted, check_transactions, merge_segments
from rmqdump.analysis.verify.recovery_checks import recovery_findings
from rmqdump.analysis.verify.result import SegmentResult
from rmqdump.analysis.verify.segment import verify_segment
from rmqdump.analysis.verify.timer_checks import verify_timer
from rmqdump.broker.recovery import (
    DEFAULT_LIST_LIMIT,
    MODE_ABNORMAL,
    VERSION_49,
    VERSION_53,
    VERSION_AUTO,
    RecoveryPrediction,
    consume_queue_states,
    predict_recovery,
    predict_recovery_auto,
)
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.errors import RmqdumpError
from rmqdump.fast import readahead
from rmqdump.findings import ERROR, INFO, SEVERITIES, WARNING, Finding
from rmqdump.store.root import Store

__all__ = ["VerifyReport", "verify_store", "verify_segment", "merge_segments", "SegmentResult", "ACCEPTED_KINDS",
           "STOP_KINDS"]

#: kinds that stop the broker's recovery walk at their offset
STOP_KINDS = frozenset({"body_crc", "bad_magic", "bad_totalsize", "truncated", "length_mismatch", "bad_field",
                        "torn_record", "zeroed_range"})
#: record kinds the broker's recovery accepts although the record is damaged
ACCEPTED_KINDS = frozenset({"torn_properties", "properties_nul", "properties_malformed", "properties_encoding",
                            "record_crc", "physical_offset_mismatch", "queue_offset_outlier",
                            "queue_offset_regression", "queue_offset_gap", "bad_topic", "tx_half_missing",
                            "tx_queue_offset", "tx_unexpected_prepared_offset", "sysflag_unknown_bits",
                            "bad_timestamp", "bad_host", "empty_body_crc", "bad_compression", "header_outlier", "queue_id_out_of_range", "bad_blank"})
_SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class VerifyReport:
    """Everything ``verify`` found; :meth:`to_dict` is the stable ``--format json`` document."""

    store: str
    findings: list[Finding] = field(default_factory=list)
    recovery: RecoveryPrediction | None = None
    segments: list[SegmentResult] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    salvage: dict | None = None
    accepted_damaged: list[dict] = field(default_factory=list)
    unchecked_damage: list[dict] = field(default_factory=list)
    version_notes: list[str] = field(default_factory=list)
    model_reason: str | None = None  # why --broker-version auto chose its model
    indexes: list[dict] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def exit_code(self) -> int:
        """0 clean (no errors), 1 errors found."""
        return 1 if self.errors else 0

    def findings_at(self, offset: int, kind: str | None = None) -> list[Finding]:
        return [f for f in self.findings if f.offset == offset and (kind is None or f.kind == kind)]

    def to_dict(self) -> dict:
        rec = None
        if self.recovery is not None:
            rec = self.recovery.to_dict()
            rec["accepted_damaged"] = self.accepted_damaged
            rec["unchecked_damage"] = self.unchecked_damage
            rec["version_notes"] = self.version_notes
        return {
            "store": self.store,
            "findings": [f.to_dict() for f in self.findings],
            "recovery": rec,
            "salvage": self.salvage,
            "segments": [s.stats() for s in self.segments],
            "index_files": self.indexes,
            "summary": self.summary,
        }


def _recovery_walker(enabled: bool, results: list[SegmentResult]):
    """The compiled :func:`~rmqdump.broker.recovery.broker_walk` (identical results, pure fallback) reusing
    the segment walks verify already did, or None for the pure walk."""
    if not enabled:
        return None
    from functools import partial

    from rmqdump.fast.recovery_walk import broker_walk_fast

    summaries = {r.start: r.walk_summary for r in results if r.walk_summary is not None}
    return partial(broker_walk_fast, summaries=summaries)


def _recovery_redispatcher(enabled: bool):
    """The compiled :func:`~rmqdump.broker.redispatch.redispatch` (column batches, identical results) where the
    compiled recovery walk runs, or None for the pure one."""
    if not enabled:
        return None
    from rmqdump.fast.redispatch import redispatch_fast

    return redispatch_fast


def _parallel_jobs(segments, use_mmap: bool) -> int:
    """Threads for the segment loop: all CPUs when every segment takes the compiled path."""
    if not use_mmap or len(segments) < 2 or not all(_fast_wanted(s.size) for s in segments):
        return 1
    from rmqdump.fast.walk import backend, default_jobs

    backend()  # load (or build) the kernels once, before the threads start
    return min(default_jobs(), len(segments))


def records_end(results: list[SegmentResult], default: int) -> int:
    """Where the valid records end: the furthest end of a segment that holds any (a record, a BLANK); a
    segment with none (an all-zero pre-allocated file, damage at its first byte) ends nothing."""
    return max((r.end_offset for r in results if r.end_offset > r.start), default=default)


def _cq_checker_class(use_mmap: bool) -> type[CqChecker]:
    """The ConsumeQueue checker: its compiled twin (column batches, identical findings) where the compiled
    walk can run, else the pure reference."""
    from rmqdump.fast.walk import fast_available

    if use_mmap and fast_available():
        from rmqdump.analysis.verify.queue_fast import FastCqChecker

        return FastCqChecker
    return CqChecker


def _cq_file_finding(p, version: str) -> Finding:
    """A consume-queue file problem under the broker model ``version``: a zero-length last file (a crash between
    creating and extending it) is an error where the broker refuses it (4.9) and info where it deletes it (5.x)."""
    if p.zero_last and not p.refuses(version):
        return Finding(INFO, "cq_file", p.file, None, "zero-length last file (a crash between creating and "
                       "extending it): a 5.x broker deletes it at load, a 4.x broker refuses to load it")
    return Finding(ERROR if p.fatal else WARNING, "cq_file", p.file, None, p.message)


def _sort_key(f: Finding):
    return (_SEV_RANK.get(f.severity, 9), f.file or "", -1 if f.offset is None else f.offset, f.kind)


def verify_store(path: str | os.PathLike | Store, *, keep_going: bool = False, check_crc: bool = True,
                 use_mmap: bool = True, max_record_size: int = MAX_RECORD_SIZE, version: str = VERSION_AUTO,
                 store_checks: bool = True, delay_levels_ms: list[int] | None = None,
                 progress: Callable[[int, int], None] | None = None, list_limit: int = DEFAULT_LIST_LIMIT,
                 max_findings_per_kind: int = 1000, compare_versions: bool = True,
                 segment_verifier: Callable[..., SegmentResult] | None = None,
                 cq_checker_factory: Callable[..., CqChecker] | None = None) -> VerifyReport:
    """Verify a store (root, ``commitlog/`` dir or one segment). Raises RmqdumpError only if it cannot run.

    ``progress(done_bytes, total_bytes)`` is called while the segments are walked.
    ``version``: the broker's recovery model, ``4.9``, ``5.3`` or ``auto`` (4.9 unless the walk meets
    a record only a 5.x broker writes — V2 magic —; then 5.3, and ``summary.broker_model_reason`` says why).
    ``segment_verifier`` / ``cq_checker_factory`` replace :func:`verify_segment` / :class:`CqChecker`
    (same signatures): ``rmqdump.spark`` hands in segment results computed on executors.
    """
    verify_segment_ = segment_verifier or verify_segment
    cq_checker_ = cq_checker_factory or _cq_checker_class(use_mmap)
    store = path if isinstance(path, Store) else Store.open(path)
    cl = store.commitlog
    root = store.root
    report = VerifyReport(str(root if root is not None else cl.location))
    findings: list[Finding] = []
    delay = delay_levels_ms or DEFAULT_DELAY_LEVELS_MS

    def seg_label(seg) -> str:
        return os.path.relpath(seg.path, root) if root is not None else seg.name  # also dledger-<id>/data/…

    for p in cl.problems:
        findings.append(Finding(p.severity, p.kind, _relabel(root, p.file), p.offset, p.detail))

    # consume queues (shared with the recovery prediction) and config
    states = []
    cq_problems = []
    topics = None
    loaded_cfg: dict = {}
    if root is not None and store_checks:
        try:
            states, cq_problems = consume_queue_states(store)
        except RmqdumpError as e:
            findings.append(Finding(INFO, "cq_unavailable", "consumequeue", None, f"consume queues not checked: {e}"))
            states = []
        try:
            cfg_findings, loaded_cfg = check_config(root)
            findings += cfg_findings
            topics = loaded_cfg.get("topics.json")
        except RmqdumpError as e:
            findings.append(Finding(ERROR, "config_unreadable", "config", None, str(e)))
    cq_checker = cq_checker_(root, states, cl, delay_levels_ms=delay, topics=topics,
                           max_per_kind=max_findings_per_kind) if root is not None and store_checks else None

    # the record loop, segment by segment
    total = sum(s.size for s in cl.segments)
    done = 0
    results: list[SegmentResult] = []
    jobs = _parallel_jobs(cl.segments, use_mmap) if cq_checker is None else 1

    def run_one(seg, on_message, cb, **kw) -> SegmentResult:
        return verify_segment_(seg, file_size=cl.file_size, check_crc=check_crc, keep_going=keep_going,
                               max_record_size=max_record_size, use_mmap=use_mmap, file_label=seg_label(seg),
                               on_message=on_message, progress=cb, list_limit=list_limit,
                               max_findings_per_kind=max_findings_per_kind,
                               zero_start=seg.start == 0 and seg is cl.segments[0], **kw)

    def from_base(base: int):
        """The progress callback of a segment starting ``base`` bytes into the store (serial loops)."""
        if progress is None:
            return None

        def cb(pos: int) -> None:
            progress(base + pos, total)
        return cb

    def take(seg, res: SegmentResult | RmqdumpError) -> None:
        if isinstance(res, RmqdumpError):
            findings.append(Finding(ERROR, "segment_unreadable", seg_label(seg), None, str(res)))
        else:
            results.append(res)
            findings.extend(res.findings)

    if jobs > 1:  # compiled walks release the GIL: segments in threads, merged in order
        from concurrent.futures import ThreadPoolExecutor

        lock = threading.Lock()
        seen: dict[int, int] = {}

        def one(seg):
            cb = None
            if progress is not None:
                def cb(pos: int, key: int = seg.start) -> None:
                    with lock:
                        seen[key] = pos
                        progress(sum(seen.values()), total)
            try:
                return run_one(seg, None, cb)
            except RmqdumpError as e:
                return e

        with ThreadPoolExecutor(max_workers=jobs) as ex:
            for seg, res in zip(cl.segments, ex.map(one, cl.segments), strict=True):
                take(seg, res)
    on_batch = getattr(cq_checker, "on_batch", None)
    batch_kw = {"on_batch": on_batch} if on_batch is not None and segment_verifier is None else {}
    # one thread for the segments (consume queues to join in order, or a single segment) on two CPUs: each
    # segment's walk runs a batch ahead on a second thread; the checks and the join run here, as in the serial
    # loop (same records, same order)
    ahead = jobs <= 1 and segment_verifier is None and readahead.wanted(cl.segments, use_mmap)
    with readahead.switch_interval() if ahead else contextlib.nullcontext():
        for seg in cl.segments if jobs <= 1 else ():
            try:
                res = run_one(seg, cq_checker.on_message if cq_checker else None, from_base(done),
                              **batch_kw, **({"read_ahead": True} if ahead else {}))
            except RmqdumpError as e:
                take(seg, e)
                continue
            done += seg.size
            take(seg, res)
    report.segments = results
    findings += merge_segments(results, cl.file_size, zero_start=cl.min_offset == 0)
    cache = RecordCache(cl, use_mmap)
    try:
        findings += check_transactions(results, cache, cl.min_offset)
        valid_end = records_end(results, cl.min_offset)

        # recovery prediction
        pred = None
        walker = _recovery_walker(use_mmap and _fast_wanted(total), results)
        redispatcher = _recovery_redispatcher(walker is not None)
        try:
            pred, report.model_reason = predict_recovery_auto(
                store, version, check_crc=check_crc, use_mmap=use_mmap, list_limit=list_limit,
                queue_states=states if store_checks else None, cq_problems=cq_problems, previous_end=valid_end,
                walker=walker, redispatcher=redispatcher)
            version = pred.version
        except RmqdumpError as e:
            version = VERSION_49 if version == VERSION_AUTO else version
            findings.append(Finding(WARNING, "recovery_unpredictable", None, None, str(e)))
        report.recovery = pred
        findings += [_cq_file_finding(p, version) for p in cq_problems]  # their severity follows the model
        if pred is not None and compare_versions and root is not None:
            other = VERSION_53 if version == VERSION_49 else VERSION_49
            try:
                alt = predict_recovery(store, version=other, check_crc=check_crc, use_mmap=use_mmap,
                                       list_limit=0, queue_states=states if store_checks else None,
                                       cq_problems=cq_problems, list_dropped=False, walker=walker,
                                       redispatcher=redispatcher)
                report.version_notes = _version_notes(pred, alt)
            except RmqdumpError:
                pass

        # store checks that need the recovery prediction
        if cq_checker is not None:
            if pred is not None and pred.mode == MODE_ABNORMAL:
                dispatch_from = pred.start_offset
            elif pred is not None and pred.max_phy_offset_of_consume_queue >= 0:
                dispatch_from = min(pred.max_phy_offset_of_consume_queue, pred.max_offset)
            else:
                dispatch_from = cl.min_offset
            findings += cq_checker.finish(cache, dispatch_from=dispatch_from, valid_end=valid_end,
                                          recovery_end=pred.max_offset if pred else None)
        if root is not None and store_checks:
            try:
                idx_findings, report.indexes = check_index(root, cl, cache, valid_end=valid_end,
                                                           recovery_end=pred.max_offset if pred else None,
                                                           max_per_kind=max_findings_per_kind)
                findings += idx_findings
            except RmqdumpError as e:
                findings.append(Finding(ERROR, "index_unreadable", "index", None, str(e)))
            max_ts = max((r.max_store_timestamp for r in results if r.max_store_timestamp is not None),
                         default=None)
            if pred is not None and pred.checkpoint is not None:
                findings += check_checkpoint(store, pred.checkpoint, max_store_ts=max_ts,
                                             has_data=any(r.records for r in results), index_infos=report.indexes)
            findings += check_abort_lock(store)
            findings += check_epochs(store, valid_end)
            findings += check_compaction(store, cache, max_per_kind=max_findings_per_kind)
            findings += verify_timer(store, cache, pred, max_per_kind=max_findings_per_kind)
            if pred is not None:
                ends = {q.queue: q.end_after for q in [*pred.queues, *pred.kept_invalid]}
                findings += check_consumer_offsets(loaded_cfg.get("consumerOffset.json"), states, ends)
    finally:
        cache.close()

    # what the broker accepts although damaged, and damage it never looks at
    if pred is not None and pred.max_offset is not None:
        lo, hi = pred.start_offset, pred.max_offset
        for f in findings:
            if f.offset is None or not (f.file or "").startswith(("commitlog", "0", "dledger-")):
                continue
            if f.kind in ACCEPTED_KINDS and lo <= f.offset < hi:
                report.accepted_damaged.append({"offset": f.offset, "kind": f.kind, "file": f.file})
            elif f.severity == ERROR and f.offset < lo and (f.kind in STOP_KINDS or f.kind in ACCEPTED_KINDS):
                report.unchecked_damage.append({"offset": f.offset, "kind": f.kind, "file": f.file})
        findings += recovery_findings(pred, cl, seg_label)

    # salvage
    first_damage = min((r.first_damage for r in results if r.first_damage is not None), default=None)
    if keep_going:
        intact = 0
        offsets: list[int] = []
        for r in results:
            if first_damage is None:
                break
            if r.first_damage is not None and r.first_damage == first_damage:
                intact += r.intact_after_damage
                offsets += r.intact_after_damage_offsets
            elif r.start > first_damage:
                intact += r.records
        report.salvage = {
            "first_damage": first_damage,
            "intact_records_after_damage": intact,
            "first_intact_offsets": offsets[:100],
            "damaged_ranges": [{"start": s, "end": e, "kind": k, "file": r.file}
                               for r in results for (s, e, k) in r.damaged],
            "broker_would_drop_intact": pred.dropped.intact if pred is not None else None,
        }

    findings.sort(key=_sort_key)
    report.findings = findings
    sev = Counter(f.severity for f in findings)
    report.summary = {
        "status": "damaged" if sev[ERROR] else "clean",
        "errors": sev[ERROR], "warnings": sev[WARNING], "infos": sev[INFO],
        "by_kind": dict(sorted(Counter(f.kind for f in findings).items())),
        "segments": len(cl.segments),
        "records": sum(r.records for r in results),
        "blanks": sum(r.blanks for r in results),
        "record_bytes": sum(r.record_bytes for r in results),
        "valid_end": records_end(results, cl.min_offset) if results else None,
        "first_damage": first_damage,
        "consume_queues": len(states),
        "cq_records_checked": cq_checker.records_checked if cq_checker else 0,
        "index_files": len(report.indexes),
        "predicted_mode": pred.mode if pred else None,
        "predicted_max_offset": pred.max_offset if pred else None,
        "keep_going": keep_going,
        "broker_model": version,
        "broker_model_reason": report.model_reason,
    }
    return report


def _relabel(root, file: str | None) -> str | None:
    if file is None or root is None:
        return file
    try:
        return os.path.relpath(file, root)
    except ValueError:
        return file


def _version_notes(a: RecoveryPrediction, b: RecoveryPrediction) -> list[str]:
    out = []
    if a.mode != b.mode:
        out.append(f"{b.version}: mode {b.mode} instead of {a.mode}")
    if a.start_file != b.start_file:
        out.append(f"{b.version}: the walk would start at {b.start_file} instead of {a.start_file}")
    if a.max_offset != b.max_offset:
        out.append(f"{b.version}: the commitlog would end at {b.max_offset} instead of {a.max_offset}")
    if a.redispatched_cq_entries != b.redispatched_cq_entries:
        out.append(f"{b.version}: recovery would re-dispatch {b.redispatched_cq_entries} consume-queue entries "
                   f"instead of {a.redispatched_cq_entries}")
    if b.version == VERSION_53 and a.mode == "normal":
        out.append("5.0.0–5.3.1 start normal recovery at the third-from-last file like 4.9 but do not back-fill "
                   "consume queues after a clean restart")
    return out
