"""IndexFile reading, querying and writing (spec §9).

Readers use ``os.pread`` of the header, one slot and the chain's entries only, so a lookup
in a 400 MiB file touches a few pages. The writer works on a writable mmap of a (sparse)
pre-sized file and implements ``IndexFile.putKey`` exactly; :meth:`IndexFileWriter.bulk_put`
does the same for arrays of hashes with numpy when it is installed.
"""

from __future__ import annotations

import mmap
import os
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rmqdump.codec.javahash import index_key, index_key_hash
from rmqdump.codec.layout import (
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_INVALID_INDEX,
    INDEX_SIZE,
    KEY_SEPARATOR,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    STORE_INDEX_DIR,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.disk.evidence import record_read
from rmqdump.errors import FormatError, NotFoundError, StoreError

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
#: Index entries per slot-table unit ratio the broker uses by default (maxIndexNum = 4 × slots).
DEFAULT_INDEX_PER_SLOT = MAX_INDEX_NUM // MAX_HASH_SLOT_NUM
INDEX_FILE_NAME_LENGTH = 17
_BYTES_PER_SLOT_DEFAULT = INDEX_HASH_SLOT_SIZE + DEFAULT_INDEX_PER_SLOT * INDEX_SIZE  # 84


# --- geometry and header ----------------------------------------------------------------------


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of an index file of the given geometry."""
    return INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE + index_num * INDEX_SIZE


@dataclass(frozen=True)
class IndexGeometry:
    """Slot-table and entry-table capacities of one index file."""

    hash_slot_num: int
    index_num: int

    @property
    def file_size(self) -> int:
        return index_file_size(self.hash_slot_num, self.index_num)

    @property
    def entries_start(self) -> int:
        return INDEX_HEADER_SIZE + self.hash_slot_num * INDEX_HASH_SLOT_SIZE

    def slot_pos(self, slot: int) -> int:
        return INDEX_HEADER_SIZE + slot * INDEX_HASH_SLOT_SIZE

    def entry_pos(self, number: int) -> int:
        return self.entries_start + number * INDEX_SIZE


DEFAULT_GEOMETRY = IndexGeometry(MAX_HASH_SLOT_NUM, MAX_INDEX_NUM)


#: ratios maxIndexNum / maxHashSlotNum tried first when the geometry is read from a file's entries
_LIKELY_RATIOS = (4, 1, 2, 8, 3, 5, 10, 16, 20, 40, 100)
#: bound on the slot counts tried one by one (each costs a few small reads)
_MAX_GEOMETRY_CANDIDATES = 200_000
#: earlier entries whose chain links must agree with a candidate geometry
_GEOMETRY_CHECK_ENTRIES = 32


def _entries_agree(read, slots: int, entries: int, count: int) -> bool:
    """Do the last written entries fit ``slots``/``entries``? The newest entry heads its slot's chain, and an
    entry's ``prevIndex`` is an older entry of the same slot (``IndexFile.putKey``). A quarter of the links
    may disagree: RocketMQ itself leaves such links when a new index file gets the name (a millisecond
    timestamp) of one it just filled and maps that file again, stale slots and all. A wrong geometry
    agrees on about one link in ``slots``."""
    if count > entries:
        return False
    base = INDEX_HEADER_SIZE + slots * INDEX_HASH_SLOT_SIZE
    newest = count - 1
    links = disagree = 0
    for number in range(newest, max(0, newest - _GEOMETRY_CHECK_ENTRIES), -1):
        raw = read(base + number * INDEX_SIZE, INDEX_SIZE)
        if len(raw) < INDEX_SIZE:
            return False
        key_hash, _phy, _diff, prev = INDEX_ENTRY.unpack(raw)
        if key_hash < 0 or not 0 <= prev <= number:
            return False
        slot = key_hash % slots
        if prev == number:  # a stale slot value equal to the count: RocketMQ links the entry to itself
            links += 1
            disagree += 1
            continue
        if number == newest:
            head = read(INDEX_HEADER_SIZE + slot * INDEX_HASH_SLOT_SIZE, INDEX_HASH_SLOT_SIZE)
            if len(head) < INDEX_HASH_SLOT_SIZE or int.from_bytes(head, "big", signed=True) != newest:
                return False
        if prev > 0:
            prev_raw = read(base + prev * INDEX_SIZE, 4)
            if len(prev_raw) < 4:
                return False
            links += 1
            disagree += int.from_bytes(prev_raw, "big", signed=True) % slots != slot
    return disagree * 4 <= links if slots > 1 else disagree == 0


def geometry_from_entries(path: str | os.PathLike, size: int) -> IndexGeometry | None:
    """The geometry a file's own entries prove (any maxIndexNum/maxHashSlotNum ratio), or None when the
    file holds fewer than two entries or no candidate fits within :data:`_MAX_GEOMETRY_CANDIDATES`."""
    from rmqdump.disk.fileio import open_regular

    body = size - INDEX_HEADER_SIZE
    try:
        fd = open_regular(path)
    except StoreError:
        return None
    try:
        def read(pos: int, n: int) -> bytes:
            return os.pread(fd, n, pos)

        header = read(0, INDEX_HEADER_SIZE)
        if len(header) < INDEX_HEADER_SIZE:
            return None
        count = int.from_bytes(header[36:40], "big", signed=True)
        if count < 2:
            return None

        def fits(slots: int) -> IndexGeometry | None:
            rest = body - slots * INDEX_HASH_SLOT_SIZE
            if slots <= 0 or rest <= 0 or rest % INDEX_SIZE:
                return None
            entries = rest // INDEX_SIZE
            return IndexGeometry(slots, entries) if _entries_agree(read, slots, entries, count) else None

        for ratio in _LIKELY_RATIOS:
            per = INDEX_HASH_SLOT_SIZE + ratio * INDEX_SIZE
            if body % per == 0 and (geo := fits(body // per)):
                return geo
        top = (body - count * INDEX_SIZE) // INDEX_HASH_SLOT_SIZE
        first = next((s for s in range(1, 6) if (body - s * INDEX_HASH_SLOT_SIZE) % INDEX_SIZE == 0), None)
        if first is None:
            return None
        for tried, slots in enumerate(range(first, top + 1, INDEX_SIZE // INDEX_HASH_SLOT_SIZE)):
            if tried >= _MAX_GEOMETRY_CANDIDATES:
                return None
            if geo := fits(slots):
                return geo
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def infer_geometry(size: int, hash_slot_num: int | None = None, index_num: int | None = None,
                   file: str | os.PathLike | None = None) -> IndexGeometry:
    """Geometry from explicit values, else from the file's own entries (``file`` given), else from its size
    (maxIndexNum = 4 × slots, the broker's default ratio)."""
    body = size - INDEX_HEADER_SIZE
    if body <= 0:
        raise FormatError(f"index file of {size} bytes is too short for the {INDEX_HEADER_SIZE}-byte header", file)
    if hash_slot_num is None and index_num is None:
        if file is not None and (geo := geometry_from_entries(file, size)) is not None:
            return geo
        if body % _BYTES_PER_SLOT_DEFAULT:
            raise FormatError(f"index file size {size} is not 40 + 84*slots and its entries do not tell "
                              f"the geometry; pass it explicitly (--index-slots/--index-entries)", file)
        hash_slot_num = body // _BYTES_PER_SLOT_DEFAULT
        index_num = hash_slot_num * DEFAULT_INDEX_PER_SLOT
    elif index_num is None:
        rest = body - hash_slot_num * INDEX_HASH_SLOT_SIZE
        if rest < 0 or rest % INDEX_SIZE:
            raise FormatError(f"index file size {size} does not fit {hash_slot_num} slots", file)
        index_num = rest // INDEX_SIZE
    elif hash_slot_num is None:
        rest = body - index_num * INDEX_SIZE
        if rest < 0 or rest % INDEX_HASH_SLOT_SIZE:
            raise FormatError(f"index file size {size} does not fit {index_num} entries", file)
        hash_slot_num = rest // INDEX_HASH_SLOT_SIZE
    if hash_slot_num <= 0 or index_num <= 0:
        raise FormatError(f"bad index geometry: {hash_slot_num} slots, {index_num} entries", file)
    geo = IndexGeometry(hash_slot_num, index_num)
    if geo.file_size != size:
        raise FormatError(f"index file is {size} bytes, geometry {hash_slot_num}/{index_num} needs "
                          f"{geo.file_size}", file)
    return geo


@dataclass
class IndexHeader:
    """The 40-byte header (§9.2)."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    @classmethod
    def unpack(cls, data: bytes) -> IndexHeader:
        return cls(*INDEX_HEADER.unpack_from(data, 0))

    def pack(self) -> bytes:
        return INDEX_HEADER.pack(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                                 self.end_phy_offset, self.hash_slot_count, self.index_count)

    @property
    def effective_index_count(self) -> int:
        """``IndexHeader.load``: a stored value <= 0 is treated as 1."""
        return self.index_count if self.index_count > 0 else 1

    @property
    def entry_count(self) -> int:
        return self.effective_index_count - 1

    def is_time_matched(self, begin: int, end: int) -> bool:
        """``IndexFile.isTimeMatched``: the file's [begin, end] overlaps the query window."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin < b and end > e) or (b <= begin <= e) or (b <= end <= e)


class IndexEntry(NamedTuple):
    """One 20-byte entry and its number."""

    number: int
    key_hash: int
    phy_offset: int
    time_diff: int
    prev_index: int


@dataclass
class QueryResult:
    """Physical offsets in the broker's order, and whether ``max_num`` cut more hits off."""

    phy_offsets: list[int] = field(default_factory=list)
    truncated: bool = False
    anomalies: list[str] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0


#: chain reads: a window of this many entries once hops are shorter than _DENSE_HOP entries
_CHAIN_WINDOW = 4096
_DENSE_HOP = 64
_SPARSE_HOP = 1 << 62


def _bad_prev(prev: int, number: int, count: int) -> str:
    if prev < 0 or prev >= count:
        return f"out of range [0, indexCount {count})"
    if prev == number:
        return "links to itself"
    return "not an earlier entry: the broker only links to earlier entries; a cycle or a damaged link"


def slot_of(key_hash: int, hash_slot_num: int) -> int:
    """``keyHash % hashSlotNum`` (keyHash is non-negative)."""
    return key_hash % hash_slot_num


# --- reader ------------------------------------------------------------------------------


class IndexFile:
    """Read-only view of one index file.

    ``strict`` (default) refuses headers the broker never writes (indexCount < 0 or >
    maxIndexNum, hashSlotCount < 0) with :class:`FormatError`; otherwise the broker's own
    normalisation applies (indexCount <= 0 means 1).
    """

    def __init__(self, path: str | os.PathLike, hash_slot_num: int | None = None, index_num: int | None = None,
                 strict: bool = True):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreError(f"cannot open index file: {exc.strerror}", self.path) from None
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError("index file is not a regular file", self.path)
            record_read(self.path)  # --evidence manifest
            self.size = st.st_size
            self.geometry = infer_geometry(self.size, hash_slot_num, index_num, self.path)
            self.header = IndexHeader.unpack(self._read(0, INDEX_HEADER_SIZE))
            if strict:
                self._check_header()
        except BaseException:
            self.close()
            raise

    def _check_header(self) -> None:
        h = self.header
        if h.index_count < 0 or h.index_count > self.geometry.index_num:
            raise FormatError(f"header indexCount {h.index_count} outside [0, {self.geometry.index_num}]",
                              self.path, 36)
        if h.hash_slot_count < 0 or h.hash_slot_count > self.geometry.hash_slot_num:
            raise FormatError(f"header hashSlotCount {h.hash_slot_count} outside [0, {self.geometry.hash_slot_num}]",
                              self.path, 32)

    def _read(self, pos: int, length: int) -> bytes:
        try:
            data = os.pread(self._fd, length, pos)
        except OSError as exc:
            raise StoreError(f"read failed: {exc.strerror}", self.path, pos) from None
        if len(data) != length:
            raise FormatError("index file ends early (truncated while open?)", self.path, pos)
        return data

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def index_count(self) -> int:
        return self.header.effective_index_count

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- raw access --------------------------------------------------------------------------
    def slot(self, slot: int) -> int:
        """Raw int32 value of slot number ``slot``."""
        if not 0 <= slot < self.geometry.hash_slot_num:
            raise NotFoundError(f"slot {slot} outside [0, {self.geometry.hash_slot_num})", self.path)
        return int.from_bytes(self._read(self.geometry.slot_pos(slot), 4), "big", signed=True)

    def slot_for_key(self, key: str) -> int:
        """Slot number of an index key string (``topic#key``)."""
        return slot_of(index_key_hash(key), self.geometry.hash_slot_num)

    def entry(self, number: int) -> IndexEntry:
        """Entry ``number`` (0 .. maxIndexNum−1; #0 is never written)."""
        if not 0 <= number < self.geometry.index_num:
            raise FormatError(f"entry number {number} outside [0, {self.geometry.index_num})", self.path)
        return IndexEntry(number, *INDEX_ENTRY.unpack(self._read(self.geometry.entry_pos(number), INDEX_SIZE)))

    def iter_entries(self) -> Iterator[IndexEntry]:
        """Entries 1 .. indexCount−1 in write order (read in chunks)."""
        count = self.index_count
        chunk = 4096
        for first in range(1, count, chunk):
            n = min(chunk, count - first)
            data = self._read(self.geometry.entry_pos(first), n * INDEX_SIZE)
            for i, values in enumerate(INDEX_ENTRY.iter_unpack(data)):
                yield IndexEntry(first + i, *values)

    def entry_time(self, entry: IndexEntry) -> int:
        """Reconstructed store time (ms): beginTimestamp + timeDiff·1000."""
        return self.header.begin_timestamp + entry.time_diff * 1000

    # -- chain walk ----------------------------------------------------------------------------
    def chain(self, head: int, count: int | None = None) -> Iterator[tuple[int, int, int, int, int]]:
        """Raw ``(number, keyHash, phyOffset, timeDiff, prevIndex)`` of the chain from entry ``head``, newest first.

        Follows prevIndex while it is an earlier written entry (0 < prev < number); the caller
        judges where the walk ended from the last tuple's prevIndex. Every step goes to a
        smaller number, so the walk is bounded by ``head`` steps without remembering entries.
        Reads one entry per pread, or a window of entries when the chain is dense (short
        hops), so a long legal chain costs a few hundred reads, not one per entry.
        """
        if not 0 <= head < self.geometry.index_num:
            raise FormatError(f"entry number {head} outside [0, {self.geometry.index_num})", self.path)
        count = self.index_count if count is None else count
        unpack = INDEX_ENTRY.unpack_from
        entries_start = self.geometry.entries_start
        buf = b""
        base = 0  # number of the first entry in buf
        n_buf = 0
        cur = head
        last_hop = _SPARSE_HOP
        while True:
            i = cur - base
            if not 0 <= i < n_buf:
                first = cur - _CHAIN_WINDOW + 1 if last_hop < _DENSE_HOP else cur
                first = max(first, 0)
                n_buf = cur - first + 1
                buf = self._read(entries_start + first * INDEX_SIZE, n_buf * INDEX_SIZE)
                base, i = first, cur - first
            key_hash, phy, time_diff, prev = unpack(buf, i * INDEX_SIZE)
            yield cur, key_hash, phy, time_diff, prev
            if prev <= INDEX_INVALID_INDEX or prev >= cur or prev > count:
                return
            last_hop = cur - prev
            cur = prev

    def walk(self, slot: int, strict: bool = True) -> Iterator[IndexEntry]:
        """Entries of the chain starting at ``slot``, newest first.

        Stops where the broker stops (prev <= 0) and at a link the broker never writes:
        a prevIndex not below the entry's own number (the broker links only to earlier
        entries; this also ends cycles) or beyond indexCount. Those raise
        :class:`FormatError` when ``strict``, else end the walk. At most indexCount steps.
        """
        count = self.index_count
        head = self.slot(slot)
        if head == INDEX_INVALID_INDEX:
            return
        if head < 0 or head >= count:
            if strict:
                raise FormatError(f"slot {slot} value {head} outside [0, indexCount {count})", self.path,
                                  self.geometry.slot_pos(slot))
            return
        for number, key_hash, phy, time_diff, prev in self.chain(head, count):
            yield IndexEntry(number, key_hash, phy, time_diff, prev)
            if prev == INDEX_INVALID_INDEX:
                return
            if prev < 0 or prev >= count or prev >= number:
                if strict:
                    raise FormatError(f"entry {number} prevIndex {prev} ({_bad_prev(prev, number, count)})",
                                      self.path, self.geometry.entry_pos(number) + 16)
                return

    # -- query -------------------------------------------------------------------------------------
    def select_phy_offsets(self, key: str, max_num: int | None = None, begin: int = 0, end: int = LONG_MAX,
                           result: QueryResult | None = None, strict: bool = False) -> QueryResult:
        """``IndexFile.selectPhyOffset`` for an index key string (``topic#key``), without the 64 cap.

        Appends to ``result`` (shared across files like the broker's list). ``truncated``
        is set when a further matching entry exists beyond ``max_num``. Chain anomalies end
        the walk (listed in ``anomalies``); with ``strict`` they raise FormatError.
        """
        res = result if result is not None else QueryResult()
        key_hash = index_key_hash(key)
        slot = slot_of(key_hash, self.geometry.hash_slot_num)
        count = self.index_count
        slot_value = self.slot(slot)
        if slot_value <= INDEX_INVALID_INDEX or slot_value > count or count <= 1:
            if slot_value < 0 or slot_value > count:
                self._anomaly(res, strict, f"slot {slot} value {slot_value} outside [0, indexCount {count}]",
                              self.geometry.slot_pos(slot))
            return res
        self._walk_query(res, key_hash, slot_value, count, max_num, begin, end, strict)
        return res

    def _walk_query(self, res: QueryResult, key_hash: int, start: int, count: int, max_num: int | None,
                    begin: int, end: int, strict: bool) -> None:
        """The broker's loop; stops after ``max_num`` hits once one more is seen (``truncated``).

        The broker follows any prevIndex in (0, indexCount] other than the entry itself; a
        prevIndex not below the entry's own number is never written by it (and would loop), so
        it ends the walk here as an anomaly — no visited set is needed to stay bounded.
        """
        if start >= self.geometry.index_num:
            self._anomaly(res, strict, f"entry number {start} beyond the entry table", None)
            return
        begin_ts = self.header.begin_timestamp
        offsets = res.phy_offsets
        for cur, key_read, phy, time_diff, prev in self.chain(start, count):
            if time_diff < 0:
                return
            time_read = begin_ts + time_diff * 1000
            if key_hash == key_read and begin <= time_read <= end:
                if max_num is not None and len(offsets) >= max_num:
                    res.truncated = True
                    return
                offsets.append(phy)
            if prev <= INDEX_INVALID_INDEX or prev > count or prev == cur or time_read < begin:
                if prev < 0 or prev > count:
                    self._anomaly(res, strict, f"entry {cur} prevIndex {prev} outside [0, {count}]",
                                  self.geometry.entry_pos(cur) + 16)
                return
            if prev > cur:
                self._anomaly(res, strict, f"entry {cur} prevIndex {prev} ({_bad_prev(prev, cur, count)})",
                              self.geometry.entry_pos(cur) + 16)
                return

    def _anomaly(self, res: QueryResult, strict: bool, message: str, offset: int | None) -> None:
        if strict:
            raise FormatError(message, self.path, offset)
        res.anomalies.append(f"{self.name}: {message}")


# --- all index files of a store --------------------------------------------------------------


def list_index_files(store_root: str | os.PathLike) -> list[Path]:
    """Regular files of ``index/`` in the broker's load order (ascending name)."""
    idir = Path(store_root) / STORE_INDEX_DIR
    try:
        entries = list(os.scandir(idir))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreError(f"cannot list index directory: {exc.strerror}", idir) from None
    return sorted((Path(e.path) for e in entries if e.is_file(follow_symlinks=False)), key=lambda p: p.name)


class IndexStore:
    """All index files of a store, queried newest → oldest like ``IndexService.queryOffset``."""

    def __init__(self, store_root: str | os.PathLike, hash_slot_num: int | None = None, index_num: int | None = None,
                 strict: bool = True):
        self.files = [IndexFile(p, hash_slot_num, index_num, strict) for p in list_index_files(store_root)]

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, topic: str, key: str, max_num: int | None = None, begin: int = 0, end: int = LONG_MAX,
              strict: bool = False) -> QueryResult:
        """Offsets for ``topic#key`` (hash hits: re-read the record to confirm the key)."""
        return self.query_key(index_key(topic, key), max_num, begin, end, strict)

    def query_key(self, idx_key: str, max_num: int | None = None, begin: int = 0, end: int = LONG_MAX,
                  strict: bool = False) -> QueryResult:
        res = QueryResult()
        for i in range(len(self.files), 0, -1):
            f = self.files[i - 1]
            if i == len(self.files):
                res.index_last_update_timestamp = f.header.end_timestamp
                res.index_last_update_phy_offset = f.header.end_phy_offset
            if f.header.is_time_matched(begin, end):
                f.select_phy_offsets(idx_key, max_num, begin, end, res, strict)
            if f.header.begin_timestamp < begin:
                break
            if max_num is not None and len(res.phy_offsets) >= max_num:
                res.truncated = res.truncated or self._more_hits(i - 1, idx_key, begin, end)
                break
        return res

    def _more_hits(self, upto: int, idx_key: str, begin: int, end: int) -> bool:
        """Whether an older file would still contribute a hit (for ``truncated``)."""
        for f in reversed(self.files[:upto]):
            if f.header.is_time_matched(begin, end) and f.select_phy_offsets(idx_key, 1, begin, end).phy_offsets:
                return True
            if f.header.begin_timestamp < begin:
                return False
        return False

    def dropped_on_abnormal_restart(self, index_msg_timestamp: int) -> list[IndexFile]:
        """Files ``IndexService.load(false)`` deletes after a crash (endTimestamp > checkpoint)."""
        return [f for f in self.files if f.header.end_timestamp > index_msg_timestamp]


# --- writer --------------------------------------------------------------------------------------


def index_file_name(now_ms: int | None = None, utc: bool = False) -> str:
    """``yyyyMMddHHmmssSSS`` of a time in ms (local time like the broker's JVM, or UTC)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    t = time.gmtime(ms // 1000) if utc else time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


def build_index_keys(topic: str, uniq_key: str | None, keys: str | None) -> list[str]:
    """Index key strings ``IndexService.buildIndex`` puts for one record, in order."""
    out = []
    if uniq_key is not None:
        out.append(index_key(topic, uniq_key))
    if keys:
        out.extend(index_key(topic, k) for k in keys.split(KEY_SEPARATOR) if k)
    return out


def build_index_entries(topic: str, uniq_key: str | None, keys: str | None, phy_offset: int, store_ts: int,
                        tran_type: int = 0) -> list[tuple[str, int, int]]:
    """(key, phyOffset, storeTimestamp) triples for one record; none for ROLLBACK records."""
    if tran_type & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return []
    return [(k, phy_offset, store_ts) for k in build_index_keys(topic, uniq_key, keys)]


def _time_diff(store_ts: int, begin_ts: int) -> int:
    """putKey's timeDiff: Java long division, then clamps."""
    diff = _wrap64(store_ts - begin_ts)
    diff = -((-diff) // 1000) if diff < 0 else diff // 1000
    if begin_ts <= 0 or diff < 0:
        return 0
    return min(diff, INT_MAX)


def _wrap64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


class IndexFileWriter:
    """Writes one index file exactly like ``IndexFile.putKey`` (§9.6).

    Create with :meth:`create` (new file, sparse, zero filled) or :meth:`open` (continue an
    existing file). The header is written through on every put; call :meth:`flush` /
    :meth:`fsync` before closing when durability matters.
    """

    def __init__(self, path: str | os.PathLike, geometry: IndexGeometry, header: IndexHeader, fd: int):
        self.path = Path(path)
        self.geometry = geometry
        self.header = header
        self._fd = fd
        self._mm = mmap.mmap(fd, geometry.file_size, access=mmap.ACCESS_WRITE)
        self._slot_base = INDEX_HEADER_SIZE
        self._entry_base = geometry.entries_start

    @classmethod
    def create(cls, path: str | os.PathLike, hash_slot_num: int = MAX_HASH_SLOT_NUM, index_num: int = MAX_INDEX_NUM,
               end_phy_offset: int = 0, end_timestamp: int = 0) -> IndexFileWriter:
        """A new file; header seeded from the previous file's end values like the broker."""
        geo = IndexGeometry(hash_slot_num, index_num)
        if hash_slot_num <= 0 or index_num <= 1:
            raise FormatError(f"bad index geometry {hash_slot_num}/{index_num}")
        header = IndexHeader()
        if end_phy_offset > 0:
            header.begin_phy_offset = header.end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            header.begin_timestamp = header.end_timestamp = end_timestamp
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise StoreError(f"cannot create index file: {exc.strerror}", path) from None
        try:
            os.ftruncate(fd, geo.file_size)
            writer = cls(path, geo, header, fd)
        except BaseException:
            os.close(fd)
            raise
        writer._write_header()
        return writer

    @classmethod
    def create_in(cls, index_dir: str | os.PathLike, hash_slot_num: int = MAX_HASH_SLOT_NUM,
                  index_num: int = MAX_INDEX_NUM, end_phy_offset: int = 0, end_timestamp: int = 0,
                  now_ms: int | None = None, utc: bool = False) -> IndexFileWriter:
        """A new file in ``index_dir`` named by creation time, bumped past existing names."""
        Path(index_dir).mkdir(parents=True, exist_ok=True)
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        existing = {p.name for p in Path(index_dir).iterdir()}
        last = max((n for n in existing if len(n) == INDEX_FILE_NAME_LENGTH and n.isdigit()), default="")
        name = index_file_name(ms, utc)
        while name in existing or name <= last:
            ms += 1
            name = index_file_name(ms, utc)
        return cls.create(Path(index_dir) / name, hash_slot_num, index_num, end_phy_offset, end_timestamp)

    @classmethod
    def open(cls, path: str | os.PathLike, hash_slot_num: int | None = None, index_num: int | None = None
             ) -> IndexFileWriter:
        """Continue writing an existing index file (header loaded like ``IndexHeader.load``)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreError(f"cannot open index file: {exc.strerror}", path) from None
        try:
            geo = infer_geometry(os.fstat(fd).st_size, hash_slot_num, index_num, path)
            header = IndexHeader.unpack(os.pread(fd, INDEX_HEADER_SIZE, 0))
            header.index_count = header.effective_index_count
            return cls(path, geo, header, fd)
        except BaseException:
            os.close(fd)
            raise

    # -- state ------------------------------------------------------------------------------------
    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.geometry.index_num

    @property
    def remaining(self) -> int:
        return max(0, self.geometry.index_num - self.header.index_count)

    def _write_header(self) -> None:
        self._mm[0:INDEX_HEADER_SIZE] = self.header.pack()

    # -- single put -----------------------------------------------------------------------------
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """``IndexFile.putKey``; False when the file is full."""
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """putKey for an already computed keyHash (non-negative int32)."""
        h = self.header
        if h.index_count >= self.geometry.index_num:
            return False
        slot_pos = self._slot_base + (key_hash % self.geometry.hash_slot_num) * INDEX_HASH_SLOT_SIZE
        slot_value = int.from_bytes(self._mm[slot_pos:slot_pos + 4], "big", signed=True)
        if slot_value <= INDEX_INVALID_INDEX or slot_value > h.index_count:
            slot_value = INDEX_INVALID_INDEX
        time_diff = _time_diff(store_timestamp, h.begin_timestamp)
        pos = self._entry_base + h.index_count * INDEX_SIZE
        INDEX_ENTRY.pack_into(self._mm, pos, key_hash, phy_offset, time_diff, slot_value)
        self._mm[slot_pos:slot_pos + 4] = h.index_count.to_bytes(4, "big", signed=True)
        if h.index_count <= 1:
            h.begin_phy_offset = phy_offset
            h.begin_timestamp = store_timestamp
        if slot_value == INDEX_INVALID_INDEX:
            h.hash_slot_count += 1
        h.index_count += 1
        h.end_phy_offset = phy_offset
        h.end_timestamp = store_timestamp
        self._write_header()
        return True

    def build_index(self, topic: str, uniq_key: str | None, keys: str | None, phy_offset: int, store_ts: int,
                    tran_type: int = 0) -> list[tuple[str, int, int]]:
        """``IndexService.buildIndex`` on this file; returns the triples that did not fit.

        Skips records below the header's endPhyOffset (already indexed) and ROLLBACK records.
        """
        if phy_offset < self.header.end_phy_offset:
            return []
        pending = build_index_entries(topic, uniq_key, keys, phy_offset, store_ts, tran_type)
        for i, (k, phy, ts) in enumerate(pending):
            if not self.put_key(k, phy, ts):
                return pending[i:]
        return []

    # -- bulk put -----------------------------------------------------------------------------------
    def bulk_put(self, key_hashes: Sequence[int], phy_offsets: Sequence[int], store_timestamps: Sequence[int]) -> int:
        """putKey for each (hash, offset, time) in order; returns how many fitted.

        Same bytes as repeated :meth:`put_hash`. Uses numpy when installed.
        """
        n = len(key_hashes)
        if not (n == len(phy_offsets) == len(store_timestamps)):
            raise ValueError("bulk_put arrays differ in length")
        m = min(n, self.remaining)
        if m == 0:
            return 0
        try:
            import numpy as np  # noqa: F401
        except ImportError:
            for i in range(m):
                self.put_hash(int(key_hashes[i]), int(phy_offsets[i]), int(store_timestamps[i]))
            return m
        self._bulk_numpy(key_hashes, phy_offsets, store_timestamps, m)
        return m

    def _bulk_numpy(self, key_hashes, phy_offsets, store_timestamps, m: int) -> None:
        import numpy as np

        h = self.header
        hashes = np.asarray(key_hashes[:m], dtype=np.int64)
        phys = np.asarray(phy_offsets[:m], dtype=np.int64)
        tss = np.asarray(store_timestamps[:m], dtype=np.int64)
        if m and (hashes.min() < 0 or hashes.max() > INT_MAX):
            raise ValueError("key hashes must be non-negative int32 values")
        c0 = h.index_count
        numbers = np.arange(c0, c0 + m, dtype=np.int64)
        slots = hashes % self.geometry.hash_slot_num
        slot_table = np.frombuffer(self._mm, dtype=">i4", count=self.geometry.hash_slot_num, offset=INDEX_HEADER_SIZE)

        # prevIndex: previous entry of the same slot in this batch, else the slot's old value
        order = np.argsort(slots, kind="stable")
        s_sorted = slots[order]
        first = np.ones(m, dtype=bool)
        first[1:] = s_sorted[1:] != s_sorted[:-1]
        prev_sorted = np.empty(m, dtype=np.int64)
        n_sorted = numbers[order]
        prev_sorted[1:] = n_sorted[:-1]
        old = slot_table[s_sorted[first]].astype(np.int64)
        first_numbers = n_sorted[first]
        old_invalid = (old <= INDEX_INVALID_INDEX) | (old > first_numbers)
        prev_sorted[first] = np.where(old_invalid, INDEX_INVALID_INDEX, old)
        prev = np.empty(m, dtype=np.int64)
        prev[order] = prev_sorted

        # timeDiff: the first entry of a fresh file uses the old beginTimestamp (quirk)
        begin = np.full(m, h.begin_timestamp, dtype=np.int64)
        new_begin_ts, new_begin_phy = h.begin_timestamp, h.begin_phy_offset
        if c0 <= 1:
            new_begin_ts, new_begin_phy = int(tss[0]), int(phys[0])
            begin[1:] = new_begin_ts
        with np.errstate(over="ignore"):
            diff = tss - begin
        td = np.where(diff < 0, 0, diff // 1000)
        td = np.where(begin <= 0, 0, np.minimum(td, INT_MAX))

        rec = np.empty(m, dtype=np.dtype([("h", ">i4"), ("p", ">i8"), ("t", ">i4"), ("v", ">i4")]))
        rec["h"], rec["p"], rec["t"], rec["v"] = hashes, phys, td, prev
        start = self._entry_base + c0 * INDEX_SIZE
        self._mm[start:start + m * INDEX_SIZE] = rec.tobytes()

        last = np.ones(m, dtype=bool)
        last[:-1] = s_sorted[:-1] != s_sorted[1:]
        slot_table[s_sorted[last]] = n_sorted[last]
        del slot_table

        h.begin_timestamp, h.begin_phy_offset = new_begin_ts, new_begin_phy
        h.hash_slot_count += int(old_invalid.sum())
        h.index_count = c0 + m
        h.end_phy_offset, h.end_timestamp = int(phys[-1]), int(tss[-1])
        self._write_header()

    # -- durability ----------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the header and msync the mapping."""
        self._write_header()
        self._mm.flush()

    def fsync(self) -> None:
        self.flush()
        os.fsync(self._fd)

    def close(self) -> None:
        if self._mm is not None:
            self._write_header()
            self._mm.close()
            self._mm = None
            os.close(self._fd)

    def __enter__(self) -> IndexFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IndexBuilder:
    """``IndexService`` over a directory: rolls to a new file when one is full."""

    def __init__(self, index_dir: str | os.PathLike, hash_slot_num: int = MAX_HASH_SLOT_NUM,
                 index_num: int = MAX_INDEX_NUM, clock_ms=None, utc: bool = False):
        self.index_dir = Path(index_dir)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._utc = utc
        self.writer: IndexFileWriter | None = None
        self.finished: list[Path] = []

    def _current(self) -> IndexFileWriter:
        w = self.writer
        if w is not None and not w.is_full:
            return w
        end_phy, end_ts = (w.header.end_phy_offset, w.header.end_timestamp) if w else (0, 0)
        if w is not None:
            w.close()
            self.finished.append(w.path)
        self.writer = IndexFileWriter.create_in(self.index_dir, self.hash_slot_num, self.index_num, end_phy, end_ts,
                                                self._clock(), self._utc)
        return self.writer

    def add_message(self, topic: str, uniq_key: str | None, keys: str | None, phy_offset: int, store_ts: int,
                    tran_type: int = 0) -> None:
        """``buildIndex`` for one record, rolling over full files."""
        w = self._current()
        pending = w.build_index(topic, uniq_key, keys, phy_offset, store_ts, tran_type)
        while pending:
            w = self._current()
            k, phy, ts = pending[0]
            if w.put_key(k, phy, ts):
                pending = pending[1:]

    def put_hashes(self, key_hashes: Sequence[int], phy_offsets: Sequence[int], store_timestamps: Sequence[int]
                   ) -> None:
        """Bulk putKey across files."""
        done, n = 0, len(key_hashes)
        while done < n:
            w = self._current()
            done += w.bulk_put(key_hashes[done:], phy_offsets[done:], store_timestamps[done:])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.finished.append(self.writer.path)
            self.writer = None

    def __enter__(self) -> IndexBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def key_hashes(keys: Iterable[str]) -> list[int]:
    """IndexFile keyHash of each key string."""
    return [index_key_hash(k) for k in keys]
