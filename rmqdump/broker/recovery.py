"""Predict what a RocketMQ broker's startup recovery would do to a store (spec §8.1, §9.8, §11).

Pure functions over the store as it is on disk; nothing is written. The default model is
the 4.9.x broker (checked against 4.9.8: ``DefaultMessageStore.load/recover``,
``CommitLog.recoverNormally/recoverAbnormally/checkMessageAndReturnSize``,
``MappedFileQueue.truncateDirtyFiles``, ``ConsumeQueue.recover/truncateDirtyLogicFiles``,
``IndexService.load``). ``version="5.3"`` models 5.3.2–5.3.3 where they differ: normal
recovery starts at the file holding the consume-queue maximum, the V2 magic is accepted, a
BLANK whose TOTALSIZE runs past the end of the file fails, a zero-length last file is deleted
at load and sub-directories are skipped.

Steps of :func:`predict_recovery`:

1. load: every commitlog file must have the store's file size and a numeric name, every
   consume-queue file its queue's size — otherwise the broker refuses to start;
2. mode: ``abnormal`` when the ``abort`` file exists, else ``normal``;
3. consume-queue recovery (third-from-last file, stop at the first invalid entry) →
   ``maxPhyOffsetOfConsumeQueue``;
4. start file: normal → third-from-last (4.9) or the file holding the CQ maximum (5.3);
   abnormal → newest file whose first record has the V1 magic and a store time ≠ 0 and
   ≤ checkpoint ``getMinTimestamp()`` (file 0 if none);
5. the walk with CRC checks: records advance, a BLANK moves to the next file, anything else
   stops → ``processOffset`` (the new commitlog end);
6. truncation: the file holding ``processOffset`` ends there, later files are deleted, and
   if ``maxPhyOffsetOfConsumeQueue >= processOffset`` every consume queue loses its entries
   at or after it;
7. re-dispatch (:mod:`rmqdump.broker.redispatch`): abnormal recovery hands every walked record to the
   consume queues (5.3.3's normal recovery those after ``maxPhyOffsetOfConsumeQueue``); queues
   gain the entries they lack;
8. abnormal only: index files whose endTimestamp > checkpoint indexMsgTimestamp are
   deleted, and the re-dispatch from the start file rebuilds entries only from there.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.broker.redispatch import QueueRedispatch, redispatch
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    CHECKPOINT,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    STORE_COMMITLOG_DIR,
)
from rmqdump.codec.record import BAD_BLANK, BAD_MAGIC, END_OF_DATA, TRUNCATED, Blank, Invalid, Message
from rmqdump.disk.fileio import read_regular
from rmqdump.disk.segment import Segment, parse_file_name
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.store.checkpoint import Checkpoint, decode_checkpoint
from rmqdump.store.commitlog import CommitLog, Skipped, read_record
from rmqdump.store.root import Store

VERSION_49 = "4.9"
VERSION_53 = "5.3"
VERSIONS = (VERSION_49, VERSION_53)
VERSION_AUTO = "auto"  # verify: 4.9 unless the store holds records only 5.x writes

MODE_NORMAL = "normal"
MODE_ABNORMAL = "abnormal"
MODE_REFUSES = "refuses_to_start"
MODE_EMPTY = "no_commitlog"

#: the broker itself imposes no record-size limit during recovery (4.9.8 allocates byte[TOTALSIZE])
BROKER_MAX_RECORD_SIZE = (1 << 31) - 1
#: ``DEFAULT_LIST_LIMIT`` offsets at most are listed per category (counts are always complete)
DEFAULT_LIST_LIMIT = 10000

_HEAD = struct.Struct(">iIiiiqqiq")  # up to BORNTIMESTAMP, 48 bytes
_I64 = struct.Struct(">q")


# --- inputs ---------------------------------------------------------------------------------


def read_checkpoint_for_recovery(store: Store) -> tuple[Checkpoint, str | None]:
    """The checkpoint as the broker maps it: a missing file or missing bytes read as zeros.

    Returns the checkpoint and a note when it is not a plain 4096-byte file.
    """
    path = store.path("checkpoint")
    if path is None:
        return Checkpoint(file_size=0), "checkpoint missing: the broker creates a zero-filled one"
    try:
        data = read_regular(path, CHECKPOINT.size)
        size = os.stat(path).st_size
    except StoreError as e:
        return Checkpoint(file_size=0), f"checkpoint unreadable ({e.message}); treated as zeros"
    except OSError as e:
        return Checkpoint(file_size=0), f"checkpoint unreadable ({e.strerror}); treated as zeros"
    cp = decode_checkpoint(data.ljust(CHECKPOINT.size, b"\0"), path)
    cp = Checkpoint(*cp.fields(), file_size=size)
    note = None if size == 4096 else f"checkpoint is {size} bytes (expected 4096); missing bytes read as zeros"
    return cp, note


def load_problems(store: Store, version: str = VERSION_49, zero_last_ok: bool = False) -> list[str]:
    """Why the broker's ``load()`` would fail on this commitlog directory (empty: it loads).
    ``zero_last_ok``: a zero-length last file is not a problem (5.x deletes it; so does repair)."""
    cl = store.commitlog
    out: list[str] = []
    d = cl.location
    if not d.is_dir():  # a single segment file was given
        return out
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        return [f"cannot list {d}: {e.strerror}"]
    last = names[-1] if names else None
    for name in names:
        p = d / name
        try:
            if p.is_dir():
                if version == VERSION_49:
                    out.append(f"{STORE_COMMITLOG_DIR}/{name} is a directory (4.9 loads it as a mapped file)")
                continue
            size = p.stat().st_size
        except OSError as e:
            out.append(f"{STORE_COMMITLOG_DIR}/{name}: {e.strerror}")
            continue
        if size != cl.file_size:
            if size == 0 and (version == VERSION_53 or zero_last_ok) and name == last:
                continue  # 5.x deletes a zero-length last file
            out.append(f"{STORE_COMMITLOG_DIR}/{name} is {size} bytes, not the store's file size "
                       f"{cl.file_size} (\"length not matched message store config value\")")
        elif parse_file_name(name) is None and not (name.isascii() and name.isdigit()):
            out.append(f"{STORE_COMMITLOG_DIR}/{name}: not a numeric file name (Long.parseLong throws at load)")
    return out


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

    def __new__(cls, file: str, message: str, fatal: bool, zero_last: bool = False) -> CqProblem:
        obj = super().__new__(cls, f"{file}: {message}")
        obj.file, obj.message, obj.fatal, obj.zero_last = file, message, fatal, zero_last
        return obj

    def __getnewargs__(self) -> tuple[str, str, bool, bool]:
        return self.file, self.message, self.fatal, self.zero_last


def consume_queue_states(store: Store) -> tuple[list[QueueState], list[CqProblem]]:
    """Every consume queue after the broker's CQ recovery, plus load problems found on the way."""
    problems: list[CqProblem] = []
    root = store.root
    if root is None or store.path("consumequeue") is None:
        return [], problems
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
        for f in cq.files:
            if cq.file_size and f.size != cq.file_size:
                problems.append(CqProblem(f"{label}/{f.path.name}", f"{f.size} bytes, not the queue file size "
                                          f"{cq.file_size}: the broker refuses to load it", True,
                                          f.size == 0 and f is cq.files[-1]))
            elif cq.file_size and f.start % cq.file_size:
                problems.append(CqProblem(f"{label}/{f.path.name}", f"start offset {f.start} is not a multiple of "
                                          f"the file size {cq.file_size}", False))
        for s in cq.stray_files:
            problems.append(CqProblem(f"{label}/{s.name}", "not a numeric mapped-file name: the broker's load "
                                      "fails on it", True))
        for a, b in cq.missing_files():
            problems.append(CqProblem(label, f"files missing for bytes [{a}, {b}): queue offsets "
                                      f"{a // 20}..{b // 20 - 1} have no entries", False))
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
    return states, problems


