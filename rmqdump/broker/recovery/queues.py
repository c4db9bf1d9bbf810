"""The consume queues as the broker's recovery sees them: their state after ``ConsumeQueue.recover``
(with the load problems met on the way), ``maxPhyOffsetOfConsumeQueue``, and the entries each loses to
``truncateDirtyLogicFiles``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.broker.recovery.inputs import VERSION_49, VERSION_53
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT, STORE_BATCH_CONSUMEQUEUE_DIR
from rmqdump.disk.extents import nonzero_chunks
from rmqdump.disk.fileio import open_regular
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.store.consumequeue.entries import CqEntry, leading_valid_units
from rmqdump.store.consumequeue.reader import RECOVER_CHUNK_UNITS, RECOVER_FIRST_UNITS
from rmqdump.store.root import Store


@dataclass
class QueueState:
    """One consume queue as the broker's ``ConsumeQueue.recover`` leaves it."""

    topic: str
    queue_id: int
    path: Path
    files: list  # MappedFileInfo of the files kept by recovery
    file_size: int
    max_offset: int  # entries (queue offset units)
    max_physic_offset: int
    first_offset: int  # queue offset of the first file's first unit
    beyond: list[tuple[int, int]]  # valid (queue offset, commitlog offset) past the recovered end
    cq: object = None
    #: :func:`_file_keep` verdicts by (file start, processOffset): verify predicts two brokers' recoveries
    keeps: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.queue_id}"


class CqProblem(str):
    """A consume-queue file problem, as the text ``"<file>: <message>"`` (a ``str``, so it
    serialises as one) with ``file``, ``message``, ``fatal`` (a 4.9 broker's ``load()`` fails)
    and ``zero_last`` (a zero-length last file, which 5.x deletes instead of failing)."""

    file: str
    message: str
    fatal: bool
    zero_last: bool
    only: str | None

    def __new__(cls, file: str, message: str, fatal: bool, zero_last: bool = False,
                only: str | None = None) -> CqProblem:
        obj = super().__new__(cls, f"{file}: {message}")
        obj.file, obj.message, obj.fatal, obj.zero_last, obj.only = file, message, fatal, zero_last, only
        return obj

    def refuses(self, version: str) -> bool:
        """Whether the broker's ``load()`` fails on it: fatal, but for a zero-length last file on 5.x (it
        deletes it; RocketMQ 5.3.3 loads such stores) and only under the model ``only`` names when it names one
        (a BatchCQ file: 5.x; a sub-folder: 4.9)."""
        if self.only is not None and version != self.only:
            return False
        return self.fatal and not (version == VERSION_53 and self.zero_last)

    def __getnewargs__(self) -> tuple[str, str, bool, bool, str | None]:
        return self.file, self.message, self.fatal, self.zero_last, self.only


