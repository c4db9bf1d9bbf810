"""The compiled verify path (rmqdump.analysis.verify.fast) against the pure one: identical findings and JSON.

Every fixture store, every real broker498 store, hand-damaged copies and a synthetic store that
trips each per-record check (so both the kernel-cleared and the Python-checked records occur,
past the per-kind finding cap too) are verified twice: ``RMQDUMP_FAST=0`` (pure) and
``RMQDUMP_FAST=1`` (compiled, whatever the size), with and without ``--keep-going``, with and
without the store checks.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REAL
from rmqdump.analysis.verify import verify_segment, verify_store
from rmqdump.broker import recovery as R
from rmqdump.cli import cli
from rmqdump.codec.encoder import encode_blank, encode_fields, with_record_crc
from rmqdump.fast import walk as fastwalk
from rmqdump.fast.recovery_walk import broker_walk_fast
from rmqdump.store.commitlog import CommitLog

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

SEG0 = "00000000000000000000"
STORES = [FIXTURES / "store", FIXTURES / "store-5x", *sorted(FIXTURES.glob("bugs/*/store"))]
STORES += sorted(p for p in REAL.glob("*") if p.is_dir()) if REAL.is_dir() else []
TS = 1795297369037


def _doc(path, fast: bool, monkeypatch, **kw) -> str:
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    try:
        return json.dumps(verify_store(path, **kw).to_dict(), sort_keys=True)
    finally:
        monkeypatch.delenv("RMQDUMP_FAST")


def assert_same(path, monkeypatch, **kw) -> dict:
    for keep_going in (False, True):
        for store_checks in (True, False):
            pure = _doc(path, False, monkeypatch, keep_going=keep_going, store_checks=store_checks, **kw)
            fast = _doc(path, True, monkeypatch, keep_going=keep_going, store_checks=store_checks, **kw)
            assert fast == pure, (path, keep_going, store_checks)
    return json.loads(pure)


@pytest.mark.parametrize("path", STORES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fast_matches_pure_on_every_store(path, monkeypatch):
    assert_same(path, monkeypatch)


def test_fast_segment_results_match(monkeypatch):
    """verify_segment(fast=True) really takes the compiled path and gives the pure statistics."""
    for path in STORES:
        cl = CommitLog.open(path)
        for seg in cl.segments:
            pure = verify_segment(seg, fast=False, keep_going=True)
            fast = verify_segment(seg, fast=True, keep_going=True)
            assert [f.to_dict() for f in fast.findings] == [f.to_dict() for f in pure.findings]
            assert fast.stats() == pure.stats()
            assert fast.topics == pure.topics and fast.end_offset == pure.end_offset
            assert {k: {q: (s.first_queue_offset, s.first_offset, s.next_expected, s.count) for q, s in d.items()}
                    for k, d in fast.queues.items()} == \
                   {k: {q: (s.first_queue_offset, s.first_offset, s.next_expected, s.count) for q, s in d.items()}
                    for k, d in pure.queues.items()}
            assert sorted(int(x) for x in fast.half_offsets) == sorted(pure.half_offsets)
            assert sorted(tuple(int(v) for v in r) for r in fast.tx_refs) == sorted(pure.tx_refs)
            if fast.records and fast.tail in ("blank", "full") and fast.first_damage is None:
                assert fast.walk_summary is not None  # only the compiled path fills it


def _real_copy(tmp_path, name="clean") -> Path:
    src = REAL / name
    if not src.is_dir():
        pytest.skip("real stores not available")
    dst = tmp_path / name
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


@pytest.mark.parametrize("damage", ["body_byte", "bad_magic", "torn_tail", "props_nul", "qoffset", "phys"])
def test_fast_matches_pure_on_damaged_copies(tmp_path, monkeypatch, damage):
    store = _real_copy(tmp_path)
    seg = store / "commitlog" / SEG0
    data = seg.read_bytes()
    if damage == "body_byte":
        _patch(seg, 90, bytes([data[90] ^ 0xFF]))  # record 0's body
    elif damage == "bad_magic":
        _patch(seg, 956 + 4, b"\x12\x34\x56\x78")
    elif damage == "torn_tail":
        end = 397358 - 0  # valid data end of broker498/clean: zero the last record's second half
        cl = CommitLog.open(store)
        last = [m for m in cl.walk(read_body=False) if hasattr(m, "queue_offset")][-1]
        _patch(seg, last.file_pos + last.size // 2, bytes(end - (last.file_pos + last.size // 2)))
    elif damage == "props_nul":
        _patch(seg, 200, b"\x00\x00")
    elif damage == "qoffset":
        _patch(seg, 1912 + 20, struct.pack(">q", 77))
    elif damage == "phys":
        _patch(seg, 956 + 28, struct.pack(">q", 5))
    doc = assert_same(store, monkeypatch)
    assert doc["summary"]["errors"] > 0


def _synthetic(root: Path, seg_size: int = 1 << 20) -> Path:
    """One commitlog segment whose records trip every per-record check, spread among clean ones."""
    rnd = random.Random(7)
    out = bytearray()
    qnext: dict[tuple[bytes, int], int] = {}
    halves: list[int] = []
    i = 0
    while True:
        pos = len(out)
        topic = rnd.choice([b"TopicA", b"TopicB", b"T\xc3\xa9", b"RMQ_SYS_TRANS_HALF_TOPIC"])
        qid = rnd.randrange(3)
        sys_flag = 0
        props = b"TAGS\x01t%d\x02KEYS\x01k%d\x02" % (i % 5, i)
        ts = TS + i * 10
        kw = {}
        qoff = qnext.get((topic, qid), 0)
        step = 1
        r = rnd.random()
        if r < 0.03:
            qoff += rnd.choice([-1, 1, 5])  # gap / regression / outlier
        elif r < 0.05:
            kw["store_addr"] = b"\x0a\x00\x00\x02"  # store host outlier
        elif r < 0.06:
            ts += 7_200_000  # store time outlier
        elif r < 0.08:
            sys_flag |= 0x8  # COMMIT
            kw["prepared_transaction_offset"] = rnd.choice(halves) if halves and rnd.random() < 0.7 else pos - 3
        elif r < 0.09:
            sys_flag |= 0xC  # ROLLBACK
            kw["prepared_transaction_offset"] = rnd.choice(halves) if halves else 0
            qoff = rnd.choice([0, 3])
        elif r < 0.10:
            sys_flag |= 0x4  # PREPARED
            qoff = 0
        elif r < 0.11:
            kw["prepared_transaction_offset"] = 99
        elif r < 0.12:
            props = b"TAGS\x01x\x02\x02KEYS\x01"  # malformed
        elif r < 0.13:
            props = b"KEYS\x01\xff\xfe"  # not UTF-8
        elif r < 0.14:
            props = "KEYS\x01ключ".encode()  # UTF-8, non-ASCII
        elif r < 0.15:
            sys_flag |= 0x80
            props += b"INNER_NUM\x013\x02"
            step = 3
        elif r < 0.16:
            sys_flag |= 0x20
            kw["store_addr"] = bytes(range(16))
        elif r < 0.17:
            sys_flag |= 0x1  # COMPRESSED, plain body
        elif r < 0.18:
            kw["born_port"] = 70000
        elif r < 0.19:
            ts = 5
        elif r < 0.20:
            kw["reconsume_times"] = -1
        elif r < 0.21:
            sys_flag |= 0x4000
        elif r < 0.22:
            kw["physical_offset"] = pos + 1
        elif r < 0.23:
            topic = b"bad/topic"
        body = b"" if rnd.random() < 0.02 else bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))
        rec = encode_fields(topic=topic, body=body, properties=props, queue_id=qid, queue_offset=qoff,
                            physical_offset=kw.pop("physical_offset", pos), sys_flag=sys_flag, born_timestamp=TS,
                            store_timestamp=ts, **kw)
        if r > 0.97:
            rec = with_record_crc(rec)
        if not body and rnd.random() < 0.5:
            rec = bytearray(rec)
            rec[8:12] = b"\x00\x00\x00\x07"  # empty body, BODYCRC 7
            rec = bytes(rec)
        if pos + len(rec) + 200 > seg_size:
            break
        out += rec
        if sys_flag & 0xC in (0, 0x8):
            qnext[(topic, qid)] = qoff + step
            if topic == b"RMQ_SYS_TRANS_HALF_TOPIC":
                halves.append(pos)
        i += 1
    out += encode_blank(seg_size - len(out))
    d = root / "commitlog"
    d.mkdir(parents=True)
    (d / SEG0).write_bytes(bytes(out))
    (d / f"{seg_size:020d}").write_bytes(bytes(out[:seg_size // 2]) + bytes(seg_size - seg_size // 2))
    return d


def test_fast_matches_pure_on_synthetic_checks(tmp_path, monkeypatch):
    d = _synthetic(tmp_path / "syn")
    doc = assert_same(d, monkeypatch)
    kinds = doc["summary"]["by_kind"]
    for k in ("queue_offset_gap", "queue_offset_regression", "header_outlier", "tx_half_missing",
              "properties_malformed", "properties_encoding", "bad_compression", "bad_host", "bad_timestamp",
              "bad_field", "sysflag_unknown_bits", "physical_offset_mismatch", "bad_topic", "empty_body_crc",
              "tx_queue_offset", "tx_unexpected_prepared_offset"):
        assert kinds.get(k), k
    capped = assert_same(d, monkeypatch, max_findings_per_kind=3)
    assert capped["summary"]["by_kind"].get("findings_suppressed")


def test_fast_matches_pure_with_damage_inside_synthetic(tmp_path, monkeypatch):
    d = _synthetic(tmp_path / "syn")
    seg = d / SEG0
    data = bytearray(seg.read_bytes())
    data[5000:5010] = bytes(10)  # zero bytes mid-record: body CRC / length damage, resync after
    data[300_000] ^= 0x55
    seg.write_bytes(bytes(data))
    assert_same(d, monkeypatch)


@pytest.mark.parametrize("path", STORES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_broker_walk_fast_matches(path):
    cl = CommitLog.open(path)
    for version in R.VERSIONS:
        for start in range(len(cl.segments)):
            a = R.broker_walk(cl, start, version=version)
            b = broker_walk_fast(cl, start, version=version)
            assert (b.process_offset, b.records, b.last_record_offset, b.last_store_timestamp, b.notes) == \
                   (a.process_offset, a.records, a.last_record_offset, a.last_store_timestamp, a.notes)
            assert (b.stop.offset, b.stop.kind, b.stop.detail, b.stop.size) == \
                   (a.stop.offset, a.stop.kind, a.stop.detail, a.stop.size)


def test_cli_json_is_identical(monkeypatch):
    path = STORES[0]
    outs = []
    for flag in ("0", "1"):
        monkeypatch.setenv("RMQDUMP_FAST", flag)
        res = CliRunner().invoke(cli, ["verify", "-q", "-f", "json", str(path)])
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        outs.append((res.exit_code, res.stdout))
    assert outs[0] == outs[1]


def test_segments_walk_into_one_set_of_column_arrays(monkeypatch):
    """Each segment verified on a thread walks into the column arrays of the one before (a set of new arrays
    per segment grew the resident set with the store: the C allocator kept them); a walk read ahead fills a
    ring of sets, kept from segment to segment too."""
    from rmqdump.fast import batch, readahead

    made = []
    real = batch._Columns.__init__

    def spy(self, capacity, derived=False):
        if derived:  # verify's own walks (the recovery predictions walk too, without derived columns)
            made.append(1)
        real(self, capacity, derived)

    monkeypatch.setattr(batch._Columns, "__init__", spy)
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    store = FIXTURES / "store"
    assert len(CommitLog.open(store / "commitlog").segments) >= 3
    verify_store(store)  # its segments are verified on one thread (this one; a read-ahead thread only walks)
    assert len(made) <= 1 + (readahead.DEPTH + 1 if readahead.wanted(CommitLog.open(store / "commitlog").segments,
                                                                     True) else 0)