def _units(cq, start: int, stop: int | None = None):
    """Raw units (valid or not) of a queue in [start, stop), skipping all-zero file remainders fast."""
    unit = 20
    for f in cq.files:
        per_file = cq.file_size // unit
        base = f.start // unit
        lo = max(start, base)
        hi = base + per_file if stop is None else min(stop, base + per_file)
        if lo >= hi:
            continue
        try:
            with open(f.path, "rb") as fh:
                fh.seek((lo - base) * unit)
                raw = fh.read((hi - lo) * unit)
        except OSError:
            raw = b"x"
        if not raw.strip(b"\0"):
            continue  # never written: every unit invalid
        for u in cq.iter_raw(lo):
            if u.queue_offset >= hi:
                break
            yield u


def max_phy_offset_of_consume_queue(states: list[QueueState]) -> int:
    """``recoverConsumeQueue``: max over queues of their ``maxPhysicOffset`` (−1 if none)."""
    return max((s.max_physic_offset for s in states), default=-1)


# --- start file ---------------------------------------------------------------------------------


def normal_start_index(cl: CommitLog, version: str = VERSION_49, max_phy_cq: int = -1) -> int:
    """``recoverNormally`` start file: 4.9/5.0–5.3.1 third-from-last; 5.3.2+ the file holding the CQ max."""
    n = len(cl.segments)
    if version == VERSION_53:
        for i in range(n - 1, -1, -1):
            if cl.segments[i].start <= max_phy_cq:
                return i
        return 0
    return max(0, n - 3)


