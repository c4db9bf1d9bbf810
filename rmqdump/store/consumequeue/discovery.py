"""Consume queues on disk: the RocksDB check (5.2+ ``storeType=defaultRocksDB``), the
``<kind>/<topic>/<queueId>/`` directories (a RocksDB consume queue's queues from its keys: the same paths,
read through :mod:`rmqdump.store.rocksdb.queue`), a queue's mapped files, and the file size a store's queues
share."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import (
    BCQ_STORE_UNIT_SIZE,
    CQ_STORE_UNIT_SIZE,
    STORE_BATCH_CONSUMEQUEUE_DIR,
    STORE_CONSUMEQUEUE_DIR,
)
from rmqdump.disk.segment import parse_file_name
from rmqdump.errors import FormatError, StoreError, UnsupportedError
from rmqdump.store.rocksdb.cq import is_rocksdb_cq

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
_QUEUE_ID_RE = re.compile(r"[+-]?[0-9]+")


def is_rocksdb_consumequeue(store_root: str | os.PathLike) -> bool:
    """True if ``consumequeue/`` holds a RocksDB database (5.2+ ``storeType=defaultRocksDB``)."""
    return is_rocksdb_cq(store_root)


def check_not_rocksdb(store_root: str | os.PathLike, action: str = "write this store") -> None:
    """Raise :class:`UnsupportedError` for a RocksDB consume queue: writers (``append``, ``repair``) cannot
    write its units and offset table yet (readers read it)."""
    cq_dir = Path(store_root) / STORE_CONSUMEQUEUE_DIR
    if is_rocksdb_cq(store_root):
        raise UnsupportedError(f"refusing to {action}: consumequeue/ is a RocksDB database (storeType="
                               "defaultRocksDB); rmqdump cannot yet write its consume queue units", cq_dir)


def parse_queue_id(name: str) -> int | None:
    """``Integer.parseInt`` of a queue dir name (ASCII digits); None if the broker would skip it."""
    if not _QUEUE_ID_RE.fullmatch(name):
        return None
    value = int(name)
    return value if INT32_MIN <= value <= INT32_MAX else None


@dataclass(frozen=True)
class QueueRef:
    """A ``<kind>/<topic>/<queueId>/`` directory found on disk."""

    topic: str
    queue_id: int
    path: Path
    batch: bool = False


def _scandir_dirs(path: Path) -> list[os.DirEntry]:
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreError(f"cannot list directory: {exc.strerror}", path) from None
    # Symlinked dirs are skipped: a forensic reader never leaves the store tree.
    return sorted((e for e in entries if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)


def discover_queues(store_root: str | os.PathLike, batch: bool = False) -> Iterator[QueueRef]:
    """Yield every ``consumequeue/TOPIC/QID`` (or ``batchconsumequeue``) dir, sorted by name.

    Non-numeric queue dirs are skipped like the broker does. A RocksDB consume queue's queues are those
    its keys and offset table name (needs the ``rocksdb`` extra), at the paths their directories would have.
    """
    root = Path(store_root)
    if not batch and is_rocksdb_cq(root):
        from rmqdump.store.rocksdb.cq import RocksConsumeQueues

        for topic, qid in RocksConsumeQueues(root).queues():
            yield QueueRef(topic, qid, root / STORE_CONSUMEQUEUE_DIR / topic / str(qid))
        return
    base = root / (STORE_BATCH_CONSUMEQUEUE_DIR if batch else STORE_CONSUMEQUEUE_DIR)
    for topic_entry in _scandir_dirs(base):
        for qid_entry in _scandir_dirs(Path(topic_entry.path)):
            qid = parse_queue_id(qid_entry.name)
            if qid is not None:
                yield QueueRef(topic_entry.name, qid, Path(qid_entry.path), batch)


@dataclass(frozen=True)
class MappedFileInfo:
    """One mapped file of a queue: start byte offset, path and on-disk size."""

    start: int
    path: Path
    size: int


def list_mapped_files(queue_dir: str | os.PathLike) -> tuple[list[MappedFileInfo], list[Path]]:
    """Files named by 20-digit offsets (sorted) and the stray entries that are not."""
    qdir = Path(queue_dir)
    try:
        entries = list(os.scandir(qdir))
    except OSError as exc:
        if qdir.parent.parent.name == STORE_CONSUMEQUEUE_DIR and is_rocksdb_cq(qdir.parent.parent.parent):
            raise UnsupportedError("a queue of a RocksDB consume queue has no mapped files: its units are keys of "
                                   "the consumequeue/ database (not compared or digested file by file)", qdir) from None
        raise StoreError(f"cannot list queue directory: {exc.strerror}", qdir) from None
    files: list[MappedFileInfo] = []
    stray: list[Path] = []
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            continue  # sub-directories are skipped by the broker (5.x)
        start = parse_file_name(e.name)  # None also above Long.MAX_VALUE: the broker's load fails on it
        if start is None or not e.is_file(follow_symlinks=False):
            stray.append(Path(e.path))
            continue
        try:
            size = e.stat(follow_symlinks=False).st_size
        except OSError as exc:
            raise StoreError(f"cannot stat: {exc.strerror}", e.path) from None
        files.append(MappedFileInfo(start, Path(e.path), size))
    files.sort(key=lambda f: f.start)
    return files, sorted(stray)


def mapped_file_count(queue_dir: str | os.PathLike) -> int:
    """How many files :func:`list_mapped_files` lists in ``queue_dir``, without a stat or an object per file
    (the directory entries' types)."""
    try:
        with os.scandir(queue_dir) as it:
            return sum(1 for e in it if parse_file_name(e.name) is not None and e.is_file(follow_symlinks=False))
    except OSError as exc:
        raise StoreError(f"cannot list queue directory: {exc.strerror}", queue_dir) from None


def infer_file_size(files: list[MappedFileInfo], unit_size: int = CQ_STORE_UNIT_SIZE) -> int | None:
    """A queue's file size: the first non-last file's size, else the last file's size."""
    if not files:
        return None
    size = files[0].size
    if size <= 0 or size % unit_size:
        raise FormatError(f"mapped file size {size} is not a positive multiple of {unit_size}", files[0].path)
    return size


#: files of one size that settle a store's CQ file size when no more than an eighth as many differ
_DECISIVE_VOTES = 32


def infer_store_cq_file_size(store_root: str | os.PathLike, batch: bool = False) -> int | None:
    """The CQ file size shared by a store (the broker's one ``mappedFileSizeConsumeQueue``, every file of every
    queue created at that size): the size most of its non-empty queue files have, so that one damaged file
    cannot set it for the whole store (the first queue's first file did: cut short, every other queue's files
    read as the wrong size). Ties go to the first queue found. The count stops once a size leads by far."""
    unit = BCQ_STORE_UNIT_SIZE if batch else CQ_STORE_UNIT_SIZE
    if not batch and is_rocksdb_cq(store_root):
        return None  # no files: the size is broker.conf's or the default
    votes: Counter[int] = Counter()
    where: dict[int, MappedFileInfo] = {}
    for ref in discover_queues(store_root, batch=batch):
        files, _ = list_mapped_files(ref.path)
        for f in files:
            if f.size:  # a zero-length file is a crash artefact, not a size
                votes[f.size] += 1
                where.setdefault(f.size, f)
        (_, n), *rest = votes.most_common() or [(0, 0)]
        if n >= _DECISIVE_VOTES and n > 8 * sum(c for _, c in rest):
            break
    if not votes:
        return None
    size = votes.most_common(1)[0][0]
    return infer_file_size([where[size]], unit)
