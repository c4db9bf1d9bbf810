"""ConsumeQueue / BatchConsumeQueue reader and writer against the real RocketMQ 4.9.8 stores."""

from __future__ import annotations

import os
import types

import pytest

from conftest import manifest, real_store
from rmqdump.codec.javahash import tags_hash
from rmqdump.codec.layout import CQ_EXT_MAX_ADDR, CQ_PRE_BLANK_SIZE
from rmqdump.errors import FormatError, NotFoundError, RmqdumpError, StoreError, UnsupportedError
from rmqdump.store.consumequeue import (
    BatchConsumeQueue,
    ConsumeQueue,
    ConsumeQueueWriter,
    check_not_rocksdb,
    discover_queues,
    encode_bcq_entry,
    encode_cq_entry,
    ext_address,
    ext_real_offset,
    file_name,
    infer_store_cq_file_size,
    is_ext_addr,
    is_rocksdb_consumequeue,
    parse_queue_id,
    queue_offset_location,
)

CASES = [("clean", "clean"), ("crash_kill9", "crash_kill9_after_rocketmq_recovery")]
FILE_SIZE = 600


def _manifest_queues(name: str):
    lines = manifest(name)
    queues = {(x["topic"], x["queueId"]): x for x in lines if x["type"] == "cq_queue"}
    entries = {(x["topic"], x["queueId"], x["queueOffset"]): (x["commitLogOffset"], x["size"], x["tagsCode"])
               for x in lines if x["type"] == "cq_entry"}
    return queues, entries


@pytest.mark.parametrize("store,man", CASES)
def test_real_queues_match_manifest(store, man):
    root = real_store(store)
    queues, entries = _manifest_queues(man)
    seen = set()
    got_entries = {}
    for ref in discover_queues(root):
        cq = ConsumeQueue(ref.path, ref.topic, ref.queue_id)
        q = queues[(ref.topic, ref.queue_id)]
        seen.add((ref.topic, ref.queue_id))
        assert cq.file_size == FILE_SIZE
        assert cq.min_offset(0) == q["minOffsetInQueue"]
        assert cq.max_offset == q["maxOffsetInQueue"]
        assert cq.max_physic_offset == q["maxPhysicOffset"]
        assert cq.missing_files() == [] and cq.truncated_files == [] and list(cq.holes()) == []
        for e in cq.iter_entries():
            assert e.is_valid and not e.is_pre_blank and not e.is_ext_addr
            got_entries[(ref.topic, ref.queue_id, e.queue_offset)] = (e.commit_log_offset, e.size, e.tags_code)
        for qo in range(cq.max_offset):
            assert cq.entry_at(qo)[1:] == entries[(ref.topic, ref.queue_id, qo)]
    assert got_entries == entries
    # queues that exist only in broker memory (no directory) are empty in the manifest
    for key in set(queues) - seen:
        assert queues[key]["maxOffsetInQueue"] == 0 and queues[key]["maxPhysicOffset"] == -1
        assert not (root / "consumequeue" / key[0] / str(key[1])).exists()


def test_clean_store_shape():
    root = real_store("clean")
    refs = list(discover_queues(root))
    assert len(refs) == 21
    assert sum(len(ConsumeQueue(r.path).files) for r in refs) == 25
    assert infer_store_cq_file_size(root) == FILE_SIZE
    assert not is_rocksdb_consumequeue(root)
    test0 = ConsumeQueue.open(root, "TopicTest", 0)
    assert [f.start for f in test0.files] == [0, 600]
    assert isinstance(test0.iter_entries(), types.GeneratorType)
    # negative tag hash (delay1) is stored sign-extended
    assert tags_hash("delay1") == -1335462130
    codes = {e.tags_code for q in (0, 1) for e in ConsumeQueue.open(root, "TopicDelay", q).iter_entries()}
    assert -1335462130 in codes


def test_open_missing_and_bad_topic():
    root = real_store("clean")
    with pytest.raises(NotFoundError):
        ConsumeQueue.open(root, "NoSuchTopic", 0)
    with pytest.raises(NotFoundError):
        ConsumeQueue.open(root, "../clean", 0)