def first_record_store_timestamp(seg: Segment, version: str = VERSION_49) -> int | None:
    """``isMappedFileMatchedRecover`` inputs: the first record's store time, None if its magic is not accepted."""
    try:
        with open(seg.path, "rb") as f:
            head = f.read(48 + 20 + 8)
    except OSError:
        return None
    if len(head) < 48:
        return None
    magic = _HEAD.unpack_from(head, 0)[1]
    if magic != MESSAGE_MAGIC_CODE and not (version == VERSION_53 and magic == MESSAGE_MAGIC_CODE_V2):
        return None
    sysflag = _HEAD.unpack_from(head, 0)[7]
    pos = 48 + (20 if sysflag & BORNHOST_V6_FLAG else 8)
    if len(head) < pos + 8:
        return None
    return _I64.unpack_from(head, pos)[0]


def abnormal_start_index(cl: CommitLog, min_timestamp: int, version: str = VERSION_49) -> tuple[int, list[str]]:
    """``recoverAbnormally`` start file: newest file whose first record qualifies, else 0."""
    notes = []
    for i in range(len(cl.segments) - 1, -1, -1):
        seg = cl.segments[i]
        ts = first_record_store_timestamp(seg, version)
        if ts is None:
            notes.append(f"{seg.name}: first record has no accepted magic")
            continue
        if ts == 0:
            notes.append(f"{seg.name}: first record store time is 0")
            continue
        if ts <= min_timestamp:
            return i, notes
        notes.append(f"{seg.name}: first record stored at {ts} > checkpoint min timestamp {min_timestamp}")
    return 0, notes


# --- the walk ---------------------------------------------------------------------------------------


@dataclass
class BrokerWalk:
    """Outcome of the recovery walk: ``process_offset`` is the commitlog end after recovery."""

    start_index: int
    start_offset: int
    process_offset: int
    records: int = 0
    last_record_offset: int | None = None
    last_store_timestamp: int = 0
    stop: Invalid | None = None
    notes: list[str] = field(default_factory=list)

    def halt(self, seg: Segment, pos: int, why: str, size: int = -1) -> BrokerWalk:
        """End the walk at ``pos`` of ``seg`` (the commitlog end after recovery) for one of the
        ``STOP_*`` reasons; returns self."""
        kind = {STOP_V2_ON_49: BAD_MAGIC, STOP_NO_BLANK: TRUNCATED, STOP_LAST_BLANK: END_OF_DATA}[why]
        self.process_offset = seg.start + pos
        self.stop = Invalid(seg.start + pos, seg.name, pos, kind, why, size)
        return self


