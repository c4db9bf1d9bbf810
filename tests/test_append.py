"""`rmqdump append` / LockedAppender / StoreWriter on real RocketMQ stores (issue #5)."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import pytest
from click.testing import CliRunner

from conftest import manifest, real_store
from rmqdump.cli import cli
from rmqdump.codec.javahash import tags_hash
from rmqdump.codec.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from rmqdump.codec.msgid import decode_offset_msg_id, decode_uniq_key
from rmqdump.codec.record import Blank, Message, record_crc_property
from rmqdump.errors import FormatError, StoreError
from rmqdump.store.checkpoint import read_checkpoint
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueue
from rmqdump.store.indexfile import IndexFile, IndexStore, list_index_files
from rmqdump.write.appender import LockedAppender, StoreGeometry, bulk_append, inspect_store, record_to_spec
from rmqdump.write.writer import MessageSpec, StoreWriter

SMALL = StoreGeometry(262144, 600, 500, 2000)  # broker498's geometry


def tree_digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def messages(path) -> list[Message]:
    return [m for m in CommitLog.open(path).walk() if isinstance(m, Message)]


def verify_errors(store) -> list:
    """Errors and warnings of `rmqdump verify` (the other engineer's checker)."""
    from rmqdump.analysis.verify import verify_store

    rep = verify_store(store)
    return [f for f in rep.findings if f.severity in ("error", "warning")], rep


def run(*args, input=None):
    return CliRunner().invoke(cli, list(map(str, args)), input=input)


# --- acceptance: 1,000 messages onto broker498/clean ------------------------------------------------------


def test_append_1000_to_clean(store_copy):
    store = store_copy("clean")
    before_q = {q: ConsumeQueue.open(store, "TopicTest", q).max_offset for q in range(4)}
    before_end = inspect_store(store).end
    specs = [MessageSpec("TopicTest", f"appended {i} ".encode() * 8, queue_id=i % 4, tags="TagX",
                         keys=f"app-{i} grp-{i // 100}", properties={"n": str(i)}) for i in range(1000)]
    acks = []
    res = bulk_append(store, specs, batch_bytes=32 * 1024, on_ack=acks.append)
    assert res.records == 1000 and len(acks) == 1000 and res.commits > 5
    assert acks[0].offset == before_end == 397358
    assert not (store / "abort").exists()

    # verify (rmqdump verify) finds nothing wrong; the broker's recovery keeps everything
    problems, rep = verify_errors(store)
    assert problems == [], problems
    assert rep.recovery.max_offset == res.end_offset and rep.recovery.dropped.count == 0

    # scan shows them with continuing queue offsets
    out = run("scan", store, "-f", "jsonl", "--topic", "TopicTest", "--body", "text", "-q")
    assert out.exit_code == 0, out.output
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    new = [r for r in rows if r["offset"] >= before_end]
    assert len(new) == 1000
    for q in range(4):
        qoffs = [r["queue_offset"] for r in new if r["queue_id"] == q]
        assert qoffs == list(range(before_q[q], before_q[q] + 250))
    assert new[7]["body"] == "appended 7 " * 8 and new[7]["properties"]["n"] == "7"

    # a segment roll with a correct blank, and a new segment of the store's size
    segs = CommitLog.open(store).segments
    assert [s.size for s in segs] == [262144] * 3
    blanks = [r for r in CommitLog.open(store).walk() if isinstance(r, Blank)]
    assert len(blanks) == 2
    b = blanks[1]
    assert b.offset + b.size == 524288 and b.size == b.bytes_to_end
    assert any(a.blank_at == b.offset for a in acks)
    first_in_new = min(a.offset for a in acks if a.offset >= 524288)
    assert first_in_new == 524288

    # ConsumeQueue and index entries exist for each; lookup --key finds each one
    with IndexStore(store) as idx:
        for a, spec in zip(acks, specs, strict=True):
            e = ConsumeQueue.open(store, "TopicTest", a.queue_id).entry_at(a.queue_offset)
            assert (e.commit_log_offset, e.size, e.tags_code) == (a.offset, a.size, tags_hash("TagX"))
            for key in (f"app-{specs.index(spec)}", a.uniq_key):
                assert a.offset in idx.query("TopicTest", key).phy_offsets
    for i in (0, 499, 999):
        out = run("lookup", store, "--key", f"app-{i}", "--topic", "TopicTest", "-f", "jsonl", "-q")
        assert out.exit_code == 0, out.output
        assert [json.loads(x)["offset"] for x in out.stdout.splitlines()] == [acks[i].offset]

    # the original index file filled up and a new one was started (header seeded like the broker)
    files = list_index_files(store)
    assert len(files) == 2
    with IndexFile(files[0]) as f0, IndexFile(files[1]) as f1:
        assert f0.header.index_count == 2000  # full: 1999 entries
        assert f1.header.begin_phy_offset > f0.header.end_phy_offset
    cp = read_checkpoint(store)
    assert cp.physic_msg_timestamp == acks[-1].store_timestamp
    assert cp.logics_msg_timestamp == acks[-1].store_timestamp
    assert cp.index_msg_timestamp == IndexFile(files[0]).header.end_timestamp

    # msgIds decode to the record's own position and the store's host
    for a in acks[:50]:
        d = decode_offset_msg_id(a.msg_id)
        assert d.offset == a.offset and d.host == "127.0.0.1:10911"
        u = decode_uniq_key(a.uniq_key, a.store_timestamp)
        assert u.pid == os.getpid() & 0xFFFF and abs(u.timestamp - a.store_timestamp) < 1000


# --- copy round trip -----------------------------------------------------------------------------------------


def test_scan_append_copy_round_trip(tmp_path):
    src = real_store("clean")
    scan = run("scan", src, "-f", "jsonl", "-q")
    assert scan.exit_code == 0
    dst = tmp_path / "copy"
    out = run("append", dst, "--init", "--commitlog-file-size", 262144, "--cq-file-size", 600, "--index-slots", 500,
              "--index-entries", 2000, "--jsonl", "-", "-f", "jsonl", "-q", input=scan.stdout)
    assert out.exit_code == 0, out.output
    acks = [json.loads(x) for x in out.stdout.splitlines()]
    a, b = messages(src), messages(dst)
    assert len(acks) == len(a) == len(b) == 232
    for x, y in zip(a, b, strict=True):
        for f in ("topic", "queue_id", "properties", "body", "flag", "tags", "keys", "uniq_key", "sys_flag",
                  "born_timestamp", "born_host", "reconsume_times", "queue_offset", "transaction", "compression"):
            assert getattr(x, f) == getattr(y, f), (f, x.offset)
        assert y.crc_ok is not False
    # COMMIT records follow their half message to its new offset
    halves = {x.offset: y.offset for x, y in zip(a, b, strict=True) if x.topic == "RMQ_SYS_TRANS_HALF_TOPIC"}
    commits = [(x, y) for x, y in zip(a, b, strict=True) if x.transaction == "commit"]
    assert len(commits) == 3
    for x, y in commits:
        assert y.prepared_transaction_offset == halves[x.prepared_transaction_offset]
    # every message is reachable through its ConsumeQueue like in the source store
    src_cq = {(e["topic"], e["queueId"], e["queueOffset"]) for e in manifest("clean") if e["type"] == "cq_entry"}
    for y in b:
        if (y.topic, y.queue_id, y.queue_offset) in src_cq:
            assert ConsumeQueue.open(dst, y.topic, y.queue_id).entry_at(y.queue_offset).commit_log_offset == y.offset
    problems, _ = verify_errors(dst)
    assert [p for p in problems if p.kind != "config_missing"] == []


# --- refusals ------------------------------------------------------------------------------------------------


def test_refuses_abort_and_dirty_tail_unless_forced(store_copy):
    torn = store_copy("crash_torn")
    before = tree_digest(torn)
    out = run("append", torn, "-t", "T", "--body", "x")
    assert out.exit_code == 2
    assert "abort" in out.output and "rmqdump repair" in out.output and "recovery stops at offset 396985" in out.output
    out = run("append", torn, "-t", "T", "--body", "x", "--force")  # would overwrite the torn bytes: never
    assert out.exit_code == 2 and "would overwrite old data" in out.output
    assert tree_digest(torn) == before  # nothing written, not even abort/lock changes

    kill9 = store_copy("crash_kill9")  # abort left by a real crash; the tail itself is clean
    out = run("append", kill9, "-t", "T", "--body", "x")
    assert out.exit_code == 2 and "abort file present" in out.output
    # this copy's abort is newer than its last record: as if a broker had started since and were recovering
    out = run("append", kill9, "-t", "T", "--body", "forced", "--force")
    assert out.exit_code == 2 and "may be recovering right now" in out.output
    last_ts = messages(kill9)[-1].store_timestamp
    os.utime(kill9 / "abort", ns=((last_ts - 5000) * 1_000_000,) * 2)  # the abort of the crashed run itself
    out = run("append", kill9, "-t", "T", "--body", "forced", "--force", "-f", "jsonl")
    assert out.exit_code == 0, out.output
    ack = json.loads(out.stdout)
    assert ack["offset"] == 338738
    assert (kill9 / "abort").read_bytes() == b""  # the broker's own abort stays: it still has to recover
    assert messages(kill9)[-1].body == b"forced"


def test_dirty_tail_details(store_copy):
    st = inspect_store(store_copy("crash_torn"))
    assert st.end == 396985
    text = " ".join(st.dirty)
    assert "ConsumeQueue %RETRY%cg-test/0 has 1 entries" in text
    assert "references offset 396985" in text  # the index points at the torn record
    assert "old data after the end" in " ".join(st.overwrite)


def test_dry_run_writes_nothing(store_copy):
    store = store_copy("clean")
    before = tree_digest(store)
    body = "y" * 40000
    out = run("append", store, "-t", "TopicBig", "--body", body, "--dry-run", "-f", "jsonl")
    assert out.exit_code == 0, out.output
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert rows[0]["offset"] == 397358 and rows[0]["queue_offset"] == 16
    jl = "\n".join(json.dumps({"topic": "TopicBig", "body": "z" * 60000}) for _ in range(3))
    out = run("append", store, "--jsonl", "-", "--body-encoding", "text", "--dry-run", "-f", "jsonl", input=jl)
    assert out.exit_code == 0, out.output
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert rows[-1]["blank_at"] is not None and rows[-1]["offset"] == 524288
    assert "end-of-file blank" in out.stderr
    assert tree_digest(store) == before
    assert not (store / "commitlog" / "00000000000000524288").exists()


def test_single_message_cli_and_properties(store_copy, tmp_path):
    store = store_copy("clean")
    out = run("append", store, "--topic", "TopicTest", "--queue", 3, "--tags", "TagA", "--keys", "k1 k2",
              "--keys", "k3", "--property", "color=blue", "--flag", 7, "--body", "héllo",
              "-f", "jsonl")
    assert out.exit_code == 0, out.output
    ack = json.loads(out.stdout)
    m = CommitLog.open(store).decode_at(ack["offset"])
    assert m.topic == "TopicTest" and m.queue_id == 3 and m.flag == 7 and m.body == "héllo".encode()
    assert m.keys == ["k1", "k2", "k3"] and m.tags == "TagA" and m.properties["color"] == "blue"
    assert m.msg_id == ack["msg_id"] and m.uniq_key == ack["uniq_key"] and m.queue_offset == ack["queue_offset"]
    bad = run("append", store, "-t", "T", "--property", "empty=", "--body", "x")
    assert bad.exit_code == 2 and "non-blank" in bad.output
    f = tmp_path / "body.bin"
    f.write_bytes(bytes(range(256)))
    out = run("append", store, "-t", "Bin", "--body-file", f, "--no-uniq-key", "--compression", "zlib",
              "-f", "jsonl")
    assert out.exit_code == 0, out.output
    m = CommitLog.open(store).decode_at(json.loads(out.stdout)["offset"])
    assert m.uniq_key is None and m.compression == "zlib" and m.decompressed_body() == bytes(range(256))
    out = run("append", store, "-t", "Stdin", "-f", "jsonl", input="from stdin")
    assert out.exit_code == 0 and CommitLog.open(store).decode_at(json.loads(out.stdout)["offset"]).body == b"from stdin"
    problems, _ = verify_errors(store)
    assert problems == [], problems


def test_jsonl_error_keeps_and_acknowledges_earlier_records(store_copy):
    store = store_copy("clean")
    lines = [json.dumps({"topic": "J", "body": "b2s="}), json.dumps({"topic": "J", "body": "b2s="}),
             json.dumps({"topic": "J", "body": "%%%"})]
    out = run("append", store, "--jsonl", "-", "-f", "jsonl", input="\n".join(lines))
    assert out.exit_code == 2 and "JSONL line 3" in out.output
    assert len([x for x in out.stdout.splitlines() if x.startswith("{")]) == 2
    assert [m.body for m in messages(store) if m.topic == "J"] == [b"ok", b"ok"]
    assert not (store / "abort").exists()
    assert inspect_store(store).dirty == []


def test_transaction_types_dispatch(store_copy):
    store = store_copy("clean")
    with LockedAppender(store) as app:
        p = app.append(MessageSpec("TopicTx", b"p", queue_id=1, keys="tx-p", transaction=TRANSACTION_PREPARED_TYPE))
        r = app.append(MessageSpec("TopicTx", b"r", queue_id=1, keys="tx-r", transaction=TRANSACTION_ROLLBACK_TYPE))
        c = app.append(MessageSpec("TopicTx", b"c", queue_id=1, keys="tx-c", transaction=TRANSACTION_COMMIT_TYPE,
                                   prepared_transaction_offset=p.offset))
    assert p.queue_offset == r.queue_offset == 0
    cq = ConsumeQueue.open(store, "TopicTx", 1)
    assert c.queue_offset == cq.max_offset - 1
    assert [e.commit_log_offset for e in cq.iter_entries()][-1] == c.offset  # only the COMMIT got an entry
    with IndexStore(store) as idx:
        assert idx.query("TopicTx", "tx-p").phy_offsets == [p.offset]  # PREPARED is indexed
        assert idx.query("TopicTx", "tx-r").phy_offsets == []  # ROLLBACK is not
        assert idx.query("TopicTx", "tx-c").phy_offsets == [c.offset]


def test_record_crc_property_and_store_host(store_copy):
    store = store_copy("clean")
    out = run("append", store, "-t", "Crc", "--body", "crc me", "--record-crc", "--store-host", "[2001:db8::7]:10911",
              "--born-host", "10.1.2.3:5555", "-f", "jsonl")
    assert out.exit_code == 0, out.output
    ack = json.loads(out.stdout)
    cl = CommitLog.open(store)
    m = cl.decode_at(ack["offset"])
    with cl.segment_for(m.offset).open() as r:
        stored, computed = record_crc_property(m, r.read(m.file_pos, m.size))
    assert stored == computed
    assert m.store_host == "[2001:db8::7]:10911" and m.born_host == "10.1.2.3:5555" and len(m.msg_id) == 56
    assert m.uniq_key.startswith("0A010203")  # the client IP of the born host


def test_record_to_spec_recompresses_decompressed_bodies():
    import base64
    import zlib

    raw = b"decompressed text " * 300
    row = {"topic": "TopicBig", "body": base64.b64encode(raw).decode(), "sys_flag": 0x301, "properties": {}}
    spec = record_to_spec(row)
    assert spec.compression == "zlib" and spec.compressed_flags == 0
    row["body"] = base64.b64encode(zlib.compress(raw)).decode()
    spec = record_to_spec(row)
    assert spec.compressed_flags == 0x301 and spec.compression is None
    with pytest.raises(FormatError):
        record_to_spec({"topic": "T", "body": None})
    with pytest.raises(FormatError):
        record_to_spec({"body": "AA=="})


def test_symlinked_queue_dir_is_refused(store_copy, tmp_path):
    store = store_copy("clean")
    outside = tmp_path / "outside"
    outside.mkdir()
    (store / "consumequeue" / "Evil").symlink_to(outside, target_is_directory=True)
    out = run("append", store, "-t", "Evil", "--body", "x")
    assert out.exit_code == 2 and "symlink" in out.output
    assert list(outside.iterdir()) == []


def test_fsync_failure_is_a_failure(tmp_path, monkeypatch):
    w = StoreWriter(tmp_path / "s", commitlog_file_size=4096, cq_file_size=600, index_slots=10, index_entries=40)
    w.append(MessageSpec("T", b"x"))

    def bad_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", bad_fsync)
    with pytest.raises(StoreError, match="fsync failed"):
        w.sync()
    monkeypatch.undo()
    with pytest.raises(StoreError, match="unusable"):
        w.sync()  # never "retried then success": the data may already be lost
    with pytest.raises(StoreError, match="unusable"):
        w.append(MessageSpec("T", b"y"))
    w.abandon()


def test_new_store_and_held_back_header(tmp_path):
    """A batch becomes visible only when its first 8 bytes are written, after the rest is on disk."""
    w = StoreWriter(tmp_path / "s", commitlog_file_size=4096, cq_file_size=600, index_slots=10, index_entries=40)
    for i in range(30):
        w.append(MessageSpec("T", b"%d" % i * 20))
    w._flush_buffer()
    seg = tmp_path / "s" / "commitlog" / "00000000000000000000"
    assert seg.read_bytes()[:8] == bytes(8) and any(seg.read_bytes()[8:100])
    assert messages(tmp_path / "s") == []  # recovery would see nothing of the unfinished batch
    w.sync()
    assert len(messages(tmp_path / "s")) == 30
    assert ConsumeQueue.open(tmp_path / "s", "T", 0).max_offset == 30
    w.close()


def test_bulk_append_function(tmp_path):
    res = bulk_append(tmp_path / "b", (MessageSpec("Bench", bytes(1000), keys=f"k{i}") for i in range(500)),
                      batch_bytes=64 * 1024, create=True, geometry=SMALL)
    assert res.records == 500 and res.bytes > 500_000 and res.mb_per_s > 0 and res.first_offset == 0
    assert len(messages(tmp_path / "b")) == 500


def test_jsonl_born_time_outside_the_calendar_is_one_line(tmp_path):
    """A record born in the year 146140482 needs a client id no calendar can date: the line is named, the records
    before it are kept, no traceback (it was a ValueError from ``calendar``)."""
    store = tmp_path / "s"
    assert run("append", store, "--init", "--topic", "T", "--body", "first").exit_code == 0
    lines = [json.dumps({"topic": "J", "body": "b2s="}), json.dumps({"topic": "J", "body": "b2s=",
                                                                       "born_timestamp": 1 << 62})]
    out = run("append", store, "--jsonl", "-", "-f", "jsonl", input="\n".join(lines))
    assert out.exit_code == 2, out.output
    assert "JSONL line 2" in out.output and "outside the calendar" in out.output
    assert "Traceback" not in out.output
    assert [m.body for m in messages(store) if m.topic == "J"] == [b"ok"]
