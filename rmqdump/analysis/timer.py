"""What a 5.x broker's timer store holds and what its ``TimerMessageStore`` would do with it at the next start.

The model (RocketMQ 5.3.3 ``TimerMessageStore.recover``/``dequeue``):

* the timerlog is walked from the file holding ``lastTimerLogFlushPos - fileSize``; every unit up to the first
  bytes that are no unit re-links its wheel slot (``reviseSlot(delayedTime, IGNORE, pos, force)``: the slot's
  last position becomes the unit; a slot that held another time is overwritten, first = last = the unit);
  the log ends there (later files are deleted);
* the read time is the checkpoint's ``lastReadTimeMs``, moved up to ``now - 7 days + 60 slots`` if older
  (what lies before is skipped);
* from the read time on, each slot whose stored time matches is delivered by walking its chain: the slot's
  ``lastPos``, then each unit's ``prevPos`` until -1; each unit's commitlog record (``offsetPy``, ``sizePy``)
  is read back and put into its real topic (``MAGIC_ROLL``: re-filed into the timer topic, ``MAGIC_DELETE``:
  a cancel marker).

A unit is ``pending`` (the broker will deliver it), ``delivered`` (its slot is before the read time),
``expired`` (skipped: older than the wheel's 7 days at ``now``), ``orphaned`` (its slot is due but its chain
does not reach it: never delivered) or ``dropped`` (after the end the broker's recovery keeps).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.javahash import java_string_hash
from rmqdump.codec.layout import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_OUT_MS,
    STORE_CONFIG_DIR,
    STORE_TIMERLOG_DIR,
    STORE_TIMERWHEEL_FILE,
    TIMER_BLANK_SLOTS,
    TIMER_CHECK_FILE,
    TIMER_LOG_UNIT_SIZE,
    TIMER_PRECISION_MS,
    TIMER_SLOTS_TOTAL,
    TIMER_TOPIC,
    TIMER_WHEEL_SLOTS,
)
from rmqdump.codec.record import Message
from rmqdump.errors import RmqdumpError
from rmqdump.store.timer import (
    LogStop,
    Slot,
    TimerCheckpoint,
    TimerLog,
    TimerMetrics,
    TimerUnit,
    TimerWheelFile,
    load_timer_metrics,
    read_timer_checkpoint,
    read_wheel,
    timer_metrics_load_fails,
)

PENDING, DELIVERED, EXPIRED, ORPHANED, DROPPED = "pending", "delivered", "expired", "orphaned", "dropped"
STATES = (PENDING, ORPHANED, DROPPED, EXPIRED, DELIVERED)
#: record verdicts for a unit's offsetPy/sizePy
REC_OK, REC_BEYOND, REC_BAD = "ok", "beyond_end", "bad"
CHAIN_LIMIT = 10_000_000


@dataclass
class TimerEntry:
    """One timerlog unit, judged; ``topic``/``keys``/... come from its commitlog record when readable."""

    unit: TimerUnit
    file: str
    state: str = DELIVERED
    bucket_ms: int = 0
    slot: int = 0
    record: str | None = None  # REC_* (checked for pending units only)
    record_detail: str = ""
    topic: str | None = None
    queue_id: int | None = None
    keys: str | None = None
    uniq_key: str | None = None
    due_ms: int | None = None

    @property
    def kind(self) -> str:
        return "delete" if self.unit.delete and not self.unit.roll else "roll" if self.unit.roll else "timer"

    def to_dict(self) -> dict:
        u = self.unit
        return {"state": self.state, "kind": self.kind, "bucket_ms": self.bucket_ms, "slot": self.slot,
                "due_ms": self.due_ms, "topic": self.topic, "queue_id": self.queue_id, "keys": self.keys,
                "uniq_key": self.uniq_key, "offset_py": u.offset_py, "size_py": u.size_py,
                "record": self.record, "record_detail": self.record_detail or None,
                "timerlog_file": self.file, "timerlog_pos": u.pos, "prev_pos": u.prev_pos, "magic": u.magic,
                "enqueue_ms": u.curr_write_time_ms, "topic_hash": u.topic_hash}


@dataclass
class ChainIssue:
    """A wheel slot whose chain the broker cannot follow as filed: ``kind`` ``dangling`` (a position that is
    no unit of the log), ``loop``, ``cross`` (a unit filed under another time) or ``first`` (its firstPos is no
    unit of the slot)."""

    kind: str
    slot: Slot
    pos: int
    detail: str


@dataclass
class TimerState:
    """The timer store of one broker store, read and judged (see the module docstring)."""

    root: Path
    precision_ms: int
    precision_source: str  # "given", "wheel" (inferred from a slot and its unit) or "default"
    now_ms: int
    checkpoint: TimerCheckpoint | None
    metrics: TimerMetrics | None
    wheel: TimerWheelFile | None
    log: TimerLog | None
    log_file_size: int | None
    log_end: int
    recovery_begin: int
    read_time_ms: int
    entries: list[TimerEntry] = field(default_factory=list)
    stops: list[LogStop] = field(default_factory=list)
    slots: dict[int, Slot] = field(default_factory=dict)  # after the recovery's re-linking
    chain_issues: list[ChainIssue] = field(default_factory=list)
    problems: list[tuple[str, str, int | None, str]] = field(default_factory=list)  # (kind, file, offset, detail)
    commitlog_end: int | None = None
    timer_queue_max: int | None = None  # max offset of consumequeue/rmq_sys_wheel_timer/0 after recovery
    enqueue_from: int | None = None  # the timer queue offset the broker's enqueue resumes at
    last_unit_queue_offset: int | None = None  # the timer queue offset of the last unit's record

    @property
    def not_enqueued(self) -> int | None:
        """Timer-topic records from where the enqueue resumes: not in the timerlog yet, or again."""
        if self.timer_queue_max is None or self.enqueue_from is None:
            return None
        return max(0, self.timer_queue_max - self.enqueue_from)

    @property
    def enqueued_again(self) -> int:
        """Records that already have a unit and that the resumed enqueue files again (delivered twice)."""
        if self.enqueue_from is None or self.last_unit_queue_offset is None:
            return 0
        end = self.last_unit_queue_offset + 1
        if self.timer_queue_max is not None:
            end = min(end, self.timer_queue_max)
        return max(0, end - self.enqueue_from)

    @property
    def pending(self) -> list[TimerEntry]:
        return [e for e in self.entries if e.state == PENDING]

    def counts(self) -> dict[str, int]:
        c = Counter(e.state for e in self.entries)
        return {s: c[s] for s in STATES}

    def buckets(self) -> list[dict]:
        """Per delivery-time bucket (slot time): what is pending."""
        by: dict[int, list[TimerEntry]] = {}
        for e in self.pending:
            by.setdefault(e.bucket_ms, []).append(e)
        return [{"bucket_ms": t, "slot": by[t][0].slot, "count": len(by[t]),
                 "topics": dict(Counter(e.topic or "?" for e in by[t]))} for t in sorted(by)]

    def summary(self) -> dict:
        cp = self.checkpoint
        return {
            "precision_ms": self.precision_ms, "precision_source": self.precision_source,
            "now_ms": self.now_ms, "read_time_ms": self.read_time_ms,
            "timerlog_files": len(self.log.files) if self.log else 0, "timerlog_file_size": self.log_file_size,
            "timerlog_end": self.log_end, "recovery_begin": self.recovery_begin,
            "units": len(self.entries), "states": self.counts(),
            "wheel_size": self.wheel.size if self.wheel else None,
            "wheel_slots_used": len(self.wheel.slots) if self.wheel else 0,
            "checkpoint": cp.to_dict() if cp else None,
            "metrics": dict(self.metrics.counts) if self.metrics else None,
            "commitlog_end": self.commitlog_end,
            "timer_queue_max_offset": self.timer_queue_max, "enqueue_from": self.enqueue_from,
            "last_unit_queue_offset": self.last_unit_queue_offset, "not_enqueued": self.not_enqueued,
            "enqueued_again": self.enqueued_again,
        }


def has_timer_store(root: str | os.PathLike | None) -> bool:
    """Whether ``root`` holds any file of a timer store."""
    if root is None:
        return False
    r = Path(root)
    return any(p.exists() for p in (r / STORE_TIMERLOG_DIR, r / STORE_TIMERWHEEL_FILE,
                                    r / STORE_CONFIG_DIR / TIMER_CHECK_FILE))


def timer_queue_bounds(root: str | os.PathLike) -> tuple[int, int] | None:
    """(min, max) offset of the timer topic's queue 0 after recovery (None: no such queue or unreadable)."""
    from rmqdump.store.consumequeue import ConsumeQueue

    try:
        q = ConsumeQueue.open(root, TIMER_TOPIC, 0, strict=False)
        return q.min_offset(), q.max_offset
    except RmqdumpError:
        return None


