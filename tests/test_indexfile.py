"""IndexFile reader, broker-equivalent query and writer against the real RocketMQ 4.9.8 stores."""

from __future__ import annotations

import os
import random
import struct
import threading

import pytest

from conftest import manifest, real_store
from rmqdump.codec.javahash import index_key, index_key_hash
from rmqdump.codec.layout import INDEX_ENTRY, INDEX_HEADER
from rmqdump.errors import FormatError, NotFoundError, RmqdumpError
from rmqdump.store.indexfile import (
    DEFAULT_GEOMETRY,
    IndexBuilder,
    IndexFile,
    IndexFileWriter,
    IndexGeometry,
    IndexStore,
    build_index_entries,
    build_index_keys,
    index_file_name,
    infer_geometry,
    key_hashes,
    list_index_files,
)

CASES = [("clean", "clean"), ("crash_kill9", "crash_kill9_after_rocketmq_recovery")]
SMALL = (500, 2000)
MANIFEST_CAP = 64  # the broker's maxMsgsNumBatch applied when the manifest was made


def _lines(name, kind):
    return [x for x in manifest(name) if x["type"] == kind]


def _real_index_bytes(store):
    files = list_index_files(real_store(store))
    assert len(files) == 1
    return files[0].read_bytes()


@pytest.mark.parametrize("store,man", CASES)
def test_header_matches_manifest(store, man):
    (expected,) = _lines(man, "index_file")
    with IndexStore(real_store(store)) as st:
        (f,) = st.files
        assert f.geometry == IndexGeometry(*SMALL) and f.size == 42040
        h = f.header
        assert (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count,
                h.index_count) == (expected["beginTimestamp"], expected["endTimestamp"], expected["beginPhyOffset"],
                                   expected["endPhyOffset"], expected["hashSlotCount"], expected["indexCount"])
        if store == "clean":
            assert f.name == expected["file"]
        # every chain is well formed, and every entry sits in exactly one chain
        seen = []
        for slot in range(f.geometry.hash_slot_num):
            seen.extend(e.number for e in f.walk(slot))
        assert sorted(seen) == list(range(1, h.index_count))
        assert sum(1 for s in range(500) if f.slot(s)) == h.hash_slot_count


@pytest.mark.parametrize("store,man", CASES)
def test_every_manifest_query(store, man):
    queries = _lines(man, "index_query")
    assert queries
    with IndexStore(real_store(store)) as st:
        for q in queries:
            expected = q["phyOffsets_in_returned_order"]
            assert index_key_hash(q["indexKey"]) == q["hash"]
            full = st.query(q["topic"], q["key"])
            assert not full.anomalies
            capped = st.query(q["topic"], q["key"], max_num=MANIFEST_CAP)
            assert capped.phy_offsets == expected, q["indexKey"]
            if len(full.phy_offsets) <= MANIFEST_CAP:
                assert full.phy_offsets == expected and not full.truncated and not capped.truncated
            else:  # the manifest was cut at 64 by the broker; ours is not
                assert full.phy_offsets[:MANIFEST_CAP] == expected and capped.truncated
    if store == "crash_kill9":
        with IndexStore(real_store(store)) as st:
            assert len(st.query("TopicCrash", "batch-0").phy_offsets) == 100


def test_query_time_window_and_cap():
    with IndexStore(real_store("clean")) as st:
        f = st.files[0]
        full = st.query("TopicTest", "order-0")
        assert len(full.phy_offsets) == 10
        assert st.query("TopicTest", "order-0", max_num=3).phy_offsets == full.phy_offsets[:3]
        assert st.query("TopicTest", "order-0", max_num=3).truncated
        assert not st.query("TopicTest", "order-0", max_num=10).truncated
        assert st.query("TopicTest", "order-0", begin=f.header.end_timestamp + 1).phy_offsets == []
        assert st.query("TopicTest", "order-0", end=f.header.begin_timestamp - 1).phy_offsets == []
        assert st.query("TopicTest", "no-such-key").phy_offsets == []
        assert full.index_last_update_phy_offset == f.header.end_phy_offset


