"""The compiled index-file check (``fast.indexjoin``) against the pure one (``analysis.verify.index_checks``): the
same findings, in the same order, on the bundled fixtures and on damaged copies of their index files and
commitlogs."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from conftest import FIXTURES
from rmqdump.analysis.verify import index_checks, verify_store
from rmqdump.analysis.verify.record_cache import RecordCache
from rmqdump.fast.engine import fast_available
from rmqdump.store.indexfile import IndexFile
from rmqdump.store.root import Store

pytestmark = pytest.mark.skipif(not fast_available(), reason="the compiled path is not available here")

IDX = "index/20261101000000000"
ENTRIES = 40 + 4 * 500


def patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def entry(root: Path, n: int):
    with IndexFile(root / IDX) as f:
        return f.entry(n)


def _flip(path: Path, pos: int, mask: int = 0x10) -> None:
    b = path.read_bytes()[pos]
    patch(path, pos, bytes([b ^ mask]))


def _segment_of(root: Path, offset: int) -> tuple[Path, int]:
    seg = Store.open(root).commitlog.segment_for(offset)
    return seg.path, offset - seg.start


def _hash(root):  # keyHash of entry 5
    _flip(root / IDX, ENTRIES + 20 * 5 + 3)


def _phy(root):  # phyOffset of entry 4: into the middle of its record
    _flip(root / IDX, ENTRIES + 20 * 4 + 11, 0x01)


def _phy_back(root):  # entry 10 points back at entry 2's record (out of the climbing order)
    patch(root / IDX, ENTRIES + 20 * 10 + 4, struct.pack(">q", entry(root, 2).phy_offset))


def _phy_far(root):  # phyOffset of the last entry: far past the commitlog
    with IndexFile(root / IDX) as f:
        last = f.index_count - 1
    _flip(root / IDX, ENTRIES + 20 * last + 4 + 2, 0x40)


def _slot(root):  # a used slot pointing past indexCount
    with IndexFile(root / IDX) as f:
        s = next(i for i in range(500) if f.slot(i) > 0)
    patch(root / IDX, 40 + 4 * s, struct.pack(">i", 1_000_000))


def _slot_link(root):  # an empty slot linked into another slot's chain (irregular, still found)
    with IndexFile(root / IDX) as f:
        busy = next(i for i in range(500) if f.slot(i) > 0)
        empty = next(i for i in range(500) if f.slot(i) == 0)
        head = f.slot(busy)
    patch(root / IDX, 40 + 4 * empty, struct.pack(">i", head))


def _prev(root):  # entry 9 links to itself, entry 11 to a newer entry
    patch(root / IDX, ENTRIES + 20 * 9 + 16, struct.pack(">i", 9))
    patch(root / IDX, ENTRIES + 20 * 11 + 16, struct.pack(">i", 13))


def _time(root):  # entry 6's timeDiff, and beginTimestamp (every later entry disagrees)
    _flip(root / IDX, ENTRIES + 20 * 6 + 15, 0x04)
    _flip(root / IDX, 5, 0x01)


def _record_zeroed(root):  # the record entry 3 points at loses its magic code
    path, pos = _segment_of(root, entry(root, 3).phy_offset)
    patch(path, pos + 4, bytes(4))


def _truncated(root):  # the segment holding the last entry's record is cut in front of it
    e = entry(root, 13)
    path, pos = _segment_of(root, e.phy_offset)
    with open(path, "r+b") as f:
        f.truncate(pos + 10)


def _hash_time(root):  # entry 5 disagrees on its key and its time, every other entry on its time
    _hash(root)
    _time(root)


DAMAGE = {"clean": None, "hash_time": _hash_time, "hash": _hash, "phy": _phy, "phy_back": _phy_back,
          "phy_far": _phy_far, "slot": _slot, "slot_link": _slot_link, "prev": _prev, "time": _time,
          "record_zeroed": _record_zeroed, "truncated": _truncated}
EXPECTED = {"hash": "index_key_mismatch", "phy": "index_entry_dangling", "phy_far": "index_entry_beyond_end",
            "slot": "index_slot_invalid", "slot_link": "index_chain_irregular", "prev": "index_chain_order",
            "time": "index_time_mismatch"}
GONE = {"record_zeroed", "truncated"}  # dangling, or stale past the end of valid data when the damage ends it


@pytest.fixture
def damaged(tmp_path):
    def make(store: str, damage: str) -> Path:
        import shutil

        root = tmp_path / f"{store}-{damage}"
        shutil.copytree(FIXTURES / store, root)
        if DAMAGE[damage] is not None:
            DAMAGE[damage](root)
        return root

    return make


def _end(store: Store) -> int:
    last = store.commitlog.segments[-1]
    return last.start + last.size


def _index_report(root: Path, engine: str, monkeypatch) -> tuple[list, list]:
    monkeypatch.setenv("RMQDUMP_FAST", engine)
    r = verify_store(root)
    return [f for f in r.findings if f.file and f.file.startswith("index")], r.indexes


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("store", ["store", "store-5x"])
def test_compiled_index_check_matches_the_pure_one(store, damage, damaged, monkeypatch):
    root = damaged(store, damage)
    calls = []
    real = index_checks._fast_one_index
    monkeypatch.setattr(index_checks, "_fast_one_index", lambda *a: calls.append(1) or real(*a))
    fast = _index_report(root, "1", monkeypatch)
    assert calls, "the compiled index check did not run"
    pure = _index_report(root, "0", monkeypatch)
    assert len(calls) == 1
    assert fast == pure
    kinds = {f.kind for f in pure[0]}
    if damage in EXPECTED:
        assert EXPECTED[damage] in kinds
    elif damage in GONE:
        assert kinds & {"index_entry_dangling", "index_entry_beyond_end"}
    elif damage == "clean":
        assert not kinds


@pytest.mark.parametrize("damage", ["time", "hash", "hash_time", "phy", "record_zeroed", "slot_link", "prev"])
@pytest.mark.parametrize("max_per_kind", [0, 1, 2])
def test_capped_findings_are_the_same(damage, max_per_kind, damaged, monkeypatch):
    """Once a kind is capped the compiled check stops decoding its entries: the kept findings stay the pure ones."""
    root = damaged("store", damage)
    store = Store.open(root)
    got = []
    for engine in ("1", "0"):
        monkeypatch.setenv("RMQDUMP_FAST", engine)
        cache = RecordCache(store.commitlog)
        try:
            got.append(index_checks.check_index(root, store.commitlog, cache, valid_end=_end(store),
                                                recovery_end=None, max_per_kind=max_per_kind))
        finally:
            cache.close()
    assert got[0] == got[1]
    assert max_per_kind == 0 or got[1][0]
