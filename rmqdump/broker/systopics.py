"""System-topic resolution: where a record in a broker-internal topic is really going.

The broker parks messages in internal topics and keeps the real destination in properties
(§4): delay-level messages in ``SCHEDULE_TOPIC_XXXX`` (queue = level − 1), transaction half
messages in ``RMQ_SYS_TRANS_HALF_TOPIC`` with op records (tag ``d``, body = half queue
offsets as text) in ``RMQ_SYS_TRANS_OP_HALF_TOPIC``, 5.x timer messages in
``rmq_sys_wheel_timer`` (due time in ``TIMER_OUT_MS``), consumer retries in ``%RETRY%<group>``
and dead letters in ``%DLQ%<group>``.

:func:`resolve` says what one record is. :class:`PendingTracker` (fed every record of a
commitlog walk, in offset order) works out what the broker still owes: delayed messages not
yet delivered (checked against ``config/delayOffset.json`` **and** against a delivered copy
with the same UNIQ_KEY in the real topic), half messages without an op record, timer
messages without a delivered copy or a cancellation, and pre-4.3 style PREPARED records
without a COMMIT/ROLLBACK record pointing at them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)

#: 5.x timer cancellation marker (``MessageConst.PROPERTY_TIMER_DEL_UNIQKEY``), value ``topic+uniqKey``.
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
#: Tag of transaction op records (``TransactionalMessageUtil.REMOVE_TAG``).
OP_REMOVE_TAG = "d"

#: Record kinds :func:`resolve` returns.
KINDS = ("normal", "delay", "timer", "timer_delete", "tx_half", "tx_op", "tx_commit", "tx_prepared",
         "tx_rollback", "retry", "dlq")
#: Keys of the dict :func:`resolve` returns (always all present, ``None`` when not applicable).
RESOLVED_FIELDS = ("kind", "real_topic", "real_queue_id", "level", "due_time", "group", "origin_msg_id",
                   "check_times", "half_queue_offsets", "via")

#: Pending states. ``pending``: the broker still owes it. ``delivered``/``resolved``: done.
#: ``redeliver``: a delivered copy exists but the persisted delay offset is behind it (the
#: broker would deliver a duplicate after a restart). ``lost``: the persisted offset says
#: delivered but no copy is on disk. ``superseded``: an older copy replaced by a re-put one
#: (transaction check-back, timer roll). ``cancelled``: a 5.x timer deleted before its time.
STATES = ("pending", "delivered", "resolved", "redeliver", "lost", "superseded", "cancelled")
#: States that mean "the broker still owes this" (listed by ``rmqdump pending`` by default).
OWED_STATES = frozenset({"pending"})
#: States that indicate an inconsistency worth reporting.
ANOMALY_STATES = frozenset({"lost", "redeliver"})


#: Prefix of light message queues (``MixAll.LMQ_PREFIX``): always queue id 0.
LMQ_PREFIX = "%LMQ%"


def multi_dispatch_targets(properties: Mapping[str, str], queue_id: int) -> list[tuple[str, int, int]]:
    """The extra queues LMQ multi-dispatch (4.9.3+, ``enableMultiDispatch``) put one record in.

    ``(topic, queue id, queue offset)`` for each name in ``INNER_MULTI_DISPATCH`` with its offset
    from ``INNER_MULTI_QUEUE_OFFSET`` (as ``ConsumeQueue.multiDispatchLmqQueue``: ``%LMQ%`` queues
    are queue 0, other names get the record's queue id). Empty when the record was not
    multi-dispatched, or when the two lists do not pair up (the broker then dispatches none).
    """
    names = properties.get(PROPERTY_INNER_MULTI_DISPATCH)
    offsets = properties.get(PROPERTY_INNER_MULTI_QUEUE_OFFSET)
    if not names or not offsets:
        return []
    names_l, offsets_l = names.split(","), offsets.split(",")
    if len(names_l) != len(offsets_l):
        return []
    out = []
    for name, off in zip(names_l, offsets_l, strict=True):
        value = _int(off)
        if value is None:
            return []
        out.append((name, 0 if name.startswith(LMQ_PREFIX) else queue_id, value))
    return out


def multi_dispatched_to(msg, topic: str, queue_id: int, queue_offset: int | None = None) -> bool:
    """Whether multi-dispatch put ``msg`` into ``topic``/``queue_id`` (at ``queue_offset`` if given).

    A ``%LMQ%`` queue's entries point at records of the parent topic: that is what LMQ means.
    """
    for name, qid, off in multi_dispatch_targets(msg.properties, msg.queue_id):
        if name == topic and (qid == queue_id or (name.startswith(LMQ_PREFIX) and queue_id == msg.queue_id)) \
                and (queue_offset is None or off == queue_offset):
            return True
    return False


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    v = value.strip()
    if v[:1] in "+-":
        ok = v[1:].isdigit()
    else:
        ok = v.isdigit()
    return int(v) if ok and v.isascii() else None


def parse_op_body(body: bytes | None) -> list[int]:
    """Half queue offsets named by an op record body: ``"5"`` (4.x) or ``"5,6,9"`` (5.x batches)."""
    if not body:
        return []
    out = []
    for part in body.decode("ascii", "replace").split(","):
        n = _int(part)
        if n is not None and n >= 0:
            out.append(n)
    return out


def _fields(msg) -> tuple[str, int, Mapping[str, str], int, int, bytes | None, int, int]:
    """(topic, queue_id, properties, sys_flag, store_timestamp, body, offset, prepared) of a Message or dict."""
    if isinstance(msg, Mapping):
        body = msg.get("_body")
        return (msg.get("topic") or "", msg.get("queue_id") or 0, msg.get("properties") or {},
                msg.get("sys_flag") or 0, msg.get("store_timestamp") or 0, body, msg.get("offset") or 0,
                msg.get("prepared_transaction_offset") or 0)
    return (msg.topic, msg.queue_id, msg.properties, msg.sys_flag, msg.store_timestamp, msg.body, msg.offset,
            msg.prepared_transaction_offset)


def delay_due_time(store_timestamp: int, level: int, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> int:
    """Delivery time of a delay-level record, as the dispatcher computes it (§7)."""
    lvl = min(level, len(delay_levels_ms))
    if lvl <= 0:
        return store_timestamp
    return store_timestamp + delay_levels_ms[lvl - 1]


_KIND_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC, RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC})


def resolved_by_topic(topic: str) -> bool:
    """Whether :func:`resolve` names the record's kind (and destination) from its topic: the delay, timer and
    transaction system topics, retry and DLQ topics. Any other record's kind follows its transaction type."""
    return topic in _KIND_TOPICS or topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))


