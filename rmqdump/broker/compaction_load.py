"""What RocketMQ 5.3.3's ``CompactionStore.load`` does with ``STORE/compaction`` when the broker starts.

For every directory ``compactionLog/<topic>/<queue>`` (files and other names there are skipped):

* the queue name goes through ``Integer.parseInt``: a name it rejects throws, and the store's ``load()`` fails;
* without the matching ``compactionCq/<topic>/<queue>`` directory the queue is not loaded (logged, no failure);
* ``MappedFileQueue.load`` of the log folder, then of the sparse-CQ folder, in name order, sub-folders skipped:
  a zero-length last file is deleted; a file of another size than the folder's file size makes the load return
  false, an ``IOException`` that leaves the queue unloaded; a name ``Long.parseLong`` rejects (a pass's
  ``<offset>.delete``) throws: the store's ``load()`` fails;
* ``SparseConsumeQueue.recover`` keeps every sparse-CQ file; the log is then cut after the last unit of the last
  sparse-CQ file (``truncateDirtyFiles``: log files starting past it are deleted);
* ``sanityCheck``: a log file without a sparse-CQ file of the same name, or the reverse, throws: the store's
  ``load()`` fails and the broker does not start.

The folder's file size is the broker's setting, not in the store: it is taken as the size most of the folder's
files (of every queue) have.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import BCQ_STORE_UNIT_SIZE, BCQ_UNIT
from rmqdump.disk.fileio import open_read
from rmqdump.disk.segment import java_parses_name
from rmqdump.store.compaction import COMPACTION_DIR, CQ_DIR, LOG_DIR, left_for_deletion

_INT_MAX = (1 << 31) - 1


@dataclass
class CompactionLoad:
    """``refusals``: (path relative to the store root, why the store's ``load()`` fails); ``unloaded``: (queue
    folder, why the broker leaves that queue's compaction log unloaded); ``deleted``: log files the load deletes."""

    refusals: list[tuple[str, str]] = field(default_factory=list)
    unloaded: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def _java_int(name: str) -> bool:
    digits = name[1:] if name[:1] in ("+", "-") else name
    return bool(digits) and digits.isascii() and digits.isdigit() and -_INT_MAX - 1 <= int(name) <= _INT_MAX


def _names(d: Path) -> list[str]:
    """A folder's entry names in Java's name order; none when it cannot be listed (``File.listFiles`` is null)."""
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []


def _entries(d: Path) -> list[tuple[str, bool, int]]:
    """(name, is a directory, size) of a folder's entries in Java's name order (``File.isDirectory`` follows
    links; a broken link is a zero-length file)."""
    out = []
    for name in _names(d):
        p = d / name
        is_dir = p.is_dir()
        try:
            size = 0 if is_dir else p.stat().st_size
        except OSError:
            size = 0
        out.append((name, is_dir, size))
    return out


def _folder_size(base: Path) -> int | None:
    """The size most files of ``base/<topic>/<queue>/`` have (None: no file)."""
    sizes: Counter[int] = Counter()
    if not base.is_dir():
        return None
    for t in (base / n for n in _names(base)):
        if not t.is_dir():
            continue
        for q in (t / n for n in _names(t)):
            if q.is_dir():
                sizes.update(s for _, d, s in _entries(q) if not d and s)
    return sizes.most_common(1)[0][0] if sizes else None


def _load_queue_files(d: Path, size: int | None, skip_leftovers: bool) -> tuple[list[str], list[str], str]:
    """``MappedFileQueue.load`` of one folder: (loaded names, names whose parse throws, why it returns false).
    Java stops at the first name that throws; every such name up to a file of another size is listed."""
    entries = [e for e in _entries(d) if not (skip_leftovers and left_for_deletion(d / e[0]))]
    loaded: list[str] = []
    bad: list[str] = []
    for i, (name, is_dir, length) in enumerate(entries):
        if is_dir:
            continue
        if length == 0 and i == len(entries) - 1:
            continue  # deleted
        if size is not None and length != size:
            return loaded, bad, "" if bad else f"{name} is {length} bytes, not the folder's file size {size}"
        if java_parses_name(name):
            loaded.append(name)
        else:
            bad.append(name)
    return loaded, bad, ""


_CHUNK_UNITS = 1 << 14


def _max_offset_in_log(cq_dir: Path, last: str, unit_bytes: int) -> int:
    """``SparseConsumeQueue.getMaxPhyOffsetInLog`` after ``recover``: the last leading valid unit of the last
    sparse-CQ file (offset + size), -1 when it has none. Read a chunk of units at a time."""
    try:
        fd = open_read(cq_dir / last)
    except OSError:
        return -1  # mapping it fails in the broker too
    best, pos, step = -1, 0, _CHUNK_UNITS * BCQ_STORE_UNIT_SIZE
    try:
        while pos + BCQ_STORE_UNIT_SIZE <= unit_bytes:
            data = os.pread(fd, min(step, unit_bytes - pos), pos)
            for i in range(len(data) // BCQ_STORE_UNIT_SIZE):
                off, size, _tags, _time, base, batch, _c, _r = BCQ_UNIT.unpack_from(data, i * BCQ_STORE_UNIT_SIZE)
                if not (off >= 0 and size > 0 and base >= 0 and batch > 0):
                    return best
                best = off + size
            if len(data) < step:
                return best
            pos += step
    except OSError:
        return best
    finally:
        os.close(fd)
    return best


def compaction_load(root: str | os.PathLike, skip_leftovers: bool = False) -> CompactionLoad:
    """The broker's load of the compaction store under ``root`` (``skip_leftovers``: as if the ``.delete`` files
    passes left were gone, which is what repair does)."""
    out = CompactionLoad()
    base = Path(root) / COMPACTION_DIR
    logs, cqs = base / LOG_DIR, base / CQ_DIR
    if not logs.is_dir():
        return out
    log_size, cq_size = _folder_size(logs), _folder_size(cqs)
    for t in (logs / n for n in _names(logs)):
        if not t.is_dir():
            continue
        for q in (t / n for n in _names(t)):
            if not q.is_dir():
                continue
            rel = f"{COMPACTION_DIR}/{LOG_DIR}/{t.name}/{q.name}"
            if not _java_int(q.name):
                out.refusals.append((rel, "not a queue id (Integer.parseInt throws)"))
                continue
            cq_dir = cqs / t.name / q.name
            if not cq_dir.is_dir():
                out.unloaded.append((rel, f"no {COMPACTION_DIR}/{CQ_DIR}/{t.name}/{q.name} folder"))
                continue
            names: dict[str, list[str]] = {}
            failed = False
            for kind, d, size, drel in ((LOG_DIR, q, log_size, rel),
                                        (CQ_DIR, cq_dir, cq_size, f"{COMPACTION_DIR}/{CQ_DIR}/{t.name}/{q.name}")):
                loaded, bad, why = _load_queue_files(d, size, skip_leftovers)
                out.refusals += [(f"{drel}/{n}", "not a numeric file name (Long.parseLong throws)") for n in bad]
                if why:
                    out.unloaded.append((drel, why))
                if bad or why:
                    failed = True
                    break
                names[kind] = loaded
            if failed:
                continue
            log_names, cq_names = names[LOG_DIR], names[CQ_DIR]
            if cq_names and cq_size:
                end = _max_offset_in_log(cq_dir, cq_names[-1], cq_size)
                if end > 0:
                    gone = [n for n in log_names if int(n) > end]
                    out.deleted += [f"{rel}/{n}" for n in gone]
                    log_names = [n for n in log_names if n not in gone]
            cq_set = set(cq_names)
            for n in log_names:
                if f"{int(n):020d}" not in cq_set:
                    out.refusals.append((f"{rel}/{n}", "a log file without its sparse consume queue file "
                                         "(CompactionLog sanityCheck throws)"))
            log_set = set(log_names)
            for n in cq_names:
                if n not in log_set:
                    out.refusals.append((f"{COMPACTION_DIR}/{CQ_DIR}/{t.name}/{q.name}/{n}", "a sparse consume "
                                         "queue file without its log file (CompactionLog sanityCheck throws)"))
    return out


__all__ = ["CompactionLoad", "compaction_load"]