def test_entry_at_bounds():
    cq = ConsumeQueue.open(real_store("clean"), "TopicTest", 1)
    with pytest.raises(NotFoundError):
        cq.entry_at(-1)
    with pytest.raises(NotFoundError):
        cq.entry_at(cq.max_offset)
    # raw read past the max returns the zero unit of the existing file
    raw = cq.entry_at(cq.max_offset, check_max=False)
    assert not raw.is_valid
    with pytest.raises(NotFoundError):
        cq.entry_at(60, check_max=False)  # third file does not exist


def test_location_rule():
    assert queue_offset_location(29, 600) == (0, 580)
    assert queue_offset_location(30, 600) == (600, 0)
    assert queue_offset_location(300001, 6_000_000) == (6_000_000, 20)
    assert file_name(600) == "00000000000000000600"


def test_encode_vector_and_ext_addresses():
    assert encode_cq_entry(1073741824, 191, 2598919).hex() == "0000000040000000000000bf000000000027a807"
    assert ext_address(0) == -9223372036854775808
    assert ext_address(100) == -9223372036854775708
    assert ext_real_offset(ext_address(100)) == 100
    assert is_ext_addr(CQ_EXT_MAX_ADDR) and not is_ext_addr(CQ_EXT_MAX_ADDR + 1)
    assert not is_ext_addr(-2147483648) and not is_ext_addr(1795297380545)
    with pytest.raises(FormatError):
        encode_cq_entry(1 << 63, 1, 0)


def test_discovery_skips_non_numeric_and_strange_topics(store_copy):
    root = store_copy("clean")
    (root / "consumequeue" / "TopicTest" / "notaqueue").mkdir()
    (root / "consumequeue" / "TopicTest" / "99999999999").mkdir()  # > int32: parseInt fails
    weird = root / "consumequeue" / "we ird\u00e9 topic"
    (weird / "+7").mkdir(parents=True)
    (weird / "-1").mkdir()
    refs = {(r.topic, r.queue_id) for r in discover_queues(root)}
    assert ("we ird\u00e9 topic", 7) in refs and ("we ird\u00e9 topic", -1) in refs
    assert not any(t == "TopicTest" and q > 3 for t, q in refs)
    assert parse_queue_id("12") == 12 and parse_queue_id("1a") is None and parse_queue_id("") is None
    assert parse_queue_id("\u0661") is None  # non-ASCII digit


def test_rocksdb_consumequeue_refused_by_writers(tmp_path):
    cq = tmp_path / "consumequeue"
    cq.mkdir()
    for name in ("CURRENT", "MANIFEST-000005", "000004.sst", "OPTIONS-000007"):
        (cq / name).write_bytes(b"rocks")
    assert is_rocksdb_consumequeue(tmp_path)
    with pytest.raises(UnsupportedError):  # writers refuse it
        check_not_rocksdb(tmp_path)
    pytest.importorskip("rocksdict")
    with pytest.raises(StoreError, match="cannot open RocksDB"):  # readers read it (tests/test_rocksdb.py): not these bytes
        list(discover_queues(tmp_path))
    with pytest.raises(StoreError, match="cannot open RocksDB"):
        ConsumeQueue.open(tmp_path, "TopicTest", 0)


def _write_queue(qdir, entries, file_size=FILE_SIZE):
    with ConsumeQueueWriter(qdir, file_size) as w:
        for off, size, tags in entries:
            w.append(off, size, tags)
        w.fsync()