#: why a recovery walk ends without damage (BrokerWalk.halt)
STOP_V2_ON_49 = "V2 magic 0xDAA320AB is unknown to a 4.x broker (illegal magic code)"
STOP_NO_BLANK = "the file ends right after a record, without a BLANK: the walk stops here"
STOP_LAST_BLANK = "BLANK in the last file"


def broker_verdict(rec: Message | Blank | Invalid, version: str = VERSION_49, blank_overruns: bool = False) -> str:
    """How ``checkMessageAndReturnSize`` judges a decoded position: ``record``, ``blank`` or ``fail``.

    ``blank_overruns``: for a BLANK with a wrong TOTALSIZE, whether that TOTALSIZE runs past
    the end of the file (5.x then fails; 4.9 never looks at a BLANK's size).
    """
    if isinstance(rec, Message):
        if rec.magic == MESSAGE_MAGIC_CODE_V2 and version == VERSION_49:
            return "fail"
        return "record"
    if isinstance(rec, Blank):
        return "blank"
    if rec.kind == BAD_BLANK:
        return "fail" if version == VERSION_53 and blank_overruns else "blank"
    return "fail"


def broker_walk(cl: CommitLog, start_index: int, *, version: str = VERSION_49, check_crc: bool = True,
                use_mmap: bool = True) -> BrokerWalk:
    """Walk from the start file exactly as recovery does (CRC checked, no size limit)."""
    segs = cl.segments
    if not segs:
        return BrokerWalk(0, 0, 0, stop=Invalid(0, "", 0, END_OF_DATA, "no commitlog files"))
    first = segs[start_index]
    w = BrokerWalk(start_index, first.start, first.start)
    index = start_index
    while True:
        seg = segs[index]
        pos = 0
        with seg.open(use_mmap) as r:
            size = r.size
            while True:
                if pos >= size:
                    # a record ended exactly at the end of the file: reading the next size underflows
                    return w.halt(seg, pos, STOP_NO_BLANK)
                rec = read_record(r, pos, check_crc=check_crc, read_body=False,
                                  max_record_size=BROKER_MAX_RECORD_SIZE)
                overruns = False
                if isinstance(rec, Invalid) and rec.kind == BAD_BLANK:
                    buf, i, avail = r.view(pos, 4)
                    overruns = avail == 4 and int.from_bytes(memoryview(buf)[i:i + 4], "big", signed=True) > size - pos
                verdict = broker_verdict(rec, version, overruns)
                if verdict == "record":
                    w.records += 1
                    w.last_record_offset = rec.offset
                    w.last_store_timestamp = rec.store_timestamp
                    pos += rec.size
                    continue
                if verdict == "blank":
                    if isinstance(rec, Invalid):
                        w.notes.append(f"BLANK at {rec.offset} accepted although {rec.detail}")
                    break
                if isinstance(rec, Message):  # V2 magic on a 4.9 broker
                    return w.halt(seg, pos, STOP_V2_ON_49, rec.size)
                w.process_offset = seg.start + pos
                w.stop = rec
                return w
        index += 1
        if index >= len(segs):
            return w.halt(seg, pos, STOP_LAST_BLANK)  # processOffset stays at the BLANK's position


def cut_short(store: Store, walk: BrokerWalk) -> str | None:
    """A store's only commitlog file that ends inside a record (or right after one, without the BLANK the
    broker always leaves): it was cut short, so its length is not the broker's mappedFileSizeCommitLog
    and ``load()`` refuses it ("length not matched message store config value"). None otherwise."""
    cl = store.commitlog
    if store.root is None or len(cl.segments) != 1 or walk.stop is None:
        return None
    seg = cl.segments[0]
    stop = walk.stop
    # evidence of a cut, not of damage: the file's last bytes are data (a broker's file ends in zeros or
    # a BLANK), and the record it stops in has a genuine magic
    try:
        with seg.open(use_mmap=False) as r:
            head = r.read(stop.offset - seg.start, 8)
            last = r.read(max(0, seg.size - 8), 8)
    except (OSError, RmqdumpError):
        return None
    if not last.strip(b"\0") or last[-4:] == b"\0\0\0\0":
        return None
    size = int.from_bytes(head[:4], "big", signed=True) if len(head) == 8 else -1
    magic = int.from_bytes(head[4:8], "big") if len(head) == 8 else 0
    crosses = stop.kind == TRUNCATED and stop.detail != STOP_NO_BLANK and size > 0 and \
        stop.offset + size > seg.end and magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
    if not crosses and not (stop.detail == STOP_NO_BLANK and walk.process_offset == seg.end):
        return None
    why = (f"a record at {stop.offset} runs {stop.offset + size - seg.end} bytes past its end" if crosses
           else "it ends right after a record, where the broker always leaves a BLANK")
    return (f"{STORE_COMMITLOG_DIR}/{seg.name} is the only commitlog file and {why}: it was cut short, so its "
            f"{seg.size} bytes are not the broker's file size (repair --commitlog-file-size restores it)")


