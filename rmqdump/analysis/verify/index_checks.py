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
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.properties import split_keys
from rmqdump.codec.record import Message
from rmqdump.disk.fileio import open_read
from rmqdump.errors import RmqdumpError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog


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
    """Index files → commitlog: keys, slots, chains, header counters and timestamps."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    out: list[Finding] = []
    infos: list[dict] = []
    counts: Counter = Counter()

    def add(sev, kind, file, off, detail):
        counts[kind] += 1
        if counts[kind] <= max_per_kind:
            out.append(Finding(sev, kind, file, off, detail))

    try:
        paths = list_index_files(root)
    except RmqdumpError as e:
        return [Finding(ERROR, "index_unreadable", "index", None, e.message)], infos
    sizes = Counter()
    for p in paths:
        try:
            sizes[p.stat().st_size] += 1
        except OSError:
            pass
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
            info = _check_one_index(f, label, n == 0, cl, cache, add, valid_end, recovery_end)
            infos.append(info)
    return out, infos


def _check_one_index(f, label: str, first_file: bool, cl: CommitLog, cache: RecordCache, add, valid_end: int,
                     recovery_end: int | None) -> dict:
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
    first_ts = last_ts = None
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
                add(ERROR, "index_entry_dangling", label, pos,
                    f"entry {e.number} points at {e.phy_offset}, where there is no valid record ({rec.kind})")
            continue
        if e.key_hash not in keyset:
            add(ERROR, "index_key_mismatch", label, pos,
                f"entry {e.number} keyHash {e.key_hash} matches no key of the record at {e.phy_offset} "
                f"({rec.topic}, {len(keyset)} indexed keys)")
        if rec.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
            add(ERROR, "index_key_mismatch", label, pos, f"entry {e.number} indexes a ROLLBACK record")
        ts = rec.store_timestamp
        if first_ts is None:
            first_ts = ts
        last_ts = ts
        if e.number > 1 and h.begin_timestamp > 0:
            d = ts - h.begin_timestamp
            exp = min(d // 1000, 0x7FFFFFFF) if d > 0 else 0  # putKey: seconds, 0 if negative, capped
            if e.time_diff != exp:
                add(WARNING, "index_time_mismatch", label, pos + 12,
                    f"entry {e.number} timeDiff {e.time_diff} s, record stored {exp} s after beginTimestamp")
    if expired:
        add(INFO, "index_entry_expired", label, None, f"{expired} entries point below the commitlog start {min_off}")
    if beyond:
        add(WARNING, "index_entry_beyond_end", label, None,
            f"{beyond} entries point past the end of valid commitlog data (stale after a truncation; queries "
            "re-read and drop them)")
    used = 0
    chain_slot = array("i", [-1]) * count
    irregular: list[tuple[str, int, str]] = []
    for s, head in enumerate(slots):
        if head == 0:
            continue
        if head < 0 or head >= count:
            add(WARNING, "index_slot_invalid", label, INDEX_HEADER_SIZE + 4 * s,
                f"slot {s} holds {head}, outside [1, indexCount {count}): ignored by queries")
            continue
        used += 1
        cur, seen = head, 0
        while cur > 0:
            if chain_slot[cur] == s:
                add(ERROR, "index_chain_cycle", label, entries_start + 20 * cur + 16,
                    f"chain of slot {s} revisits entry {cur}")
                break
            if chain_slot[cur] != -1:
                irregular.append(("index_chain_merge", entries_start + 20 * cur + 16,
                                  f"entry {cur} is on the chains of slots {chain_slot[cur]} and {s}"))
                break
            chain_slot[cur] = s
            if hashes[cur] % slots_n != s:
                irregular.append(("index_slot_mismatch", entries_start + 20 * cur,
                                  f"entry {cur} (keyHash {hashes[cur]}, slot {hashes[cur] % slots_n}) is on the "
                                  f"chain of slot {s}"))
            prev = prevs[cur]
            if prev == cur:  # RocketMQ's query ends a chain there (prevIndex == the entry read)
                irregular.append(("index_chain_order", entries_start + 20 * cur + 16,
                                  f"entry {cur} prevIndex {prev} points at itself"))
                break
            if prev >= cur or prev < 0 or prev >= count:
                if prev != 0:
                    add(ERROR, "index_chain_order", label, entries_start + 20 * cur + 16,
                        f"entry {cur} prevIndex {prev} does not point at an older entry")
                break
            cur = prev
            seen += 1
            if seen > count:
                break
    if irregular:
        if _own_slot_reachable(slots, hashes, prevs, count, chain_slot):
            # RocketMQ itself leaves such files after a crash: every entry is still on its own slot's chain,
            # so every query finds what it should (the extra links only cost a few hops)
            add(INFO, "index_chain_irregular", label, irregular[0][1],
                f"{len(irregular)} irregular chain link(s) (first: {irregular[0][2]}); every entry is still on "
                "its own slot's chain, so queries find every key")
        else:
            for kind, off, detail in irregular:
                add(ERROR, kind, label, off, detail)
    if used != h.hash_slot_count:  # a statistic the broker never reads back (stale slots make it drift)
        add(INFO, "index_header_mismatch", label, 32,
            f"hashSlotCount {h.hash_slot_count} but {used} slots are in use")
    unreachable = [i for i in range(1, count) if chain_slot[i] == -1]
    if unreachable:
        add(WARNING, "index_entry_unreachable", label, entries_start + 20 * unreachable[0],
            f"{len(unreachable)} entries (first #{unreachable[0]}) are on no slot chain: queries never find them")
    if first_phy is not None:
        if h.begin_phy_offset != first_phy and first_file:
            add(WARNING, "index_header_mismatch", label, 16,
                f"beginPhyOffset {h.begin_phy_offset} but the first entry points at {first_phy}")
        if h.end_phy_offset != last_entry_phy:
            add(WARNING, "index_header_mismatch", label, 24,
                f"endPhyOffset {h.end_phy_offset} but the last entry points at {last_entry_phy}")
        if first_ts is not None and h.begin_timestamp != first_ts and first_file:
            add(WARNING, "index_header_mismatch", label, 0,
                f"beginTimestamp {h.begin_timestamp} but the first indexed record was stored at {first_ts}")
        if last_ts is not None and h.end_timestamp != last_ts:
            add(WARNING, "index_header_mismatch", label, 8,
                f"endTimestamp {h.end_timestamp} but the last indexed record was stored at {last_ts}")
    return info


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