def test_writer_roundtrip_and_rollover(tmp_path):
    qdir = tmp_path / "consumequeue" / "T" / "0"
    data = [(i * 100, 100, i - 35) for i in range(70)]
    _write_queue(qdir, data)
    names = sorted(os.listdir(qdir))
    assert names == [file_name(0), file_name(600), file_name(1200)]
    assert all(os.path.getsize(qdir / n) == 600 for n in names)
    cq = ConsumeQueue(qdir)
    assert cq.max_offset == 70 and cq.min_offset() == 0
    assert cq.max_physic_offset == 69 * 100 + 100
    assert [e[1:] for e in cq.iter_entries()] == data
    assert [e.queue_offset for e in cq.iter_entries(65, 68)] == [65, 66, 67]
    # reopen continues at the recovered end; broker write rule skips duplicates
    with ConsumeQueueWriter(qdir, FILE_SIZE) as w:
        assert w.next_queue_offset == 70
        assert not w.put_message_position_info(6900, 100, 0, 69)  # already built (offset+size <= max)
        assert not w.put_message_position_info(8000, 10, 0, 60)  # queue offset below write position
        assert w.put_message_position_info(8000, 10, 7, 70)
        assert w.put_message_position_info(9000, 10, 7, 75)  # gap: appended at current position
    cq = ConsumeQueue(qdir)
    assert cq.max_offset == 72 and cq.entry_at(71)[1:] == (9000, 10, 7)


def test_writer_pre_blank(tmp_path):
    qdir = tmp_path / "q"
    with ConsumeQueueWriter(qdir, FILE_SIZE) as w:
        assert w.put_message_position_info(5000, 200, 42, 35)
    assert os.listdir(qdir) == [file_name(600)]
    cq = ConsumeQueue(qdir)
    assert cq.max_offset == 36
    blanks = list(cq.iter_entries(stop=35))
    assert [e.queue_offset for e in blanks] == list(range(30, 35))
    assert all(e.is_pre_blank and e.is_valid and e.size == CQ_PRE_BLANK_SIZE for e in blanks)
    assert cq.entry_at(35)[1:] == (5000, 200, 42)
    assert cq.min_offset(0) == 30  # pre-blank offsets (0) pass when the commitlog starts at 0
    assert cq.min_offset(1) == 35
    with pytest.raises(NotFoundError):
        cq.entry_at(3)


def test_recovery_rules(tmp_path):
    qdir = tmp_path / "q"
    _write_queue(qdir, [(i * 10, 10, 0) for i in range(120)])  # 4 full files
    cq = ConsumeQueue(qdir)
    assert cq.max_offset == 120
    # an invalid entry in the first file is outside the third-last-file window
    with open(qdir / file_name(0), "r+b") as f:
        f.seek(5 * 20)
        f.write(bytes(20))
    cq = ConsumeQueue(qdir)
    assert cq.max_offset == 120
    assert [e.queue_offset for e in cq.holes()] == [5]
    # an invalid entry in the window stops recovery; later files would be deleted
    with open(qdir / file_name(1200), "r+b") as f:
        f.seek(3 * 20)
        f.write(encode_cq_entry(-1, 10, 0))
    cq = ConsumeQueue(qdir)
    assert cq.max_offset == 63
    assert cq.max_physic_offset == 62 * 10 + 10
    assert [f.start for f in cq.truncated_files] == [1800]


@pytest.mark.parametrize(("chunk", "first"), [(4, 256), (5, 256), (7, 256), (30, 256), (31, 256), (30, 1), (31, 2)])
@pytest.mark.parametrize("bad_at", [None, 0, 4, 5, 6, 14, 15, 29])
def test_recovery_scan_across_read_chunks(tmp_path, monkeypatch, chunk, first, bad_at):
    """The recovery scan reads each file in chunks of units (the first ``first`` units, then 4 x more each
    time up to ``chunk``): wherever the first invalid unit falls (first in a chunk, last in one, none), the
    recovered end and last entry are the unit-by-unit answer."""
    import rmqdump.store.consumequeue.reader as reader

    monkeypatch.setattr(reader, "RECOVER_CHUNK_UNITS", chunk)
    monkeypatch.setattr(reader, "RECOVER_FIRST_UNITS", first)
    entries = [(i * 10, 10, 0) for i in range(30)]  # one full file of 30 units
    if bad_at is not None:
        entries[bad_at] = (-1, 10, 0)
    qdir = tmp_path / "q"
    _write_queue(qdir, entries)
    cq = ConsumeQueue(qdir)
    end = 30 if bad_at is None else bad_at
    assert cq.max_offset == end
    assert cq.max_physic_offset == (-1 if end == 0 else (end - 1) * 10 + 10)


