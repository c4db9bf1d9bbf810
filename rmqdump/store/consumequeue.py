"""ConsumeQueue (and 5.x BatchConsumeQueue) reading and writing (spec §1.2, §8, §11.5).

Reading is bounded in memory: files are read in chunks with ``os.pread`` and entries are
yielded one by one. Queue offsets are entry numbers (byte offset / unit size).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rmqdump.codec.layout import (
    BCQ_STORE_UNIT_SIZE,
    BCQ_UNIT,
    CQ_EXT_MAX_ADDR,
    CQ_PRE_BLANK_SIZE,
    CQ_STORE_UNIT_SIZE,
    CQ_UNIT,
    FILE_NAME_DIGITS,
    STORE_BATCH_CONSUMEQUEUE_DIR,
    STORE_CONSUMEQUEUE_DIR,
)
from rmqdump.disk.evidence import record_read
from rmqdump.errors import FormatError, NotFoundError, RmqdumpError, StoreError, UnsupportedError

LONG_MIN = -(1 << 63)
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
#: ``ConsumeQueueExt.MAX_REAL_OFFSET``
CQ_EXT_MAX_REAL_OFFSET = CQ_EXT_MAX_ADDR - LONG_MIN
#: ConsumeQueue recovery starts at the third-from-last file (``ConsumeQueue.recover``).
RECOVER_FILES_BACK = 3
#: Entries per read chunk (multiple of both unit sizes' natural alignment is not needed).
CHUNK_UNITS = 4096
#: BCQ ``compactedOffset`` value when unset (``INVALID_POS``).
BCQ_INVALID_POS = -1

_FILE_NAME_RE = re.compile(rf"[0-9]{{{FILE_NAME_DIGITS}}}")
_QUEUE_ID_RE = re.compile(r"[+-]?[0-9]+")
_ROCKSDB_MARKERS = ("CURRENT", "IDENTITY", "LOCK")


# --- entry values ------------------------------------------------------------------------


def is_ext_addr(tags_code: int) -> bool:
    """``ConsumeQueueExt.isExtAddr``: the tagsCode field holds an ext-file address."""
    return tags_code <= CQ_EXT_MAX_ADDR


def ext_real_offset(address: int) -> int:
    """``ConsumeQueueExt.unDecorate``: ext address -> offset in the ext file queue."""
    return address - LONG_MIN


def ext_address(real_offset: int) -> int:
    """``ConsumeQueueExt.decorate``: ext real offset -> tagsCode address."""
    return real_offset + LONG_MIN


def is_valid_cq_unit(commit_log_offset: int, size: int) -> bool:
    """The broker's CQ validity test (``offset >= 0 && size > 0``)."""
    return commit_log_offset >= 0 and size > 0


class CqEntry(NamedTuple):
    """One 20-byte ConsumeQueue unit and its queue offset."""

    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int

    @property
    def is_valid(self) -> bool:
        return is_valid_cq_unit(self.commit_log_offset, self.size)

    @property
    def is_pre_blank(self) -> bool:
        """A ``fillPreBlank`` placeholder (offset 0, size 0x7FFFFFFF)."""
        return self.commit_log_offset == 0 and self.size == CQ_PRE_BLANK_SIZE

    @property
    def is_ext_addr(self) -> bool:
        return is_ext_addr(self.tags_code)

    @property
    def ext_real_offset(self) -> int | None:
        return ext_real_offset(self.tags_code) if is_ext_addr(self.tags_code) else None


class BcqEntry(NamedTuple):
    """One 46-byte BatchConsumeQueue unit; ``unit_index`` counts units, not messages."""

    unit_index: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_time: int
    msg_base_offset: int
    batch_size: int
    compacted_offset: int
    reserved: int

    @property
    def is_valid(self) -> bool:
        return (self.commit_log_offset >= 0 and self.size > 0
                and self.msg_base_offset >= 0 and self.batch_size > 0)

    @property
    def next_offset(self) -> int:
        """Queue offset after this unit's messages."""
        return self.msg_base_offset + self.batch_size