def resolve(msg, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> dict:
    """What a record is and where it is really going.

    ``msg`` is a :class:`rmqdump.codec.record.Message` or a dict in the JSONL schema (for op
    records pass the raw body as ``_body``). Returns a dict with every key of
    :data:`RESOLVED_FIELDS`; ``real_topic``/``real_queue_id`` are the destination (the
    record's own for ordinary messages) and ``due_time`` is epoch ms for delay/timer records.
    """
    topic, qid, props, sys_flag, store_ts, body, _offset, _prepared = _fields(msg)
    out = dict.fromkeys(RESOLVED_FIELDS)
    out["kind"] = "normal"
    out["real_topic"] = topic
    out["real_queue_id"] = qid
    real_topic = props.get(PROPERTY_REAL_TOPIC)
    real_qid = _int(props.get(PROPERTY_REAL_QUEUE_ID))
    tran = sys_flag & TRANSACTION_TYPE_MASK
    if topic == SCHEDULE_TOPIC:
        out["kind"] = "delay"
        level = _int(props.get(PROPERTY_DELAY_TIME_LEVEL))
        if level is None:
            level = qid + 1
        out["level"] = level
        out["due_time"] = delay_due_time(store_ts, level, delay_levels_ms)
        out["real_topic"], out["real_queue_id"] = real_topic, real_qid
        if real_topic and real_topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            out["group"] = real_topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            out["origin_msg_id"] = props.get(PROPERTY_ORIGIN_MESSAGE_ID)
    elif topic == TIMER_TOPIC:
        out["real_topic"], out["real_queue_id"] = real_topic, real_qid
        if PROPERTY_TIMER_DEL_UNIQKEY in props:
            out["kind"] = "timer_delete"
        else:
            out["kind"] = "timer"
        out["due_time"] = _int(props.get(PROPERTY_TIMER_OUT_MS)) or _timer_request(props, store_ts)
    elif topic == RMQ_SYS_TRANS_HALF_TOPIC:
        out["kind"] = "tx_half"
        out["real_topic"], out["real_queue_id"] = real_topic, real_qid
        out["check_times"] = _int(props.get(PROPERTY_TRANSACTION_CHECK_TIMES)) or 0
    elif topic == RMQ_SYS_TRANS_OP_HALF_TOPIC:
        out["kind"] = "tx_op"
        out["real_topic"], out["real_queue_id"] = RMQ_SYS_TRANS_HALF_TOPIC, qid
        out["half_queue_offsets"] = parse_op_body(body) if body is not None else None
    elif topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        out["kind"] = "retry"
        out["group"] = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        out["real_topic"] = props.get(PROPERTY_RETRY_TOPIC)
        out["real_queue_id"] = None
        out["origin_msg_id"] = props.get(PROPERTY_ORIGIN_MESSAGE_ID)
    elif topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
        out["kind"] = "dlq"
        out["group"] = topic[len(DLQ_GROUP_TOPIC_PREFIX):]
        out["real_topic"] = props.get(PROPERTY_DLQ_ORIGIN_TOPIC) or props.get(PROPERTY_RETRY_TOPIC)
        out["real_queue_id"] = None
        out["origin_msg_id"] = props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID) or props.get(PROPERTY_ORIGIN_MESSAGE_ID)
    elif tran == TRANSACTION_COMMIT_TYPE:
        out["kind"] = "tx_commit"
    elif tran == TRANSACTION_PREPARED_TYPE:
        out["kind"] = "tx_prepared"
    elif tran == TRANSACTION_ROLLBACK_TYPE:
        out["kind"] = "tx_rollback"
    if out["kind"] in ("normal", "tx_commit", "retry"):
        # a delivered copy keeps the properties of its detour
        if PROPERTY_TIMER_OUT_MS in props or PROPERTY_TIMER_ENQUEUE_MS in props:
            out["via"] = "timer"
        elif PROPERTY_DELAY_TIME_LEVEL in props and real_topic:
            out["via"] = "delay"
            out["level"] = _int(props.get(PROPERTY_DELAY_TIME_LEVEL))
    return out


