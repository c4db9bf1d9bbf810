"""The 5.x timer store's checks (:func:`check_timer`): what its ``TimerMessageStore`` would do wrong at the next
start. Every finding names something the broker acts on:

* ``timer_wheel_size`` (error): a ``timerwheel`` of another non-zero length than 38,707,200 bytes: the
  ``TimerWheel`` constructor throws, the broker does not start;
* ``timer_log_files`` (error): timerlog files of unequal sizes or with gaps, or a file whose name is no offset:
  ``MappedFileQueue.load`` fails (or throws) and the broker does not start;
* ``timer_unreadable`` (error): a timer file rmqdump cannot read (``config/timermetrics`` and its ``.bak`` both
  undecodable: ``TimerMetrics.load`` fails and the broker does not start);
* ``timer_metrics_lost`` (warning): ``config/timermetrics`` undecodable and no ``.bak`` holds a copy: the broker
  starts with empty timer metrics;
* ``timer_log_damaged`` (warning): bytes that are no unit before the end of a timerlog file's units; the
  broker's recovery truncates the timerlog there when it scans that file;
* ``timer_unit_beyond_commitlog`` (error; apache/rocketmq #10668): a unit to deliver whose commitlog record
  lies past the commitlog end (after a truncation): the delivery is lost, the dequeue retries and stalls;
* ``timer_unit_bad_record`` (error): a unit to deliver whose record is not the timer message it filed
  (another record, size or topic): lost, or another message delivered;
* ``timer_unit_orphaned`` (warning): a unit due at or after the read time that no wheel chain reaches:
  never delivered;
* ``timer_slot_dangling`` / ``timer_chain_loop`` / ``timer_chain_crosses_slot`` (warning): a slot's chain
  that leaves the log, loops, or delivers a unit filed for another time;
* ``timer_slot_first`` (info): a due slot's firstPos that is no unit of that slot: the broker's ``checkPhyPos``
  (its second re-linking pass) and its metrics recount start from the smallest firstPos;
* ``timer_checkpoint_ahead`` (warning): ``lastTimerLogFlushPos`` past the end of the timerlog's units:
  units the broker had flushed are gone;
* ``timer_enqueued_again`` (warning): the queue offset the broker's enqueue resumes at (the last unit's record
  + 1, at most the checkpoint's masterTimerQueueOffset) is before records that already have units: they are
  filed and delivered twice;
* ``timer_read_time_ahead`` (warning): the checkpoint's ``lastReadTimeMs`` is over a minute after now: the
  dequeue waits for the clock to get there, and every slot before it counts as delivered;
* ``timer_metrics_mismatch`` (info): ``config/timermetrics`` counts for a topic differ from the units
  waiting in the log (what ``checkAndReviseMetrics`` would reset them to).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from rmqdump.analysis.timer import (
    ORPHANED,
    PENDING,
    REC_BAD,
    REC_BEYOND,
    TimerState,
    has_timer_store,
    predicted_queue_end,
    read_timer_state,
)
from rmqdump.codec.javahash import java_string_hash
from rmqdump.codec.layout import (
    STORE_CONFIG_DIR,
    STORE_TIMERLOG_DIR,
    STORE_TIMERWHEEL_FILE,
    TIMER_CHECK_FILE,
    TIMER_SLOT_SIZE,
    TIMER_TOPIC,
)
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.checkpoint import ms_to_iso

_CHAIN_KINDS = {"dangling": "timer_slot_dangling", "loop": "timer_chain_loop", "cross": "timer_chain_crosses_slot",
                "first": "timer_slot_first"}
READ_TIME_SLACK_MS = 60_000  # clocks of the broker and of this machine may differ a little
_PROBLEM_SEVERITY = {"timer_unreadable": ERROR, "timer_log_files": ERROR, "timer_metrics_lost": WARNING}


def _slot_file_pos(index: int) -> int:
    return index * TIMER_SLOT_SIZE


def verify_timer(store, cache, pred, *, max_per_kind: int = 1000) -> list[Finding]:
    """``verify``'s hook: the timer findings of ``store`` (none without a timer store); ``cache`` reads the
    commitlog records, ``pred`` is the recovery prediction (None: none could be made)."""
    if not has_timer_store(store.root):
        return []
    st = read_timer_state(store.root, now_ms=int(time.time() * 1000),
                          commitlog_end=pred.max_offset if pred is not None else None,
                          queue_end=predicted_queue_end(pred) if pred is not None else None,
                          decode=lambda off: cache.decode(off, check_crc=True))
    return check_timer(st, max_per_kind=max_per_kind)


def check_timer(st: TimerState, *, max_per_kind: int = 1000) -> list[Finding]:
    """Findings about ``st`` (file names relative to the store root; offsets are byte positions in that
    file: the timerlog's are timerlog offsets, the same as its file names count)."""
    out: list[Finding] = []
    for kind, file, off, detail in st.problems:
        out.append(Finding(_PROBLEM_SEVERITY.get(kind, ERROR), kind, _rel(st, file), off, detail))
    if st.wheel is not None and not st.wheel.size_ok:
        out.append(Finding(ERROR, "timer_wheel_size", STORE_TIMERWHEEL_FILE, st.wheel.size,
                           f"the timer wheel is {st.wheel.size} bytes, not 38707200: the broker's TimerWheel "
                           "refuses it and the broker does not start"))
    for stop in st.stops:
        if stop.is_damage:
            out.append(Finding(WARNING, "timer_log_damaged", f"{STORE_TIMERLOG_DIR}/{stop.file}", stop.pos,
                               f"{stop.reason}: {stop.detail}: the units of this file end here; the broker's "
                               "recovery truncates the timerlog at this point when it scans this file"))
    n: Counter[str] = Counter()

    def add(f: Finding) -> None:
        n[f.kind] += 1
        if n[f.kind] <= max_per_kind:
            out.append(f)

    for e in st.entries:
        where = f"{STORE_TIMERLOG_DIR}/{e.file}"
        if e.state == PENDING and e.record == REC_BEYOND:
            add(Finding(ERROR, "timer_unit_beyond_commitlog", where, e.unit.pos,
                        f"timer delivery due {ms_to_iso(e.bucket_ms)} points at {e.record_detail}: the broker cannot read "
                        "it (the delivery is lost; its dequeue retries the read, apache/rocketmq #10668)"))
        elif e.state == PENDING and e.record == REC_BAD:
            add(Finding(ERROR, "timer_unit_bad_record", where, e.unit.pos,
                        f"timer delivery due {ms_to_iso(e.bucket_ms)} at commitlog offset {e.unit.offset_py}: "
                        f"{e.record_detail}"))
        elif e.state == ORPHANED:
            add(Finding(WARNING, "timer_unit_orphaned", where, e.unit.pos,
                        f"timer unit due {ms_to_iso(e.bucket_ms)} (commitlog offset {e.unit.offset_py}) is reached by no "
                        f"chain of its wheel slot {e.slot}: the broker never delivers it"))
    for c in st.chain_issues:
        add(Finding(INFO if c.kind == "first" else WARNING, _CHAIN_KINDS[c.kind], STORE_TIMERWHEEL_FILE,
                    _slot_file_pos(c.slot.index), c.detail))

    cp = st.checkpoint
    if cp is not None and st.log is not None and st.log.files and cp.last_timer_log_flush_pos > st.log_end:
        out.append(Finding(WARNING, "timer_checkpoint_ahead", f"{STORE_CONFIG_DIR}/{TIMER_CHECK_FILE}", 8,
                           f"lastTimerLogFlushPos {cp.last_timer_log_flush_pos} is past the end of the timerlog's "
                           f"units ({st.log_end}): units the broker had flushed are gone"))
    if st.enqueued_again:
        out.append(Finding(WARNING, "timer_enqueued_again", f"{STORE_CONFIG_DIR}/{TIMER_CHECK_FILE}", 24,
                           f"the timer's enqueue resumes at queue offset {st.enqueue_from} of {TIMER_TOPIC}/0 "
                           f"(masterTimerQueueOffset {cp.master_timer_queue_offset}) while the timerlog already holds "
                           f"units up to queue offset {st.last_unit_queue_offset}: {st.enqueued_again} timer "
                           "message(s) get a second unit and are delivered twice"))
    if cp is not None and cp.last_read_time_ms > st.now_ms + READ_TIME_SLACK_MS:
        out.append(Finding(WARNING, "timer_read_time_ahead", f"{STORE_CONFIG_DIR}/{TIMER_CHECK_FILE}", 0,
                           f"lastReadTimeMs {ms_to_iso(cp.last_read_time_ms)} is after now ({ms_to_iso(st.now_ms)}): "
                           "the broker's dequeue waits until its clock gets there and treats every slot before it "
                           "as delivered"))
    out += _metrics(st)
    return out


def _metrics(st: TimerState) -> list[Finding]:
    """``checkAndReviseMetrics``: per topic, the units from the read time on (+1, a delete marker -1)."""
    m = st.metrics
    if m is None or not st.entries:
        return []
    by_hash: Counter[int] = Counter()
    for e in st.entries:
        if e.bucket_ms >= st.read_time_ms and e.state in (PENDING, ORPHANED):
            by_hash[e.unit.topic_hash] += -1 if e.unit.delete else 1
    out = []
    for topic, count in sorted(m.counts.items()):
        want = by_hash.get(java_string_hash(topic), 0)
        if count != want:
            file = f"{STORE_CONFIG_DIR}/{m.path.name}" if m.path else f"{STORE_CONFIG_DIR}/timermetrics"
            out.append(Finding(INFO, "timer_metrics_mismatch", file, None,
                               f"timingCount[{topic!r}] is {count}, the timerlog holds {want} waiting unit(s) of "
                               "that topic (the broker's checkAndReviseMetrics would reset it)"))
    return out


def _rel(st: TimerState, file: str) -> str:
    try:
        return str(Path(file).relative_to(st.root))
    except ValueError:
        return file


__all__ = ["check_timer", "verify_timer"]
