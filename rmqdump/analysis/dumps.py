"""Structural dumps of the consume queues and index files (the library behind ``rmqdump cq`` / ``index``).

Summaries are JSON-ready dicts; entry iterators yield flat dict rows. Nothing here walks
the commitlog.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, INDEX_ENTRY, INDEX_HASH_SLOT_SIZE, INDEX_SIZE, hash_slots
from rmqdump.errors import NotFoundError, RmqdumpError
from rmqdump.store.geometry import StoreGeometry, _Reader, check_index_file

#: invalid units listed by queue offset in a summary (the rest are counted)
MAX_LISTED = 20
#: index entries read per chunk by the full analysis
ENTRY_CHUNK = 1 << 20
#: bytes of consume-queue units from which the summary counts them with numpy (``RMQDUMP_FAST`` overrides)
UNIT_COUNT_FAST = 1 << 20
#: units per read when numpy counts them (1.3 MB)
FAST_CHUNK_UNITS = 1 << 16

CQ_ENTRY_FIELDS = ("topic", "queue_id", "queue_offset", "commit_log_offset", "size", "tags_code", "status", "file")
INDEX_ENTRY_FIELDS = ("file", "number", "key_hash", "slot", "phy_offset", "time_diff", "time", "prev_index")


# --- consume queues ----------------------------------------------------------------------


def select_queues(store_root: str | os.PathLike, topic: str | None = None, queue_id: int | None = None) -> list:
    """QueueRefs of ``consumequeue/`` matching the topic / queue id (NotFoundError if none do)."""
    from rmqdump.store.consumequeue import discover_queues

    refs = sorted((r for r in discover_queues(store_root)
                   if (topic is None or r.topic == topic) and (queue_id is None or r.queue_id == queue_id)),
                  key=lambda r: (r.topic, r.queue_id))
    if not refs and (topic is not None or queue_id is not None):
        what = (f"topic {topic!r}" if topic is not None else "any topic") + \
            (f" queue {queue_id}" if queue_id is not None else "")
        raise NotFoundError(f"no consume queue for {what}", Path(store_root) / "consumequeue")
    return refs


def _status(e) -> str:
    if e.is_pre_blank:
        return "pre_blank"
    return "valid" if e.is_valid else "invalid"


def unit_counts(q) -> tuple[int, int, list[int]]:
    """(``fillPreBlank`` placeholders, invalid units, queue offsets of the first :data:`MAX_LISTED` invalid ones)
    in queue ``q``'s broker view; numpy's twin (``fast.cqcount``) on big queues, this loop otherwise."""
    from rmqdump.fast.engine import use_fast

    if use_fast(max(0, q.max_offset * CQ_STORE_UNIT_SIZE - (q.files[0].start if q.files else 0)), UNIT_COUNT_FAST):
        from rmqdump.fast.cqcount import unit_counts as fast_counts

        return fast_counts(q.entry_chunks(chunk_units=FAST_CHUNK_UNITS), MAX_LISTED)
    holes: list[int] = []
    n_holes = pre_blank = 0
    for e in q.iter_entries():
        if e.is_pre_blank:
            pre_blank += 1
        elif not e.is_valid:
            n_holes += 1
            if len(holes) < MAX_LISTED:
                holes.append(e.queue_offset)
    return pre_blank, n_holes, holes


def cq_queue_summary(ref, file_size: int | None, commitlog_min_offset: int = 0) -> dict:
    """One queue: files, min/max offsets, missing files, invalid units, what recovery would cut."""
    from rmqdump.store.consumequeue import ConsumeQueue

    q = ConsumeQueue(ref.path, ref.topic, ref.queue_id, file_size, strict=False)
    out: dict = {"topic": ref.topic, "queue_id": ref.queue_id, "files": [f.path.name for f in q.files],
                 "file_size": q.file_size}
    if not q.files:
        out.update(min_offset=0, max_offset=0, entries=0, max_physic_offset=-1, missing_files=[], holes=0,
                   hole_offsets=[], pre_blank=0, truncated_by_recovery=[], problems=q.problems,
                   stray_files=[str(p.name) for p in q.stray_files])
        return out
    pre_blank, n_holes, holes = unit_counts(q)
    per_file = q.file_size // CQ_STORE_UNIT_SIZE
    out.update(
        min_offset=q.min_offset(commitlog_min_offset), max_offset=q.max_offset,
        first_file_offset=q.files[0].start // CQ_STORE_UNIT_SIZE,
        entries=q.max_offset - q.files[0].start // CQ_STORE_UNIT_SIZE,
        max_physic_offset=q.max_physic_offset,
        missing_files=[{"from_queue_offset": a // CQ_STORE_UNIT_SIZE, "to_queue_offset": b // CQ_STORE_UNIT_SIZE,
                        "files": (b - a) // q.file_size} for a, b in q.missing_files()],
        holes=n_holes, hole_offsets=holes, pre_blank=pre_blank,
        truncated_by_recovery=[f.path.name for f in q.truncated_files],
        entries_per_file=per_file, problems=q.problems, stray_files=[p.name for p in q.stray_files],
    )
    return out


def cq_summary(store_root: str | os.PathLike, topic: str | None = None, queue_id: int | None = None,
               geometry: StoreGeometry | None = None, commitlog_min_offset: int = 0) -> dict:
    """Every selected queue's summary, plus the store-wide CQ file size and its source."""
    size = geometry.cq_file_size if geometry is not None else None
    source = geometry.sources.get("consumequeue") if geometry is not None else None
    doc: dict = {"store": str(store_root), "file_size": size, "file_size_source": source, "queues": [],
                 "errors": []}
    for ref in select_queues(store_root, topic, queue_id):
        try:
            doc["queues"].append(cq_queue_summary(ref, size if source != "default" else None, commitlog_min_offset))
        except RmqdumpError as exc:
            doc["errors"].append(str(exc))
    return doc