def _timer_request(props: Mapping[str, str], store_ts: int) -> int | None:
    """Due time of a 5.x timer request that has no TIMER_OUT_MS yet."""
    deliver = _int(props.get(PROPERTY_TIMER_DELIVER_MS))
    if deliver is not None:
        return deliver
    sec = _int(props.get(PROPERTY_TIMER_DELAY_SEC))
    if sec is not None:
        return store_ts + sec * 1000
    ms = _int(props.get(PROPERTY_TIMER_DELAY_MS))
    return store_ts + ms if ms is not None else None


def timer_del_target(value: str) -> str:
    """The UNIQ_KEY a ``TIMER_DEL_UNIQKEY`` value (``topic+uniqKey``) cancels."""
    return value.rsplit("+", 1)[-1]


# --- pending computation ----------------------------------------------------------------------


@dataclass
class Candidate:
    """A system-topic record whose fate is being decided."""

    kind: str  # delay | timer | tx_half | tx_prepared
    offset: int
    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp: int
    uniq_key: str | None
    keys: list[str]
    tags: str | None
    resolved: dict
    size: int = 0
    state: str = "pending"
    detail: str = ""
    delivered_offset: int | None = None  # offset of the delivered / commit copy

    def to_dict(self) -> dict:
        r = self.resolved
        return {
            "kind": self.kind, "state": self.state, "topic": self.topic, "queue_id": self.queue_id,
            "queue_offset": self.queue_offset, "offset": self.offset, "real_topic": r["real_topic"],
            "real_queue_id": r["real_queue_id"], "level": r["level"], "due_time": r["due_time"],
            "store_timestamp": self.store_timestamp, "uniq_key": self.uniq_key, "keys": self.keys,
            "tags": self.tags, "delivered_offset": self.delivered_offset, "detail": self.detail,
        }


