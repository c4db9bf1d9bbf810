"""The IndexFile's layout (spec §9.2): its geometry (slot and entry capacities, the file size and
positions they imply, inferred from explicit values, the file's own entries or its size), the 40-byte
header and the 20-byte entry."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rmqdump.codec.layout import (
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_SIZE,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
)
from rmqdump.errors import FormatError, StoreError

#: Index entries per slot-table unit ratio the broker uses by default (maxIndexNum = 4 × slots).
DEFAULT_INDEX_PER_SLOT = MAX_INDEX_NUM // MAX_HASH_SLOT_NUM
_BYTES_PER_SLOT_DEFAULT = INDEX_HASH_SLOT_SIZE + DEFAULT_INDEX_PER_SLOT * INDEX_SIZE  # 84


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
#: other index files read for the geometry of one whose own entries do not tell it
_MAX_SIBLINGS = 8
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


def _geometry_from_siblings(path: Path, size: int) -> IndexGeometry | None:
    """The geometry the entries of another index file of the same size in the same directory prove (the closest
    by name first): a file too new to tell its own (a broker killed right after rolling to it leaves it with
    no entry) was made by the same broker settings."""
    try:
        names = [e.name for e in os.scandir(path.parent) if e.name != path.name
                 and e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_size == size]
    except OSError:
        return None
    near = sorted(names, key=lambda n: (n > path.name, abs(_as_int(n) - _as_int(path.name))))
    for name in near[:_MAX_SIBLINGS]:
        if (geo := geometry_from_entries(path.parent / name, size)) is not None:
            return geo
    return None


def _as_int(name: str) -> int:
    return int(name) if name.isdigit() else 0


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
        if file is not None and (geo := _geometry_from_siblings(Path(file), size)) is not None:
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
