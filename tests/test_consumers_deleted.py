"""`consumers`: messages deleted before consumption (forced deletion, expiry) and what is at risk next."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from oracle.harness import load, put, unavailable_reason

from conftest import FIXTURES
from rmqdump.analysis.consumers import consumer_lag
from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.root import Store


def records(store) -> list[Message]:
    return [m for m in CommitLog.open(store / "commitlog").walk() if isinstance(m, Message)]


def consumers_json(store, *args):
    res = CliRunner().invoke(cli, ["consumers", str(store), "-f", "json", *args])
    assert res.exit_code == 0, res.output
    return {(r["group"], r["topic"], r["queue_id"]): r for r in json.loads(res.stdout)}, res.stderr


def check_deleted(rows, before: list[Message], cl_min: int) -> int:
    """Every row's deleted range is exactly the messages of [committed, min) the deletion took, and their
    real store times lie inside the reported bounds. Returns how many rows had deletions."""
    n = 0
    for (_g, topic, qid), r in rows.items():
        if r["min_offset"] is None:
            continue
        gone = [m for m in before if m.topic == topic and m.queue_id == qid and r["committed"] is not None
                and r["committed"] <= m.queue_offset < r["min_offset"]]
        if r["committed"] is None or r["committed"] >= r["min_offset"]:
            assert r["deleted"] == 0 and r["deleted_queue_offsets"] is None
            continue
        n += 1
        assert gone and all(m.offset < cl_min for m in gone)
        assert r["deleted"] == len(gone) == r["min_offset"] - r["committed"]
        assert r["deleted_queue_offsets"] == [r["committed"], r["min_offset"]]
        assert r["deleted_commitlog_offsets"] == [gone[0].offset, gone[-1].offset + gone[-1].size]
        assert r["deleted_stored_not_after"] is not None
        assert all(m.store_timestamp <= r["deleted_stored_not_after"] for m in gone)
        if r["deleted_stored_not_before"] is not None:
            assert all(m.store_timestamp >= r["deleted_stored_not_before"] for m in gone)
    return n


def check_at_risk(rows, store) -> None:
    """AT RISK = the unconsumed messages stored in the oldest segment (none when it is the only one)."""
    cl = CommitLog.open(store / "commitlog")
    end = cl.segments[0].end if len(cl.segments) > 1 else -1
    msgs = [m for m in records(store) if m.offset < end]
    for (_g, topic, qid), r in rows.items():
        if r["min_offset"] is None:
            continue
        start = max(r["committed"] or 0, r["min_offset"])
        mine = [m for m in msgs if m.topic == topic and m.queue_id == qid and m.queue_offset >= start]
        assert (r["at_risk"], r["at_risk_bytes"]) == (len(mine), sum(m.size for m in mine)), (topic, qid)


def test_forced_deletion_of_the_oldest_segment(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", store)
    before = records(store)
    rows, _ = consumers_json(store)
    assert all(r["deleted"] in (0, None) for r in rows.values())  # nothing deleted yet
    check_at_risk(rows, store)
    assert sum(r["at_risk"] or 0 for r in rows.values()) == 8

    (store / "commitlog" / "00000000000000000000").unlink()  # what forced deletion does to the oldest file
    cl_min = Store.open(store).commitlog.min_offset
    rows, err = consumers_json(store)
    assert check_deleted(rows, before, cl_min) == 3
    assert sum(r["deleted"] or 0 for r in rows.values()) == 8
    # the bounds are the oldest remaining record's store time and the index file's begin time
    first_left = next(m for m in before if m.offset >= cl_min)
    assert {r["deleted_stored_not_after"] for r in rows.values() if r["deleted"]} == {first_left.store_timestamp}
    assert {r["deleted_stored_not_before"] for r in rows.values() if r["deleted"]} == {before[0].store_timestamp}
    check_at_risk(rows, store)
    assert "cg-test: 8 messages deleted before consumption in 3 queues" in err
    assert "a bound" in err and "the next one forced deletion or expiry removes" in err

    table = CliRunner().invoke(cli, ["consumers", str(store), "-f", "table", "-q"])
    assert table.exit_code == 0 and "DELETED" in table.stdout and "AT RISK" in table.stdout

    rep = consumer_lag(store, commitlog_min_offset=cl_min)  # without the commitlog: no deletion facts
    assert all(r.deleted is None and r.at_risk is None for r in rep.rows)


@pytest.mark.oracle
def test_deleted_before_consumption_on_a_rocketmq_store(tmp_path):
    """A store RocketMQ 4.9.8 wrote over four 4 KiB segments; the oldest deleted; RocketMQ's load() says
    where each queue now starts (minOffsetInQueue), and rmqdump's deleted ranges must end there."""
    reason = unavailable_reason("498")
    if reason:
        pytest.skip(reason)
    store = tmp_path / "store"
    spec = [{"type": "settings", "mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 200,
             "maxHashSlotNum": 64, "maxIndexNum": 256}]
    spec += [{"topic": "TopicD", "queueId": i % 3, "keys": [f"k{i}"], "body": f"message {i:03d} " + "x" * 120}
             for i in range(70)]
    put("498", store, spec)
    before = records(store)
    assert len(CommitLog.open(store / "commitlog").segments) >= 3
    (store / "config").mkdir(exist_ok=True)
    (store / "config" / "consumerOffset.json").write_text(
        '{"offsetTable":{"TopicD@cg-slow":{0:1,1:0,2:2},"TopicD@cg-fast":{0:23,1:23,2:23}}}')
    (store / "commitlog" / "00000000000000000000").unlink()
    manifest = load("498", store, ["4096", "200", "64", "256"])
    rmq_min = {(q["topic"], q["queueId"]): q["minOffsetInQueue"] for q in manifest if q["type"] == "cq_queue"}
    cl_min = next(m for m in manifest if m["type"] == "store_info")["commitlog_min_offset"]
    assert cl_min == 4096
    rows, err = consumers_json(store)
    for (_g, topic, qid), r in rows.items():
        assert r["min_offset"] == rmq_min[(topic, qid)]
    assert check_deleted(rows, before, cl_min) == 3  # cg-slow's three queues; cg-fast consumed past the min
    assert all(rows[("cg-fast", "TopicD", q)]["deleted"] == 0 for q in range(3))
    check_at_risk(rows, store)
    assert "cg-slow:" in err and "deleted before consumption" in err