def test_geometry_inference():
    assert infer_geometry(42040) == IndexGeometry(500, 2000)
    assert infer_geometry(420_000_040) == DEFAULT_GEOMETRY
    assert infer_geometry(42040, hash_slot_num=500) == IndexGeometry(500, 2000)
    assert infer_geometry(40 + 4 * 10 + 20 * 7, 10, 7) == IndexGeometry(10, 7)
    assert infer_geometry(40 + 4 * 10 + 20 * 7, index_num=7) == IndexGeometry(10, 7)
    for bad in [(0,), (39,), (42039,), (42040, 501, None), (42040, 500, 1999), (40 + 4 * 10 + 20 * 7,)]:
        with pytest.raises(FormatError):
            infer_geometry(*bad)


def test_spec_vector_default_geometry(tmp_path):
    """§16.7 on a sparse full-size (420,000,040 B) file."""
    path = tmp_path / "20231115060000123"
    with IndexFileWriter.create(path) as w:
        assert w.build_index("TopicTest", "0A00000530391B6D358654A6C3D20007", "KEY1 KEY2", 1073741824,
                             1700000000123) == []
        assert w.build_index("TopicTest", None, "KEY1", 1073742015, 1700000005999) == []
    assert path.stat().st_size == 420_000_040
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse
    with open(path, "rb") as fh:
        header = fh.read(40)
        fh.seek(20000120)
        entry4 = fh.read(20)
    assert header.hex() == ("0000018bcfe5687b" "0000018bcfe57f6f" "0000000040000000" "00000000400000bf"
                            "00000003" "00000005")
    assert entry4.hex() == "62c3592c" "00000000400000bf" "00000005" "00000002"
    with IndexFile(path) as f:
        assert f.geometry == DEFAULT_GEOMETRY
        assert [f.slot(s) for s in (388173, 1969516, 1969515)] == [1, 4, 3]
        assert [(e.number, e.key_hash, e.time_diff, e.prev_index) for e in f.iter_entries()] == [
            (1, 440388173, 0, 0), (2, 1656969516, 0, 0), (3, 1656969515, 0, 0), (4, 1656969516, 5, 2)]
        assert f.select_phy_offsets("TopicTest#KEY1").phy_offsets == [1073742015, 1073741824]
        assert f.slot_for_key("polygenelubricants") == 0


def _messages(man):
    return _lines(man, "message")


def _entries_of(msgs):
    out = []
    for m in msgs:
        out.extend(build_index_entries(m["topic"], m.get("uniqKey"), m.get("keys"), m["commitLogOffset"],
                                       m["storeTimestamp"], m["tranType"]))
    return out


@pytest.mark.parametrize("store,man", CASES)
def test_rebuild_index_byte_for_byte(tmp_path, store, man):
    real = _real_index_bytes(store)
    msgs = _messages(man)
    assert [m["commitLogOffset"] for m in msgs] == sorted(m["commitLogOffset"] for m in msgs)
    with IndexFileWriter.create(tmp_path / "one", *SMALL) as w:
        for m in msgs:
            assert w.build_index(m["topic"], m.get("uniqKey"), m.get("keys"), m["commitLogOffset"],
                                 m["storeTimestamp"], m["tranType"]) == []
    assert (tmp_path / "one").read_bytes() == real
    # bulk path (numpy when available), split in uneven batches
    entries = _entries_of(msgs)
    hashes = key_hashes(k for k, _, _ in entries)
    phys = [p for _, p, _ in entries]
    tss = [t for _, _, t in entries]
    with IndexFileWriter.create(tmp_path / "bulk", *SMALL) as w:
        for a, b in [(0, 1), (1, 7), (7, 300), (300, len(entries))]:
            assert w.bulk_put(hashes[a:b], phys[a:b], tss[a:b]) == b - a
    assert (tmp_path / "bulk").read_bytes() == real


def test_build_index_keys_rules():
    assert build_index_keys("T", "U", "a  b   c") == ["T#U", "T#a", "T#b", "T#c"]
    assert build_index_keys("T", None, None) == []
    assert build_index_keys("T", "", "") == ["T#"]
    assert build_index_entries("T", "U", "k", 5, 9, tran_type=0xC) == []
    assert build_index_entries("T", "U", "k", 5, 9, tran_type=0x4) == [("T#U", 5, 9), ("T#k", 5, 9)]
    assert index_file_name(1795297369121, utc=True) == "20261121214249121"


