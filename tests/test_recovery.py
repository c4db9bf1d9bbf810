"""Recovery prediction against what RocketMQ 4.9.8 itself did (the after-recovery manifests)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from conftest import manifest, real_store
from rmqdump.broker.recovery import (
    MODE_ABNORMAL,
    MODE_NORMAL,
    MODE_REFUSES,
    VERSION_49,
    VERSION_53,
    abnormal_start_index,
    broker_verdict,
    broker_walk,
    first_record_store_timestamp,
    normal_start_index,
    predict_recovery,
)
from rmqdump.codec.encoder import encode_fields
from rmqdump.codec.layout import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2
from rmqdump.codec.record import Message, decode_record
from rmqdump.disk.segment import Segment
from rmqdump.store.checkpoint import Checkpoint, write_checkpoint
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueue, discover_queues
from rmqdump.store.root import Store

DAMAGED = ["corrupt_crc", "crash_torn", "crash_torn_props", "crash_kill9"]
SEG0, SEG1 = "00000000000000000000", "00000000000000262144"
BLANK_AT = 167227  # the BLANK record of file 0 in broker498/clean (94,917 bytes to the end)
FILE = 262144


def after(name: str) -> list[dict]:
    return manifest(f"{name}_after_rocketmq_recovery")


def store_info(lines: list[dict]) -> dict:
    return next(m for m in lines if m["type"] == "store_info")


def predict(path, **kw):
    return predict_recovery(Store.open(path), **kw)


# --- the four real recoveries -------------------------------------------------------------------


@pytest.mark.parametrize("name", DAMAGED)
def test_mode_and_end_match_rocketmq(name):
    info = store_info(after(name))
    pred = predict(real_store(name))
    assert pred.mode == (MODE_ABNORMAL if info["abort_file_present_before_load"] else MODE_NORMAL)
    assert pred.max_offset == info["commitlog_max_offset_after_recovery"]


def test_clean_store_prediction_matches_its_manifest():
    pred = predict(real_store("clean"))
    assert pred.mode == MODE_NORMAL
    assert pred.max_offset == store_info(manifest("clean"))["commitlog_max_offset_after_recovery"] == 397358
    assert pred.dropped.count == 0 and pred.dropped_cq_entries == 0 and not pred.deleted_commitlog_files


@pytest.mark.parametrize("name", DAMAGED)
def test_surviving_records_are_exactly_rocketmqs(name):
    pred = predict(real_store(name))
    kept = {m["commitLogOffset"] for m in after(name) if m["type"] == "message"}
    ours = {r.offset for r in CommitLog.open(real_store(name)).walk(read_body=False)
            if isinstance(r, Message) and r.offset < pred.max_offset}
    assert ours == kept


@pytest.mark.parametrize("name", DAMAGED)
def test_surviving_cq_entries_are_exactly_rocketmqs(name):
    root = real_store(name)
    pred = predict(root)
    dropped = {(q.queue, qo) for q in pred.queues for qo, _ in q.dropped}
    ours = set()
    for ref in discover_queues(root):
        for e in ConsumeQueue(ref.path, ref.topic, ref.queue_id, strict=False).iter_entries():
            if e.is_valid and (f"{ref.topic}/{ref.queue_id}", e.queue_offset) not in dropped:
                ours.add((ref.topic, ref.queue_id, e.queue_offset, e.commit_log_offset))
    theirs = {(m["topic"], m["queueId"], m["queueOffset"], m["commitLogOffset"])
              for m in after(name) if m["type"] == "cq_entry"}
    assert ours == theirs


def test_corrupt_crc_normal_recovery_truncates_at_the_bad_crc():
    lines = after("corrupt_crc")
    pred = predict(real_store("corrupt_crc"))
    assert pred.mode == MODE_NORMAL and pred.start_file == SEG0
    assert pred.walk.stop.kind == "body_crc" and pred.walk.stop.offset == 15458
    assert pred.walk.records == sum(m["type"] == "message" for m in lines) == 64
    assert pred.truncated_file == (SEG0, 15458) and pred.deleted_commitlog_files == [SEG1]
    # 232 records before, 64 kept: 168 dropped, one of them the damaged record itself
    assert pred.dropped.count == 168 and pred.dropped.intact == 167 and pred.dropped.damaged_records == 1
    assert pred.dropped.damaged_ranges == [(15458, 15700, "body_crc")]
    assert pred.dropped.offsets[0] == 15700
    assert pred.cq_truncated and pred.dropped_cq_entries == 232 - sum(m["type"] == "cq_entry" for m in lines)
    assert pred.deleted_index_files == []  # normal recovery keeps index files
    queues = {f"{m['topic']}/{m['queueId']}": m["maxOffsetInQueue"] for m in lines if m["type"] == "cq_queue"}
    for q in pred.queues:
        assert min(q.new_end, q.dropped[0][0]) == queues[q.queue]


def test_corrupt_crc_differs_on_5_3():
    # 5.3.2+ starts normal recovery at the file holding the CQ maximum: the bad record in file 0 is never read
    pred = predict(real_store("corrupt_crc"), version=VERSION_53)
    assert pred.start_file == SEG1 and pred.max_offset == 397358 and pred.dropped.count == 0


def test_crash_torn_abnormal_recovery_and_lost_index_entries():
    lines = after("crash_torn")
    pred = predict(real_store("crash_torn"))
    assert pred.mode == MODE_ABNORMAL
    # checkpoint min timestamp (physic/logics - 3 s) selects file 1: its first record is older
    cp_min = store_info(lines)["checkpoint_physicMsgTimestamp"] - 3000
    assert first_record_store_timestamp(CommitLog.open(real_store("crash_torn")).segments[1]) <= cp_min
    assert pred.start_file == SEG1
    assert pred.walk.stop.offset == 396985 and pred.max_offset == 396985
    assert pred.dropped.count == 1 and pred.dropped.intact == 0
    assert pred.dropped_cq_entries == 1
    [q] = pred.queues
    assert q.queue == "%RETRY%cg-test/0" and q.dropped == [(1, 396985)]
    # the only index file is deleted (endTimestamp > indexMsgTimestamp 0) and re-built from the start file
    assert [f["file"] for f in pred.deleted_index_files] == ["20261121214249121"]
    [rebuilt] = [m for m in lines if m["type"] == "index_file"]
    assert rebuilt["file"] != "20261121214249121" and rebuilt["beginPhyOffset"] == pred.start_offset
    assert pred.lost_index_range == (0, FILE)
    # RocketMQ's own queries confirm: keys of records in file 0 are gone, later ones still found
    cl = CommitLog.open(real_store("crash_torn"))
    first_file_keys = {(r.topic, k) for r in cl.walk(read_body=False, end=BLANK_AT) if isinstance(r, Message)
                       for k in [*r.keys, r.uniq_key] if k}
    queries = [m for m in lines if m["type"] == "index_query"]
    for m in queries:
        if (m["topic"], m["key"]) in first_file_keys:
            assert not any(o < FILE for o in m["phyOffsets_in_returned_order"])
    assert any(m["phyOffsets_in_returned_order"] for m in queries)


def test_crash_torn_props_is_accepted():
    pred = predict(real_store("crash_torn_props"))
    assert pred.max_offset == 397358 == store_info(after("crash_torn_props"))["commitlog_max_offset_after_recovery"]
    assert pred.dropped.count == 0 and pred.dropped_cq_entries == 0
    assert pred.walk.last_record_offset == 396985  # the torn record is walked over


def test_crash_kill9_keeps_everything_and_rebuilds_the_index():
    lines = after("crash_kill9")
    pred = predict(real_store("crash_kill9"))
    assert pred.mode == MODE_ABNORMAL
    # an all-zero checkpoint: minTimestamp 0, no file qualifies -> file 0
    assert pred.checkpoint.physic_msg_timestamp == 0 and pred.start_file == SEG0
    assert pred.walk.records == 464 == sum(m["type"] == "message" for m in lines)
    assert pred.max_offset == 338738 and pred.dropped.count == 0
    assert pred.deleted_commitlog_files == ["00000000000000524288"]  # the pre-allocated, all-zero file
    assert [f["file"] for f in pred.deleted_index_files] == ["20261121215156097"]
    [rebuilt] = [m for m in lines if m["type"] == "index_file"]
    assert rebuilt["beginPhyOffset"] == pred.start_offset == 0 and pred.lost_index_range is None


# --- rules on their own ----------------------------------------------------------------------------


def _fake_log(n: int) -> CommitLog:
    segs = [Segment(Path(f"/nonexistent/{i * FILE:020d}"), i * FILE, FILE) for i in range(n)]
    return CommitLog(segs, FILE, Path("/nonexistent"), [])


@pytest.mark.parametrize("n,expected", [(1, 0), (2, 0), (3, 0), (4, 1), (7, 4)])
def test_normal_start_is_third_from_last_on_4_9(n, expected):
    assert normal_start_index(_fake_log(n), VERSION_49) == expected


@pytest.mark.parametrize("cq_max,expected", [(-1, 0), (10, 0), (FILE, 1), (3 * FILE + 5, 3), (99 * FILE, 4)])
def test_normal_start_holds_the_cq_max_on_5_3(cq_max, expected):
    assert normal_start_index(_fake_log(5), VERSION_53, cq_max) == expected


def test_checkpoint_min_timestamp_boundary(store_copy):
    root = store_copy("crash_torn")
    cl = CommitLog.open(root)
    ts1 = first_record_store_timestamp(cl.segments[1])
    # min(physic, logics) - 3000 must be >= the first record's store time (inclusive)
    for stamp, expected in ((ts1 + 3000, 1), (ts1 + 2999, 0), (0, 0)):
        write_checkpoint(root / "checkpoint", Checkpoint(stamp, stamp + 50000, 0), fsync=False)
        pred = predict(root)
        assert abnormal_start_index(cl, pred.checkpoint.min_timestamp)[0] == expected
        assert pred.start_file == cl.segments[expected].name
        # either way the walk ends at the torn record
        assert pred.max_offset == 396985
    # index files survive when indexMsgTimestamp covers them
    write_checkpoint(root / "checkpoint", Checkpoint(ts1 + 3000, ts1 + 3000, 1795297380545), fsync=False)
    assert predict(root).deleted_index_files == []


def _patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def test_zeroed_blank_stops_normal_recovery_and_deletes_the_next_file(store_copy):
    root = store_copy("clean")
    _patch(root / "commitlog" / SEG0, BLANK_AT, bytes(8))
    pred = predict(root)
    assert pred.max_offset == BLANK_AT and pred.deleted_commitlog_files == [SEG1]
    assert pred.dropped.intact == 57 and pred.dropped.offsets[0] == FILE
    assert pred.dropped_cq_entries == 57


def test_record_ending_at_the_file_end_without_blank(store_copy):
    # a record filling the BLANK's 94,917 bytes exactly: the broker's walk underflows at the file end
    root = store_copy("clean")
    topic = b"TopicTest"
    body = b"x" * (94917 - 91 - len(topic))
    rec = encode_fields(topic=topic, body=body, properties=b"", physical_offset=BLANK_AT, queue_id=0,
                        queue_offset=33, store_timestamp=1795297370000, born_timestamp=1795297370000)
    assert len(rec) == 94917
    _patch(root / "commitlog" / SEG0, BLANK_AT, rec)
    pred = predict(root)
    assert pred.walk.stop.offset == FILE and pred.max_offset == FILE
    # file 1 starts exactly at processOffset: kept, but its write position is 0 -> all its records are lost
    assert pred.truncated_file == (SEG1, 0) and pred.deleted_commitlog_files == []
    assert pred.dropped.intact == 57


def test_blank_size_rules_differ_between_versions(store_copy):
    root = store_copy("clean")
    _patch(root / "commitlog" / SEG0, BLANK_AT, struct.pack(">iI", 94917 + 8, BLANK_MAGIC_CODE))
    cl = CommitLog.open(root)
    assert broker_walk(cl, 0, version=VERSION_49).process_offset == 397358  # 4.9 ignores the blank's size
    assert broker_walk(cl, 0, version=VERSION_53).process_offset == BLANK_AT  # 5.x: runs past the file end
    _patch(root / "commitlog" / SEG0, BLANK_AT, struct.pack(">iI", 94917 - 8, BLANK_MAGIC_CODE))
    cl = CommitLog.open(root)
    assert broker_walk(cl, 0, version=VERSION_53).process_offset == 397358  # smaller is tolerated


def test_v2_magic_is_unknown_to_4_9():
    rec = encode_fields(topic=b"T", body=b"hello", properties=b"", magic=MESSAGE_MAGIC_CODE_V2)
    msg = decode_record(rec, 0, len(rec), 0, 0, SEG0)
    assert isinstance(msg, Message)
    assert broker_verdict(msg, VERSION_49) == "fail" and broker_verdict(msg, VERSION_53) == "record"


def test_load_failures_refuse_to_start(store_copy):
    root = store_copy("clean")
    os.truncate(root / "commitlog" / SEG1, 1000)
    pred = predict(root)
    assert pred.mode == MODE_REFUSES and "1000 bytes" in pred.load_errors[0]
    root2 = store_copy("crash_kill9")
    (root2 / "commitlog" / "00000000000000786432").write_bytes(b"")
    assert predict(root2).mode == MODE_REFUSES  # 4.9 refuses any zero-length file
    assert predict(root2, version=VERSION_53).mode == MODE_ABNORMAL  # 5.x deletes a zero-length last file
    root3 = store_copy("crash_torn")
    (root3 / "commitlog" / "notes.txt").write_bytes(b"x" * FILE)
    assert predict(root3).mode == MODE_REFUSES  # Long.parseLong("notes.txt") throws at load


def test_cq_is_not_truncated_when_its_max_is_below_the_end(store_copy):
    # 4.9.8 truncates consume queues only if maxPhyOffsetOfConsumeQueue >= processOffset
    root = store_copy("crash_torn")
    retry = root / "consumequeue" / "%RETRY%cg-test" / "0" / SEG0
    _patch(retry, 20, bytes(20))  # drop the entry of the torn record (the last CQ entry of the store)
    pred = predict(root)
    assert pred.max_offset == 396985
    assert pred.max_phy_offset_of_consume_queue == 396985 and pred.cq_truncated
    assert pred.dropped_cq_entries == 0
