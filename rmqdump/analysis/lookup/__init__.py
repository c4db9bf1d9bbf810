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

This module holds the key lookups; the index files to trust and their hash chains are in
:mod:`~rmqdump.analysis.lookup.index`, the commitlog walk in :mod:`~rmqdump.analysis.lookup.scan`,
the lookups by offset, offsetMsgId and queue position in :mod:`~rmqdump.analysis.lookup.direct`,
the result and the record helpers they share in :mod:`~rmqdump.analysis.lookup.result`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from rmqdump.analysis.lookup.direct import lookup_msg_id, lookup_offset, lookup_queue
from rmqdump.analysis.lookup.index import LONG_MAX, _EarlyStop, _index_candidates, _index_plan, _time_covered
from rmqdump.analysis.lookup.result import (
    Collision,
    LookupResult,
    _crc_warning,
    _describe_invalid,
    _iso,
    _key_matches,
    _open_store,
    hit_timings,
    read_message,
)
from rmqdump.analysis.lookup.scan import _matcher, _scan
from rmqdump.codec.record import Blank, Invalid, Message
from rmqdump.errors import FormatError, RmqdumpError
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.geometry import StoreGeometry, resolve_geometry
from rmqdump.store.root import Store

__all__ = ["LONG_MAX", "Collision", "LookupResult", "is_uniq_key", "known_topics", "lookup_key", "lookup_msg_id",
           "lookup_offset", "lookup_queue", "lookup_uniq_key", "read_message"]


def _geometry(store: Store, geometry: StoreGeometry | None, parts: tuple[str, ...]) -> StoreGeometry:
    if geometry is not None:
        return geometry
    return resolve_geometry(store.root, commitlog_file_size=store.commitlog.file_size, parts=parts)


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
               progress: Callable[[int], None] | None = None, by_uniq_key: bool = False) -> LookupResult:
    """Records of ``topic`` whose KEYS element or UNIQ_KEY equals ``key``, newest first.

    ``topic`` None searches every topic the store names (see :func:`known_topics`) in the
    index and every record in a scan. ``begin``/``end`` bound the store time (ms,
    inclusive). ``max_num`` caps the hits; ``truncated`` then says whether more exist.
    ``timing`` says, per hit, the born-vs-store skew and whether the broker's own query
    (the window a key query, or with ``by_uniq_key`` a query by client id, would use) returns it;
    when a window finds nothing, ``outside_window`` lists the key's records outside it.
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
    res.timing = hit_timings(st, geo, res.hits, key, begin, end, by_uniq_key)
    if not res.hits and (begin is not None or end is not None):
        wide = lookup_key(st, topic, key, max_num=max_num, force_scan=force_scan, geometry=geo, use_mmap=use_mmap,
                          by_uniq_key=by_uniq_key)
        res.outside_window = hit_timings(st, geo, wide.hits, key, begin, end, by_uniq_key)
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
    return lookup_key(store, topic, s, by_uniq_key=True, **kwargs)
