"""Index files after a repair: rebuilt from the commitlog (names, geometry and entry order as the
broker's IndexService writes them), or corrected in place."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rmqdump.codec.layout import (
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INT32,
    STORE_INDEX_DIR,
)
from rmqdump.errors import RmqdumpError
from rmqdump.write.repair.files import _open, _pread_all, diff_files
from rmqdump.write.repair.model import Change, RepairPlan


def _index_keys_of(rec) -> list[str]:
    from rmqdump.store.indexfile.writer import record_index_keys

    return record_index_keys(rec)


def build_index_files(cl, out_dir: Path, slots: int, entries: int, *, start: int, end: int, first_name: str | None,
                      seed_phy: int = 0, seed_ts: int = 0, skip_first_keys: int = 0, name_clock=None,
                      taken_names: set[str] | None = None, use_mmap: bool = True,
                      exclude: set[int] | frozenset = frozenset()) -> list[Path]:
    """Index files for the records in [start, end), written like ``IndexService`` (rolling full files).

    The first file is named ``first_name`` (or by ``name_clock``) and seeded with the previous
    file's end values (``seed_phy``/``seed_ts``); ``skip_first_keys`` keys of the record at
    ``start`` are skipped (they went into the previous file).
    """
    from rmqdump.codec.javahash import index_key_hash
    from rmqdump.codec.record import Message
    from rmqdump.store.indexfile import IndexFileWriter
    from rmqdump.store.indexfile.writer import next_index_file_name

    clock = name_clock or (lambda: int(time.time() * 1000))
    taken = set(taken_names or ())
    made: list[Path] = []

    def new_file(end_phy: int, end_ts: int):
        if first_name is not None and not made:
            name = first_name
        else:
            name = next_index_file_name(clock(), True, made[-1].name if made else "", taken, out_dir)
        taken.add(name)
        w = IndexFileWriter.create(out_dir / name, slots, entries, end_phy, end_ts)
        made.append(w.path)
        return w

    w = new_file(seed_phy, seed_ts)
    hashes: list[int] = []
    phys: list[int] = []
    tss: list[int] = []

    def put_all(hs, ps, ts) -> None:
        nonlocal w
        done = 0
        while done < len(hs):
            n = w.bulk_put(hs[done:], ps[done:], ts[done:])
            done += n
            if done < len(hs):
                h = w.header
                w.close()
                w = new_file(h.end_phy_offset, h.end_timestamp)

    def flush() -> None:
        put_all(hashes, phys, tss)
        hashes.clear()
        phys.clear()
        tss.clear()

    if start < end:
        pos: int | None = start
        from rmqdump.fast import indexkeys

        if indexkeys.applies(cl, start, end, use_mmap):
            pos = None
            first = True
            for item in indexkeys.index_keys(cl, start=start, end=end):
                if isinstance(item, indexkeys.HandOver):
                    pos = item.offset
                    break
                hs, ps, ts = item.hashes, item.offsets, item.store_timestamps
                if exclude:
                    keep = ~_isin(ps, exclude)
                    hs, ps, ts = hs[keep], ps[keep], ts[keep]
                if first and skip_first_keys and ps.size and int(ps[0]) == start:
                    k = min(skip_first_keys, int((ps == start).sum()))  # the record at start: its first keys
                    hs, ps, ts = hs[k:], ps[k:], ts[k:]
                first = False
                put_all(hs, ps, ts)
        for rec in cl.walk(start=pos, end=end, check_crc=False, read_body=False, keep_going=True,
                           use_mmap=use_mmap) if pos is not None else ():
            if not isinstance(rec, Message) or rec.offset < start or rec.offset in exclude:
                continue
            keys = _index_keys_of(rec)
            if rec.offset == start and skip_first_keys:
                keys = keys[skip_first_keys:]
            for k in keys:
                hashes.append(index_key_hash(k))
                phys.append(rec.offset)
                tss.append(rec.store_timestamp)
            if len(hashes) >= 65536:
                flush()
        flush()
    w.close()
    return made


def _isin(offsets, exclude: set[int] | frozenset):
    """Per offset: is it in ``exclude``."""
    import numpy as np

    return np.isin(offsets, np.fromiter(exclude, np.int64, len(exclude)))


def _fix_first_time_diff(original: Path, staged: Path, entries_start: int) -> None:
    """Keep the original first entry's timeDiff (it depends on the seed of a file we may not have)."""
    pos = entries_start + INDEX_ENTRY.size
    fa = _open(original)
    try:
        a = os.pread(fa, INDEX_ENTRY.size, pos)
    finally:
        os.close(fa)
    fb = _open(staged, os.O_RDWR)
    try:
        b = os.pread(fb, INDEX_ENTRY.size, pos)
        if len(a) == len(b) == INDEX_ENTRY.size:
            ha, pa, ta, va = INDEX_ENTRY.unpack(a)
            hb, pb, tb, vb = INDEX_ENTRY.unpack(b)
            if (ha, pa, va) == (hb, pb, vb) and pa != 0 and ta != tb:
                os.pwrite(fb, INDEX_ENTRY.pack(hb, pb, ta, vb), pos)
    finally:
        os.close(fb)


