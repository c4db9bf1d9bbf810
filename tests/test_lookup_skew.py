"""`lookup`: born-vs-store skew per hit and the window the broker's own query uses (apache/rocketmq #681)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from oracle.harness import put, unavailable_reason

from rmqdump.analysis.lookup import lookup_key, lookup_uniq_key
from rmqdump.analysis.lookup.result import UNIQ_KEY_QUERY_SLACK_MS
from rmqdump.cli import cli
from rmqdump.codec.javahash import index_key
from rmqdump.codec.msgid import decode_uniq_key
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.indexfile import IndexFile, list_index_files
from rmqdump.write.message import MessageSpec, make_uniq_key
from rmqdump.write.writer import StoreWriter

T0 = 1_793_491_200_000  # 2026-11-01T00:00:00Z
AHEAD_MS = 60_000  # the second producer's clock runs a minute ahead of the broker's


def skewed_store(tmp_path):
    """Two messages: one from a producer in step with the broker, one from a producer a minute ahead."""
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=4096, cq_file_size=600, index_slots=16, index_entries=64) as w:
        w.append(MessageSpec("TopicS", b"in step", keys="order-1", born_timestamp=T0 + 1_000,
                             store_timestamp=T0 + 1_004))
        w.append(MessageSpec("TopicS", b"clock ahead", keys="order-2", born_timestamp=T0 + 2_000 + AHEAD_MS,
                             store_timestamp=T0 + 2_003))
        w.sync()
    return root


def broker_returns(root, topic: str, key: str, begin: int, end: int, offset: int) -> bool:
    """rmqdump's replica of IndexFile.selectPhyOffset (judged against RocketMQ elsewhere) over every file."""
    for p in list_index_files(root):
        with IndexFile(p, 16, 64) as f:
            if offset in f.select_phy_offsets(index_key(topic, key), begin=begin, end=end).phy_offsets:
                return True
    return False


def msgs(root) -> list[Message]:
    return [m for m in CommitLog.open(root / "commitlog").walk() if isinstance(m, Message)]


def test_uniq_key_window_misses_a_producer_ahead(tmp_path):
    root = skewed_store(tmp_path)
    for m in msgs(root):
        res = lookup_uniq_key(root, m.uniq_key)
        assert [h.offset for h in res.hits] == [m.offset]  # rmqdump finds it either way
        (t,) = res.timing
        assert t.skew_ms == m.store_timestamp - m.born_timestamp
        begin = decode_uniq_key(m.uniq_key, m.born_timestamp).timestamp - UNIQ_KEY_QUERY_SLACK_MS
        assert t.window == (begin, (1 << 63) - 1)
        assert t.index_time is not None and t.index_time <= m.store_timestamp < t.index_time + 1000
        assert t.in_window == broker_returns(root, m.topic, m.uniq_key, *t.window, m.offset)
        assert t.in_window == (m.body == b"in step")
        if not t.in_window:
            assert "producer's clock is ahead" in t.note and t.skew_ms < -AHEAD_MS + 5_000

    ahead = msgs(root)[1]
    res = CliRunner().invoke(cli, ["lookup", str(root), "--uniq-key", ahead.uniq_key, "-f", "jsonl"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)
    assert row["timing"]["in_broker_window"] is False and row["timing"]["skew_ms"] == ahead.store_timestamp - \
        ahead.born_timestamp
    assert "the broker's query misses it" in res.stderr and "UNIQ_KEY" in res.stderr
    table = CliRunner().invoke(cli, ["lookup", str(root), "--uniq-key", ahead.uniq_key, "-f", "table"])
    assert "SKEW" in table.stdout and "-60.0 s" in table.stdout


def test_key_window_by_born_time_explains_not_found(tmp_path):
    root = skewed_store(tmp_path)
    ahead = msgs(root)[1]
    # the window a user picks from the producer's log (its born time): the store time is a minute earlier
    lo, hi = ahead.born_timestamp - 5_000, ahead.born_timestamp + 5_000
    res = lookup_key(root, "TopicS", "order-2", begin=lo, end=hi)
    assert res.hits == [] and not broker_returns(root, "TopicS", "order-2", lo, hi, ahead.offset)
    (t,) = res.outside_window
    assert (t.offset, t.in_window, t.window) == (ahead.offset, False, (lo, hi))
    cli_res = CliRunner().invoke(cli, ["lookup", str(root), "--key", "order-2", "--topic", "TopicS",
                                       "--since", str(lo), "--until", str(hi)])
    assert cli_res.exit_code == 1
    assert f"offset {ahead.offset}: born" in cli_res.stderr and "(inside the window)" in cli_res.stderr
    assert "widen the window by the skew" in cli_res.stderr
    # without a window both are found and both are inside the broker's (0 .. Long.MAX_VALUE) window
    res = lookup_key(root, "TopicS", "order-2")
    assert [t.in_window for t in res.timing] == [True] and res.outside_window == []


@pytest.mark.oracle
def test_skew_on_a_store_rocketmq_indexed(tmp_path):
    """RocketMQ 4.9.8 stores (and indexes, with its own timeDiff) a message whose producer clock is an hour
    ahead: the index time rmqdump reads is the one RocketMQ's selectPhyOffset compares."""
    reason = unavailable_reason("498")
    if reason:
        pytest.skip(reason)
    import time

    born = int(time.time() * 1000) + 3_600_000
    uniq = make_uniq_key(bytes([10, 0, 0, 5]), 4242, 7, born, 1)
    store = tmp_path / "store"
    put("498", store, [{"type": "settings", "mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600,
                        "maxHashSlotNum": 64, "maxIndexNum": 256},
                       {"topic": "TopicS", "keys": ["late"], "body": "from the future", "bornTimestamp": born,
                        "uniqKey": uniq}])
    (m,) = msgs(store)
    assert m.born_timestamp == born and m.store_timestamp < born - 3_000_000
    res = CliRunner().invoke(cli, ["lookup", str(store), "--uniq-key", uniq, "-f", "jsonl",
                                   "--index-slots", "64", "--index-entries", "256"])
    assert res.exit_code == 0, res.output
    t = json.loads(res.stdout)["timing"]
    assert t["index_time"] is not None and t["index_time"] <= m.store_timestamp < t["index_time"] + 1000
    assert t["in_broker_window"] is False and t["skew_ms"] < -3_000_000
    assert "producer's clock is ahead" in res.stderr
