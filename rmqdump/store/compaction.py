"""The 5.x compaction store (``compaction/``, topics with ``cleanup.policy=COMPACTION``), read as RocketMQ
5.3.3's ``store/kv`` classes write it:

* ``compactionLog/<topic>/<queueId>/<20-digit offset>``: commitlog-format records, each copied byte for byte
  from the commitlog by ``CompactionLog.asyncPutMessage`` (records without KEYS are left out) with only
  PHYSICALOFFSET rewritten to the record's offset in this log. A compaction pass rewrites all files but the
  last one keeping, per KEYS string, the latest record with a body (and every record after the pass's last
  queue offset). A file ends at its first zero TOTALSIZE (the end callback writes nothing) or at a BLANK
  (``maxBlank`` + BLANK magic, when the record or the sparse CQ file would not fit).
* ``compactionCq/<topic>/<queueId>/<same name as its log file>``: a ``SparseConsumeQueue``: 46-byte
  BatchConsumeQueue units (offset in the log, size, tagsCode, storeTime, queue offset, batch 1, -1, 0); the
  unit with offset -1 and size 0 ends a file (``putEndPositionInfo``).
* ``position-checkpoint`` (+ ``.bak``): ``CompactionPositionMgr``, a ConfigManager JSON
  ``{"queueOffsetMap": {"<topic>_<queueId>": lastCompactedQueueOffset}}``; the ``.bak`` is read when the
  file is missing, empty or does not parse.

The log's file size is ``compactionMappedFileSize`` fitted to whole sparse-CQ files
(``CompactionLog.getCompactionLogSize``); each file is read on its own, as the sparse CQ addresses it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import BCQ_STORE_UNIT_SIZE, BCQ_UNIT
from rmqdump.codec.record import END_OF_DATA, Invalid, Message
from rmqdump.disk.fileio import open_read
from rmqdump.disk.segment import parse_file_name
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue.entries import BcqEntry

COMPACTION_DIR = "compaction"
LOG_DIR = "compactionLog"
CQ_DIR = "compactionCq"
POSITION_FILE = "position-checkpoint"
#: sub-folders a compaction pass or a slave's replication writes before moving files up
WORK_FOLDERS = ("compacting", "replicating")


def _read_bytes(path: Path) -> bytes:
    fd = open_read(path)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def _offset_files(d: Path) -> list[Path]:
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if p.is_file() and parse_file_name(p.name) is not None),
                  key=lambda p: p.name)


@dataclass
class Positions:
    """``position-checkpoint`` as ``CompactionPositionMgr.load`` reads it (``used``: the file it took)."""

    offsets: dict[tuple[str, int], int]
    used: Path | None
    problems: list[tuple[Path, str]] = field(default_factory=list)

    def offset(self, topic: str, queue_id: int) -> int:
        """``getOffset``: the last compacted queue offset, -1 when none."""
        return self.offsets.get((topic, queue_id), -1)


def _parse_positions(text: str) -> dict[tuple[str, int], int]:
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    table = doc.get("queueOffsetMap") or {}
    if not isinstance(table, dict):
        raise ValueError("queueOffsetMap is not an object")
    out: dict[tuple[str, int], int] = {}
    for k, v in table.items():
        topic, sep, qid = str(k).rpartition("_")
        if not sep or not qid.lstrip("-").isdigit() or not isinstance(v, int):
            raise ValueError(f"entry {k!r}: {v!r} is not <topic>_<queueId>: offset")
        out[(topic, int(qid))] = v
    return out


def read_positions(comp_dir: Path) -> Positions:
    """The position checkpoint, falling back to ``.bak`` as ConfigManager.load does."""
    problems: list[tuple[Path, str]] = []
    for p in (comp_dir / POSITION_FILE, comp_dir / (POSITION_FILE + ".bak")):
        if not p.exists():
            continue
        try:
            text = _read_bytes(p).decode("utf-8")
            if not text:
                problems.append((p, "empty file"))
                continue
            return Positions(_parse_positions(text), p, problems)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append((p, f"does not parse: {e}"))
    return Positions({}, None, problems)


@dataclass
class SparseUnit:
    """One sparse-CQ unit: its file, index in the file and the BatchConsumeQueue fields."""

    file: Path
    index: int
    entry: BcqEntry

    @property
    def is_end(self) -> bool:
        """The end-of-file unit ``putEndPositionInfo`` writes (offset -1)."""
        return self.entry.commit_log_offset == -1


@dataclass
class CompactionQueue:
    """One compacted topic queue: its log files and sparse-CQ files (both named by log offset)."""

    topic: str
    queue_id: int
    log_dir: Path
    cq_dir: Path
    log_files: list[Path]
    cq_files: list[Path]

    def log_file_for(self, offset: int) -> Path | None:
        """The log file holding log offset ``offset`` (largest start <= offset)."""
        best = None
        for p in self.log_files:
            if parse_file_name(p.name) <= offset:
                best = p
        return best

    def walk_file(self, path: Path, check_crc: bool = True) -> tuple[list[Message], Invalid | None]:
        """The records of one log file and, when it ends at damage rather than zeros or a BLANK, why."""
        w = CommitLog.open(path).walk(check_crc=check_crc)
        recs = [r for r in w if isinstance(r, Message)]
        stop = w.stop if w.stop is not None and w.stop.kind != END_OF_DATA else None
        return recs, stop

    def records(self, check_crc: bool = True) -> Iterator[tuple[Path, Message]]:
        """Every record of every log file, file by file."""
        for p in self.log_files:
            for r in self.walk_file(p, check_crc)[0]:
                yield p, r

    def units(self) -> Iterator[SparseUnit]:
        """Every written sparse-CQ unit (the end unit included), file by file, up to the first all-zero unit."""
        for p in self.cq_files:
            data = _read_bytes(p)
            for i in range(len(data) // BCQ_STORE_UNIT_SIZE):
                raw = data[i * BCQ_STORE_UNIT_SIZE:(i + 1) * BCQ_STORE_UNIT_SIZE]
                if not any(raw):
                    break
                yield SparseUnit(p, i, BcqEntry(i, *BCQ_UNIT.unpack(raw)))

    def record_at(self, offset: int, check_crc: bool = True) -> Message | Invalid | None:
        """The record at log offset ``offset`` (None: no log file holds it)."""
        p = self.log_file_for(offset)
        if p is None:
            return None
        cl = CommitLog.open(p)
        if offset >= cl.segments[0].end:
            return None
        rec = cl.decode_at(offset, check_crc=check_crc)
        return rec if isinstance(rec, (Message, Invalid)) else Invalid(offset, p.name, offset - cl.min_offset,
                                                                         "blank", "a BLANK (end-of-file) record")


@dataclass
class CompactionStore:
    """``STORE/compaction``: the position checkpoint and every topic queue with a log or sparse-CQ folder."""

    path: Path
    positions: Positions
    queues: dict[tuple[str, int], CompactionQueue]


def _queue_dirs(base: Path) -> dict[tuple[str, int], Path]:
    out: dict[tuple[str, int], Path] = {}
    if not base.is_dir():
        return out
    for t in sorted(base.iterdir()):
        if not t.is_dir() or t.is_symlink():
            continue
        for q in sorted(t.iterdir()):
            if q.is_dir() and not q.is_symlink() and q.name.lstrip("-").isdigit():
                out[(t.name, int(q.name))] = q
    return out


def stray_files(root: str | os.PathLike) -> list[Path]:
    """Files in the compaction log and sparse CQ queue folders whose names are not file offsets (a pass's
    ``.delete`` left behind; what the broker's load does with them: :mod:`rmqdump.broker.compaction_load`)."""
    d = Path(root) / COMPACTION_DIR
    out: list[Path] = []
    for base in (d / LOG_DIR, d / CQ_DIR):
        for qd in _queue_dirs(base).values():
            out += sorted(p for p in qd.iterdir() if p.is_file() and parse_file_name(p.name) is None)
    return out


DELETE_SUFFIX = ".delete"


def left_for_deletion(path: Path) -> bool:
    """A file a compaction pass renamed to ``<offset>.delete`` (``MappedFile.renameToDelete``) to destroy it once
    its replacement was in place: RocketMQ never reads it again; a pass that failed before destroying it leaves
    it, and the next load fails on its name."""
    name = path.name
    return name.endswith(DELETE_SUFFIX) and parse_file_name(name[:-len(DELETE_SUFFIX)]) is not None


def open_compaction(root: str | os.PathLike | None) -> CompactionStore | None:
    """The compaction store under a store root (None when there is no ``compaction/`` folder)."""
    if root is None:
        return None
    d = Path(root) / COMPACTION_DIR
    if not d.is_dir():
        return None
    logs, cqs = _queue_dirs(d / LOG_DIR), _queue_dirs(d / CQ_DIR)
    queues = {}
    for key in sorted(set(logs) | set(cqs)):
        ld = logs.get(key, d / LOG_DIR / key[0] / str(key[1]))
        qd = cqs.get(key, d / CQ_DIR / key[0] / str(key[1]))
        queues[key] = CompactionQueue(key[0], key[1], ld, qd, _offset_files(ld), _offset_files(qd))
    return CompactionStore(d, read_positions(d), queues)


__all__ = ["COMPACTION_DIR", "CQ_DIR", "DELETE_SUFFIX", "LOG_DIR", "POSITION_FILE", "CompactionQueue",
           "CompactionStore", "Positions", "SparseUnit", "left_for_deletion", "open_compaction", "read_positions",
           "stray_files"]
