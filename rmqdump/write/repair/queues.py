"""Consume queues after a repair: the broker's dispatch rules replayed per queue (truncation,
re-dispatch, back-fill, LMQ targets) and the full rebuild."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rmqdump.broker.systopics import LMQ_PREFIX, multi_dispatch_targets
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code
from rmqdump.codec.layout import (
    CQ_STORE_UNIT_SIZE,
    CQ_UNIT,
    INNER_BATCH_FLAG,
    SCHEDULE_TOPIC,
    STORE_CONSUMEQUEUE_DIR,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.disk.extents import data_extents
from rmqdump.disk.paths import is_safe_component
from rmqdump.errors import RmqdumpError
from rmqdump.fast.cqrebuild import QueueUnits, put_units
from rmqdump.fast.redispatch import dispatch_candidates
from rmqdump.store.consumequeue import ConsumeQueueWriter, batch_cq_topics, open_batch_queues
from rmqdump.write.repair.files import (
    _merge_units,
    _nonzero_pieces,
    _open,
    _pread_all,
    _writes_from_overlay,
    diff_files,
)
from rmqdump.write.repair.model import Change, RepairPlan
from rmqdump.write.writer import ensure_store_dir


class _QueueEdit:
    """One consume queue's final state: existing files with overlays, deletions and new files."""

    def __init__(self, root: Path, topic: str, queue_id: int, qdir: Path, file_size: int, files: list,
                 write_units: int, max_phys: int):
        self.root = root
        self.topic = topic
        self.queue_id = queue_id
        self.qdir = qdir
        self.file_size = file_size
        self.existing = {f.start: f for f in files}
        self.write_units = write_units
        self.max_phys = max_phys
        self.zero_from: dict[int, int] = {}  # file start -> position from which original bytes become zero
        self.deleted: set[int] = set()
        self.units: dict[int, bytes] = {}  # logical byte offset -> 20-byte unit
        self.dropped = 0
        self.added = 0
        self.holes: list[tuple[int, int]] = []  # byte ranges of files missing between kept ones

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.queue_id}"

    def truncate(self, new_end_units: int, dropped: int) -> None:
        cut = new_end_units * CQ_STORE_UNIT_SIZE
        for start in self.existing:
            if start >= cut:
                self.deleted.add(start)
                self.zero_from[start] = 0
            elif start + self.file_size > cut:
                self.zero_from[start] = cut - start
        self.write_units = min(self.write_units, new_end_units)
        self.dropped += dropped

    def put(self, offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """``putMessagePositionInfo`` (skip already-built and duplicate positions); a record whose queue
        offset lies in a file missing between kept ones gets its unit back at that position."""
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        if any(a <= expect < b for a, b in self.holes):
            if expect not in self.units:
                self.units[expect] = CQ_UNIT.pack(offset, size, tags_code)
                self.added += 1
            return True
        if offset + size <= self.max_phys:
            return False
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        # a zero-length file (a crash between creating and extending it) holds nothing: the broker's first
        # dispatch into the queue creates its file anew, placeholders first (5.x deletes it at load, 4.9 refuses)
        live = [s for s, f in self.existing.items() if s not in self.deleted and f.size > 0]
        if not live and not self.units and expect != 0 and self.write_units * CQ_STORE_UNIT_SIZE != expect:
            start = expect - expect % self.file_size  # fillPreBlank for a queue created mid-way
            for pos in range(start, expect, CQ_STORE_UNIT_SIZE):
                self.units[pos] = CQ_UNIT.pack(0, 0x7FFFFFFF, 0)
            self.write_units = expect // CQ_STORE_UNIT_SIZE
        cur = self.write_units * CQ_STORE_UNIT_SIZE
        if expect < cur:
            return False
        self.units[cur] = CQ_UNIT.pack(offset, size, tags_code)
        self.write_units += 1
        self.max_phys = offset + size
        self.added += 1
        fs = cur - cur % self.file_size
        self.deleted.discard(fs)
        return True

    def changes(self) -> list[Change]:
        from rmqdump.store.consumequeue import file_name

        out: list[Change] = []
        rel_dir = self.qdir.relative_to(self.root).as_posix()
        by_file: dict[int, dict[int, bytes]] = {}
        for pos, unit in self.units.items():
            fs = pos - pos % self.file_size
            by_file.setdefault(fs, {})[pos - fs] = unit
        wrong_size = {fs for fs, f in self.existing.items() if f.size != self.file_size}
        touched = set(by_file) | set(self.zero_from) | self.deleted | wrong_size
        for fs in sorted(touched):
            rel = f"{rel_dir}/{file_name(fs)}"
            units = by_file.get(fs, {})
            if fs in self.deleted and not units:
                out.append(Change("delete", rel, group="consumequeue",
                                  why=f"{self.name}: file after the new end"))
                continue
            if fs not in self.existing:
                pieces = _merge_units(units)
                out.append(Change("create", rel, size=self.file_size, pieces=pieces, group="consumequeue",
                                  why=f"{self.name}: new file"))
                continue
            f = self.existing[fs]
            zero_at = self.zero_from.get(fs)
            if fs in wrong_size:
                if f.size == 0 and not units and fs == max(self.existing):
                    out.append(Change("delete", rel, group="consumequeue", why=f"{self.name}: zero-length last "
                                      "file: a crash between creating and extending it"))
                else:
                    out += self._replace(f, rel, zero_at, units)
                continue
            lo = min([*units, *([zero_at] if zero_at is not None else [])])
            hi = f.size
            fd = _open(f.path)
            try:
                original = _pread_all(fd, hi - lo, lo)
            finally:
                os.close(fd)
            final = bytearray(original)
            if zero_at is not None:
                final[zero_at - lo:] = bytes(hi - zero_at)
            for p, u in units.items():
                final[p - lo:p - lo + CQ_STORE_UNIT_SIZE] = u
            for off, data in _writes_from_overlay(original, lo, bytes(final), CQ_STORE_UNIT_SIZE):
                out.append(Change("write", rel, offset=off, length=len(data),
                                  data=None if data.count(0) == len(data) else data, group="consumequeue",
                                  why=f"{self.name}: entries"))
        return out


    def _replace(self, f, rel: str, zero_at: int | None, units: dict[int, bytes]) -> list[Change]:
        """A file of the wrong size (a crash between create and extend, or a cut copy): the broker's
        load refuses it, so it is replaced by a full-size file holding its bytes (backed up by the delete)."""
        keep = min(f.size, self.file_size, self.file_size if zero_at is None else zero_at)
        fd = _open(f.path)
        try:
            final = bytearray(_pread_all(fd, keep, 0))
        finally:
            os.close(fd)
        final.extend(bytes(self.file_size - len(final)))
        for p, u in units.items():
            final[p:p + CQ_STORE_UNIT_SIZE] = u
        why = f"{self.name}: {f.size} bytes, not the queue file size {self.file_size} (the broker refuses to load it)"
        return [Change("delete", rel, group="consumequeue", why=why),
                Change("create", rel, size=self.file_size, pieces=_nonzero_pieces(final), group="consumequeue",
                       why=why)]


def _topic_alive(root: Path):
    """A predicate: may a topic whose consume-queue directory is gone get its entries back? Not when
    ``config/topics.json`` exists and no longer lists it (deleted by an admin: the broker removed its queues,
    the commitlog keeps the records until they expire)."""
    from rmqdump.store.config import load_topics

    try:
        topics = load_topics(root).data
    except RmqdumpError:
        topics = None
    if not topics:
        return lambda topic: True
    return lambda topic: topic in topics or topic.startswith(LMQ_PREFIX)


#: why repair refuses a store whose BatchCQ records only the broker's own recovery would dispatch
BATCH_CQ_UNWRITTEN = "BatchConsumeQueue units are not written by rmqdump"


def _cq_changes(cl, root: Path, states, cq_file_size: int, pred, end: int, plan: RepairPlan, use_mmap: bool,
                delay_levels_ms, filler_offsets: set[int], cq_truncation) -> list[Change]:
    from rmqdump.codec.record import Message

    edits: dict[tuple[str, int], _QueueEdit] = {}
    for st in states:
        qt = cq_truncation(st, end, True)
        new_end = min(qt.end_after, qt.recovered_end)
        max_phys = -1
        if new_end > st.first_offset and st.cq is not None:
            try:
                e = st.cq.entry_at(new_end - 1, check_max=False)
                if e.is_valid:
                    max_phys = e.commit_log_offset + e.size
            except RmqdumpError:
                pass
        ed = _QueueEdit(root, st.topic, st.queue_id, st.path, st.file_size, st.cq.files if st.cq else st.files,
                        new_end, max_phys)
        extent = _cq_extent(st, new_end)
        # a file from the new end on holds no unit to keep; left in place, the broker would append at its
        # start whatever queue offset comes next, and keep its invalid first unit after a crash (kept_invalid)
        past = any(f.start >= new_end * CQ_STORE_UNIT_SIZE for f in ed.existing.values())
        if extent > new_end or qt.count or past:
            ed.truncate(new_end, qt.count)
        edits[(st.topic, st.queue_id)] = ed
        if st.cq is not None:
            ed.holes = [(a, b) for a, b in st.cq.missing_files() if a < new_end * CQ_STORE_UNIT_SIZE]
    # dispatch every record the consume queues lack, also below where the broker's recovery starts (what it
    # would never restore: a lost queue tail, units of files missing between kept ones, queues whose
    # directory is gone - unless config/topics.json says the topic was deleted)
    # where the broker itself dispatches from: the abnormal recovery's walk, else the reput service's start
    if pred.mode == "abnormal" and pred.start_offset is not None:
        dispatch_from = pred.start_offset
    else:
        dispatch_from = max(cl.min_offset, min(pred.max_phy_offset_of_consume_queue, end))
    start = cl.min_offset
    alive = _topic_alive(root)
    batch_topics = batch_cq_topics(root)
    batch_queues = open_batch_queues(root) if batch_topics else {}
    undispatched_batch: dict[tuple[str, int], int] = {}
    brokers_own = 0  # of those, records the broker's own recovery of the store as it is would dispatch
    # the records a queue already holds (below its maxPhysicOffset) are skipped by the compiled walk unseen
    built = {key: ed.max_phys for key, ed in edits.items()
             if ed is not None and ed.max_phys >= 0 and not ed.holes and key[0] not in batch_topics
             and key[0] != SCHEDULE_TOPIC}
    for rec in dispatch_candidates(cl, start, end, built, use_mmap=use_mmap):
        if not isinstance(rec, Message) or rec.offset in filler_offsets:
            continue
        if rec.sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            continue
        key = (rec.topic, rec.queue_id)
        if rec.topic in batch_topics or rec.sys_flag & INNER_BATCH_FLAG:
            # a 5.x BatchCQ topic: dispatched into batchconsumequeue/, never into consumequeue/
            bq = batch_queues.get(key)
            if bq is None or rec.offset + rec.size > bq.max_physic_end:
                undispatched_batch[key] = undispatched_batch.get(key, 0) + 1
                if rec.offset >= dispatch_from:
                    brokers_own += 1
            continue
        try:
            tags = dispatch_tags_code(rec.topic, rec.properties, rec.store_timestamp, delay_levels_ms)
        except ValueError:
            plan.warnings.append(f"record at {rec.offset}: malformed DELAY; the broker's dispatch fails too")
            continue
        for topic, qid, qoff in dispatch_targets(rec):
            key = (topic, qid)
            ed = edits.get(key)
            if rec.offset < dispatch_from and ed is None and key not in edits and not alive(topic):
                continue
            if ed is None and key not in edits:
                if not is_safe_component(topic):
                    plan.warnings.append(f"topic {topic!r} cannot be a consume-queue directory; not dispatched")
                    edits[key] = None
                    continue
                qdir = root / STORE_CONSUMEQUEUE_DIR / topic / str(qid)
                ed = _QueueEdit(root, topic, qid, qdir, cq_file_size, _unloaded_files(qdir), 0, -1)
                edits[key] = ed
            if ed is not None:
                ed.put(rec.offset, rec.size, tags, qoff)
    for (topic, qid), n in sorted(undispatched_batch.items()):
        plan.warnings.append(f"batchconsumequeue/{topic}/{qid}: {n} record(s) of this BatchCQ topic have no "
                             "BatchConsumeQueue unit; rmqdump does not write BatchConsumeQueue units (not "
                             "supported), nothing dispatched for them")
    if brokers_own:
        # the repaired store's recovery would start past them (a repair ends in a normal recovery from the queues'
        # new end): they would never be dispatched, where the broker's own recovery of this store dispatches them
        plan.blocked = (f"{brokers_own} record(s) of BatchCQ topics have no BatchConsumeQueue unit, which rmqdump "
                        f"cannot write ({BATCH_CQ_UNWRITTEN}); the broker's own recovery of the store as it is "
                        "dispatches them and a repaired store's would not: start the broker on it first, then "
                        "repair what remains")
    out: list[Change] = []
    for ed in edits.values():
        if ed is None:
            continue
        if ed.dropped:
            plan.step("consumequeue", "drop", queue=ed.name, entries=ed.dropped)
        gone = sorted(ed.deleted - {p - p % ed.file_size for p in ed.units})
        if gone and not ed.dropped:
            from rmqdump.store.consumequeue import file_name

            plan.step("consumequeue", "delete", queue=ed.name, files=[file_name(fs) for fs in gone],
                      detail="no entry from the queue's end on: the broker's recovery would keep the first unit "
                             "of such a last file, and append at its start whatever queue offset comes next")
        if ed.added:
            plan.step("consumequeue", "dispatch", queue=ed.name, entries=ed.added,
                      detail="records the dispatch had not caught up with")
        out += ed.changes()
    for f in states:
        if f.cq is not None and f.cq.stray_files:
            plan.warnings.append(f"consumequeue/{f.topic}/{f.queue_id}: stray files left alone")
    return out


def _unloaded_files(qdir: Path) -> list:
    """Files of a queue whose consume queue did not load (e.g. only a zero-length file): replaced or deleted."""
    from rmqdump.store.consumequeue import list_mapped_files

    if not qdir.is_dir():
        return []
    return list_mapped_files(qdir)[0]


def _cq_extent(st, from_units: int) -> int:
    """Units up to the last non-zero byte of a queue's files at or after ``from_units`` (0 if none)."""
    from rmqdump.write.appender import nonzero_span

    best = 0
    cut = from_units * CQ_STORE_UNIT_SIZE
    for f in st.cq.files if st.cq is not None else st.files:
        if f.start + f.size <= cut:
            continue
        span = nonzero_span(f.path, max(0, cut - f.start), f.size)
        if span is not None:
            best = max(best, (f.start + span[1] + CQ_STORE_UNIT_SIZE - 1) // CQ_STORE_UNIT_SIZE)
    return best


def _rebuild_cq_changes(cl, root: Path, cq_file_size: int, end: int, plan: RepairPlan, use_mmap: bool,
                        delay_levels_ms) -> list[Change]:
    """Regenerate every consume queue from the commitlog; diff against what is on disk."""
    from rmqdump.store.consumequeue import discover_queues, file_name, list_mapped_files

    stage = Path(tempfile.mkdtemp(prefix="rmqdump-rebuild-cq-"))
    try:
        built = rebuild_consume_queues(cl, stage, cq_file_size, end=end, use_mmap=use_mmap,
                                       delay_levels_ms=delay_levels_ms, warnings=plan.warnings,
                                       batch_topics=batch_cq_topics(root), expired_from=root)
        out: list[Change] = []
        seen: set[str] = set()
        for rel in built:
            staged = stage / rel
            dst = root / rel
            seen.add(rel)
            if dst.is_file() and not dst.is_symlink() and dst.stat().st_size == staged.stat().st_size:
                for off, data in diff_files(dst, staged, CQ_STORE_UNIT_SIZE * 50):
                    out.append(Change("write", rel, offset=off, length=len(data), data=data, group="consumequeue",
                                      why="rebuild"))
            else:
                if dst.exists() or dst.is_symlink():
                    out.append(Change("delete", rel, group="consumequeue", why="rebuild (size)"))
                fd = _open(staged)
                try:
                    pieces = []
                    for a, b in data_extents(fd, 0, os.fstat(fd).st_size):
                        data = _pread_all(fd, b - a, a)
                        stripped = data.rstrip(b"\0")
                        if stripped:
                            pieces.append((a, stripped))
                finally:
                    os.close(fd)
                out.append(Change("create", rel, size=staged.stat().st_size, pieces=pieces, group="consumequeue",
                                  why="rebuild"))
        for ref in discover_queues(root):
            files, _ = list_mapped_files(ref.path)
            for f in files:
                rel = f"{STORE_CONSUMEQUEUE_DIR}/{ref.topic}/{ref.queue_id}/{file_name(f.start)}"
                if rel not in seen:
                    out.append(Change("delete", rel, group="consumequeue", why="rebuild: no such entries"))
        return out
    finally:
        shutil.rmtree(stage, ignore_errors=True)


class _Rebuilt:
    """The queue writers of a rebuild and its warnings, in the order the records raise them."""

    def __init__(self, out_root: Path, cq_file_size: int, warnings: list[str] | None):
        self.out_root, self.cq_file_size, self.warnings = out_root, cq_file_size, warnings
        self.writers: dict[tuple[str, int], ConsumeQueueWriter | None] = {}
        self.skipped_batch: dict[str, int] = {}

    def warn(self, text: str) -> None:
        if self.warnings is not None:
            self.warnings.append(text)

    def writer(self, topic: str, qid: int) -> ConsumeQueueWriter | None:
        """The queue's writer, made at its first record; None (said once) when the topic cannot be a directory."""
        key = (topic, qid)
        w = self.writers.get(key, False)
        if w is False:
            if not is_safe_component(topic):
                self.warn(f"topic {topic!r} cannot be a consume-queue directory; skipped")
                w = None
            else:
                qdir, _ = ensure_store_dir(self.out_root, STORE_CONSUMEQUEUE_DIR, topic, str(qid))
                w = ConsumeQueueWriter(qdir, self.cq_file_size)
            self.writers[key] = w
        return w

    def batch_record(self, topic: str, n: int = 1) -> None:
        """``n`` records of a BatchCQ topic, not rebuilt (said once, at the end)."""
        self.skipped_batch[topic] = self.skipped_batch.get(topic, 0) + n

    def units(self, u: QueueUnits) -> None:
        """A batch of the compiled walk: its new queues' writers made in the order their records come (a topic
        that cannot be a directory is said then), then each queue's units."""
        for t, n in u.batch_topic_records.items():
            self.batch_record(t, n)
        for _, k in sorted((u.first[k], k) for k, key in enumerate(u.keys) if key not in self.writers):
            self.writer(*u.keys[k])
        for k, (topic, qid) in enumerate(u.keys):
            w = self.writers[(topic, qid)]
            if w is not None:
                put_units(w, *u.queue(k))

    def finish(self) -> None:
        for w in self.writers.values():
            if w is not None:
                w.fsync()
        for topic, n in sorted(self.skipped_batch.items()):
            self.warn(f"BatchCQ topic {topic!r}: {n} record(s) not rebuilt: rebuilding BatchConsumeQueue "
                      "units (batchconsumequeue/) is not supported; they are left as they are")

    def close(self) -> None:
        for w in self.writers.values():
            if w is not None:
                w.close()


def dispatch_targets(rec) -> list[tuple[str, int, int]]:
    """The queues the broker's dispatcher puts a record in: (topic, queue id, queue offset) of its own
    queue, then each LMQ multi-dispatch target (``INNER_MULTI_DISPATCH``)."""
    out = [(rec.topic, rec.queue_id, rec.queue_offset)]
    if b"INNER_MULTI_DISPATCH" in rec.properties_raw:
        out += multi_dispatch_targets(rec.properties, rec.queue_id)
    return out


def rebuild_consume_queues(cl, out_root: Path, cq_file_size: int, *, end: int | None = None, use_mmap: bool = True,
                           delay_levels_ms=DEFAULT_DELAY_LEVELS_MS, warnings: list[str] | None = None,
                           batch_topics: set[str] | frozenset[str] = frozenset(),
                           expired_from: Path | None = None) -> list[str]:
    """Write ``consumequeue/`` for the records in [min offset, end) under ``out_root``; returns relative paths.

    ``expired_from``: the store whose queues' leading units into commitlog files retention deleted are carried
    over (:mod:`rmqdump.write.repair.expired`): no record is left to regenerate them from.

    Records of 5.x BatchCQ topics (``batch_topics``, and any inner-batch record) are skipped: the
    broker keeps them in ``batchconsumequeue/``, which is not rebuilt (not supported; a warning says so).
    The walk is compiled where it can run (:mod:`rmqdump.fast.cqrebuild`, the same files and warnings).
    """
    from rmqdump.codec.record import Message
    from rmqdump.fast import cqrebuild

    sink = _Rebuilt(out_root, cq_file_size, warnings)
    try:
        start: int | None = cl.min_offset
        if cqrebuild.applies(cl, end, use_mmap):
            start = None
            for item in cqrebuild.dispatch_units(cl, end=end, batch_topics=batch_topics,
                                                 delay_levels_ms=delay_levels_ms):
                if isinstance(item, cqrebuild.HandOver):
                    start = item.offset
                    break
                sink.units(item)
        for rec in cl.walk(start=start, end=end, check_crc=False, read_body=False, keep_going=True,
                           use_mmap=use_mmap) if start is not None else ():
            if not isinstance(rec, Message):
                continue
            if rec.sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
                continue
            if rec.topic in batch_topics or rec.sys_flag & INNER_BATCH_FLAG:
                sink.batch_record(rec.topic)
                continue
            try:
                tags = dispatch_tags_code(rec.topic, rec.properties, rec.store_timestamp, delay_levels_ms)
            except ValueError:
                sink.warn(f"record at {rec.offset}: malformed DELAY; not dispatched")
                continue
            for topic, qid, qoff in dispatch_targets(rec):
                w = sink.writer(topic, qid)
                if w is not None:
                    w.put_message_position_info(rec.offset, rec.size, tags, qoff)
        sink.finish()
    finally:
        sink.close()
    if expired_from is not None:
        from rmqdump.write.repair.expired import carry_expired_units

        carry_expired_units(expired_from, out_root, cq_file_size, cl.min_offset)
    out = []
    base = out_root / STORE_CONSUMEQUEUE_DIR
    for p in sorted(base.rglob("*")) if base.is_dir() else []:
        if p.is_file():
            out.append(p.relative_to(out_root).as_posix())
    return out