def cq_entries(store_root: str | os.PathLike, topic: str | None = None, queue_id: int | None = None,
               geometry: StoreGeometry | None = None, raw: bool = False) -> Iterator[dict]:
    """Entry rows of the selected queues (the broker's view, or every non-zero unit with ``raw``)."""
    from rmqdump.store.consumequeue import ConsumeQueue

    size = geometry.cq_file_size if geometry is not None and geometry.sources.get("consumequeue") != "default" \
        else None
    for ref in select_queues(store_root, topic, queue_id):
        q = ConsumeQueue(ref.path, ref.topic, ref.queue_id, size, strict=False)
        if not q.files:
            continue
        it = q.iter_raw() if raw else q.iter_entries()
        for e in it:
            if raw and e.commit_log_offset == 0 and e.size == 0 and e.tags_code == 0:
                continue
            start = e.queue_offset * CQ_STORE_UNIT_SIZE
            name = f"{start - start % q.file_size:020d}"
            yield {"topic": ref.topic, "queue_id": ref.queue_id, "queue_offset": e.queue_offset,
                   "commit_log_offset": e.commit_log_offset, "size": e.size, "tags_code": e.tags_code,
                   "status": _status(e), "file": name}


# --- index files -------------------------------------------------------------------------


def _open_index_files(store_root: str | os.PathLike, geometry: StoreGeometry, name: str | None = None):
    from rmqdump.store.indexfile import IndexFile, list_index_files

    paths = list_index_files(store_root)
    if name is not None:
        paths = [p for p in paths if p.name == name]
        if not paths:
            raise NotFoundError(f"no index file named {name!r}", Path(store_root) / "index")
    for p in paths:
        try:
            yield p, IndexFile(p, geometry.index_hash_slot_num, geometry.index_num, strict=False)
        except RmqdumpError as exc:
            yield p, exc


def analyse_index_file(f) -> dict:
    """Slot occupancy, chain-length histogram and structural problems, from one full read.

    A chain is intact when every entry's prevIndex is the previous entry of the same slot
    (0 for the first) and every slot holds its last entry — what ``putKey`` writes.
    The histogram counts entries per slot: the chain a query walks when the links are intact.
    """
    geo = f.geometry
    S = geo.hash_slot_num
    count = f.index_count
    n = max(0, min(count, geo.index_num) - 1)
    with _Reader(f.path) as r:
        slots = r.read(geo.slot_pos(0), S * INDEX_HASH_SLOT_SIZE)
        try:
            import numpy as np
        except ImportError:  # numpy is optional (rmqdump[fast])
            np = None
        if np is not None:
            res = _analyse_numpy(np, r, geo, slots, n, count)
        else:
            res = _analyse_python(r, geo, slots, n, count)
    res["problems"] = res["problems"][:MAX_LISTED] + ([f"... {len(res['problems']) - MAX_LISTED} more"]
                                                      if len(res["problems"]) > MAX_LISTED else [])
    return res


