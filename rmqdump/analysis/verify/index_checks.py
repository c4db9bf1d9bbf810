"""Index files → commitlog (:func:`check_index`): every entry's key and record, slots, hash chains, header
counters and timestamps.

The store checks (:mod:`rmqdump.analysis.verify.queue_checks`, :mod:`~rmqdump.analysis.verify.index_checks`,
:mod:`~rmqdump.analysis.verify.meta_checks`) append :class:`~rmqdump.findings.Finding` objects to a list;
file names are relative to the store root, offsets are byte positions in that file (for the commitlog: the
commitlog offset).
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from pathlib import Path

from rmqdump.analysis.verify.record_cache import RecordCache
from rmqdump.codec.javahash import index_key_hash
from rmqdump.codec.layout import (
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SIZE,
    MAX_RECORD_SIZE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.properties import split_keys
from rmqdump.codec.record import Message
from rmqdump.disk.fileio import open_read
from rmqdump.errors import RmqdumpError
from rmqdump.fast.engine import use_fast
from rmqdump.fast.indexabi import (  # entry status bits and chain event classes, shared with the compiled twin
    EV_CYCLE,
    EV_MERGE,
    EV_ORDER,
    EV_ORDER_SELF,
    EV_SLOT_INVALID,
    EV_SLOT_MISMATCH,
    IRREGULAR,
    S_BEYOND,
    S_DANGLING,
    S_EXPIRED,
    S_KEY,
    S_PYTHON,
    S_ROLLBACK,
    S_TIME,
)
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog

_FAST_INDEX_BYTES = 1 << 20  # entry bytes from which the compiled check pays for itself (~50,000 entries)


class _Sink:
    """Findings with a cap per kind (counted over all index files)."""

    def __init__(self, max_per_kind: int):
        self.out: list[Finding] = []
        self.counts: Counter = Counter()
        self.max = max_per_kind

    def __call__(self, sev: str, kind: str, file: str, off: int | None, detail: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= self.max:
            self.out.append(Finding(sev, kind, file, off, detail))

    def full(self, kind: str) -> bool:
        return self.counts[kind] >= self.max


def _own_slot_reachable(slots, hashes, prevs, count: int, chain_slot) -> bool:
    """Whether every entry on some chain is also on the chain of the slot its keyHash selects (what a query
    walks). The work is bounded (4 x the entry count); beyond it the answer is no."""
    n = len(slots)
    own = bytearray(count)
    budget = 4 * count + n
    for s, head in enumerate(slots):
        cur = head if 0 < head < count else 0
        while cur > 0:
            budget -= 1
            if budget < 0:
                return False
            if hashes[cur] % n == s:
                own[cur] = 1
            prev = prevs[cur]
            if prev >= cur or prev < 0:
                break
            cur = prev
    return all(own[i] for i in range(1, count) if chain_slot[i] != -1)


def check_index(root: Path, cl: CommitLog, cache: RecordCache, *, valid_end: int, recovery_end: int | None,
                max_per_kind: int = 1000) -> tuple[list[Finding], list[dict]]:
    """Index files → commitlog: keys, slots, chains, header counters and timestamps. Files of at least
    ``_FAST_INDEX_BYTES`` of entries take the compiled join (``fast.engine.use_fast``; ``RMQDUMP_FAST=1/0``)."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    infos: list[dict] = []
    add = _Sink(max_per_kind)
    try:
        paths = list_index_files(root)
    except RmqdumpError as e:
        return [Finding(ERROR, "index_unreadable", "index", None, e.message)], infos
    for n, p in enumerate(paths):
        label = f"index/{p.name}"
        if not (len(p.name) == 17 and p.name.isdigit()):
            add(WARNING, "index_file_name", label, None, "not a 17-digit yyyyMMddHHmmssSSS name")
        try:
            f = IndexFile(p, strict=False)
        except RmqdumpError as e:
            add(ERROR, "index_file_size", label, e.offset, e.message)
            continue
        with f:
            fast = cache.use_mmap and use_fast(f.index_count * INDEX_SIZE, threshold=_FAST_INDEX_BYTES,
                                               segments=cl.segments)  # DLedger data files: the pure path
            info = _check_one_index(f, label, n == 0, cl, cache, add, valid_end, recovery_end, fast)
            infos.append(info)
    return add.out, infos