def predicted_queue_end(pred) -> int | None:
    """The timer topic's queue max offset after a :class:`~rmqdump.broker.recovery.RecoveryPrediction`
    (re-dispatch included), None if the prediction does not name that queue."""
    name = f"{TIMER_TOPIC}/0"
    for q in getattr(pred, "redispatched", ()):
        if q.queue == name:
            return q.new_end
    for q in [*getattr(pred, "queues", ()), *getattr(pred, "kept_invalid", ())]:
        if q.queue == name:
            return q.end_after
    return None


def _enqueue_from(st: TimerState, units: dict[int, TimerUnit], decode, bounds: tuple[int, int] | None) -> None:
    """``recover``'s queue offset: the last unit's record's queue offset + 1 (``reviseQueueOffset``), else the
    checkpoint's lastTimerQueueOffset; at most masterTimerQueueOffset; within the queue's bounds."""
    cp = st.checkpoint
    if cp is None:
        return
    last = units.get(st.log_end - TIMER_LOG_UNIT_SIZE)
    readable = last is not None and (st.commitlog_end is None or last.offset_py + last.size_py <= st.commitlog_end)
    m = decode(last.offset_py) if readable and decode is not None else None
    if isinstance(m, Message) and m.size == last.size_py:
        st.last_unit_queue_offset = m.queue_offset
        curr = m.queue_offset + 1
    else:
        curr = cp.last_timer_queue_offset
    curr = min(curr, cp.master_timer_queue_offset)
    if bounds is not None:
        curr = min(max(curr, bounds[0]), bounds[1])
    st.enqueue_from = curr