def _summary(used: int, S: int, problems: list[str], bad_prev: int, bad_heads: int, hist: dict[int, int],
             time_back: int) -> dict:
    return {"used_slots": used, "slot_occupancy": round(used / S, 6) if S else 0.0,
            "chain_length_histogram": {str(k): v for k, v in sorted(hist.items())},
            "max_chain_length": max(hist) if hist else 0,
            "mean_chain_length": round(sum(k * v for k, v in hist.items()) / used, 3) if used else 0.0,
            "broken_links": bad_prev, "wrong_slot_heads": bad_heads,
            "entries_with_negative_time": time_back, "problems": problems}


def _analyse_numpy(np, r: _Reader, geo, slots: bytes, n: int, count: int) -> dict:
    """Streaming check in chunks of ENTRY_CHUNK entries; memory ~ slot table + one chunk."""
    S = geo.hash_slot_num
    table = np.frombuffer(slots, dtype=">i4").astype(np.int64)
    dt = np.dtype([("h", ">i4"), ("p", ">i8"), ("t", ">i4"), ("v", ">i4")])
    last = np.zeros(S, dtype=np.int64)  # last entry number seen per slot
    per_slot = np.zeros(S, dtype=np.int64)  # entries per slot (= chain length when links are intact)
    bad_prev = bad_hash = time_back = 0
    first_bad = None
    for first in range(1, n + 1, ENTRY_CHUNK):
        m = min(ENTRY_CHUNK, n + 1 - first)
        ent = np.frombuffer(r.read(geo.entry_pos(first), m * INDEX_SIZE), dtype=dt)
        kh = ent["h"].astype(np.int64)
        prev = ent["v"].astype(np.int64)
        numbers = np.arange(first, first + m, dtype=np.int64)
        bad_hash += int((kh < 0).sum())
        time_back += int((ent["t"] < 0).sum())
        slot_of = np.where(kh < 0, 0, kh) % S
        order = np.argsort(slot_of, kind="stable")
        s_sorted = slot_of[order]
        n_sorted = numbers[order]
        head = np.ones(m, dtype=bool)
        head[1:] = s_sorted[1:] != s_sorted[:-1]
        expected_sorted = np.empty(m, dtype=np.int64)
        expected_sorted[1:] = n_sorted[:-1]
        expected_sorted[head] = last[s_sorted[head]]
        mismatch = prev[order] != expected_sorted
        k = int(mismatch.sum())
        if k:
            if first_bad is None:
                i = int(np.argmax(mismatch))
                first_bad = (int(n_sorted[i]), int(prev[order][i]), int(expected_sorted[i]))
            bad_prev += k
        tail = np.ones(m, dtype=bool)
        tail[:-1] = s_sorted[:-1] != s_sorted[1:]
        last[s_sorted[tail]] = n_sorted[tail]
        per_slot += np.bincount(slot_of, minlength=S)
    problems: list[str] = []
    if bad_prev:
        problems.append(f"{bad_prev} entries whose prevIndex is not the previous entry of their slot (first: entry "
                        f"{first_bad[0]} prevIndex {first_bad[1]}, expected {first_bad[2]}); chain lengths below "
                        "count entries per slot")
    head_bad = table != last
    bad_heads = int(head_bad.sum())
    if bad_heads:
        s = int(np.argmax(head_bad))
        problems.append(f"{bad_heads} slots not holding their last entry (first: slot {s} = {int(table[s])}, "
                        f"expected {int(last[s])})")
    out_of_range = int(((table < 0) | (table >= count)).sum())
    if out_of_range:
        problems.append(f"{out_of_range} slots outside [0, indexCount {count})")
    if bad_hash:
        problems.append(f"{bad_hash} entries with a negative keyHash")
    used = int(((table > 0) & (table < count)).sum())
    vals, cnts = np.unique(per_slot[per_slot > 0], return_counts=True)
    hist = {int(v): int(c) for v, c in zip(vals, cnts, strict=True)}
    return _summary(used, S, problems, bad_prev, bad_heads, hist, time_back)