#: Row columns of :meth:`Candidate.to_dict` (the ``pending`` command's schema).
PENDING_FIELDS = ("kind", "state", "topic", "queue_id", "queue_offset", "offset", "real_topic", "real_queue_id",
                  "level", "due_time", "store_timestamp", "uniq_key", "keys", "tags", "delivered_offset", "detail")


@dataclass
class PendingTracker:
    """Feed every Message of a walk (offset order) to :meth:`add`, then call :meth:`finish`.

    ``delay_offsets`` is ``config/delayOffset.json`` ({level: next queue offset to deliver}),
    or None when the store has none (then only delivered copies are used). Op records need
    their bodies (walk with ``read_body=True``).
    """

    delay_offsets: Mapping[int, int] | None = None
    delay_levels_ms: list[int] = field(default_factory=lambda: list(DEFAULT_DELAY_LEVELS_MS))
    candidates: list[Candidate] = field(default_factory=list)
    _by_uniq: dict[str, list[Candidate]] = field(default_factory=dict)  # delay/timer awaiting a copy
    _halves: dict[tuple[int, int], Candidate] = field(default_factory=dict)  # (queue, queue offset)
    _half_by_offset: dict[int, Candidate] = field(default_factory=dict)
    _half_by_uniq: dict[str, list[Candidate]] = field(default_factory=dict)
    _ops: set[tuple[int, int]] = field(default_factory=set)
    _commits_by_prepared: dict[int, int] = field(default_factory=dict)
    _commit_uniq: dict[str, int] = field(default_factory=dict)
    _legacy_done: dict[int, tuple[str, int]] = field(default_factory=dict)
    _cancelled: dict[str, int] = field(default_factory=dict)
    _timers_by_uniq: dict[str, list[Candidate]] = field(default_factory=dict)
    records: int = 0
    copy_topics: set[str] = field(default_factory=set)  # real topics of candidates awaiting a copy (only grows)

    def matters(self, topic: str, sys_flag: int) -> bool:
        """Whether :meth:`add` can change anything for a record of ``topic`` and ``sys_flag``: a system topic, a
        transaction record, or a topic a delivered copy may be in. Any other record only counts (:meth:`skip`)."""
        return (sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_NOT_TYPE or topic in self.copy_topics
                or resolved_by_topic(topic))

    def skip(self, n: int) -> None:
        """Account for ``n`` records :meth:`matters` says nothing about."""
        self.records += n

    def add(self, msg) -> None:
        """Account for one decoded record (a :class:`~rmqdump.codec.record.Message`)."""
        self.records += 1
        topic = msg.topic
        if topic == RMQ_SYS_TRANS_OP_HALF_TOPIC:
            if msg.tags == OP_REMOVE_TAG or msg.tags is None:
                for qo in parse_op_body(msg.body):
                    self._ops.add((msg.queue_id, qo))
            return
        r = resolve(msg, self.delay_levels_ms)
        kind = r["kind"]
        uniq = msg.uniq_key
        if kind in ("delay", "timer", "tx_half", "tx_prepared"):
            c = Candidate(kind, msg.offset, topic, msg.queue_id, msg.queue_offset, msg.store_timestamp, uniq,
                          msg.keys, msg.tags, r, msg.size)
            self.candidates.append(c)
            if kind == "tx_half":
                self._halves[(msg.queue_id, msg.queue_offset)] = c
                self._half_by_offset[msg.offset] = c
                if uniq:
                    self._half_by_uniq.setdefault(uniq, []).append(c)
            elif uniq:
                self._by_uniq.setdefault(uniq, []).append(c)
                if r["real_topic"] is not None:
                    self.copy_topics.add(r["real_topic"])
                if kind == "timer":
                    self._timers_by_uniq.setdefault(uniq, []).append(c)
            return
        if kind == "timer_delete":
            target = msg.properties.get(PROPERTY_TIMER_DEL_UNIQKEY)
            if target:
                self._cancelled[timer_del_target(target)] = msg.offset
            return
        if kind == "tx_commit":
            self._commits_by_prepared[msg.prepared_transaction_offset] = msg.offset
            if uniq:
                self._commit_uniq[uniq] = msg.offset
            self._legacy_done[msg.prepared_transaction_offset] = ("commit", msg.offset)
        elif kind == "tx_rollback":
            self._legacy_done[msg.prepared_transaction_offset] = ("rollback", msg.offset)
        # a delivered copy: same UNIQ_KEY, written later, in the candidate's real topic
        if uniq and uniq in self._by_uniq:
            for c in self._by_uniq[uniq]:
                if c.delivered_offset is None and c.resolved["real_topic"] == topic and msg.offset > c.offset:
                    c.delivered_offset = msg.offset
                    break

    def finish(self) -> list[Candidate]:
        """Decide every candidate's state; returns all candidates in offset order."""
        for c in self.candidates:
            if c.kind == "delay":
                self._decide_delay(c)
            elif c.kind == "timer":
                self._decide_timer(c)
            elif c.kind == "tx_half":
                self._decide_half(c)
            elif c.kind == "tx_prepared":
                done = self._legacy_done.get(c.offset)
                if done:
                    c.state, c.delivered_offset = "resolved", done[1]
                    c.detail = f"{done[0]} record at {done[1]}"
                else:
                    c.detail = "PREPARED record with no COMMIT/ROLLBACK record pointing at it"
        return self.candidates

    def _decide_delay(self, c: Candidate) -> None:
        level = c.resolved["level"]
        copy = c.delivered_offset is not None
        offset_done = None
        if self.delay_offsets is not None:
            offset_done = c.queue_offset < self.delay_offsets.get(level, 0)
        where = f"delayOffset.json level {level} = {self.delay_offsets.get(level, 0)}" \
            if self.delay_offsets is not None else "no delayOffset.json"
        if copy and offset_done is not False:
            c.state = "delivered"
            c.detail = f"delivered copy at {c.delivered_offset}"
        elif copy:
            c.state = "redeliver"
            c.detail = (f"delivered copy at {c.delivered_offset}, but {where}: the broker would deliver it "
                        "again after a restart")
        elif offset_done:
            c.state = "lost"
            c.detail = f"{where} says delivered, but no copy with its UNIQ_KEY is in {c.resolved['real_topic']}"
        else:
            c.state = "pending"
            c.detail = where
        if not c.uniq_key and c.state != "delivered":
            c.detail += "; no UNIQ_KEY, so delivered copies cannot be matched"

    def _decide_timer(self, c: Candidate) -> None:
        if c.uniq_key and c.uniq_key in self._cancelled:
            c.state, c.detail = "cancelled", f"deleted by the record at {self._cancelled[c.uniq_key]}"
        elif c.delivered_offset is not None:
            c.state, c.detail = "delivered", f"delivered copy at {c.delivered_offset}"
        else:
            copies = self._timers_by_uniq.get(c.uniq_key or "", [])
            if copies and copies[-1] is not c:
                c.state, c.detail = "superseded", f"rolled over: re-put at {copies[-1].offset}"
            else:
                c.state, c.detail = "pending", "no delivered copy with its UNIQ_KEY"

    def _decide_half(self, c: Candidate) -> None:
        if (c.queue_id, c.queue_offset) in self._ops:
            commit = self._commits_by_prepared.get(c.offset)
            if commit is None and c.uniq_key:
                commit = self._commit_uniq.get(c.uniq_key)
            c.state = "resolved"
            if commit is not None:
                c.delivered_offset = commit
                c.detail = f"op record present; committed (record at {commit})"
            else:
                c.detail = "op record present; rolled back"
            return
        copies = self._half_by_uniq.get(c.uniq_key or "", [])
        later = [h for h in copies if h.offset > c.offset]
        if later:
            c.state = "superseded"
            c.detail = f"checked back and re-put at {later[0].offset} (queue offset {later[0].queue_offset})"
            return
        commit = self._commits_by_prepared.get(c.offset)
        if commit is not None:
            c.state, c.delivered_offset = "resolved", commit
            c.detail = f"committed (record at {commit}) but no op record yet: the broker may check it back"
            return
        c.state = "pending"
        c.detail = "no op record: the broker will check the producer back"


def pending_states(messages: Iterable, delay_offsets: Mapping[int, int] | None = None,
                   delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> list[Candidate]:
    """Run a :class:`PendingTracker` over ``messages`` (Message objects, offset order)."""
    t = PendingTracker(delay_offsets, list(delay_levels_ms))
    for m in messages:
        t.add(m)
    return t.finish()