def _infer_precision(wheel: TimerWheelFile | None, units: dict[int, TimerUnit]) -> int | None:
    """``timerPrecisionMs`` from a slot and the unit its ``lastPos`` names (the setting is not on disk)."""
    if wheel is None:
        return None
    votes: Counter[int] = Counter()
    for s in wheel.slots.values():
        u = units.get(s.last_pos)
        if u is None or s.time_units <= 0 or u.delayed_ms <= 0:
            continue
        p = u.delayed_ms // s.time_units
        if p > 0 and u.delayed_ms // p == s.time_units and s.time_units % TIMER_WHEEL_SLOTS == s.index:
            votes[p] += 1
        if len(votes) and sum(votes.values()) >= 16:
            break
    return votes.most_common(1)[0][0] if votes else None


def _file_index(per_file: list, pos: int) -> int:
    """``recoverAndRevise``'s first file: the last one starting at or before ``pos`` (else the first)."""
    idx = 0
    for i, (f, _us, _s) in enumerate(per_file):
        if pos >= f.start:
            idx = i
    return idx


def _revise(slots: dict[int, Slot], u: TimerUnit, precision: int) -> None:
    """``TimerWheel.reviseSlot(delayedTime, IGNORE, pos, force=true)``."""
    t = u.delayed_ms // precision
    idx = t % TIMER_WHEEL_SLOTS
    s = slots.get(idx)
    if s is None or s.time_units != t:
        num, magic = (s.num, s.magic) if s is not None else (0, 0)
        slots[idx] = Slot(idx, t, u.pos, u.pos, num, magic)
    else:
        slots[idx] = Slot(idx, t, s.first_pos, u.pos, s.num, s.magic)