def encode_cq_entry(offset: int, size: int, tags_code: int) -> bytes:
    """Encode one 20-byte ConsumeQueue unit."""
    try:
        return CQ_UNIT.pack(offset, size, tags_code)
    except Exception as exc:  # struct.error for out-of-range values
        raise FormatError(f"cannot encode CQ entry ({offset}, {size}, {tags_code}): {exc}") from None


def encode_bcq_entry(offset: int, size: int, tags_code: int, store_time: int, msg_base_offset: int,
                     batch_size: int, compacted_offset: int = BCQ_INVALID_POS) -> bytes:
    """Encode one 46-byte BatchConsumeQueue unit (reserved int = 0)."""
    try:
        return BCQ_UNIT.pack(offset, size, tags_code, store_time, msg_base_offset, batch_size, compacted_offset, 0)
    except Exception as exc:
        raise FormatError(f"cannot encode BCQ entry: {exc}") from None


PRE_BLANK_ENTRY = CQ_UNIT.pack(0, CQ_PRE_BLANK_SIZE, 0)


def queue_offset_location(queue_offset: int, file_size: int, unit_size: int = CQ_STORE_UNIT_SIZE) -> tuple[int, int]:
    """(file start byte offset, position in file) of a queue offset's unit."""
    logical = queue_offset * unit_size
    pos = logical % file_size
    return logical - pos, pos


def file_name(start_offset: int) -> str:
    """Mapped-file name of a start offset (20 digits)."""
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


# --- store discovery ---------------------------------------------------------------------


def _is_rocksdb_dir(path: Path) -> bool:
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError(f"cannot list directory: {exc.strerror}", path) from None
    for e in entries:
        if not e.is_file(follow_symlinks=False):
            continue
        if e.name in _ROCKSDB_MARKERS or e.name.startswith("MANIFEST-") or e.name.endswith(".sst"):
            return True
    return False


def is_rocksdb_consumequeue(store_root: str | os.PathLike) -> bool:
    """True if ``consumequeue/`` holds a RocksDB database (5.2+ ``storeType=defaultRocksDB``)."""
    return _is_rocksdb_dir(Path(store_root) / STORE_CONSUMEQUEUE_DIR)


def check_not_rocksdb(store_root: str | os.PathLike) -> None:
    """Raise :class:`UnsupportedError` for a RocksDB consume queue."""
    cq_dir = Path(store_root) / STORE_CONSUMEQUEUE_DIR
    if _is_rocksdb_dir(cq_dir):
        raise UnsupportedError("consumequeue is a RocksDB database (storeType=defaultRocksDB); not decoded", cq_dir)


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

    Non-numeric queue dirs are skipped like the broker does. Raises
    :class:`UnsupportedError` for a RocksDB consume queue.
    """
    root = Path(store_root)
    if not batch:
        check_not_rocksdb(root)
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
        raise StoreError(f"cannot list queue directory: {exc.strerror}", qdir) from None
    files: list[MappedFileInfo] = []
    stray: list[Path] = []
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            continue  # sub-directories are skipped by the broker (5.x)
        if not _FILE_NAME_RE.fullmatch(e.name) or not e.is_file(follow_symlinks=False):
            stray.append(Path(e.path))
            continue
        try:
            size = e.stat(follow_symlinks=False).st_size
        except OSError as exc:
            raise StoreError(f"cannot stat: {exc.strerror}", e.path) from None
        files.append(MappedFileInfo(int(e.name), Path(e.path), size))
    files.sort(key=lambda f: f.start)
    return files, sorted(stray)


def infer_file_size(files: list[MappedFileInfo], unit_size: int = CQ_STORE_UNIT_SIZE) -> int | None:
    """A queue's file size: the first non-last file's size, else the last file's size."""
    if not files:
        return None
    size = files[0].size
    if size <= 0 or size % unit_size:
        raise FormatError(f"mapped file size {size} is not a positive multiple of {unit_size}", files[0].path)
    return size