def _check_one_index(f, label: str, first_file: bool, cl: CommitLog, cache: RecordCache, add: _Sink,
                     valid_end: int, recovery_end: int | None, fast: bool = False) -> dict:
    h = f.header
    geo = f.geometry
    count = h.index_count
    info = {"file": f.name, "entries": max(0, count - 1), "begin_timestamp": h.begin_timestamp,
            "end_timestamp": h.end_timestamp, "begin_phy_offset": h.begin_phy_offset,
            "end_phy_offset": h.end_phy_offset}
    if count < 0 or count > geo.index_num:
        add(ERROR, "index_header", label, 36, f"indexCount {count} outside [0, {geo.index_num}]")
        return info
    count = max(count, 1)
    if fast:
        ends = _fast_one_index(f, label, cl, cache, add, valid_end, recovery_end, count)
    else:
        ends = _pure_one_index(f, label, cl, cache, add, valid_end, recovery_end, count)
    first_phy, last_entry_phy, first, last = ends
    if first_phy is not None:
        if h.begin_phy_offset != first_phy and first_file:
            add(WARNING, "index_header_mismatch", label, 16,
                f"beginPhyOffset {h.begin_phy_offset} but the first entry points at {first_phy}")
        if h.end_phy_offset != last_entry_phy:
            add(WARNING, "index_header_mismatch", label, 24,
                f"endPhyOffset {h.end_phy_offset} but the last entry points at {last_entry_phy}")
        # the header's times are the first and last entry's records' (IndexFile.putKey): compared only where
        # those records are still there (not in files retention deleted, not cut by recovery)
        if first[0] == 1 and h.begin_timestamp != first[1] and first_file:
            add(WARNING, "index_header_mismatch", label, 0,
                f"beginTimestamp {h.begin_timestamp} but the first indexed record was stored at {first[1]}")
        if last[0] == count - 1 and h.end_timestamp != last[1]:
            add(WARNING, "index_header_mismatch", label, 8,
                f"endTimestamp {h.end_timestamp} but the last indexed record was stored at {last[1]}")
    return info