def test_missing_file_gap(tmp_path):
    qdir = tmp_path / "q"
    _write_queue(qdir, [(i * 10, 10, 0) for i in range(90)])
    os.remove(qdir / file_name(600))
    cq = ConsumeQueue(qdir)
    assert cq.missing_files() == [(600, 1200)]
    with pytest.raises(NotFoundError):
        cq.entry_at(40)
    assert cq.max_offset == 90


@pytest.mark.parametrize("damage", ["truncate_last", "wrong_size_first", "odd_size_only", "empty_only"])
def test_hostile_cq_files(tmp_path, damage):
    qdir = tmp_path / "q"
    _write_queue(qdir, [(i * 10, 10, 0) for i in range(45)])
    if damage == "truncate_last":
        os.truncate(qdir / file_name(600), 317)
    elif damage == "wrong_size_first":
        os.truncate(qdir / file_name(0), 580)
    elif damage == "odd_size_only":
        os.remove(qdir / file_name(600))
        os.truncate(qdir / file_name(0), 599)
    else:
        os.remove(qdir / file_name(600))
        os.truncate(qdir / file_name(0), 0)
    with pytest.raises(RmqdumpError) as info:
        _ = ConsumeQueue(qdir).max_offset
    assert isinstance(info.value, (FormatError, StoreError))
    assert info.value.file is not None


def test_non_strict_reads_truncated_file(tmp_path):
    qdir = tmp_path / "q"
    _write_queue(qdir, [(i * 10, 10, 0) for i in range(45)])
    os.truncate(qdir / file_name(600), 317)  # 15 whole units + 17 bytes
    cq = ConsumeQueue(qdir, strict=False)
    assert cq.problems and cq.max_offset == 45
    assert [e.queue_offset for e in cq.iter_raw(40)] == list(range(40, 45))
    with pytest.raises(StoreError):
        ConsumeQueue(qdir, file_size=600)


def test_stray_files_and_symlinks(tmp_path):
    qdir = tmp_path / "q"
    _write_queue(qdir, [(i * 10, 10, 0) for i in range(3)])
    (qdir / "junk.tmp").write_bytes(b"x")
    os.symlink(qdir / file_name(0), qdir / file_name(600))
    cq = ConsumeQueue(qdir)
    assert [f.start for f in cq.files] == [0]
    assert {p.name for p in cq.stray_files} == {"junk.tmp", file_name(600)}


def test_batch_consume_queue(tmp_path):
    root = tmp_path
    qdir = root / "batchconsumequeue" / "BT" / "0"
    qdir.mkdir(parents=True)
    unit_file = 46 * 4
    units = [encode_bcq_entry(1000 * i, 300, 7, 1700000000000 + i, 10 * i, 10 if i != 2 else 1) for i in range(5)]
    # offsets: 0..9, 10..19, 20, 30..39 (gap from a lost unit), 40..49
    (qdir / file_name(0)).write_bytes(b"".join(units[:4]))
    (qdir / file_name(unit_file)).write_bytes(units[4] + bytes(46 * 3))
    refs = list(discover_queues(root, batch=True))
    assert [(r.topic, r.queue_id, r.batch) for r in refs] == [("BT", 0, True)]
    bcq = BatchConsumeQueue(refs[0].path)
    assert bcq.file_size == unit_file
    assert bcq.unit_count_end == 5
    assert bcq.max_offset == 50
    units_read = list(bcq.iter_units())
    assert [u.msg_base_offset for u in units_read] == [0, 10, 20, 30, 40]
    assert all(u.compacted_offset == -1 and u.reserved == 0 and u.is_valid for u in units_read)
    assert bcq.find(15).unit_index == 1
    assert bcq.find(20).batch_size == 1
    assert bcq.find(49).unit_index == 4
    for missing in (21, 50, -1):
        with pytest.raises(NotFoundError):
            bcq.find(missing)
    assert len(list(bcq.iter_units(include_invalid=True))) == 8