def _random_triples(rng, n, ts0=1795297369112):
    hs = [rng.choice([rng.randrange(0, 2**31), rng.randrange(0, 40)]) for _ in range(n)]
    phys = [i * 97 for i in range(n)]
    tss = [ts0 + rng.randrange(-5000, 400000) for _ in range(n)]
    return hs, phys, tss


def test_bulk_equals_single_puts(tmp_path):
    rng = random.Random(7)
    hs, phys, tss = _random_triples(rng, 700)
    with IndexFileWriter.create(tmp_path / "a", 37, 400, end_phy_offset=55, end_timestamp=1795297000000) as a, \
            IndexFileWriter.create(tmp_path / "b", 37, 400, end_phy_offset=55, end_timestamp=1795297000000) as b:
        # pre-existing garbage slot values: one larger than indexCount, one negative
        for w in (a, b):
            w._mm[40 + 4 * 3:40 + 4 * 4] = struct.pack(">i", 150)
            w._mm[40 + 4 * 5:40 + 4 * 6] = struct.pack(">i", -4)
        single = sum(a.put_hash(h, p, t) for h, p, t in zip(hs, phys, tss, strict=True))
        done = b.bulk_put(hs[:250], phys[:250], tss[:250])
        done += b.bulk_put(hs[250:], phys[250:], tss[250:])
        assert single == done == 399
        assert a.is_full and b.is_full and b.bulk_put(hs, phys, tss) == 0
        assert not a.put_hash(1, 1, 1)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_first_entry_quirk_and_rollover(tmp_path):
    """A new file's first timeDiff is relative to the previous file's end time (§9.6)."""
    clock = iter(range(1795297369000, 1795297369100))
    with IndexBuilder(tmp_path / "index", 7, 4, clock_ms=lambda: next(clock), utc=True) as b:
        b.add_message("T", "U1", "k1", 100, 1_000_000)
        b.add_message("T", None, "k2", 200, 1_004_000)  # file 1 now full (indexCount 4 = maxIndexNum)
        b.add_message("T", "U3", None, 300, 1_009_500)
        b.add_message("T", None, "k1", 100, 1_009_600)  # below endPhyOffset of file 2: skipped
    names = [p.name for p in list_index_files(tmp_path)]
    assert names == sorted(names) and len(names) == 2 and all(len(n) == 17 for n in names)
    with IndexStore(tmp_path, 7, 4) as st:
        f1, f2 = st.files
        assert (f1.header.index_count, f1.header.end_phy_offset, f1.header.end_timestamp) == (4, 200, 1_004_000)
        assert (f2.header.begin_timestamp, f2.header.begin_phy_offset, f2.header.index_count) == (1_009_500, 300, 2)
        first = f2.entry(1)
        assert first.time_diff == 5  # (1_009_500 - 1_004_000) // 1000, relative to the old end time
        assert st.query("T", "k1").phy_offsets == [100]
        assert st.query("T", "U3").phy_offsets == [300]
        # the window excludes file 1 by its header times: iteration stops after file 2
        assert st.query("T", "k1", begin=1_009_000).phy_offsets == []
        assert [f.name for f in st.dropped_on_abnormal_restart(1_004_000)] == [names[1]]


def _small_file(tmp_path, n=20):
    path = tmp_path / "idx"
    with IndexFileWriter.create(path, 10, 40) as w:
        for i in range(n):
            w.put_key(index_key("T", f"k{i % 3}"), 1000 + i, 1795297369112 + i * 1000)
    return path


def _poke(path, pos, fmt, *values):
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(struct.pack(fmt, *values))


def _run_bounded(fn, seconds=5.0):
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hang"
    if "exc" in out:
        raise out["exc"]
    return out.get("value")


def test_hostile_slot_beyond_index_count(tmp_path):
    path = _small_file(tmp_path)
    with IndexFile(path) as f:
        slot = f.slot_for_key("T#k1")
    _poke(path, 40 + 4 * slot, ">i", 999)
    with IndexFile(path) as f:
        res = _run_bounded(lambda: f.select_phy_offsets("T#k1"))
        assert res.phy_offsets == [] and res.anomalies  # the broker treats it as empty
        with pytest.raises(FormatError):
            f.select_phy_offsets("T#k1", strict=True)
        with pytest.raises(FormatError):
            list(f.walk(slot))