def _message_entry(add: _Sink, label: str, pos: int, number: int, key_hash: int, phy: int, time_diff: int,
                   rec: Message, keyset: set[int], begin_ts: int) -> None:
    """The findings of one entry pointing at a message (both paths)."""
    if key_hash not in keyset:
        add(ERROR, "index_key_mismatch", label, pos,
            f"entry {number} keyHash {key_hash} matches no key of the record at {phy} "
            f"({rec.topic}, {len(keyset)} indexed keys)")
    if rec.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        add(ERROR, "index_key_mismatch", label, pos, f"entry {number} indexes a ROLLBACK record")
    if number > 1 and begin_ts > 0:
        d = rec.store_timestamp - begin_ts
        exp = min(d // 1000, 0x7FFFFFFF) if d > 0 else 0  # putKey: seconds, 0 if negative, capped
        if time_diff != exp:
            add(WARNING, "index_time_mismatch", label, pos + 12,
                f"entry {number} timeDiff {time_diff} s, record stored {exp} s after beginTimestamp")


def _dangling(add: _Sink, label: str, pos: int, number: int, phy: int, rec) -> None:
    add(ERROR, "index_entry_dangling", label, pos,
        f"entry {number} points at {phy}, where there is no valid record ({rec.kind})")


def _entry_totals(add: _Sink, label: str, expired: int, beyond: int, min_off: int) -> None:
    if expired:
        add(INFO, "index_entry_expired", label, None, f"{expired} entries point below the commitlog start {min_off}")
    if beyond:
        add(WARNING, "index_entry_beyond_end", label, None,
            f"{beyond} entries point past the end of valid commitlog data (stale after a truncation; queries "
            "re-read and drop them)")


def _chain_event(add: _Sink, irregular: list, label: str, entries_start: int, count: int, slots_n: int,
                 ev: int, a: int, b: int, c: int) -> None:
    """Word one chain event (both paths): errors and warnings now, irregular links into ``irregular``."""
    if ev == EV_SLOT_INVALID:
        add(WARNING, "index_slot_invalid", label, INDEX_HEADER_SIZE + 4 * a,
            f"slot {a} holds {b}, outside [1, indexCount {count}): ignored by queries")
    elif ev == EV_CYCLE:
        add(ERROR, "index_chain_cycle", label, entries_start + 20 * b + 16, f"chain of slot {a} revisits entry {b}")
    elif ev == EV_ORDER:
        add(ERROR, "index_chain_order", label, entries_start + 20 * a + 16,
            f"entry {a} prevIndex {b} does not point at an older entry")
    elif ev == EV_MERGE:
        irregular.append(("index_chain_merge", entries_start + 20 * a + 16,
                          f"entry {a} is on the chains of slots {b} and {c}"))
    elif ev == EV_SLOT_MISMATCH:
        irregular.append(("index_slot_mismatch", entries_start + 20 * a,
                          f"entry {a} (keyHash {b}, slot {b % slots_n}) is on the chain of slot {c}"))
    else:  # RocketMQ's query ends a chain there (prevIndex == the entry read)
        irregular.append(("index_chain_order", entries_start + 20 * a + 16, f"entry {a} prevIndex {b} points at itself"))


def _chain_totals(add: _Sink, label: str, irregular: list, n_irregular: int, reachable, used: int, h,
                  unreachable: int, first_unreachable: int, entries_start: int) -> None:
    """The chain findings after the walk (both paths); ``reachable()``: every entry is on its own slot's chain."""
    if n_irregular:
        if reachable():
            # RocketMQ itself leaves such files after a crash: every entry is still on its own slot's chain,
            # so every query finds what it should (the extra links only cost a few hops)
            add(INFO, "index_chain_irregular", label, irregular[0][1],
                f"{n_irregular} irregular chain link(s) (first: {irregular[0][2]}); every entry is still on "
                "its own slot's chain, so queries find every key")
        else:
            for kind, off, detail in irregular:
                add(ERROR, kind, label, off, detail)
    if used != h.hash_slot_count:  # a statistic the broker never reads back (stale slots make it drift)
        add(INFO, "index_header_mismatch", label, 32,
            f"hashSlotCount {h.hash_slot_count} but {used} slots are in use")
    if unreachable:
        add(WARNING, "index_entry_unreachable", label, entries_start + 20 * first_unreachable,
            f"{unreachable} entries (first #{first_unreachable}) are on no slot chain: queries never find them")


def _pure_one_index(f, label: str, cl: CommitLog, cache: RecordCache, add: _Sink, valid_end: int,
                    recovery_end: int | None, count: int):
    """The reference: entries in Python (a decoded record each), then the chains."""
    h = f.header
    geo = f.geometry
    slots_n = geo.hash_slot_num
    raw = _pread(f.path, slots_n * INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE)
    slots = array("i", raw[: len(raw) - len(raw) % 4])
    if array("i", [1]).tobytes()[0] == 1:
        slots.byteswap()
    prevs = array("i", [0]) * count
    hashes = array("i", [0]) * count
    # entries -> records (streamed; chains use the arrays filled here)
    entries_start = geo.entries_start
    last_phy = None
    rec = None
    keyset: set[int] = set()
    min_off = cl.min_offset
    expired = beyond = 0
    first = last = (-1, 0)  # (entry number, store time) of the first and last entries with a record
    first_phy = last_entry_phy = None
    for e in f.iter_entries():
        pos = entries_start + 20 * e.number
        prevs[e.number] = e.prev_index
        hashes[e.number] = e.key_hash
        if first_phy is None:
            first_phy = e.phy_offset
        last_entry_phy = e.phy_offset
        if e.phy_offset != last_phy:
            last_phy = e.phy_offset
            rec = None if e.phy_offset < min_off else cache.decode(e.phy_offset, check_crc=False)
            keyset = _index_hashes(rec) if isinstance(rec, Message) else set()
        if rec is None:
            expired += 1
            continue
        if not isinstance(rec, Message):
            if e.phy_offset >= valid_end or (recovery_end is not None and e.phy_offset >= recovery_end):
                beyond += 1
            else:
                _dangling(add, label, pos, e.number, e.phy_offset, rec)
            continue
        _message_entry(add, label, pos, e.number, e.key_hash, e.phy_offset, e.time_diff, rec, keyset,
                       h.begin_timestamp)
        if first[0] < 0:
            first = (e.number, rec.store_timestamp)
        last = (e.number, rec.store_timestamp)
    _entry_totals(add, label, expired, beyond, min_off)
    used = 0
    chain_slot = array("i", [-1]) * count
    irregular: list[tuple[str, int, str]] = []

    def event(ev: int, a: int, b: int = 0, c: int = 0) -> None:
        _chain_event(add, irregular, label, entries_start, count, slots_n, ev, a, b, c)

    for s, head in enumerate(slots):
        if head == 0:
            continue
        if head < 0 or head >= count:
            event(EV_SLOT_INVALID, s, head)
            continue
        used += 1
        cur, seen = head, 0
        while cur > 0:
            if chain_slot[cur] == s:
                event(EV_CYCLE, s, cur)
                break
            if chain_slot[cur] != -1:
                event(EV_MERGE, cur, chain_slot[cur], s)
                break
            chain_slot[cur] = s
            if hashes[cur] % slots_n != s:
                event(EV_SLOT_MISMATCH, cur, hashes[cur], s)
            prev = prevs[cur]
            if prev == cur:  # RocketMQ's query ends a chain there (prevIndex == the entry read)
                event(EV_ORDER_SELF, cur, prev)
                break
            if prev >= cur or prev < 0 or prev >= count:
                if prev != 0:
                    event(EV_ORDER, cur, prev)
                break
            cur = prev
            seen += 1
            if seen > count:
                break
    unreachable = [i for i in range(1, count) if chain_slot[i] == -1]
    _chain_totals(add, label, irregular, len(irregular),
                  lambda: _own_slot_reachable(slots, hashes, prevs, count, chain_slot), used, h, len(unreachable),
                  unreachable[0] if unreachable else 0, entries_start)
    return first_phy, last_entry_phy, first, last


_ENTRY_KINDS = ((S_DANGLING, "index_entry_dangling"), (S_KEY, "index_key_mismatch"),
                (S_ROLLBACK, "index_key_mismatch"), (S_TIME, "index_time_mismatch"))


def _fast_one_index(f, label: str, cl: CommitLog, cache: RecordCache, add: _Sink, valid_end: int,
                    recovery_end: int | None, count: int):
    """The compiled twin (:mod:`rmqdump.fast.indexjoin`): entries and chains judged in place; only entries it
    flags are decoded here, to word their findings as the pure path does (none once their kinds are capped)."""
    import numpy as np

    from rmqdump.fast.indexjoin import chain_events, entry_status, own_slot_reachable

    h = f.header
    geo = f.geometry
    entries_start = geo.entries_start
    min_off = cl.min_offset
    mm = f.mapped()
    idx = segs = readers = maps = None
    try:
        idx = np.frombuffer(mm, dtype=np.uint8)
        first_phy = last_entry_phy = None
        segs, readers = [], []
        if count > 1:
            first_phy = INDEX_ENTRY.unpack_from(mm, entries_start + 20)[1]
            last_entry_phy = INDEX_ENTRY.unpack_from(mm, entries_start + 20 * (count - 1))[1]
            segs, readers = _mapped_segments(cl, cache, idx, entries_start, count)
        maps = [(start, end, r.mm) for (start, end, _), r in zip(segs, readers, strict=True) if r is not None]

        def release(i0: int, i1: int, lo: int, hi: int) -> None:  # keep the resident set bounded
            _drop_pages(mm, entries_start + 20 * i0, entries_start + 20 * i1)
            for start, end, m in maps:
                if lo < end and hi > start:
                    _drop_pages(m, lo - start, hi - start)

        res = entry_status(idx, entries_start, count, segs, min_off=min_off, valid_end=valid_end,
                           recovery_end=recovery_end, begin_ts=h.begin_timestamp, max_record_size=MAX_RECORD_SIZE,
                           release=release)
        maps = readers = []
        segs = None
        st = res.status[1:count]
        expired = int(np.count_nonzero(st == S_EXPIRED))
        beyond = int(np.count_nonzero(st == S_BEYOND))
        first, last = res.first, res.last
        for i in (np.flatnonzero(st & (S_DANGLING | S_KEY | S_ROLLBACK | S_TIME | S_PYTHON)) + 1).tolist():
            code = int(res.status[i])
            if not code & S_PYTHON and all(add.full(kind) for bit, kind in _ENTRY_KINDS if code & bit):
                continue  # nothing left to word
            pos = entries_start + 20 * i
            key_hash, phy, time_diff, _ = INDEX_ENTRY.unpack_from(mm, pos)
            rec = cache.decode(phy, check_crc=False)
            if not isinstance(rec, Message):
                if phy >= valid_end or (recovery_end is not None and phy >= recovery_end):
                    beyond += 1
                else:
                    _dangling(add, label, pos, i, phy, rec)
                continue
            _message_entry(add, label, pos, i, key_hash, phy, time_diff, rec, _index_hashes(rec), h.begin_timestamp)
            if code & S_PYTHON:
                if first[0] < 0 or i < first[0]:
                    first = (i, rec.store_timestamp)
                if i > last[0]:
                    last = (i, rec.store_timestamp)
        _entry_totals(add, label, expired, beyond, min_off)
        slots_n = geo.hash_slot_num
        ch = chain_events(idx, slots_n, slots_n, entries_start, count, add.max)
        irregular: list[tuple[str, int, str]] = []
        for ev, a, b, c in ch.events:
            _chain_event(add, irregular, label, entries_start, count, slots_n, ev, a, b, c)
        _chain_totals(add, label, irregular, sum(ch.class_count[k] for k in IRREGULAR),
                      lambda: own_slot_reachable(idx, slots_n, entries_start, count, ch.chain_slot), ch.used, h,
                      ch.unreachable, ch.first_unreachable, entries_start)
        return first_phy, last_entry_phy, first, last
    finally:
        idx = segs = readers = maps = res = None
        mm.close()


def _drop_pages(m, a: int, b: int) -> None:
    """MADV_DONTNEED ``m[a:b]`` (whole pages): the page cache keeps them, our resident set drops them."""
    import mmap

    a = max(a, 0) & ~(mmap.PAGESIZE - 1)
    b = min(b, len(m))
    if b > a and hasattr(mmap, "MADV_DONTNEED"):
        try:
            m.madvise(mmap.MADV_DONTNEED, a, b - a)
        except (OSError, ValueError):
            pass


def _mapped_segments(cl: CommitLog, cache: RecordCache, idx, entries_start: int, count: int) -> tuple[list, list]:
    """(start, end as ``segment_for`` counts it, mapped bytes or None) of the segments the entries' offsets span,
    through the cache's readers (a segment that cannot be mapped: None, the Python decoder reads it), and the
    mapping readers (None for those)."""
    import mmap

    import numpy as np

    phys = np.ndarray((count - 1,), dtype=">i8", buffer=idx, offset=entries_start + 20 + 4, strides=(20,))
    lo, hi = int(phys.min()), int(phys.max())
    out, readers = [], []
    for seg in cl.segments:
        end = seg.start + max(seg.size, 1)
        if end <= lo or seg.start > hi:
            continue
        buf = mapped = None
        try:
            r = cache.readers.get(seg.start)
            if r is None and seg.size > 0:
                r = cache.readers[seg.start] = seg.open(True)
            if r is not None and isinstance(getattr(r, "mm", None), mmap.mmap):
                buf, mapped = np.frombuffer(r.mm, dtype=np.uint8), r
        except RmqdumpError:
            buf = mapped = None
        out.append((seg.start, end, buf))
        readers.append(mapped)
    return out, readers


def _index_hashes(rec: Message) -> set[int]:
    props = rec.properties
    topic = rec.topic
    out = set()
    uk = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uk:
        out.add(index_key_hash(f"{topic}#{uk}"))
    for k in split_keys(props.get(PROPERTY_KEYS)):
        out.add(index_key_hash(f"{topic}#{k}"))
    return out


def _pread(path: Path, n: int, pos: int) -> bytes:
    fd = open_read(path, nonblock=False)
    try:
        return os.pread(fd, n, pos)
    finally:
        os.close(fd)