def consume_queue_states(store: Store) -> tuple[list[QueueState], list[CqProblem]]:
    """Every consume queue after the broker's CQ recovery, plus load problems found on the way."""
    problems: list[CqProblem] = []
    root = store.root
    if root is None:
        return [], problems
    if store.path("consumequeue") is None:
        return [], batch_cq_problems(root)
    from rmqdump.store.consumequeue import ConsumeQueue, discover_queues, infer_store_cq_file_size

    try:
        file_size = infer_store_cq_file_size(root)
    except RmqdumpError as e:
        problems.append(CqProblem("consumequeue", f"cannot infer the file size: {e.message}", False))
        file_size = None
    states: list[QueueState] = []
    for ref in discover_queues(root):
        label = f"consumequeue/{ref.topic}/{ref.queue_id}"
        try:
            cq = ConsumeQueue(ref.path, ref.topic, ref.queue_id, file_size, strict=False)
        except RmqdumpError as e:
            problems.append(CqProblem(label, e.message, True))
            continue
        problems += queue_file_problems(label, cq)
        if not cq.files or not cq.file_size:
            continue
        try:
            end = cq.max_offset
            maxphy = cq.max_physic_offset
            gone = {f.start for f in cq.truncated_files}
            kept = [f for f in cq.files if f.start not in gone]
            beyond = [(e.queue_offset, e.commit_log_offset) for e in _units(cq, end) if e.is_valid]
        except RmqdumpError as e:
            problems.append(CqProblem(label, e.message, False))
            continue
        states.append(QueueState(ref.topic, ref.queue_id, ref.path, kept, cq.file_size, end, maxphy,
                                 cq.files[0].start // 20, beyond, cq))
    return states, problems + batch_cq_problems(root)


def queue_file_problems(label: str, cq) -> list[CqProblem]:
    """What the broker's load meets in one consume queue's folder (``label``: ``consumequeue/T/Q``): files of
    another size, starts off the file size, entries that are no mapped file, files missing between others."""
    out: list[CqProblem] = []
    for f in cq.files:
        if cq.file_size and f.size != cq.file_size:
            out.append(CqProblem(f"{label}/{f.path.name}", f"{f.size} bytes, not the queue file size "
                                 f"{cq.file_size}: the broker refuses to load it", True,
                                 f.size == 0 and f is cq.files[-1]))
        elif cq.file_size and f.start % cq.file_size:
            out.append(CqProblem(f"{label}/{f.path.name}", f"start offset {f.start} is not a multiple of "
                                 f"the file size {cq.file_size}", False))
    out += _stray_problems(label, cq.path, cq.stray_files)
    for a, b in cq.missing_files():
        out.append(CqProblem(label, f"files missing for bytes [{a}, {b}): queue offsets "
                             f"{a // 20}..{b // 20 - 1} have no entries", False))
    return out


#: a :class:`CqProblem`'s message for a file in a queue folder that is no mapped file
STRAY_MESSAGE = "not a numeric mapped-file name: the broker's load fails on it"
#: ... and for a sub-folder there (4.9 reads its length as a file's)
SUBFOLDER_MESSAGE = "a folder where 4.9 expects only mapped files: its load fails on it (5.x skips it)"


def _stray_problems(label: str, qdir: Path, strays: list[Path], only: str | None = None) -> list[CqProblem]:
    """A queue folder's entries that are no mapped file: ``MappedFileQueue.load`` fails on each file (its size
    differs, or ``Long.parseLong`` throws), but 5.x deletes a zero-length last one (sub-folders count in that
    order); 5.x skips a sub-folder, 4.9 fails on it (a directory's length is not the file size)."""
    try:
        with os.scandir(qdir) as it:  # d_type: no stat per entry
            entries = {e.name: e.is_dir() for e in it}
    except OSError:
        entries = {}
    out = [] if only == VERSION_53 else [  # 5.x skips them (a 5.x-only folder: none matters)
        CqProblem(f"{label}/{n}", SUBFOLDER_MESSAGE, True, False, VERSION_49) for n in sorted(entries) if entries[n]]
    last = max(entries) if entries else None
    for s in strays:
        try:
            zero = s.name == last and s.stat().st_size == 0
        except OSError:
            zero = False
        out.append(CqProblem(f"{label}/{s.name}", STRAY_MESSAGE, True, zero, only))
    return out


def batch_cq_problems(root: Path) -> list[CqProblem]:
    """The 5.x BatchConsumeQueue files the broker's load fails on (4.9 never reads ``batchconsumequeue/``)."""
    from rmqdump.store.consumequeue.batch import open_batch_queues

    out: list[CqProblem] = []
    for (topic, qid), q in open_batch_queues(root).items():
        label = f"{STORE_BATCH_CONSUMEQUEUE_DIR}/{topic}/{qid}"
        for f in q.files:
            if q.file_size and f.size != q.file_size:
                out.append(CqProblem(f"{label}/{f.path.name}", f"{f.size} bytes, not the queue file size "
                                     f"{q.file_size}: the broker refuses to load it", True,
                                     f.size == 0 and f is q.files[-1], VERSION_53))
        out += _stray_problems(label, q.path, q.stray_files, only=VERSION_53)
    return out


def _units(cq, start: int, stop: int | None = None):
    """The units of a queue in [start, stop) that hold a non-zero byte, in order (an all-zero unit is invalid;
    the callers keep the valid ones). Holes of the sparse files RocketMQ creates and all-zero chunks are
    skipped without reading or decoding them (:mod:`rmqdump.disk.extents`): reading a 300,000-unit file's
    zeros per queue made a store of 20,000 queues take minutes."""
    unit = CQ_STORE_UNIT_SIZE
    per_file = cq.file_size // unit
    for f in cq.files:
        base = f.start // unit
        lo = max(start, base)
        hi = base + per_file if stop is None else min(stop, base + per_file)
        if lo >= hi:
            continue
        try:
            fd = open_regular(f.path)
        except StoreError:  # no regular file: the reader's own path (a RocksDB queue's virtual file) or its error
            for u in cq.iter_raw(lo):
                if u.queue_offset >= hi:
                    break
                yield u
            continue
        try:
            yield from _nonzero_units(fd, base, lo, hi)
        except OSError as e:
            raise StoreError(f"read failed: {e.strerror}", f.path) from None
        finally:
            os.close(fd)


def _nonzero_units(fd: int, base: int, lo: int, hi: int):
    """:class:`CqEntry` of the units in [lo, hi) of the file (first unit: queue offset ``base``) with a non-zero
    byte. A unit across two chunks is read whole once."""
    unit = CQ_STORE_UNIT_SIZE
    done = lo  # units before it are yielded or known zero
    for pos, data in nonzero_chunks(fd, (lo - base) * unit, (hi - base) * unit):
        first = max(done, base + pos // unit)
        last = min(hi, base + -(-(pos + len(data)) // unit))
        if first >= last:
            continue
        raw = os.pread(fd, (last - first) * unit, (first - base) * unit)
        for i, u in enumerate(CQ_UNIT.iter_unpack(raw[:len(raw) - len(raw) % unit])):
            if u[0] or u[1] or u[2]:
                yield CqEntry(first + i, *u)
        done = last


def max_phy_offset_of_consume_queue(states: list[QueueState]) -> int:
    """``recoverConsumeQueue``: max over queues of their ``maxPhysicOffset`` (−1 if none)."""
    return max((s.max_physic_offset for s in states), default=-1)


@dataclass
class QueueTruncation:
    """Entries one consume queue loses: past its first invalid entry, and to the commitlog truncation."""

    queue: str
    recovered_end: int
    new_end: int
    dropped: list[tuple[int, int]]  # (queue offset, commitlog offset)
    #: (queue offset, commitlog offset, size) of an invalid unit the truncation keeps: the first unit of the
    #: queue's last file, which ``truncateDirtyLogicFiles`` tests only against ``processOffset``
    kept_invalid: tuple[int, int, int] | None = None

    @property
    def count(self) -> int:
        return len(self.dropped)

    @property
    def end_after(self) -> int:
        """The queue's max offset after the truncation: its new end, or its first dropped entry if lower."""
        return min(self.new_end, self.dropped[0][0]) if self.dropped else self.new_end


def cq_truncation(state: QueueState, process_offset: int, truncate: bool) -> QueueTruncation:
    """Emulate ``ConsumeQueue.truncateDirtyLogicFiles(processOffset)`` after ``recover()``.

    The loop starts at the last file ``recover()`` kept, which is the one starting at the recovered end when
    its first unit stopped ``recover()``: that unit is kept whatever it holds, if its offset is below
    ``processOffset`` (the ``i == 0`` branch tests nothing else), and so are the valid units after it."""
    end = state.max_offset
    dropped = list(state.beyond)
    new_end = end
    kept_invalid = None
    if truncate and state.files:
        unit = 20
        per_file = state.file_size // unit
        new_end = state.first_offset
        for f in reversed(state.files):
            base = f.start // unit
            if base > end:
                continue  # recover() deleted it
            key = (f.start, process_offset)
            if key not in state.keeps:
                state.keeps[key] = _file_keep(state, f, process_offset)
            keep = state.keeps[key]
            if keep is None:  # not one whole file alone at its place: unit by unit
                units = list(_first_units(state.cq, base, per_file))
                if not units or units[0].commit_log_offset >= process_offset:
                    continue  # deleteLastMappedFile
                keep = base + 1
                rest = units[1:] if units[0].is_valid else list(_first_units(state.cq, base + 1, per_file - 1))
                for u in rest:
                    if u.is_valid and u.commit_log_offset < process_offset:
                        keep = u.queue_offset + 1
                    else:
                        break
            elif keep < 0:
                continue  # deleteLastMappedFile
            if base == end:
                try:
                    first = state.cq.entry_at(end, check_max=False)
                except RmqdumpError:
                    first = None
                if first is not None and not first.is_valid:
                    kept_invalid = (end, first.commit_log_offset, first.size)
                new_end = keep
            else:
                new_end = min(keep, end)
            break
        dropped = [d for d in dropped if d[0] >= new_end]
        dropped += [(u.queue_offset, u.commit_log_offset) for u in _units(state.cq, new_end, end) if u.is_valid]
    dropped.sort()
    return QueueTruncation(state.name, end, new_end, dropped, kept_invalid)


def kept_invalid_units(truncations: list[QueueTruncation], redispatched: list) -> list[QueueTruncation]:
    """The truncations that keep an invalid unit, but for queues recovery dispatches a record into: its walk
    dispatches before ``truncateDirtyLogicFiles`` runs, writing that unit."""
    filled = {q.queue for q in redispatched}
    return [qt for qt in truncations if qt.kept_invalid is not None and qt.queue not in filled]


def _file_keep(state: QueueState, f, process_offset: int) -> int | None:
    """The truncation loop's verdict on file ``f`` read as raw units (no object per unit): the queue offset
    after its first unit (kept unchecked) and the valid units after it below ``process_offset``, -1 when its
    first unit is not below it, None when ``f`` is not a whole, aligned file that no other file overlaps
    (then :func:`_first_units` decides)."""
    cq, fs = state.cq, state.file_size
    files = cq.files
    if (cq.file_size != fs or fs % CQ_STORE_UNIT_SIZE or f.start % CQ_STORE_UNIT_SIZE or f.size < fs
            or any(b.start <= a.start for a, b in zip(files, files[1:], strict=False))
            or any(g is not f and g.start < f.start + fs and g.start + min(g.size, fs) > f.start for g in files)):
        return None
    unit, per_file = CQ_STORE_UNIT_SIZE, fs // CQ_STORE_UNIT_SIZE
    k = 0  # leading units kept, read in chunks growing from RECOVER_FIRST_UNITS
    want = RECOVER_FIRST_UNITS
    try:
        fd = open_regular(f.path)
        try:
            while k < per_file:
                n = min(want, per_file - k)
                raw = os.pread(fd, n * unit, k * unit)
                if len(raw) < n * unit:
                    return None  # shorter than the file size after all
                if k == 0:
                    if CQ_UNIT.unpack_from(raw)[0] >= process_offset:
                        return -1
                    m = 1 + leading_valid_units(raw[unit:], process_offset)  # the first unit: i == 0
                else:
                    m = leading_valid_units(raw, process_offset)
                k += m
                if m < n:
                    break
                want = min(want * 4, RECOVER_CHUNK_UNITS)
        finally:
            os.close(fd)
    except (OSError, StoreError):
        return None
    return f.start // unit + k


def _first_units(cq, base: int, per_file: int):
    """Units of the file starting at queue offset ``base``, up to the first invalid one (inclusive)."""
    for u in cq.iter_raw(base):
        if u.queue_offset >= base + per_file:
            return
        yield u
        if not u.is_valid:
            return
