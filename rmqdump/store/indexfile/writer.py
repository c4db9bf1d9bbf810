"""IndexFile writing (spec §9.6): the keys ``IndexService.buildIndex`` puts for a record, one file
written exactly like ``IndexFile.putKey``, and the builder that rolls to a new file when one is full.

The writer works on a writable mmap of a (sparse) pre-sized file; :meth:`IndexFileWriter.bulk_put`
does the same as repeated puts for arrays of hashes with numpy when it is installed.
"""

from __future__ import annotations

import calendar
import mmap
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from rmqdump.codec.javahash import index_key, index_key_hash
from rmqdump.codec.layout import (
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_INVALID_INDEX,
    INDEX_SIZE,
    KEY_SEPARATOR,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.disk.durable import fsync_raw, open_write
from rmqdump.errors import FormatError, StoreError
from rmqdump.store.indexfile.layout import IndexGeometry, IndexHeader, infer_geometry

INT_MAX = (1 << 31) - 1
INDEX_FILE_NAME_LENGTH = 17


def index_file_name(now_ms: int | None = None, utc: bool = False) -> str:
    """``yyyyMMddHHmmssSSS`` of a time in ms (local time like the broker's JVM, or UTC)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    t = time.gmtime(ms // 1000) if utc else time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


def _name_ms(name: str, utc: bool) -> int | None:
    """The time in ms an index file name spells (None if it spells none)."""
    if len(name) != INDEX_FILE_NAME_LENGTH or not name.isdigit():
        return None
    try:
        t = time.strptime(name[:14], "%Y%m%d%H%M%S")
    except ValueError:
        return None
    secs = calendar.timegm(t) if utc else int(time.mktime(t))
    return secs * 1000 + int(name[14:])


def next_index_file_name(now_ms: int, utc: bool, after: str = "", taken: set[str] | frozenset = frozenset(),
                         where: str | os.PathLike | None = None) -> str:
    """The name of a new index file made at ``now_ms``, sorting after ``after`` and not in ``taken``.

    A clock behind ``after`` (an index file from a host whose clock ran ahead) jumps past it in one
    step, never millisecond by millisecond."""
    ms = now_ms
    name = index_file_name(ms, utc)
    if after and name <= after:
        base = _name_ms(after, utc)
        if base is None:
            raise StoreError(f"cannot name a new index file after {after!r}: it spells no time", where)
        ms = max(ms, base + 1)
        name = index_file_name(ms, utc)
    for _ in range(10_000):
        if name not in taken and name > after and len(name) == INDEX_FILE_NAME_LENGTH:
            return name
        ms += 1
        name = index_file_name(ms, utc)
    raise StoreError(f"no free index file name after {after!r}", where)


def build_index_keys(topic: str, uniq_key: str | None, keys: str | None) -> list[str]:
    """Index key strings ``IndexService.buildIndex`` puts for one record, in order."""
    out = []
    if uniq_key is not None:
        out.append(index_key(topic, uniq_key))
    if keys:
        out.extend(index_key(topic, k) for k in keys.split(KEY_SEPARATOR) if k)
    return out


def record_index_keys(rec) -> list[str]:
    """The index key strings ``IndexService.buildIndex`` puts for a decoded record; none for a ROLLBACK."""
    if rec.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return []
    props = rec.properties
    return build_index_keys(rec.topic, props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), props.get(PROPERTY_KEYS))


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
            fd = open_write(path, read=True, create=True, exclusive=True)
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
        name = next_index_file_name(ms, utc, last, existing, index_dir)
        return cls.create(Path(index_dir) / name, hash_slot_num, index_num, end_phy_offset, end_timestamp)

    @classmethod
    def open(cls, path: str | os.PathLike, hash_slot_num: int | None = None, index_num: int | None = None
             ) -> IndexFileWriter:
        """Continue writing an existing index file (header loaded like ``IndexHeader.load``)."""
        try:
            fd = open_write(path, read=True)
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
        fsync_raw(self._fd)

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