def infer_store_cq_file_size(store_root: str | os.PathLike, batch: bool = False) -> int | None:
    """The CQ file size shared by a store: from the first queue with 2+ files, else a last file."""
    unit = BCQ_STORE_UNIT_SIZE if batch else CQ_STORE_UNIT_SIZE
    fallback: list[MappedFileInfo] = []
    for ref in discover_queues(store_root, batch=batch):
        files, _ = list_mapped_files(ref.path)
        files = [f for f in files if f.size]  # a zero-length file is a crash artefact, not a size
        if len(files) >= 2:
            return infer_file_size(files, unit)
        if files and not fallback:
            fallback = files
    return infer_file_size(fallback, unit) if fallback else None


def _open_ro(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
    except OSError as exc:
        raise StoreError(f"cannot open: {exc.strerror}", path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError("not a regular file", path)
    record_read(path)  # --evidence manifest
    return fd


def _pread(path: Path, length: int, offset: int) -> bytes:
    fd = _open_ro(path)
    try:
        return os.pread(fd, length, offset)
    except OSError as exc:
        raise StoreError(f"read failed: {exc.strerror}", path, offset) from None
    finally:
        os.close(fd)


def _iter_file_units(path: Path, unit_size: int, start_pos: int = 0, end_pos: int | None = None
                     ) -> Iterator[tuple[int, bytes]]:
    """Yield (position, chunk) pairs of whole units from ``path`` in bounded chunks."""
    fd = _open_ro(path)
    try:
        chunk = unit_size * CHUNK_UNITS
        pos = start_pos
        while end_pos is None or pos < end_pos:
            want = chunk if end_pos is None else min(chunk, end_pos - pos)
            try:
                data = os.pread(fd, want, pos)
            except OSError as exc:
                raise StoreError(f"read failed: {exc.strerror}", path, pos) from None
            usable = len(data) - len(data) % unit_size
            if usable <= 0:
                return
            yield pos, data[:usable]
            if usable < want:
                return
            pos += usable
    finally:
        os.close(fd)


# --- ConsumeQueue reader -------------------------------------------------------------------


@dataclass
class _QueueBase:
    """Shared mapped-file handling for CQ and BCQ."""

    path: Path
    topic: str | None = None
    queue_id: int | None = None
    file_size: int | None = None
    strict: bool = True
    files: list[MappedFileInfo] = field(init=False)
    stray_files: list[Path] = field(init=False)
    problems: list[str] = field(init=False)

    unit_size = CQ_STORE_UNIT_SIZE

    def __post_init__(self) -> None:
        self._recovered: tuple[int, tuple | None] | None = None
        self.path = Path(self.path)
        self.files, self.stray_files = list_mapped_files(self.path)
        self.problems = []
        self._size_given = self.file_size is not None
        if self.file_size is None:
            self.file_size = infer_file_size(self.files, self.unit_size)
        elif self.file_size <= 0 or self.file_size % self.unit_size:
            raise FormatError(f"file size {self.file_size} is not a positive multiple of {self.unit_size}", self.path)
        self._by_start = {f.start: f for f in self.files}
        self._check_files()

    def _check_files(self) -> None:
        for f in self.files:
            if f.size != self.file_size:
                origin = "given" if self._size_given else f"inferred from {self.files[0].path.name}"
                self._problem(StoreError(f"mapped file is {f.size} bytes, expected {self.file_size} ({origin}); "
                                         "the broker refuses to load such a queue", f.path))
            if self.file_size and f.start % self.file_size:
                self._problem(StoreError(f"file start offset {f.start} is not a multiple of the file size "
                                         f"{self.file_size}", f.path))

    def _problem(self, exc: StoreError) -> None:
        if self.strict:
            raise exc
        self.problems.append(str(exc))

    def missing_files(self) -> list[tuple[int, int]]:
        """Gaps between files: (first missing byte offset, next present file start)."""
        gaps = []
        for a, b in zip(self.files, self.files[1:], strict=False):
            if b.start > a.start + self.file_size:
                gaps.append((a.start + self.file_size, b.start))
        return gaps

    def _recover_scan(self) -> tuple[int, tuple | None]:
        """``recover()``: (processOffset in bytes, last valid unit tuple) from the third-last file."""
        if not self.files:
            return 0, None
        index = max(0, len(self.files) - RECOVER_FILES_BACK)
        last_valid = None
        while True:
            f = self.files[index]
            valid_bytes, unit = self._leading_valid(f)
            if unit is not None:
                last_valid = unit
            if valid_bytes == self.file_size and index + 1 < len(self.files):
                index += 1
                continue
            return f.start + valid_bytes, last_valid

    def _leading_valid(self, f: MappedFileInfo) -> tuple[int, tuple | None]:
        raise NotImplementedError

    def _recover(self) -> tuple[int, tuple | None]:
        """``_recover_scan`` once per queue object (memoised)."""
        if self._recovered is None:
            self._recovered = self._recover_scan()
        return self._recovered


class ConsumeQueue(_QueueBase):
    """Reader of one ``consumequeue/<topic>/<queueId>/`` directory (§8.1).

    ``strict`` (default) raises :class:`StoreError` for files the broker would refuse
    (wrong size, misaligned name); with ``strict=False`` they are listed in ``problems``
    and read as far as their bytes go.
    """

    unit_size = CQ_STORE_UNIT_SIZE

    @classmethod
    def open(cls, store_root: str | os.PathLike, topic: str, queue_id: int, file_size: int | None = None,
             strict: bool = True) -> ConsumeQueue:
        """Open a queue of a store by topic and queue id (NotFoundError if it has no directory)."""
        check_not_rocksdb(store_root)
        if "/" in topic or topic in ("", ".", "..") or "\0" in topic:
            raise NotFoundError(f"invalid topic name {topic!r}")
        qdir = Path(store_root) / STORE_CONSUMEQUEUE_DIR / topic / str(queue_id)
        if not qdir.is_dir() or qdir.is_symlink():
            raise NotFoundError(f"no consume queue for {topic}/{queue_id}", qdir)
        return cls(qdir, topic, queue_id, file_size, strict)

    # -- recovery view --------------------------------------------------------------------
    def _leading_valid(self, f: MappedFileInfo) -> tuple[int, tuple | None]:
        last = None
        valid_end = 0
        for pos, chunk in _iter_file_units(f.path, CQ_STORE_UNIT_SIZE, 0, self.file_size):
            for i, (off, size, tags) in enumerate(CQ_UNIT.iter_unpack(chunk)):
                if not (off >= 0 and size > 0):
                    return pos + i * CQ_STORE_UNIT_SIZE, last
                last = (off, size, tags)
            valid_end = pos + len(chunk)
        return valid_end, last

    @property
    def max_offset(self) -> int:
        """``getMaxOffsetInQueue`` after the broker's recovery (start of last file + valid bytes) / 20."""
        return self._recover()[0] // CQ_STORE_UNIT_SIZE

    @property
    def max_physic_offset(self) -> int:
        """``maxPhysicOffset`` the recovery leaves: offset + size of the last valid entry, −1 if none."""
        last = self._recover()[1]
        return -1 if last is None else last[0] + last[1]

    @property
    def truncated_files(self) -> list[MappedFileInfo]:
        """Files the broker's recovery would delete (they start after the recovered end)."""
        end = self._recover()[0]
        return [f for f in self.files if f.start > end]

    def min_offset(self, commit_log_min_offset: int = 0) -> int:
        """``correctMinOffset``: first entry of the first file with offset >= commitlog min.

        Only the readable (valid) part of the first file is scanned; if nothing qualifies
        the broker keeps its initial value, 0.
        """
        if not self.files:
            return 0
        first = self.files[0]
        readable = min(self.file_size, max(0, self._recover()[0] - first.start))
        for pos, chunk in _iter_file_units(first.path, CQ_STORE_UNIT_SIZE, 0, readable):
            for i, (off, _size, _tags) in enumerate(CQ_UNIT.iter_unpack(chunk)):
                if off >= commit_log_min_offset:
                    return (first.start + pos + i * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
        return 0

    # -- entries ---------------------------------------------------------------------------
    def entry_at(self, queue_offset: int, check_max: bool = True) -> CqEntry:
        """The entry at ``queue_offset`` in O(1). NotFoundError outside [0, max) or with no file."""
        if queue_offset < 0:
            raise NotFoundError(f"negative queue offset {queue_offset}", self.path)
        if check_max and queue_offset >= self.max_offset:
            raise NotFoundError(f"queue offset {queue_offset} >= max offset {self.max_offset}", self.path)
        if not self.file_size:
            raise NotFoundError("queue has no files", self.path)
        start, pos = queue_offset_location(queue_offset, self.file_size)
        f = self._by_start.get(start)
        if f is None:
            raise NotFoundError(f"no file {file_name(start)} for queue offset {queue_offset}", self.path)
        data = _pread(f.path, CQ_STORE_UNIT_SIZE, pos)
        if len(data) < CQ_STORE_UNIT_SIZE:
            raise FormatError(f"file ends inside the entry of queue offset {queue_offset}", f.path, pos)
        return CqEntry(queue_offset, *CQ_UNIT.unpack(data))

    def iter_raw(self, start: int = 0) -> Iterator[CqEntry]:
        """Every unit of every file (valid or not), from queue offset ``start``, in file order."""
        for f in self.files:
            file_end = f.start + min(f.size, self.file_size)
            begin = max(start * CQ_STORE_UNIT_SIZE, f.start)
            if begin >= file_end:
                continue
            for pos, chunk in _iter_file_units(f.path, CQ_STORE_UNIT_SIZE, begin - f.start, self.file_size):
                base = (f.start + pos) // CQ_STORE_UNIT_SIZE
                for i, unit in enumerate(CQ_UNIT.iter_unpack(chunk)):
                    yield CqEntry(base + i, *unit)

    def iter_entries(self, start: int | None = None, stop: int | None = None) -> Iterator[CqEntry]:
        """Entries in [start, stop) clipped to [first file start, max_offset): the broker's view.

        Invalid units inside that range (possible only before the recovery window) are
        yielded too; check ``entry.is_valid``.
        """
        end = self.max_offset if stop is None else min(stop, self.max_offset)
        first = self.files[0].start // CQ_STORE_UNIT_SIZE if self.files else 0
        begin = first if start is None else max(start, first)
        if begin >= end:
            return
        for e in self.iter_raw(begin):
            if e.queue_offset >= end:
                return
            yield e

    def holes(self) -> Iterator[CqEntry]:
        """Invalid units below ``max_offset`` (never produced by a healthy broker)."""
        return (e for e in self.iter_entries() if not e.is_valid)

    def entries(self) -> list[CqEntry]:
        """All entries of :meth:`iter_entries` as a list (only when asked)."""
        return list(self.iter_entries())


# --- BatchConsumeQueue reader ---------------------------------------------------------------


class BatchConsumeQueue(_QueueBase):
    """Reader of one ``batchconsumequeue/<topic>/<queueId>/`` directory (§8.3)."""

    unit_size = BCQ_STORE_UNIT_SIZE

    def _leading_valid(self, f: MappedFileInfo) -> tuple[int, tuple | None]:
        last = None
        valid_end = 0
        for pos, chunk in _iter_file_units(f.path, BCQ_STORE_UNIT_SIZE, 0, self.file_size):
            for i, unit in enumerate(BCQ_UNIT.iter_unpack(chunk)):
                if not (unit[0] >= 0 and unit[1] > 0 and unit[4] >= 0 and unit[5] > 0):
                    return pos + i * BCQ_STORE_UNIT_SIZE, last
                last = unit
            valid_end = pos + len(chunk)
        return valid_end, last

    @property
    def unit_count_end(self) -> int:
        """Unit index after the last valid unit."""
        return self._recover()[0] // BCQ_STORE_UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """Max queue (message) offset: last valid unit's msgBaseOffset + batchSize, 0 if none."""
        last = self._recover()[1]
        return 0 if last is None else last[4] + last[5]

    def unit_at(self, unit_index: int) -> BcqEntry:
        """The unit number ``unit_index`` (not a message offset)."""
        if unit_index < 0 or not self.file_size:
            raise NotFoundError(f"no BCQ unit {unit_index}", self.path)
        start, pos = queue_offset_location(unit_index, self.file_size, BCQ_STORE_UNIT_SIZE)
        f = self._by_start.get(start)
        if f is None:
            raise NotFoundError(f"no file {file_name(start)} for unit {unit_index}", self.path)
        data = _pread(f.path, BCQ_STORE_UNIT_SIZE, pos)
        if len(data) < BCQ_STORE_UNIT_SIZE:
            raise FormatError(f"file ends inside unit {unit_index}", f.path, pos)
        return BcqEntry(unit_index, *BCQ_UNIT.unpack(data))

    def iter_units(self, include_invalid: bool = False) -> Iterator[BcqEntry]:
        """Units in file order up to the recovered end (all units with ``include_invalid``)."""
        end = None if include_invalid else self._recover()[0]
        for f in self.files:
            if end is not None and f.start >= end:
                return
            for pos, chunk in _iter_file_units(f.path, BCQ_STORE_UNIT_SIZE, 0, self.file_size):
                base = (f.start + pos) // BCQ_STORE_UNIT_SIZE
                for i, unit in enumerate(BCQ_UNIT.iter_unpack(chunk)):
                    if end is not None and (base + i) * BCQ_STORE_UNIT_SIZE >= end:
                        return
                    yield BcqEntry(base + i, *unit)

    @property
    def max_physic_end(self) -> int:
        """End (offset + size) of the record of the last valid unit, -1 if none: dispatch reached it."""
        last = self._recover()[1]
        return -1 if last is None else last[0] + last[1]

    def find(self, queue_offset: int) -> BcqEntry:
        """The unit holding message ``queue_offset`` (binary search on msgBaseOffset)."""
        lo, hi = self.files[0].start // BCQ_STORE_UNIT_SIZE if self.files else 0, self.unit_count_end - 1
        found = None
        while lo <= hi:
            mid = (lo + hi) // 2
            unit = self.unit_at(mid)
            if unit.msg_base_offset <= queue_offset:
                found, lo = unit, mid + 1
            else:
                hi = mid - 1
        if found is None or queue_offset >= found.next_offset:
            raise NotFoundError(f"queue offset {queue_offset} not in batch consume queue", self.path)
        return found


def open_batch_queues(store_root: str | os.PathLike) -> dict[tuple[str, int], BatchConsumeQueue]:
    """Every ``batchconsumequeue/TOPIC/QID`` of a 5.x store, opened leniently (``strict=False``).

    A BatchCQ topic (``queue.type=BatchCQ``) is dispatched into these 46-byte units instead of
    ``consumequeue/``: its records count as dispatched when a unit points at them. A queue whose
    directory cannot be read is left out.
    """
    out: dict[tuple[str, int], BatchConsumeQueue] = {}
    root = Path(store_root)
    if not (root / STORE_BATCH_CONSUMEQUEUE_DIR).is_dir():
        return out
    try:
        size = infer_store_cq_file_size(root, batch=True)
        refs = list(discover_queues(root, batch=True))
    except RmqdumpError:
        return out
    for ref in refs:
        try:
            out[(ref.topic, ref.queue_id)] = BatchConsumeQueue(ref.path, ref.topic, ref.queue_id, size, strict=False)
        except RmqdumpError:
            continue
    return out


def batch_cq_topics(store_root: str | os.PathLike) -> set[str]:
    """5.x BatchCQ topics: a ``batchconsumequeue/TOPIC`` directory (how the store marks one on disk) or
    ``queue.type=BatchCQ`` in ``config/topics.json`` (what the broker declares to the store)."""
    out: set[str] = set()
    try:
        out = {e.name for e in _scandir_dirs(Path(store_root) / STORE_BATCH_CONSUMEQUEUE_DIR)}
    except RmqdumpError:
        pass
    from rmqdump.store.config import load_topics

    try:
        topics = load_topics(store_root).data or {}
    except RmqdumpError:
        return out
    for name, cfg in topics.items():
        attrs = cfg.attributes
        if (attrs.get("queue.type") or attrs.get("+queue.type") or "").lower() == "batchcq":
            out.add(name)
    return out


# --- writer --------------------------------------------------------------------------------


class ConsumeQueueWriter:
    """Appends CQ units to one queue dir, creating full-size zero-filled files as needed.

    Mirrors ``putMessagePositionInfo``: the write position starts at the recovered end of
    the queue; a queue created for a non-zero first offset is pre-blank filled. Call
    :meth:`fsync` before relying on the data; :meth:`close` does not sync.
    """

    def __init__(self, queue_dir: str | os.PathLike, file_size: int):
        if file_size <= 0 or file_size % CQ_STORE_UNIT_SIZE:
            raise FormatError(f"file size {file_size} is not a positive multiple of {CQ_STORE_UNIT_SIZE}")
        self.path = Path(queue_dir)
        self.file_size = file_size
        self.path.mkdir(parents=True, exist_ok=True)
        reader = ConsumeQueue(self.path, file_size=file_size)
        self.write_offset = reader._recover()[0]  # bytes
        self.max_physic_offset = reader.max_physic_offset
        self._has_files = bool(reader.files)
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._dir_dirty = True  # the directory may have unsynced entries: fsynced once, then after a file is created

    @property
    def next_queue_offset(self) -> int:
        return self.write_offset // CQ_STORE_UNIT_SIZE

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is not None:
            return fd
        path = self.path / file_name(start)
        flags = os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            self._dir_dirty = True
            os.ftruncate(fd, self.file_size)
        except FileExistsError:
            fd = os.open(path, flags)
            if os.fstat(fd).st_size != self.file_size:
                os.close(fd)
                raise StoreError(f"existing file is not {self.file_size} bytes", path) from None
        except OSError as exc:
            raise StoreError(f"cannot create: {exc.strerror}", path) from None
        self._fds[start] = fd
        self._has_files = True
        return fd

    def _write_at(self, logical: int, data: bytes) -> None:
        start, pos = logical - logical % self.file_size, logical % self.file_size
        try:
            os.pwrite(self._fd(start), data, pos)
        except OSError as exc:
            raise StoreError(f"write failed: {exc.strerror}", self.path / file_name(start), pos) from None
        self._dirty.add(start)

    def append(self, offset: int, size: int, tags_code: int) -> int:
        """Append one unit at the write position; returns its queue offset."""
        data = encode_cq_entry(offset, size, tags_code)
        q = self.next_queue_offset
        self._write_at(self.write_offset, data)
        self.write_offset += CQ_STORE_UNIT_SIZE
        self.max_physic_offset = offset + size
        return q

    def put_message_position_info(self, offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """The broker's write rule; False when the unit is skipped (already built / duplicate)."""
        if offset + size <= self.max_physic_offset:
            return False
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        if not self._has_files and expect != 0:
            self._fill_pre_blank(expect)
        if expect < self.write_offset:
            return False
        self.append(offset, size, tags_code)
        return True

    def put_many(self, units: Sequence[int]) -> int:
        """:meth:`put_message_position_info` for many units, one ``pwrite`` per file touched.

        ``units`` is flat: offset, size, tagsCode, queue offset, offset, ... Same bytes and
        the same skips as the one-unit calls in order; returns how many units were written.
        """
        n = len(units)
        i = first = 0
        if not self._has_files:  # a new queue: the first unit decides the pre-blank fill
            while i < n and not self._has_files:
                first += self.put_message_position_info(units[i], units[i + 1], units[i + 2], units[i + 3])
                i += 4
        start = self.write_offset
        w = start
        maxp = self.max_physic_offset
        out = bytearray()
        pack = CQ_UNIT.pack
        try:
            while i < n:
                offset, size, tags_code, queue_offset = units[i:i + 4]
                i += 4
                if offset + size <= maxp or queue_offset * CQ_STORE_UNIT_SIZE < w:
                    continue
                out += pack(offset, size, tags_code)
                w += CQ_STORE_UNIT_SIZE
                maxp = offset + size
        except Exception:  # struct.error: the one-unit encoder names the unit
            encode_cq_entry(offset, size, tags_code)
            raise
        view = memoryview(out)
        pos = start
        while view:
            chunk = view[:self.file_size - pos % self.file_size]
            self._write_at(pos, chunk)
            view = view[len(chunk):]
            pos += len(chunk)
        self.write_offset = w
        self.max_physic_offset = maxp
        return first + (w - start) // CQ_STORE_UNIT_SIZE

    def _fill_pre_blank(self, expect: int) -> None:
        start = expect - expect % self.file_size
        self.write_offset = start
        self._fd(start)
        count = (expect - start) // CQ_STORE_UNIT_SIZE
        for i in range(0, count, CHUNK_UNITS):
            n = min(CHUNK_UNITS, count - i)
            self._write_at(self.write_offset, PRE_BLANK_ENTRY * n)
            self.write_offset += n * CQ_STORE_UNIT_SIZE

    def fsync(self) -> None:
        """fsync every file written to, and the queue directory if a file was created in it."""
        for start in sorted(self._dirty):
            os.fsync(self._fds[start])
        self._dirty.clear()
        if not self._dir_dirty:
            return
        self._dir_dirty = False
        dfd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dfd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(dfd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> ConsumeQueueWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- ConsumeQueueExt units (optional) ---------------------------------------------------------


class CqExtUnit(NamedTuple):
    """One ConsumeQueueExt unit (§8.2)."""

    size: int
    tags_code: int
    msg_store_time: int
    bitmap: bytes


def read_ext_unit(ext_queue_dir: str | os.PathLike, address_or_offset: int, file_size: int) -> CqExtUnit:
    """Read the ext unit at a CQ ext address (or already un-decorated real offset)."""
    real = ext_real_offset(address_or_offset) if is_ext_addr(address_or_offset) else address_or_offset
    start, pos = real - real % file_size, real % file_size
    path = Path(ext_queue_dir) / file_name(start)
    head = _pread(path, 20, pos)
    if len(head) < 20:
        raise FormatError("ext unit header past end of file", path, pos)
    size = int.from_bytes(head[0:2], "big", signed=True)
    tags = int.from_bytes(head[2:10], "big", signed=True)
    store_time = int.from_bytes(head[10:18], "big", signed=True)
    bitmap_size = int.from_bytes(head[18:20], "big", signed=True)
    if size < 20 or bitmap_size < 0 or size != 20 + bitmap_size:
        raise FormatError(f"bad ext unit (size {size}, bitmap {bitmap_size})", path, pos)
    bitmap = _pread(path, bitmap_size, pos + 20) if bitmap_size else b""
    if len(bitmap) < bitmap_size:
        raise FormatError("ext unit bitmap past end of file", path, pos)
    return CqExtUnit(size, tags, store_time, bitmap)