def test_hostile_prev_index_cycle(tmp_path):
    path = _small_file(tmp_path)
    with IndexFile(path) as f:
        head = f.slot(f.slot_for_key("T#k1"))
        chain = [e.number for e in f.walk(f.slot_for_key("T#k1"))]
        begin_ts = f.header.begin_timestamp
    assert len(chain) >= 3
    # make the oldest entry point back to the head: a cycle the broker's own loop never leaves
    _poke(path, 40 + 4 * 10 + 20 * chain[-1] + 16, ">i", head)
    with IndexFile(path) as f:
        res = _run_bounded(lambda: f.select_phy_offsets("T#k1", begin=begin_ts))
        assert len(res.phy_offsets) == len(chain) and res.anomalies
        with pytest.raises(FormatError):
            _run_bounded(lambda: list(f.walk(f.slot_for_key("T#k1"))))
        with pytest.raises(FormatError):
            _run_bounded(lambda: f.select_phy_offsets("T#k1", strict=True))
    # a cycle whose hash never matches
    _poke(path, 40 + 4 * 10 + 20 * chain[-1], ">i", 12345)
    with IndexFile(path) as f:
        _run_bounded(lambda: f.select_phy_offsets("T#k1"))


def test_hostile_header_values(tmp_path):
    path = _small_file(tmp_path)
    _poke(path, 36, ">i", -5)
    with pytest.raises(FormatError) as info:
        IndexFile(path)
    assert info.value.file == str(path) and info.value.offset == 36
    with IndexFile(path, strict=False) as f:  # the broker treats <= 0 as 1: empty
        assert f.index_count == 1 and list(f.iter_entries()) == []
        assert f.select_phy_offsets("T#k1").phy_offsets == []
    _poke(path, 36, ">i", 41)
    with pytest.raises(FormatError):
        IndexFile(path)
    with IndexFile(path, strict=False) as f:
        with pytest.raises(RmqdumpError):
            list(f.iter_entries())


def test_hostile_truncated_and_junk_files(tmp_path):
    path = _small_file(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size - 1)
    with pytest.raises(FormatError) as info:
        IndexFile(path)
    assert info.value.file == str(path)
    os.truncate(path, 20)
    with pytest.raises(FormatError):
        IndexFile(path)
    store = tmp_path / "store"
    (store / "index").mkdir(parents=True)
    (store / "index" / "20260101000000000").write_bytes(b"\0" * 1000)
    with pytest.raises(FormatError):
        IndexStore(store)
    # an all-zero (never flushed) header: indexCount 0 is legal and means empty
    empty = tmp_path / "empty"
    empty.write_bytes(bytes(40 + 4 * 10 + 20 * 40))
    with IndexFile(empty, 10, 40) as f:
        assert f.index_count == 1 and f.select_phy_offsets("T#x").phy_offsets == []
    with IndexFile(empty, 10, 40) as f:
        with pytest.raises(NotFoundError):
            f.slot(10)
        with pytest.raises(FormatError):
            f.entry(40)


def test_random_hostile_bytes_never_escape(tmp_path):
    rng = random.Random(3)
    base = _small_file(tmp_path).read_bytes()
    path = tmp_path / "fuzz"
    for _ in range(200):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 12)):
            pos = rng.randrange(0, len(data) - 4)
            data[pos:pos + 4] = rng.randrange(-2**31, 2**31).to_bytes(4, "big", signed=True)
        path.write_bytes(bytes(data))
        for strict in (False, True):
            try:
                with IndexFile(path, strict=strict) as f:
                    for k in range(3):
                        f.select_phy_offsets(f"T#k{k}", strict=strict)
                        for _ in f.walk(f.slot_for_key(f"T#k{k}"), strict=strict):
                            pass
            except RmqdumpError:
                pass


def test_header_struct_sizes():
    assert INDEX_HEADER.size == 40 and INDEX_ENTRY.size == 20