# --- consequences ---------------------------------------------------------------------------------------


def commitlog_truncation(cl: CommitLog, process_offset: int) -> tuple[tuple[str, int] | None, list[str]]:
    """``truncateDirtyFiles``: (file holding the new end, its new write position) and deleted files."""
    held = None
    deleted = []
    fs = cl.file_size
    for s in cl.segments:
        tail = s.start + fs
        if tail > process_offset:
            if process_offset >= s.start:
                held = (s.name, process_offset - s.start)
            else:
                deleted.append(s.name)
    return held, deleted


@dataclass
class QueueTruncation:
    """Entries one consume queue loses: past its first invalid entry, and to the commitlog truncation."""

    queue: str
    recovered_end: int
    new_end: int
    dropped: list[tuple[int, int]]  # (queue offset, commitlog offset)

    @property
    def count(self) -> int:
        return len(self.dropped)


def cq_truncation(state: QueueState, process_offset: int, truncate: bool) -> QueueTruncation:
    """Emulate ``ConsumeQueue.truncateDirtyLogicFiles(processOffset)`` after ``recover()``."""
    end = state.max_offset
    dropped = list(state.beyond)
    new_end = end
    if truncate and state.files:
        unit = 20
        new_end = state.first_offset
        for f in reversed(state.files):
            base = f.start // unit
            units = list(_first_units(state.cq, base, state.file_size // unit)) if base < end else []
            if not units or units[0].commit_log_offset >= process_offset:
                continue  # deleteLastMappedFile
            keep = base + 1
            for u in units[1:]:
                if u.is_valid and u.commit_log_offset < process_offset:
                    keep = u.queue_offset + 1
                else:
                    break
            new_end = min(keep, end)
            break
        dropped += [(u.queue_offset, u.commit_log_offset) for u in _units(state.cq, new_end, end) if u.is_valid]
    dropped.sort()
    return QueueTruncation(state.name, end, new_end, dropped)


def _first_units(cq, base: int, per_file: int):
    """Units of the file starting at queue offset ``base``, up to the first invalid one (inclusive)."""
    for u in cq.iter_raw(base):
        if u.queue_offset >= base + per_file:
            return
        yield u
        if not u.is_valid:
            return


def index_deletions(store: Store, checkpoint: Checkpoint, abnormal: bool) -> tuple[list[dict], list[str]]:
    """``IndexService.load``: after an abnormal exit, files with endTimestamp > indexMsgTimestamp go."""
    out: list[dict] = []
    notes: list[str] = []
    if not abnormal or store.root is None:
        return out, notes
    try:
        from rmqdump.store.indexfile import IndexFile, list_index_files
    except ImportError:  # pragma: no cover
        return out, ["index reader unavailable"]
    try:
        paths = list_index_files(store.root)
    except RmqdumpError as e:
        return out, [str(e)]
    for p in paths:
        try:
            with IndexFile(p, strict=False) as f:
                h = f.header
        except RmqdumpError as e:
            notes.append(f"index/{p.name}: {e.message}")
            continue
        if h.end_timestamp > checkpoint.index_msg_timestamp:
            out.append({"file": p.name, "end_timestamp": h.end_timestamp, "begin_phy_offset": h.begin_phy_offset,
                        "end_phy_offset": h.end_phy_offset, "entries": h.entry_count})
    return out, notes


@dataclass
class DroppedRecords:
    """Records at or after ``processOffset``: intact ones (listed) and damaged ranges."""

    intact: int = 0
    damaged_records: int = 0
    bytes: int = 0
    offsets: list[int] = field(default_factory=list)
    topics: Counter = field(default_factory=Counter)
    damaged_ranges: list[tuple[int, int, str]] = field(default_factory=list)
    offsets_truncated: bool = False

    @property
    def count(self) -> int:
        return self.intact + self.damaged_records

    def to_dict(self) -> dict:
        return {
            "count": self.count, "intact": self.intact, "damaged": self.damaged_records, "bytes": self.bytes,
            "first_offset": min([*self.offsets[:1], *(s for s, _, _ in self.damaged_ranges)], default=None),
            "offsets": self.offsets, "offsets_truncated": self.offsets_truncated,
            "topics": dict(sorted(self.topics.items())),
            "damaged_ranges": [{"start": s, "end": e, "kind": k} for s, e, k in self.damaged_ranges],
        }


def dropped_records(cl: CommitLog, process_offset: int, *, use_mmap: bool = True,
                    list_limit: int = DEFAULT_LIST_LIMIT) -> DroppedRecords:
    """Every valid-looking record the truncation discards (keep-going walk from ``processOffset``)."""
    out = DroppedRecords()
    if not cl.segments or process_offset >= cl.segments[-1].end:
        return out
    walk = cl.walk(start=process_offset, check_crc=True, read_body=False, keep_going=True, use_mmap=use_mmap)
    for rec in walk:
        if isinstance(rec, Message):
            out.intact += 1
            out.bytes += rec.size
            out.topics[rec.topic] += 1
            if len(out.offsets) < list_limit:
                out.offsets.append(rec.offset)
            else:
                out.offsets_truncated = True
        elif isinstance(rec, Skipped):
            _add_damage(out, rec.start, rec.end, rec.reason)
    stop = walk.stop
    if stop is not None and stop.kind != END_OF_DATA:
        seg = cl.segment_for(stop.offset)
        end = seg.end if seg else stop.offset
        _add_damage(out, stop.offset, end, stop)
    return out


def _add_damage(out: DroppedRecords, start: int, end: int, reason: Invalid) -> None:
    out.damaged_ranges.append((start, end, reason.kind))
    if reason.kind != END_OF_DATA and reason.size > 0:
        out.damaged_records += 1  # a record whose TOTALSIZE is readable
        out.bytes += min(reason.size, end - start)


# --- the prediction ------------------------------------------------------------------------------------


@dataclass
class RecoveryPrediction:
    """What the broker would do at its next start. ``to_dict`` gives the stable JSON form."""

    version: str
    mode: str
    reason: str
    start_file: str | None = None
    start_offset: int | None = None
    max_offset: int | None = None
    previous_end: int | None = None
    walk: BrokerWalk | None = None
    truncated_file: tuple[str, int] | None = None
    deleted_commitlog_files: list[str] = field(default_factory=list)
    max_phy_offset_of_consume_queue: int = -1
    cq_truncated: bool = False
    queues: list[QueueTruncation] = field(default_factory=list)
    redispatched: list[QueueRedispatch] = field(default_factory=list)
    dropped: DroppedRecords = field(default_factory=DroppedRecords)
    deleted_index_files: list[dict] = field(default_factory=list)
    lost_index_range: tuple[int, int] | None = None
    load_errors: list[str] = field(default_factory=list)
    cut_short: str | None = None  # why the only commitlog file was cut short (:func:`cut_short`)
    notes: list[str] = field(default_factory=list)
    checkpoint: Checkpoint | None = None

    @property
    def dropped_cq_entries(self) -> int:
        return sum(q.count for q in self.queues)

    @property
    def redispatched_cq_entries(self) -> int:
        return sum(q.count for q in self.redispatched)

    def to_dict(self) -> dict:
        stop = self.walk.stop if self.walk else None
        return {
            "version": self.version,
            "mode": self.mode,
            "reason": self.reason,
            "start_file": self.start_file,
            "start_offset": self.start_offset,
            "max_offset": self.max_offset,
            "previous_end": self.previous_end,
            "stop": None if stop is None else {"offset": stop.offset, "kind": stop.kind, "detail": stop.detail},
            "records_walked": self.walk.records if self.walk else 0,
            "truncated_file": None if self.truncated_file is None else {
                "file": self.truncated_file[0], "position": self.truncated_file[1]},
            "deleted_commitlog_files": self.deleted_commitlog_files,
            "dropped_records": self.dropped.to_dict(),
            "max_phy_offset_of_consume_queue": self.max_phy_offset_of_consume_queue,
            "cq_truncated": self.cq_truncated,
            "dropped_cq_entries": {
                "count": self.dropped_cq_entries,
                "queues": {q.queue: {"count": q.count, "from_queue_offset": q.dropped[0][0],
                                     "new_max_offset": min(q.new_end, q.dropped[0][0]),
                                     "commitlog_offsets": [o for _, o in q.dropped[:100]]}
                           for q in self.queues if q.count},
            },
            "redispatched_cq_entries": {
                "count": self.redispatched_cq_entries,
                "queues": {q.queue: q.to_dict() for q in self.redispatched},
            },
            "deleted_index_files": self.deleted_index_files,
            "lost_index_range": None if self.lost_index_range is None else list(self.lost_index_range),
            "load_errors": self.load_errors,
            "notes": self.notes,
        }


def predict_recovery(store: Store, *, version: str = VERSION_49, check_crc: bool = True, use_mmap: bool = True,
                     list_limit: int = DEFAULT_LIST_LIMIT, queue_states: list[QueueState] | None = None,
                     previous_end: int | None = None, list_dropped: bool = True,
                     cq_problems: list[CqProblem] | None = None, zero_last_ok: bool = False,
                     walker: Callable[..., BrokerWalk] | None = None) -> RecoveryPrediction:
    """Reproduce the broker's startup recovery on ``store`` (see the module docstring).

    ``previous_end`` (end of valid data as a plain walk sees it) only feeds the notes;
    ``queue_states`` (with their ``cq_problems``) may be passed to avoid reading the consume
    queues twice;
    ``list_dropped=False`` skips the keep-going walk that lists the dropped records;
    ``zero_last_ok``: a zero-length last commitlog file does not stop the start (repair deletes it).
    ``walker``: a drop-in for :func:`broker_walk` (verify passes its compiled walk).
    """
    if version not in VERSIONS:
        raise ValueError(f"unknown broker version model {version!r}")
    cl = store.commitlog
    abnormal = store.abort_present
    mode = MODE_ABNORMAL if abnormal else MODE_NORMAL
    reason = "abort file present: the previous run did not shut down cleanly" if abnormal else \
        "no abort file: the previous run shut down cleanly"
    pred = RecoveryPrediction(version, mode, reason, previous_end=previous_end)
    pred.load_errors = load_problems(store, version, zero_last_ok)
    if queue_states is None:
        queue_states, cq_problems = consume_queue_states(store)
    pred.load_errors += [str(p) for p in cq_problems or ()
                         if p.fatal and not (version == VERSION_53 and p.zero_last)]
    if pred.load_errors:
        pred.mode = MODE_REFUSES
        pred.reason = (f"{pred.load_errors[0]}; the broker's load() fails and it does not start "
                       f"(figures below: the {mode} recovery once that is fixed)")
    if store.root is None:
        pred.notes.append("only commitlog files given: no abort/checkpoint/consume queues; assuming a clean exit")
    max_phy_cq = max_phy_offset_of_consume_queue(queue_states)
    pred.max_phy_offset_of_consume_queue = max_phy_cq
    checkpoint, cp_note = read_checkpoint_for_recovery(store) if store.root is not None else (Checkpoint(), None)
    pred.checkpoint = checkpoint
    if cp_note and abnormal:
        pred.notes.append(cp_note)
    if not cl.segments:
        pred.mode = MODE_EMPTY
        pred.reason = "no commitlog files: every consume queue is destroyed"
        return pred
    if abnormal:
        start, why = abnormal_start_index(cl, checkpoint.min_timestamp, version)
        pred.notes.append(f"checkpoint min timestamp {checkpoint.min_timestamp} "
                          f"(min(physic {checkpoint.physic_msg_timestamp}, logics {checkpoint.logics_msg_timestamp})"
                          f" - 3 s) selects start file {cl.segments[start].name}")
    else:
        start = normal_start_index(cl, version, max_phy_cq)
    walk = (walker or broker_walk)(cl, start, version=version, check_crc=check_crc, use_mmap=use_mmap)
    pred.walk = walk
    short = pred.cut_short = cut_short(store, walk)
    if short and not pred.load_errors:
        pred.load_errors.append(short)
        pred.mode = MODE_REFUSES
        pred.reason = (f"{short}; the broker's load() fails and it does not start "
                       f"(figures below: the {mode} recovery once that is fixed)")
    pred.notes += walk.notes
    pred.start_file = cl.segments[start].name
    pred.start_offset = cl.segments[start].start
    pred.max_offset = walk.process_offset
    pred.truncated_file, pred.deleted_commitlog_files = commitlog_truncation(cl, walk.process_offset)
    pred.cq_truncated = max_phy_cq >= walk.process_offset
    for st in queue_states:
        qt = cq_truncation(st, walk.process_offset, pred.cq_truncated)
        if qt.count:
            pred.queues.append(qt)
    if abnormal or version == VERSION_53:
        from rmqdump.store.consumequeue import batch_cq_topics

        bcq = batch_cq_topics(store.root) if version == VERSION_53 and store.root is not None else frozenset()
        pred.redispatched = redispatch(cl, queue_states, start_index=start, end_offset=walk.process_offset,
                                       after=-1 if abnormal else max_phy_cq, batch_topics=bcq, use_mmap=use_mmap)
    if list_dropped:
        pred.dropped = dropped_records(cl, walk.process_offset, use_mmap=use_mmap, list_limit=list_limit)
    idx, idx_notes = index_deletions(store, checkpoint, abnormal)
    pred.deleted_index_files = idx
    pred.notes += idx_notes
    if idx:
        lo = min(max(cl.min_offset, f["begin_phy_offset"]) for f in idx)
        if lo < pred.start_offset:
            pred.lost_index_range = (lo, pred.start_offset)
            pred.notes.append(f"index entries of records in [{lo}, {pred.start_offset}) are lost: their index "
                              f"file is deleted and re-dispatch starts at {pred.start_file}")
    if start > 0 and not abnormal and version == VERSION_49:
        pred.notes.append(f"normal recovery checks only the last three files (from {pred.start_file}); "
                          "damage in earlier files is not seen at startup")
    return pred


def predict_recovery_auto(store: Store, version: str = VERSION_AUTO, **kwargs) -> tuple[RecoveryPrediction, str | None]:
    """:func:`predict_recovery` with ``version`` ``auto``: the 4.9 model unless the store holds a file only
    a 5.x broker creates (:data:`rmqdump.broker.version.FIVE_X_ONLY_PATHS`) or the 4.9 walk meets a V2-magic
    record — only a 5.x broker writes those — then the 5.3 model. Returns (prediction, why that model;
    None when ``version`` was explicit). The appender writes V2 records only where this picks 5.3 (or
    when told the broker is 5.x), so its own writes never change the model."""
    from rmqdump.broker.version import five_x_files, five_x_files_reason

    if version != VERSION_AUTO:
        return predict_recovery(store, version=version, **kwargs), None
    files = five_x_files(store.root)
    if files:
        return predict_recovery(store, version=VERSION_53, **kwargs), five_x_files_reason(files)
    pred = predict_recovery(store, version=VERSION_49, **kwargs)
    stop = pred.walk.stop if pred.walk else None
    if stop is not None and stop.detail == STOP_V2_ON_49:
        return (predict_recovery(store, version=VERSION_53, **kwargs),
                f"5.x: a V2-magic record at {stop.offset} (written by a 5.x broker)")
    return pred, "4.9: no record or file only a 5.x broker writes (--broker-version 5.3 to model 5.x)"