def read_timer_state(root: str | os.PathLike, *, now_ms: int, precision_ms: int | None = None,
                     decode: Callable[[int], Message | object] | None = None,
                     commitlog_end: int | None = None, decode_all: bool = False,
                     queue_end: int | None = None) -> TimerState:
    """Read ``root``'s timer store and judge every unit (see the module docstring).

    ``decode(offset)`` reads the commitlog record at an offset (a :class:`Message` or anything else for
    none); ``commitlog_end`` is where the broker's commitlog ends after its recovery (None: unknown).
    Records are read for the units the broker will read (pending, orphaned), for all with ``decode_all``.
    ``queue_end``: the timer topic's queue max offset after the broker's recovery (:func:`predicted_queue_end`;
    None: as on disk).
    Unreadable parts become ``problems`` (kind, file, offset, detail), never exceptions.
    """
    r = Path(root)
    problems: list[tuple[str, str, int | None, str]] = []

    def guarded(what: str, fn):
        try:
            return fn()
        except RmqdumpError as e:
            problems.append(("timer_unreadable", e.file or what, e.offset, f"{what}: {e.message}"))
            return None

    cp = guarded(f"{STORE_CONFIG_DIR}/{TIMER_CHECK_FILE}", lambda: read_timer_checkpoint(r / STORE_CONFIG_DIR / TIMER_CHECK_FILE))
    before = len(problems)
    metrics = guarded(f"{STORE_CONFIG_DIR}/timermetrics", lambda: load_timer_metrics(r))
    if len(problems) > before:  # neither config/timermetrics nor its .bak decodes (ConfigManager.load)
        kind, file, off, detail = problems[-1]
        if timer_metrics_load_fails(r):
            problems[-1] = (kind, file, off, f"{detail}; its .bak does not decode either: TimerMessageStore.load() "
                                             "fails and the broker does not start")
        else:
            problems[-1] = ("timer_metrics_lost", file, off, f"{detail}; no .bak holds a copy: the broker starts "
                                                             "with empty timer metrics")
    wheel = guarded(STORE_TIMERWHEEL_FILE, lambda: read_wheel(r / STORE_TIMERWHEEL_FILE))
    log = guarded(STORE_TIMERLOG_DIR, lambda: TimerLog.open(r / STORE_TIMERLOG_DIR)) \
        if (r / STORE_TIMERLOG_DIR).is_dir() else None

    units: dict[int, TimerUnit] = {}
    unit_file: dict[int, str] = {}
    stops: list[LogStop] = []
    per_file: list[tuple[object, list[TimerUnit], LogStop]] = []
    if log is not None:
        for name, off, detail in log.problems:
            problems.append(("timer_log_files", f"{STORE_TIMERLOG_DIR}/{name}", off, detail))
        for f in log.files:
            got = guarded(f"{STORE_TIMERLOG_DIR}/{f.name}", f.units)
            if got is None:
                break
            us, stop = got
            per_file.append((f, us, stop))
            stops.append(stop)
            for u in us:
                units[u.pos] = u
                unit_file[u.pos] = f.name

    inferred = None if precision_ms else _infer_precision(wheel, units)
    precision = precision_ms or inferred or TIMER_PRECISION_MS
    source = "given" if precision_ms else "wheel" if inferred else "default"

    read_time = cp.last_read_time_ms if cp else 0
    window = now_ms // precision * precision - TIMER_SLOTS_TOTAL * precision + TIMER_BLANK_SLOTS * precision
    read_time = max(read_time, window)

    # recovery: re-link the slots of the units from the file holding lastTimerLogFlushPos - fileSize
    slots = dict(wheel.slots) if wheel is not None and wheel.size_ok else {}
    file_size = log.file_size if log else None
    begin = max(0, (cp.last_timer_log_flush_pos if cp else 0) - (log.files[-1].size if log and log.files else 0))
    log_end = 0
    kept: set[int] = set(units)
    if per_file:
        start_i = _file_index(per_file, begin)
        log_end = per_file[start_i][0].start
        for i in range(start_i, len(per_file)):
            f, us, stop = per_file[i]
            for u in us:
                _revise(slots, u, precision)
            log_end = stop.pos
            if stop.reason not in ("blank", "end"):
                for _f, later, _st in per_file[i + 1:]:
                    kept.difference_update(u.pos for u in later)
                break
        # checkPhyPos(readTime, logEnd): a slot due from the read time on whose lastPos is past the log end makes
        # the broker re-link once more, from the file holding the smallest such firstPos (no truncation)
        read_units = read_time // precision
        min_first = min((s.first_pos for s in slots.values() if read_units <= s.time_units < read_units
                         + TIMER_WHEEL_SLOTS and s.time_units % TIMER_WHEEL_SLOTS == s.index
                         and s.last_pos > log_end), default=None)
        if min_first is not None and min_first < log_end:
            for _f, us, _stop in per_file[_file_index(per_file, min_first):]:
                for u in us:
                    if u.pos in kept:
                        _revise(slots, u, precision)

    st = TimerState(r, precision, source, now_ms, cp, metrics, wheel, log, file_size, log_end, begin,
                    read_time, stops=stops, slots=slots, problems=problems, commitlog_end=commitlog_end)
    bounds = timer_queue_bounds(r)
    if queue_end is not None:
        bounds = (min(bounds[0], queue_end) if bounds else 0, queue_end)
    st.timer_queue_max = bounds[1] if bounds else None
    _enqueue_from(st, units, decode, bounds)

    # the chains the dequeue walks, from every slot due at or after the read time
    reached: set[int] = set()
    read_units = read_time // precision
    for s in sorted(slots.values(), key=lambda s: s.time_units):
        if s.time_units < read_units or s.time_units % TIMER_WHEEL_SLOTS != s.index or s.last_pos == -1:
            continue
        fu = units.get(s.first_pos) if s.first_pos in kept else None
        if fu is None or fu.delayed_ms // precision != s.time_units:
            st.chain_issues.append(ChainIssue("first", s, s.first_pos, (
                f"slot {s.index} (time {s.time_ms(precision)}): firstPos {s.first_pos} is no unit of that slot "
                "(the broker's checkPhyPos re-links and its metrics recount start from the smallest firstPos)")))
        pos, seen = s.last_pos, set()
        while pos != -1 and len(seen) < CHAIN_LIMIT:
            u = units.get(pos)
            if u is None or pos not in kept:
                st.chain_issues.append(ChainIssue("dangling", s, pos, (
                    f"slot {s.index} (time {s.time_ms(precision)}) reaches timerlog position {pos}, "
                    + ("which is no unit of the log" if u is None else "after the end the recovery keeps")
                    + f" (log end {log_end}): the broker reads no delivery there")))
                break
            if pos in seen:
                st.chain_issues.append(ChainIssue("loop", s, pos, f"slot {s.index}: the chain loops at {pos}"))
                break
            seen.add(pos)
            if u.delayed_ms // precision != s.time_units:
                st.chain_issues.append(ChainIssue("cross", s, pos, (
                    f"slot {s.index} (time {s.time_ms(precision)}) reaches the unit at {pos} filed for "
                    f"{u.delayed_ms}: the broker delivers it at the slot's time")))
            reached.add(pos)
            pos = u.prev_pos

    by_hash = {java_string_hash(t): t for t in (metrics.counts if metrics else ())}
    for pos in sorted(units):
        u = units[pos]
        e = TimerEntry(u, unit_file[pos], bucket_ms=u.delayed_ms // precision * precision,
                       slot=(u.delayed_ms // precision) % TIMER_WHEEL_SLOTS)
        if pos not in kept:
            e.state = DROPPED
        elif pos in reached:
            e.state = PENDING
        elif e.bucket_ms < (cp.last_read_time_ms if cp else 0) // precision * precision:
            e.state = DELIVERED
        elif e.bucket_ms < read_time:
            e.state = EXPIRED
        else:
            e.state = ORPHANED
        if decode_all or e.state in (PENDING, ORPHANED):
            _judge_record(e, decode, commitlog_end)
            if e.topic is None:
                e.topic = by_hash.get(u.topic_hash)  # the metrics' topic of that hash
        st.entries.append(e)
    return st


def _judge_record(e: TimerEntry, decode, commitlog_end: int | None) -> None:
    """What the broker's ``getMessageByCommitOffset(offsetPy, sizePy)`` finds for a unit it will read."""
    u = e.unit
    if commitlog_end is not None and u.offset_py + u.size_py > commitlog_end:
        e.record = REC_BEYOND
        e.record_detail = (f"commitlog offset {u.offset_py} + {u.size_py} bytes, past the commitlog end "
                           f"{commitlog_end}")
        return
    if decode is None:
        return
    m = decode(u.offset_py)
    if not isinstance(m, Message):
        e.record = REC_BEYOND if commitlog_end is None and getattr(m, "kind", "") == "end_of_data" else REC_BAD
        e.record_detail = f"no record at commitlog offset {u.offset_py}: {getattr(m, 'detail', m)}"
        return
    props = m.properties
    real = props.get(PROPERTY_REAL_TOPIC)
    e.topic = real if real is not None else m.topic
    qid = props.get(PROPERTY_REAL_QUEUE_ID)
    e.queue_id = int(qid) if qid is not None and qid.lstrip("-").isdigit() else None
    e.keys = " ".join(m.keys) or None
    e.uniq_key = m.uniq_key or props.get(PROPERTY_TIMER_DEL_UNIQKEY)
    out = props.get(PROPERTY_TIMER_OUT_MS)
    e.due_ms = int(out) if out is not None and out.lstrip("-").isdigit() else e.unit.delayed_ms
    problems = []
    if m.size != u.size_py:
        problems.append(f"the record there is {m.size} bytes, the unit says {u.size_py}")
    if m.topic != TIMER_TOPIC:
        problems.append(f"the record there is of topic {m.topic!r}, not {TIMER_TOPIC}")
    h = java_string_hash(real) if real is not None else 0
    if not problems and h != u.topic_hash:
        problems.append(f"its REAL_TOPIC {real!r} hashes to {h}, the unit holds {u.topic_hash}")
    e.record = REC_BAD if problems else REC_OK
    e.record_detail = "; ".join(problems)


__all__ = ["DELIVERED", "DROPPED", "EXPIRED", "ORPHANED", "PENDING", "REC_BAD", "REC_BEYOND", "REC_OK", "STATES",
           "ChainIssue", "TimerEntry", "TimerState", "has_timer_store", "predicted_queue_end", "read_timer_state",
           "timer_queue_bounds"]