def test_bulk_put_without_numpy(tmp_path, monkeypatch):
    import sys

    rng = random.Random(11)
    hs, phys, tss = _random_triples(rng, 60)
    with IndexFileWriter.create(tmp_path / "np", 13, 50) as w:
        assert w.bulk_put(hs, phys, tss) == 49
    monkeypatch.setitem(sys.modules, "numpy", None)
    with IndexFileWriter.create(tmp_path / "py", 13, 50) as w:
        assert w.bulk_put(hs, phys, tss) == 49
    assert (tmp_path / "np").read_bytes() == (tmp_path / "py").read_bytes()


def test_writer_reopen_continues(tmp_path):
    rng = random.Random(5)
    hs, phys, tss = _random_triples(rng, 30)
    with IndexFileWriter.create(tmp_path / "a", 11, 44) as w:
        w.bulk_put(hs, phys, tss)
    with IndexFileWriter.create(tmp_path / "b", 11, 44) as w:
        w.bulk_put(hs[:10], phys[:10], tss[:10])
    with IndexFileWriter.open(tmp_path / "b") as w:
        assert w.geometry == IndexGeometry(11, 44) and w.header.index_count == 11
        w.bulk_put(hs[10:], phys[10:], tss[10:])
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.parametrize("stride", [1, 3, 50, 100, 7000])
def test_chain_walk_reads_windows_and_matches_the_entry_table(tmp_path, stride):
    """Dense and sparse chains (a key every ``stride`` entries): walk() equals the chain rebuilt from the entries."""
    path = tmp_path / "idx"
    n = 20000
    with IndexFileWriter.create(path, 97, 40000) as w:
        for i in range(n):
            key = "T#hot" if i % stride == 0 else f"T#k{i}"
            w.put_key(key, 1000 + i, 1795297369112 + i)
    with IndexFile(path, 97, 40000) as f:
        slot = f.slot_for_key("T#hot")
        walked = list(f.walk(slot))
        want = sorted((e for e in f.iter_entries() if e.key_hash % 97 == slot), key=lambda e: -e.number)
        assert walked == want
        hot = index_key_hash("T#hot")
        res = f.select_phy_offsets("T#hot")
        assert res.phy_offsets == [e.phy_offset for e in want if e.key_hash == hot] and not res.anomalies
        capped = f.select_phy_offsets("T#hot", max_num=2)
        assert capped.phy_offsets == res.phy_offsets[:2] and capped.truncated


def test_prev_index_above_its_entry_ends_the_walk(tmp_path):
    """A prevIndex not below its own entry's number (never written by the broker) is a damaged link."""
    path = _small_file(tmp_path)
    with IndexFile(path) as f:
        slot = f.slot_for_key("T#k1")
        chain = [e.number for e in f.walk(slot)]
    _poke(path, 40 + 4 * 10 + 20 * chain[1] + 16, ">i", chain[1] + 1)  # forward link, inside indexCount
    with IndexFile(path) as f:
        with pytest.raises(FormatError, match="not an earlier entry"):
            list(f.walk(slot))
        assert [e.number for e in f.walk(slot, strict=False)] == chain[:2]
        res = f.select_phy_offsets("T#k1")
        assert len(res.phy_offsets) == 2 and "not an earlier entry" in res.anomalies[0]


def test_a_new_index_file_name_jumps_past_a_name_from_a_clock_ahead(tmp_path):
    """An index file named by a host whose clock ran years ahead: the next name is found in one step (it
    was searched millisecond by millisecond: a repair hung); a name that spells no time is refused."""
    import signal

    from rmqdump.errors import StoreError
    from rmqdump.store.indexfile.writer import IndexFileWriter, next_index_file_name

    signal.alarm(20)  # a regression would loop for years of milliseconds
    try:
        now = 1_790_000_000_000
        assert next_index_file_name(now, True, "20991231235959998") == "20991231235959999"
        assert next_index_file_name(now, True, "20991231235959998", {"20991231235959999"}) == "21000101000000000"
        assert next_index_file_name(now, True, "") == "20260921141320000"
        with pytest.raises(StoreError, match="spells no time"):
            next_index_file_name(now, True, "99999999999999999")
        (tmp_path / "20991231235959998").write_bytes(b"")
        w = IndexFileWriter.create_in(tmp_path, 4, 8, now_ms=now, utc=True)
        assert w.path.name == "20991231235959999"
        w.close()
    finally:
        signal.alarm(0)
