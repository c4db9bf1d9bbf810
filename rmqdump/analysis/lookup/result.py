"""What a lookup answers (:class:`LookupResult`, :class:`Collision`) and the record helpers every lookup
shares: decoding the record at an offset with its body CRC judged, and describing what was found."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rmqdump.codec.record import Blank, Invalid, Message
from rmqdump.errors import RmqdumpError
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.geometry import StoreGeometry
from rmqdump.store.root import Store


@dataclass
class Collision:
    """A record reached through the key's hash slot whose topic or keys do not match."""

    offset: int
    topic: str
    keys: list[str]
    uniq_key: str | None
    reason: str

    def to_dict(self) -> dict:
        return {"offset": self.offset, "topic": self.topic, "keys": self.keys, "uniq_key": self.uniq_key,
                "reason": self.reason}


@dataclass
class LookupResult:
    """Confirmed records (newest first) and everything the caller should be told about them.

    ``source``: ``index``, ``scan``, ``index+scan``, ``consumequeue``, ``msg-id`` or ``offset``.
    ``reasons``: why (part of) the commitlog was scanned. ``unreadable``: index entries
    pointing at no valid record, as (offset, why). ``warnings``: anything else worth a line
    (host mismatch, CRC failures, index anomalies). ``scanned``: commitlog ranges walked. ``timing``:
    born vs store time of each hit and whether the broker's own query would return it;
    ``outside_window``: when a window found nothing, the key's records outside it (why "not found").
    """

    hits: list[Message] = field(default_factory=list)
    collisions: list[Collision] = field(default_factory=list)
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    truncated: bool = False
    source: str = "index"
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    scanned: list[tuple[int, int]] = field(default_factory=list)
    topics_searched: int = 0
    geometry: StoreGeometry | None = None
    timing: list[HitTiming] = field(default_factory=list)  # per hit (key lookups), in ``hits`` order
    outside_window: list[HitTiming] = field(default_factory=list)  # key matches outside --since/--until


def _open_store(store: Store | str | os.PathLike) -> Store:
    return store if isinstance(store, Store) else Store.open(store)



def read_message(cl: CommitLog, offset: int, *, use_mmap: bool = True, max_record_size: int | None = None
                 ) -> Message | Blank | Invalid:
    """Decode the record at ``offset`` with its body; ``crc_ok`` tells whether the body CRC holds.

    A body CRC mismatch does not hide the record (the broker's recovery would stop there,
    but the bytes are what the user is looking for).
    """
    kw = {"max_record_size": max_record_size} if max_record_size else {}
    rec = cl.decode_at(offset, use_mmap=use_mmap, check_crc=False, read_body=True, **kw)
    if isinstance(rec, Message) and rec.body_length > 0 and rec.body is not None:
        from rmqdump.codec.crc import body_crc

        rec.crc_ok = body_crc(rec.body) == rec.body_crc
    return rec


def _describe_invalid(rec: Blank | Invalid) -> str:
    if isinstance(rec, Blank):
        return f"end-of-file BLANK record ({rec.size} bytes)"
    return f"{rec.kind}: {rec.detail}"


def _crc_warning(msg: Message) -> str | None:
    if msg.crc_ok is False:
        return (f"record at {msg.offset} fails its body CRC (the broker's recovery stops there); shown as stored")
    return None


def _key_matches(msg: Message, key: str) -> bool:
    if key == msg.uniq_key:
        return True
    return key in msg.keys



def _iso(ms: int) -> str:
    from rmqdump.store.checkpoint import ms_to_iso

    return ms_to_iso(ms)


# --- the broker's own query window, and where each hit falls in it (apache/rocketmq #681, #5174) ----------

#: ``MQAdminImpl.queryMessageByUniqKey(topic, uniqKey)`` (4.x clients: viewMessage by client id, the dashboard,
#: ``consumeMessageDirectly``/resend) asks the broker from the time in the UNIQ_KEY minus this, to Long.MAX_VALUE
UNIQ_KEY_QUERY_SLACK_MS = 1000
JAVA_LONG_MAX = (1 << 63) - 1


