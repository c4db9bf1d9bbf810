"""IndexFile reading and querying (spec §9): one file's slots, entries and hash chains, the broker's
``selectPhyOffset``, and all index files of a store queried like ``IndexService.queryOffset``.

Readers use ``os.pread`` of the header, one slot and the chain's entries only, so a lookup
in a 400 MiB file touches a few pages.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.javahash import index_key, index_key_hash
from rmqdump.codec.layout import INDEX_ENTRY, INDEX_HEADER_SIZE, INDEX_INVALID_INDEX, INDEX_SIZE, STORE_INDEX_DIR
from rmqdump.disk.evidence import record_read
from rmqdump.disk.fileio import open_read
from rmqdump.errors import FormatError, NotFoundError, StoreError
from rmqdump.store.indexfile.layout import IndexEntry, IndexHeader, infer_geometry

LONG_MAX = (1 << 63) - 1


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
            self._fd = open_read(self.path, follow=False)
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

    def mapped(self):
        """A read-only mapping of the whole file (``mmap``; the caller closes it): the compiled index check
        reads slots and entries in place."""
        import mmap

        try:
            return mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot map: {exc}", self.path) from None

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