def _index_consistent(path: Path, geo, header) -> bool:
    """Slot heads within indexCount (a torn putKey leaves a slot pointing past it)."""
    fd = _open(path)
    try:
        table = _pread_all(fd, geo.hash_slot_num * INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE)
    finally:
        os.close(fd)
    count = header.effective_index_count
    for (v,) in INT32.iter_unpack(table):
        if v > count or v < 0:
            return False
    return True


def _index_changes(cl, root: Path, files: list[Path], headers: list, geo, end: int, plan: RepairPlan, stage: Path,
                   name_clock, use_mmap: bool, infer_geometry, neutralised: list[tuple[int, int]] = (),
                   interrupted: str | None = None) -> list[Change]:
    """Delete index files wholly past the end; rebuild the last one when it is stale, lagging or torn, or when
    ``interrupted`` (what the abort marker of an interrupted rmqdump write says) is given."""
    from rmqdump.codec.record import Message

    out: list[Change] = []
    keep = list(range(len(files)))
    for i in reversed(range(len(files))):
        h = headers[i]
        if h is not None and h.entry_count > 0 and h.begin_phy_offset >= end:
            out.append(Change("delete", f"{STORE_INDEX_DIR}/{files[i].name}", group="index",
                              why="every entry points past the end"))
            plan.step("index", "delete", file=files[i].name, entries=h.entry_count)
            keep.pop()
        else:
            break
    if not keep:
        return out
    li = keep[-1]
    path, h = files[li], headers[li]
    try:
        lgeo = infer_geometry(path.stat().st_size, geo.index_slots, geo.index_entries, path)
    except RmqdumpError:
        lgeo = None
    reasons = []
    for i, (p, hh) in enumerate(zip(files, headers, strict=True)):
        if hh is None or hh.entry_count == 0 or i == li:
            continue
        hit = [a for a, _ in neutralised if hh.begin_phy_offset <= a <= hh.end_phy_offset]
        if hit:
            plan.warnings.append(f"index/{p.name} holds entries for the neutralised record(s) at {hit[:5]}; "
                                 "--rebuild-index regenerates it")
    if h is None or lgeo is None:
        reasons.append("unreadable header or size")
    else:
        hit = [a for a, _ in neutralised if h.entry_count > 0 and h.begin_phy_offset <= a <= h.end_phy_offset]
        if hit:
            reasons.append(f"entries point at neutralised records ({', '.join(map(str, hit[:5]))})")
        if h.entry_count > 0 and h.end_phy_offset >= end:
            reasons.append(f"entries point at offset {h.end_phy_offset}, past the end {end}")
        if not _index_consistent(path, lgeo, h):
            reasons.append("a slot points past indexCount (torn putKey)")
        lag_from = None
        if h.entry_count > 0 and h.end_phy_offset < end:
            last = cl.decode_at(h.end_phy_offset, check_crc=False, read_body=False)
            if isinstance(last, Message):
                lag_from = h.end_phy_offset + last.size
            else:
                reasons.append(f"the last entry points at {h.end_phy_offset}, where there is no record")
        elif h.entry_count == 0:
            lag_from = _record_start_at_or_after(cl, max(h.begin_phy_offset, cl.min_offset), end, use_mmap)
        if lag_from is not None and lag_from < end:
            for rec in cl.walk(start=lag_from, end=end, check_crc=False, read_body=False, use_mmap=use_mmap):
                if isinstance(rec, Message) and _index_keys_of(rec):
                    reasons.append(f"records from offset {rec.offset} have no index entries")
                    break
    if h is None or lgeo is None:
        interrupted = None
    if interrupted and not reasons:
        # its writes may have stopped inside this file (a header already new, entries or slots not yet): only
        # a rebuild compared byte for byte tells; when the file is whole the comparison changes nothing
        reasons.append(f"an interrupted rmqdump run ({interrupted}) may have left it partly written")
    if not reasons or lgeo is None:
        if lgeo is None:
            plan.warnings.append(f"index/{path.name}: geometry unknown; use --rebuild-index")
        return out
    prev = headers[li - 1] if li > 0 else None
    seed_phy = prev.end_phy_offset if prev is not None else 0
    seed_ts = prev.end_timestamp if prev is not None else 0
    begin = h.begin_phy_offset if (h is not None and h.entry_count > 0) else max(seed_phy, cl.min_offset)
    skip = 0
    if prev is not None and prev.entry_count > 0 and prev.end_phy_offset == begin:
        skip = _entries_at_phy(files[li - 1], lgeo, prev, begin)
    begin_rec = _record_start_at_or_after(cl, begin, end, use_mmap)
    made = build_index_files(cl, stage, lgeo.hash_slot_num, lgeo.index_num, start=begin_rec, end=end,
                             first_name=path.name, seed_phy=seed_phy, seed_ts=seed_ts,
                             skip_first_keys=skip if begin_rec == begin else 0, name_clock=name_clock,
                             taken_names={p.name for p in files}, use_mmap=use_mmap,
                             exclude={a for a, _ in neutralised})
    _fix_first_time_diff(path, made[0], lgeo.entries_start)
    writes = [Change("write", f"{STORE_INDEX_DIR}/{path.name}", offset=off, length=len(data), data=data,
                     group="index", why="rebuild") for off, data in diff_files(path, made[0])]
    if interrupted and len(reasons) == 1 and not writes and len(made) == 1:
        return out  # the interrupted run left this file whole
    out += writes
    from rmqdump.store.indexfile import IndexFile

    with IndexFile(made[0], lgeo.hash_slot_num, lgeo.index_num) as f:
        n_new = f.header.entry_count
    plan.step("index", "rebuild", file=path.name, entries_before=h.entry_count if h else None, entries_after=n_new,
              reasons=reasons)
    for extra in made[1:]:
        out.append(Change("create", f"{STORE_INDEX_DIR}/{extra.name}", size=extra.stat().st_size, source=extra,
                          group="index", why="rebuild: next index file"))
        plan.step("index", "create", file=extra.name)
    return out


