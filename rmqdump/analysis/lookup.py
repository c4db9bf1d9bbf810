"""Find messages in a store the way the broker does, and confirm every hit from the commitlog.

* by key (``KEYS`` element or ``UNIQ_KEY``) through the IndexFile hash slots, like
  ``mqadmin queryMsgByKey`` but without the 64-result cap: every candidate offset is decoded
  and kept only if its topic and key really match; other records reached through the same
  31-bit hash are reported as collisions, never returned;
* by offsetMsgId, by (topic, queue id, queue offset) through the ConsumeQueue, or by
  commitlog offset.

When the index cannot answer (missing, deleted by the broker's abnormal recovery, not
covering the commitlog or the time window, unreadable) the commitlog is walked instead —
only the part the index does not cover — and the result says why (``reasons``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.codec.record import Blank, Invalid, Message
from rmqdump.errors import FormatError, NotFoundError, RmqdumpError
from rmqdump.store.commitlog import CommitLog, Skipped
from rmqdump.store.geometry import StoreGeometry, check_index_file, geometry_hint, resolve_geometry
from rmqdump.store.root import Store

LONG_MAX = (1 << 63) - 1
#: the index keeps store time in whole seconds (truncated), relative to the file's begin time
INDEX_TIME_SLACK_MS = 1000


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
    (host mismatch, CRC failures, index anomalies). ``scanned``: commitlog ranges walked.
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


# --- helpers ---------------------------------------------------------------------------


def _open_store(store: Store | str | os.PathLike) -> Store:
    return store if isinstance(store, Store) else Store.open(store)


def _geometry(store: Store, geometry: StoreGeometry | None, parts: tuple[str, ...]) -> StoreGeometry:
    if geometry is not None:
        return geometry
    return resolve_geometry(store.root, commitlog_file_size=store.commitlog.file_size, parts=parts)


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


def _indexable(msg: Message) -> bool:
    """Whether ``IndexService.buildIndex`` puts entries for this record."""
    if msg.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return False
    return msg.uniq_key is not None or bool(msg.keys)


def _iso(ms: int) -> str:
    from rmqdump.store.checkpoint import ms_to_iso

    return ms_to_iso(ms)


# --- index selection ---------------------------------------------------------------------


@dataclass
class _IndexPlan:
    """Index files to trust, and the commitlog ranges they do not cover."""

    files: list = field(default_factory=list)  # IndexFile, oldest first
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ranges: list[tuple[int, int | None, int | None]] = field(default_factory=list)  # (start, end, already)


def _index_plan(store: Store, geo: StoreGeometry, use_index: bool = True) -> _IndexPlan:
    plan = _IndexPlan()
    cl = store.commitlog
    if not use_index:
        plan.reasons.append("--scan given: walking the commitlog")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    if store.root is None:
        plan.reasons.append("index missing: only commitlog files were given, not a store root")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    from rmqdump.store.indexfile import IndexFile, list_index_files

    paths = list_index_files(store.root)
    if not paths:
        what = "no index/ directory" if store.path("index") is None else "index/ holds no files"
        plan.reasons.append(f"index missing: {what}")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    if geo.index_hash_slot_num is None:
        plan.reasons.append(f"index unusable: geometry unknown ({'; '.join(geo.problems)}); {geometry_hint()}")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    doomed_cut = _recovery_cutoff(store, plan)
    for p in paths:
        try:
            f = IndexFile(p, geo.index_hash_slot_num, geo.index_num)
        except RmqdumpError as exc:
            plan.reasons.append(f"index file {p.name} unusable: {exc.message}; {geometry_hint()}")
            continue
        try:
            problems = check_index_file(f)
        except RmqdumpError as exc:
            problems = [exc.message]
        if problems:
            f.close()
            plan.reasons.append(f"index file {p.name} does not fit geometry {geo.index_hash_slot_num}/"
                                f"{geo.index_num} ({geo.sources.get('index')}): {problems[0]}; {geometry_hint()}")
            continue
        if doomed_cut is not None and f.header.end_timestamp > doomed_cut:
            plan.reasons.append(f"index deleted by recovery: abort present and {p.name} ends at "
                                f"{_iso(f.header.end_timestamp)} > checkpoint indexMsgTimestamp {doomed_cut} "
                                "(the broker's abnormal restart deletes it and re-indexes)")
            f.close()
            continue
        if f.index_count <= 1:
            f.close()
            continue  # an empty file covers nothing
        plan.files.append(f)
    _coverage(cl, plan)
    return plan


def _recovery_cutoff(store: Store, plan: _IndexPlan) -> int | None:
    """checkpoint indexMsgTimestamp when the next start would be an abnormal one, else None."""
    if not store.abort_present:
        return None
    from rmqdump.broker.lock import probe_lock

    try:
        pid = probe_lock(store.root)
    except RmqdumpError:
        pid = None
    if pid:
        plan.warnings.append(f"a broker (PID {pid}) holds the store's lock: abort is its live marker; "
                             "using the index as it is")
        return None
    cp_path = store.path("checkpoint")
    if cp_path is None:
        return 0
    from rmqdump.store.checkpoint import read_checkpoint

    try:
        return read_checkpoint(cp_path).index_msg_timestamp
    except RmqdumpError as exc:
        plan.warnings.append(f"checkpoint unreadable ({exc}); taking indexMsgTimestamp as 0")
        return 0


def _coverage(cl: CommitLog, plan: _IndexPlan) -> None:
    """Commitlog ranges outside the trusted files: (start, end or None, offset already indexed)."""
    if not plan.files:
        plan.ranges.append((cl.min_offset, None, None))
        return
    first = plan.files[0].header
    if first.begin_phy_offset > cl.min_offset:
        plan.ranges.append((cl.min_offset, first.begin_phy_offset, None))
    for a, b in zip(plan.files, plan.files[1:], strict=False):
        if b.header.begin_phy_offset > a.header.end_phy_offset:
            plan.ranges.append((a.header.end_phy_offset, b.header.begin_phy_offset, a.header.end_phy_offset))
    last = plan.files[-1].header.end_phy_offset
    plan.ranges.append((max(last, cl.min_offset), None, last))


def _time_covered(plan: _IndexPlan, begin: int, end: int) -> bool:
    if not plan.files:
        return False
    lo = min(f.header.begin_timestamp for f in plan.files)
    hi = max(f.header.end_timestamp for f in plan.files)
    return lo <= begin and end <= hi


def _chain_offsets(f, key_hash: int, lo: int, out: set[int], stop: _EarlyStop | None = None) -> str | None:
    """``selectPhyOffset`` for one keyHash in one file into ``out``; the first sign of damage in the chain.

    Same walk and stop rules as the broker (newest entry first; stop at a timeDiff < 0,
    at prevIndex 0, or once an entry reads older than ``lo``), except that what the broker
    silently stops at (or loops on) is reported: a slot or prevIndex outside the written
    entries, a prevIndex not below its entry's number (the broker only links to earlier
    entries, so this bounds the walk), an entry whose keyHash selects another slot, a
    negative timeDiff. With ``stop`` the walk ends once enough hits are confirmed in chain
    order (see :class:`_EarlyStop`).
    """
    from rmqdump.store.indexfile import _bad_prev

    S = f.geometry.hash_slot_num
    slot = key_hash % S
    count = f.index_count
    if count <= 1:
        return None
    begin_ts = f.header.begin_timestamp
    try:
        head = f.slot(slot)
        if head == 0:
            return None
        if head < 0 or head >= count:
            return f"slot {slot} value {head} outside [0, indexCount {count})"
        add = out.add
        for number, kh, phy, time_diff, prev in f.chain(head, count):
            if kh < 0 or kh % S != slot:
                return f"entry {number} in the chain of slot {slot} has keyHash {kh} (another slot's)"
            if time_diff < 0:
                return f"entry {number} in the chain of slot {slot} has a negative timeDiff {time_diff}"
            t = begin_ts + time_diff * 1000
            if t < lo:
                break
            if kh == key_hash:
                add(phy)
                if stop is not None and stop.enough(phy):
                    break
            if prev == 0:
                break
            if prev < 0 or prev >= number:
                return f"entry {number} prevIndex {prev} ({_bad_prev(prev, number, count)})"
    except FormatError as exc:
        return exc.message
    return None


class _EarlyStop:
    """Ends a key's chain walk (across its index files) once ``max_num`` + 1 hits are confirmed in chain order.

    The broker writes entries in commitlog order, so a chain read newest first lists
    offsets from high to low. While that holds, the hits seen so far are the highest ones
    and everything not yet read lies below them: the final newest-first confirmation
    (capped at ``max_num``, one more for ``truncated``) never reaches it. A chain out of
    order disables the stop for this key. Decoded records are kept for the confirmation.
    """

    def __init__(self, max_num: int, check: Callable[[int], bool]):
        self.need = max_num + 1
        self.check = check
        self.hits = 0
        self.last: int | None = None
        self.ordered = True

    def enough(self, off: int) -> bool:
        last = self.last
        if last is not None:
            if off == last:
                return False
            if off > last:
                self.ordered = False
        self.last = off
        if not self.ordered:
            return False
        if self.check(off):
            self.hits += 1
        return self.hits >= self.need


def _index_candidates(plan: _IndexPlan, topics: Iterable[str], key: str, begin: int,
                      stopper: Callable[[], _EarlyStop] | None = None) -> tuple[set[int], list]:
    """Offsets whose index entry hashes like ``topic#key`` (newest file first), and damaged files.

    Without ``stopper`` every chain is walked to its end; with it, each topic's walk ends
    early once its hits are confirmed (see :class:`_EarlyStop`). The window's end is not
    used here: a non-first file's first entry reads later than its real store time (§9.6),
    so the end is applied to the decoded records instead.
    """
    from rmqdump.codec.javahash import index_key, index_key_hash

    out: set[int] = set()
    damaged: dict[str, tuple] = {}
    lo = max(0, begin - INDEX_TIME_SLACK_MS) if begin > 0 else 0
    for topic in topics:
        key_hash = index_key_hash(index_key(topic, key))
        stop = stopper() if stopper is not None else None
        for f in reversed(plan.files):
            if f.header.is_time_matched(lo, LONG_MAX):
                damage = _chain_offsets(f, key_hash, lo, out, stop)
                if damage is not None and f.name not in damaged:
                    damaged[f.name] = (f, damage)
                if stop is not None and stop.ordered and stop.hits >= stop.need:
                    break
            if f.header.begin_timestamp < lo:
                break
    return out, list(damaged.values())


# --- scanning ----------------------------------------------------------------------------


def _scan(cl: CommitLog, start: int, end: int | None, match: Callable[[Message], bool], res: LookupResult,
          *, keep_going: bool, use_mmap: bool, max_record_size: int, already: int | None = None,
          count: bool = False, progress: Callable[[int], None] | None = None) -> tuple[list[int], int]:
    """Walk [start, end); offsets of matching records and (``count``) how many indexable ones lay past ``already``."""
    walk = cl.walk(start=start, end=end, check_crc=False, read_body=False, keep_going=keep_going,
                   use_mmap=use_mmap, max_record_size=max_record_size)
    found: list[int] = []
    unindexed = 0
    skipped = 0
    for n, rec in enumerate(walk):
        if progress is not None and n & 1023 == 0:
            progress(walk.end_offset)
        if isinstance(rec, Message):
            if count and (already is None or rec.offset > already) and _indexable(rec):
                unindexed += 1
            if match(rec):
                found.append(rec.offset)
        elif isinstance(rec, Skipped):
            skipped += 1
            res.warnings.append(f"scan skipped damaged bytes [{rec.start}, {rec.end}) in {rec.file}: "
                                f"{rec.reason.kind}: {rec.reason.detail}")
    stop = walk.stop
    stop_at = walk.end_offset
    if stop is not None and stop.kind != "end_of_data" and not keep_going:
        res.warnings.append(f"scan stopped at damage at offset {stop.offset}: {stop.kind}: {stop.detail}")
    res.scanned.append((start, stop_at if end is None else min(end, max(stop_at, start))))
    return found, unindexed


def _matcher(topics: set[str] | None, key: str, begin: int, end: int) -> Callable[[Message], bool]:
    raw = {t.encode("utf-8") for t in topics} if topics is not None else None
    kb = key.encode("utf-8", "surrogatepass")
    prefilter = "\ufffd" not in key  # U+FFFD may stand for undecodable bytes

    def match(m: Message) -> bool:
        if raw is not None and m.topic_raw not in raw:
            return False
        if not begin <= m.store_timestamp <= end:
            return False
        if prefilter and kb not in m.properties_raw:  # cheap: the key must appear in the properties bytes
            return False
        return _key_matches(m, key)

    return match


# --- key lookups -------------------------------------------------------------------------


def known_topics(store: Store) -> list[str]:
    """Topics named by consumequeue/ and batchconsumequeue/ directories and config/topics.json."""
    names: set[str] = set()
    if store.root is None:
        return []
    from rmqdump.store.consumequeue import discover_queues, is_rocksdb_consumequeue

    for batch in (False, True):
        if batch or not is_rocksdb_consumequeue(store.root):
            try:
                names.update(ref.topic for ref in discover_queues(store.root, batch=batch))
            except RmqdumpError:
                pass
    try:
        from rmqdump.store.config import load_topics

        loaded = load_topics(store.root)
        if loaded.data:
            names.update(loaded.data)
    except RmqdumpError:
        pass
    return sorted(names)


def lookup_key(store: Store | str | os.PathLike, topic: str | None, key: str, begin: int | None = None,
               end: int | None = None, max_num: int | None = None, *, force_scan: bool = False,
               geometry: StoreGeometry | None = None, use_mmap: bool = True,
               progress: Callable[[int], None] | None = None) -> LookupResult:
    """Records of ``topic`` whose KEYS element or UNIQ_KEY equals ``key``, newest first.

    ``topic`` None searches every topic the store names (see :func:`known_topics`) in the
    index and every record in a scan. ``begin``/``end`` bound the store time (ms,
    inclusive). ``max_num`` caps the hits; ``truncated`` then says whether more exist.
    """
    if not key:
        raise FormatError("empty key: the broker never indexes empty keys")
    if topic is not None and not topic:
        raise FormatError("empty topic")
    if max_num is not None and max_num < 1:
        raise FormatError(f"--max must be at least 1, got {max_num}")
    st = _open_store(store)
    lo = 0 if begin is None else begin
    hi = LONG_MAX if end is None else end
    if lo > hi:
        raise FormatError(f"time window is empty: begin {lo} > end {hi}")
    geo = _geometry(st, geometry, ("commitlog", "index"))
    res = LookupResult(geometry=geo)
    res.warnings.extend(geo.problems)
    cl = st.commitlog
    plan = _index_plan(st, geo, use_index=not force_scan)
    res.warnings.extend(plan.warnings)
    res.reasons.extend(plan.reasons)
    try:
        topics = [topic] if topic is not None else known_topics(st)
        res.topics_searched = len(topics) if plan.files else 0
        candidates: set[int] = set()
        extra: list[tuple[int, int]] = []  # commitlog ranges of damaged index files
        decoded: dict[int, Message | Blank | Invalid] = {}
        if plan.files:
            stopper = None
            if max_num is not None:
                is_hit = _hit_check(cl, decoded, {topic} if topic is not None else None, key, lo, hi, use_mmap,
                                    geo.max_record_size)
                stopper = lambda: _EarlyStop(max_num, is_hit)  # noqa: E731
            found, damaged = _index_candidates(plan, topics, key, lo, stopper)
            candidates |= found
            for f, why in damaged:
                h = f.header
                res.reasons.append(f"index file {f.name} is damaged ({why}): scanned the commitlog it covers, "
                                   f"[{h.begin_phy_offset}, {h.end_phy_offset}]")
                extra.append((h.begin_phy_offset, h.end_phy_offset + 1))
            if (begin is not None or end is not None) and not _time_covered(plan, lo, hi):
                a = min(f.header.begin_timestamp for f in plan.files)
                b = max(f.header.end_timestamp for f in plan.files)
                res.reasons.append(f"index does not cover the time window: it holds {_iso(a)} .. {_iso(b)}; "
                                   "scanned the commitlog outside the index's offsets (use --scan to walk all of it)")
        match = _matcher({topic} if topic is not None else None, key, lo, hi)
        for start, stop in extra:
            found, _ = _scan(cl, start, stop, match, res, keep_going=True, use_mmap=use_mmap,
                             max_record_size=geo.max_record_size, progress=progress)
            candidates.update(found)
        for start, stop, already in plan.ranges:
            full = already is None and start == cl.min_offset and stop is None
            found, unindexed = _scan(cl, start, stop, match, res, keep_going=already is None, use_mmap=use_mmap,
                                     max_record_size=geo.max_record_size, already=already,
                                     count=bool(plan.files) and not full, progress=progress)
            candidates.update(found)
            if plan.files and unindexed and not full:
                where = f"[{start}, {stop})" if stop is not None else f"from {start} to the end"
                what = "index stale" if stop is None else "index does not cover the commitlog"
                res.reasons.append(f"{what}: {unindexed} records with keys at {where} are not in the index; "
                                   "scanned them")
        res.source = "index" if plan.files and not res.reasons else ("index+scan" if plan.files else "scan")
        _confirm(cl, sorted(candidates, reverse=True), {topic} if topic is not None else None, key, lo, hi, max_num,
                 res, use_mmap, geo.max_record_size, decoded)
    finally:
        for f in plan.files:
            f.close()
    return res


def _hit_check(cl: CommitLog, decoded: dict, topics: set[str] | None, key: str, lo: int, hi: int, use_mmap: bool,
               max_record_size: int) -> Callable[[int], bool]:
    """Whether the record at an offset is a hit exactly as :func:`_confirm` judges it (decoded records are kept)."""
    raw = {t.encode("utf-8") for t in topics} if topics is not None else None

    def is_hit(off: int) -> bool:
        rec = decoded.get(off)
        if rec is None:
            try:
                rec = read_message(cl, off, use_mmap=use_mmap, max_record_size=max_record_size)
            except RmqdumpError:
                return False  # not a hit; the confirmation reports it if it gets that far
            decoded[off] = rec
        return (isinstance(rec, Message) and lo <= rec.store_timestamp <= hi
                and (raw is None or rec.topic_raw in raw) and _key_matches(rec, key))

    return is_hit


def _confirm(cl: CommitLog, offsets: list[int], topics: set[str] | None, key: str, lo: int, hi: int,
             max_num: int | None, res: LookupResult, use_mmap: bool, max_record_size: int,
             decoded: dict | None = None) -> None:
    raw = {t.encode("utf-8") for t in topics} if topics is not None else None
    decoded = decoded or {}
    for off in offsets:
        rec = decoded.get(off)
        if rec is None:
            rec = read_message(cl, off, use_mmap=use_mmap, max_record_size=max_record_size)
        if not isinstance(rec, Message):
            res.unreadable.append((off, _describe_invalid(rec)))
            continue
        if not lo <= rec.store_timestamp <= hi:
            continue
        topic_ok = raw is None or rec.topic_raw in raw
        key_ok = _key_matches(rec, key)
        if not (topic_ok and key_ok):
            why = "topic and key differ" if not (topic_ok or key_ok) else ("topic differs" if not topic_ok
                                                                          else "key differs")
            res.collisions.append(Collision(off, rec.topic, rec.keys, rec.uniq_key, why))
            continue
        if max_num is not None and len(res.hits) >= max_num:
            res.truncated = True
            return
        w = _crc_warning(rec)
        if w:
            res.warnings.append(w)
        res.hits.append(rec)


def is_uniq_key(s: str) -> bool:
    """A client message id: 32 (IPv4) or 56 (IPv6) hex characters."""
    if len(s) not in (32, 56):
        return False
    try:
        bytes.fromhex(s)
    except ValueError:
        return False
    return True


def lookup_uniq_key(store: Store | str | os.PathLike, uniq_key: str, topic: str | None = None, **kwargs
                    ) -> LookupResult:
    """Records carrying this client message id (UNIQ_KEY), in ``topic`` or in every topic.

    The id is indexed like a key, so a record listing it in KEYS matches too. Retries,
    delay-topic copies and transaction half messages keep the id, so without ``topic``
    all of them are found.
    """
    s = uniq_key.strip().upper()  # MessageClientIDSetter writes upper-case hex
    if not is_uniq_key(s):
        raise FormatError(f"UNIQ_KEY {uniq_key!r} must be 32 or 56 hexadecimal characters")
    return lookup_key(store, topic, s, **kwargs)


# --- direct lookups ----------------------------------------------------------------------


def _direct(store: Store, offset: int, what: str, use_mmap: bool, geometry: StoreGeometry | None,
            source: str) -> LookupResult:
    geo = geometry or resolve_geometry(store.root, commitlog_file_size=store.commitlog.file_size, parts=())
    res = LookupResult(source=source, geometry=geo)
    cl = store.commitlog
    if cl.segment_for(offset) is None:
        last = cl.segments[-1]
        raise NotFoundError(f"{what}: offset {offset} is outside the commitlog "
                            f"[{cl.min_offset}, {last.end})")
    rec = read_message(cl, offset, use_mmap=use_mmap, max_record_size=geo.max_record_size)
    if not isinstance(rec, Message):
        seg = cl.segment_for(offset)
        raise NotFoundError(f"{what}: no record starts at offset {offset}: {_describe_invalid(rec)}",
                            seg.path if seg else None, offset - seg.start if seg else None)
    if rec.physical_offset != rec.offset:
        res.warnings.append(f"record at {rec.offset} carries PHYSICALOFFSET {rec.physical_offset} "
                            "(copied or moved bytes?)")
    w = _crc_warning(rec)
    if w:
        res.warnings.append(w)
    res.hits.append(rec)
    return res


def lookup_offset(store: Store | str | os.PathLike, offset: int, *, use_mmap: bool = True,
                  geometry: StoreGeometry | None = None) -> LookupResult:
    """The record starting at commitlog ``offset`` (NotFoundError if none starts there)."""
    if offset < 0:
        raise FormatError(f"negative commitlog offset {offset}")
    return _direct(_open_store(store), offset, "--offset", use_mmap, geometry, "offset")


def lookup_msg_id(store: Store | str | os.PathLike, msg_id: str, *, use_mmap: bool = True,
                  geometry: StoreGeometry | None = None) -> LookupResult:
    """The record an offsetMsgId names; warns when the id's store host is not this store's."""
    from rmqdump.codec.msgid import decode_offset_msg_id

    mid = decode_offset_msg_id(msg_id)  # FormatError when malformed
    st = _open_store(store)
    try:
        res = _direct(st, mid.offset, f"msg id {msg_id.strip()}", use_mmap, geometry, "msg-id")
    except NotFoundError as exc:
        first = read_message(st.commitlog, st.commitlog.min_offset, use_mmap=use_mmap)
        if isinstance(first, Message) and (first.store_addr, first.store_port) != (mid.address, mid.port):
            raise NotFoundError(f"{exc.message} (the id names store host {mid.host}; this store's records were "
                                f"stored by {first.store_host}: probably another broker's id)", exc.file,
                                exc.offset) from None
        raise
    rec = res.hits[0]
    if (rec.store_addr, rec.store_port) != (mid.address, mid.port):
        res.warnings.append(f"msg id names store host {mid.host} but the record at offset {mid.offset} was stored "
                            f"by {rec.store_host}: the id probably comes from another broker")
    return res


def lookup_queue(store: Store | str | os.PathLike, topic: str, queue_id: int, queue_offset: int, *,
                 use_mmap: bool = True, geometry: StoreGeometry | None = None) -> LookupResult:
    """The record a ConsumeQueue entry points at (BatchConsumeQueue for BatchCQ topics)."""
    st = _open_store(store)
    if st.root is None:
        raise NotFoundError("--queue needs a store root (only commitlog files were given)")
    geo = geometry or resolve_geometry(st.root, commitlog_file_size=st.commitlog.file_size, parts=())
    from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, STORE_BATCH_CONSUMEQUEUE_DIR, STORE_CONSUMEQUEUE_DIR
    from rmqdump.disk.paths import is_safe_component
    from rmqdump.store.consumequeue import BatchConsumeQueue, ConsumeQueue

    if not is_safe_component(topic):
        raise NotFoundError(f"no consume queue for topic {topic!r}: not a valid directory name")
    cq_dir = Path(st.root) / STORE_CONSUMEQUEUE_DIR / topic / str(queue_id)
    bcq_dir = Path(st.root) / STORE_BATCH_CONSUMEQUEUE_DIR / topic / str(queue_id)
    if not cq_dir.is_dir() and bcq_dir.is_dir() and not bcq_dir.is_symlink():
        bq = BatchConsumeQueue(bcq_dir, topic, queue_id)
        unit = bq.find(queue_offset)
        offset, size, what = unit.commit_log_offset, unit.size, f"batch consume queue unit {unit.unit_index}"
    else:
        cq_size = geo.cq_file_size if geo.sources.get("consumequeue") in ("broker.conf", "option") else None
        q = ConsumeQueue.open(st.root, topic, queue_id, file_size=cq_size)
        try:  # O(1): the broker's max offset (a scan of the last files) is only computed for errors
            entry = q.entry_at(queue_offset, check_max=False)
        except NotFoundError:
            entry = None
        if entry is None or not entry.is_valid or entry.is_pre_blank:
            first = q.files[0].start // CQ_STORE_UNIT_SIZE if q.files else 0
            if entry is None or queue_offset >= q.max_offset:
                raise NotFoundError(f"queue offset {queue_offset} is outside "
                                    f"[{first}, {q.max_offset})", q.path)
            kind = "a pre-blank placeholder" if entry.is_pre_blank else "invalid"
            raise NotFoundError(f"{topic}/{queue_id} queue offset {queue_offset}: entry is {kind} "
                                f"(offset {entry.commit_log_offset}, size {entry.size})", q.path)
        offset, size, what = entry.commit_log_offset, entry.size, f"consume queue {topic}/{queue_id}@{queue_offset}"
    res = _direct(st, offset, what, use_mmap, geo, "consumequeue")
    rec = res.hits[0]
    if rec.topic != topic or rec.queue_id != queue_id:
        from rmqdump.broker.systopics import multi_dispatched_to

        # an LMQ queue's entries point at records of the parent topic that list it in INNER_MULTI_DISPATCH
        if not (isinstance(rec, Message) and multi_dispatched_to(rec, topic, queue_id, queue_offset)):
            res.warnings.append(f"{what} points at offset {offset}, a record of {rec.topic}/{rec.queue_id}")
    if rec.size != size:
        res.warnings.append(f"{what} says size {size}, the record at {offset} is {rec.size} bytes")
    return res