@dataclass
class HitTiming:
    """Born vs store time of one hit, and whether the broker's own query would return it.

    ``skew_ms`` = store − born: negative when the producer's clock is ahead of the broker's.
    ``index_time``: the time ``IndexFile.selectPhyOffset`` compares with the window (the file's
    beginTimestamp + timeDiff·1000, whole seconds after it: up to 999 ms before the store time); None
    when no index entry of the key points at the record (the broker's query cannot return it).
    ``window``: ``[begin, end]`` of the broker's query (``QueryMessageRequestHeader``'s
    beginTimestamp/endTimestamp; ``how`` says which client asks for which). ``in_window`` None: no entry.
    """

    offset: int
    born_timestamp: int
    store_timestamp: int
    skew_ms: int
    index_time: int | None
    index_file: str | None
    window: tuple[int, int]
    how: str
    in_window: bool | None
    note: str = ""

    def to_dict(self) -> dict:
        return {"offset": self.offset, "born_timestamp": self.born_timestamp, "store_timestamp": self.store_timestamp,
                "skew_ms": self.skew_ms, "index_time": self.index_time, "index_file": self.index_file,
                "broker_window": list(self.window), "broker_window_how": self.how,
                "in_broker_window": self.in_window, "note": self.note}


def broker_window(msg: Message, key: str, begin: int | None, end: int | None, by_uniq_key: bool
                  ) -> tuple[tuple[int, int], str]:
    """The ``[begin, end]`` the broker's ``queryMessage`` would be given for this lookup, and who asks so."""
    if by_uniq_key:
        from rmqdump.codec.msgid import decode_uniq_key

        try:
            t = decode_uniq_key(key, reference_ms=msg.born_timestamp).timestamp
        except RmqdumpError:
            t = None
        if t is not None:
            return ((t - UNIQ_KEY_QUERY_SLACK_MS, JAVA_LONG_MAX),
                    "queryMessageByUniqKey (4.x viewMessage by client id, dashboard, resend): from the UNIQ_KEY's "
                    "time (the producer's clock) minus 1 s")
    return ((0 if begin is None else begin, JAVA_LONG_MAX if end is None else end),
            "queryMsgByKey / queryMessage(topic, key, maxNum, begin, end): the caller's window "
            "(here --since/--until; mqadmin's default 0 .. Long.MAX_VALUE)")


def _index_time(files: list, msg: Message, key: str) -> tuple[int | None, str | None]:
    """The time the broker reads from the index entry of ``topic#key`` that points at ``msg`` (newest file first)."""
    from rmqdump.codec.javahash import index_key, index_key_hash

    ikey = index_key(msg.topic, key)
    want = index_key_hash(ikey)
    for f in reversed(files):
        h = f.header
        if h.end_phy_offset and not h.begin_phy_offset <= msg.offset <= h.end_phy_offset:
            continue
        try:
            for e in f.walk(f.slot_for_key(ikey), strict=False):
                if e.key_hash == want and e.phy_offset == msg.offset and e.time_diff >= 0:
                    return f.entry_time(e), f.name
        except RmqdumpError:
            continue
    return None, None


def hit_timings(store: Store, geometry: StoreGeometry, hits: list[Message], key: str, begin: int | None,
                end: int | None, by_uniq_key: bool) -> list[HitTiming]:
    """:class:`HitTiming` of every hit, its index entry read from the store's index files."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    files = []
    try:
        for p in list_index_files(store.root) if store.root is not None else []:
            try:
                files.append(IndexFile(p, geometry.index_hash_slot_num, geometry.index_num, strict=False))
            except RmqdumpError:
                continue
        out = []
        for m in hits:
            (lo, hi), how = broker_window(m, key, begin, end, by_uniq_key)
            t, name = _index_time(files, m, key)
            skew = m.store_timestamp - m.born_timestamp
            inside = None if t is None else lo <= t <= hi
            if t is None:
                note = "no index entry points at it: the broker's query by key cannot return it"
            elif inside:
                note = ""
            else:
                side = (f"{lo - t} ms before the window begins ({_iso(lo)})" if t < lo
                        else f"{t - hi} ms after the window ends ({_iso(hi)})")
                clock = (f"; stored {-skew} ms before it was born: the producer's clock is ahead of the broker's"
                         if skew < 0 else "")
                note = f"the broker's query misses it: its index time {_iso(t)} is {side}{clock}"
            out.append(HitTiming(m.offset, m.born_timestamp, m.store_timestamp, skew, t, name, (lo, hi), how,
                                 inside, note))
        return out
    finally:
        for f in files:
            f.close()