def _record_start_at_or_after(cl, offset: int, end: int, use_mmap: bool) -> int:
    """``offset`` if a record starts there, else the recovery walk's first record after it."""
    from rmqdump.codec.record import Blank, Message

    if offset >= end:
        return end
    rec = cl.decode_at(offset, check_crc=False, read_body=False)
    if isinstance(rec, Message | Blank):
        return offset
    seg = cl.segment_for(offset)
    for r in cl.walk(start=seg.start if seg else cl.min_offset, end=end, check_crc=False, read_body=False,
                     use_mmap=use_mmap):
        if isinstance(r, Message) and r.offset >= offset:
            return r.offset
    return end


def _entries_at_phy(path: Path, geo, header, phy: int) -> int:
    """How many of the last entries of an index file point at ``phy``."""
    n = 0
    fd = _open(path)
    try:
        i = header.effective_index_count - 1
        while i >= 1:
            e = os.pread(fd, INDEX_ENTRY.size, geo.entries_start + i * INDEX_ENTRY.size)
            if len(e) < INDEX_ENTRY.size or INDEX_ENTRY.unpack(e)[1] != phy:
                break
            n += 1
            i -= 1
    finally:
        os.close(fd)
    return n


def _rebuild_index_changes(cl, root: Path, files: list[Path], geo, end: int, plan: RepairPlan, stage: Path,
                           name_clock, use_mmap: bool) -> list[Change]:
    """Regenerate every index file from the commitlog (in place: diff against the existing files)."""
    made = build_index_files(cl, stage, geo.index_slots, geo.index_entries, start=cl.min_offset, end=end,
                             first_name=files[0].name if files else None, name_clock=name_clock,
                             taken_names={p.name for p in files}, use_mmap=use_mmap)
    # keep the existing names, in order, for the files the rebuild produced
    names = [p.name for p in files]
    out: list[Change] = []
    for i, staged in enumerate(made):
        name = names[i] if i < len(names) else staged.name
        if name != staged.name:
            target = stage / name
            staged.rename(target)
            staged = target
        dst = root / STORE_INDEX_DIR / name
        if i < len(names) and dst.stat().st_size == staged.stat().st_size:
            _fix_first_time_diff(dst, staged, INDEX_HEADER_SIZE + geo.index_slots * INDEX_HASH_SLOT_SIZE)
            for off, data in diff_files(dst, staged):
                out.append(Change("write", f"{STORE_INDEX_DIR}/{name}", offset=off, length=len(data), data=data,
                                  group="index", why="rebuild"))
        else:
            if i < len(names):
                out.append(Change("delete", f"{STORE_INDEX_DIR}/{name}", group="index", why="rebuild (size)"))
            out.append(Change("create", f"{STORE_INDEX_DIR}/{name}", size=staged.stat().st_size, source=staged,
                              group="index", why="rebuild"))
    for name in names[len(made):]:
        out.append(Change("delete", f"{STORE_INDEX_DIR}/{name}", group="index", why="rebuild: not needed"))
    plan.step("index", "rebuild_all", files=len(made), detail="every index file regenerated from the commitlog")
    return out


def _full_index_end_ts(root: Path, plan: RepairPlan, geo) -> int:
    """endTimestamp of the newest index file that is full after the repair (0 if none)."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    deleted = {c.path for c in plan.changes if c.op == "delete"}
    best = 0
    for p in list_index_files(root):
        if f"{STORE_INDEX_DIR}/{p.name}" in deleted:
            continue
        try:
            with IndexFile(p, strict=False) as f:
                if f.header.index_count >= f.geometry.index_num:
                    best = max(best, f.header.end_timestamp)
        except (RmqdumpError, AttributeError):
            continue
    return best