def _analyse_python(r: _Reader, geo, slots: bytes, n: int, count: int) -> dict:
    """The same check without numpy (slower; memory ~ two int arrays of the slot count)."""
    from array import array

    S = geo.hash_slot_num
    table = hash_slots(S).unpack(slots)
    last = array("q", bytes(8 * S))
    per_slot = array("q", bytes(8 * S))
    bad_prev = time_back = bad_hash = 0
    first_bad = None
    num = 1
    for first in range(1, n + 1, ENTRY_CHUNK):
        m = min(ENTRY_CHUNK, n + 1 - first)
        for kh, _phy, td, prev in INDEX_ENTRY.iter_unpack(r.read(geo.entry_pos(first), m * INDEX_SIZE)):
            if kh < 0:
                bad_hash += 1
            s = max(kh, 0) % S
            if prev != last[s]:
                bad_prev += 1
                if first_bad is None:
                    first_bad = (num, prev, last[s])
            if td < 0:
                time_back += 1
            last[s] = num
            per_slot[s] += 1
            num += 1
    problems: list[str] = []
    if bad_prev:
        problems.append(f"{bad_prev} entries whose prevIndex is not the previous entry of their slot (first: entry "
                        f"{first_bad[0]} prevIndex {first_bad[1]}, expected {first_bad[2]}); chain lengths below "
                        "count entries per slot")
    bad = [s for s in range(S) if table[s] != last[s]]
    if bad:
        problems.append(f"{len(bad)} slots not holding their last entry (first: slot {bad[0]} = {table[bad[0]]}, "
                        f"expected {last[bad[0]]})")
    out_of_range = sum(1 for v in table if v < 0 or v >= count)
    if out_of_range:
        problems.append(f"{out_of_range} slots outside [0, indexCount {count})")
    if bad_hash:
        problems.append(f"{bad_hash} entries with a negative keyHash")
    used = sum(1 for v in table if 0 < v < count)
    hist: dict[int, int] = {}
    for c in per_slot:
        if c:
            hist[c] = hist.get(c, 0) + 1
    return _summary(used, S, problems, bad_prev, len(bad), hist, time_back)


def index_summary(store, geometry: StoreGeometry, name: str | None = None, analyse: bool = True) -> dict:
    """Index files of a store: headers, geometry checks, coverage, and (``analyse``) slot/chain statistics."""
    from rmqdump.store.checkpoint import read_checkpoint

    root = store.root
    cl = store.commitlog
    cp_ts = None
    if store.abort_present:
        cp_ts = 0
        if store.path("checkpoint") is not None:
            try:
                cp_ts = read_checkpoint(store.path("checkpoint")).index_msg_timestamp
            except RmqdumpError:
                cp_ts = 0
    doc: dict = {"store": str(root), "geometry": {"hash_slot_num": geometry.index_hash_slot_num,
                                                  "index_num": geometry.index_num,
                                                  "source": geometry.sources.get("index")},
                 "geometry_problems": list(geometry.problems), "commitlog_min_offset": cl.min_offset,
                 "abort_present": store.abort_present, "files": []}
    if root is None:
        return doc
    for p, f in _open_index_files(root, geometry, name):
        if isinstance(f, RmqdumpError):
            doc["files"].append({"file": p.name, "error": str(f)})
            continue
        with f:
            h = f.header
            entry: dict = {"file": p.name, "size": f.size, "begin_timestamp": h.begin_timestamp,
                           "end_timestamp": h.end_timestamp, "begin_phy_offset": h.begin_phy_offset,
                           "end_phy_offset": h.end_phy_offset, "hash_slot_count": h.hash_slot_count,
                           "index_count": h.index_count, "entries": h.entry_count,
                           "full": h.index_count >= f.geometry.index_num,
                           "deleted_by_abnormal_restart": cp_ts is not None and h.end_timestamp > cp_ts}
            problems = []
            if h.index_count < 0 or h.index_count > f.geometry.index_num:
                problems.append(f"header indexCount {h.index_count} outside [0, {f.geometry.index_num}]")
            try:
                problems += check_index_file(f)
                if analyse:
                    stats = analyse_index_file(f)
                    problems += stats.pop("problems")
                    entry.update(stats)
                    if stats["used_slots"] != h.hash_slot_count:
                        problems.append(f"{stats['used_slots']} slots in use but header hashSlotCount is "
                                        f"{h.hash_slot_count}")
            except RmqdumpError as exc:
                problems.append(str(exc))
            entry["problems"] = problems
            doc["files"].append(entry)
    return doc


def index_entries(store_root: str | os.PathLike, geometry: StoreGeometry, name: str | None = None
                  ) -> Iterator[dict]:
    """Every written entry (1 .. indexCount−1) of the selected files, in write order."""
    for p, f in _open_index_files(store_root, geometry, name):
        if isinstance(f, RmqdumpError):
            raise f
        with f:
            S = f.geometry.hash_slot_num
            begin = f.header.begin_timestamp
            for e in f.iter_entries():
                yield {"file": p.name, "number": e.number, "key_hash": e.key_hash,
                       "slot": e.key_hash % S if e.key_hash >= 0 else None, "phy_offset": e.phy_offset,
                       "time_diff": e.time_diff, "time": begin + e.time_diff * 1000, "prev_index": e.prev_index}
