"""Recovery re-dispatch: the consume-queue entries RocketMQ's recovery writes back, predicted.

Both stores were written by RocketMQ itself (``fixtures/oracle/``) and then lost consume-queue
bytes; ``manifest.jsonl`` holds the queues RocketMQ's own ``load()`` left:

* ``498-crash-cq-lag``: a 4.9.8 crash (``abort``) with a zeroed CQ tail, a deleted topic and a
  deleted LMQ queue: abnormal recovery re-dispatches every record it walks, LMQ targets too;
* ``533-normal-cq-lag``: a 5.3.3 clean shutdown with a queue's last CQ file deleted: 5.3.3's normal
  recovery re-dispatches only records *after* the queues' maximum physical offset, so the record
  starting exactly there stays undispatched (a 4.9 broker's normal recovery re-dispatches nothing).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from oracle_fixtures import fixture_dir, fixture_manifest

from rmqdump.broker.recovery import consume_queue_states, predict_recovery
from rmqdump.broker.redispatch import DispatchModel
from rmqdump.cli import cli
from rmqdump.store.root import Store


def _queue_ends(manifest: list[dict]) -> dict[str, int]:
    return {f"{m['topic']}/{m['queueId']}": m["maxOffsetInQueue"] for m in manifest
            if m["type"] == "cq_queue" and m["maxOffsetInQueue"] > 0}


def _predicted_ends(store, version: str) -> dict[str, int]:
    st = Store.open(store)
    states, _ = consume_queue_states(st)
    ends = {s.name: s.max_offset for s in states}
    pred = predict_recovery(st, version=version)
    for q in pred.queues:
        ends[q.queue] = q.new_end
    for q in pred.redispatched:
        ends[q.queue] = q.new_end
    return {k: v for k, v in ends.items() if v > 0}


@pytest.mark.parametrize("name,version", [("498-crash-cq-lag", "4.9"), ("533-normal-cq-lag", "5.3")])
def test_queue_ends_after_recovery_equal_rocketmqs(name, version):
    store = fixture_dir(name) / "store"
    assert _predicted_ends(store, version) == _queue_ends(fixture_manifest(name))


def test_abnormal_recovery_recreates_deleted_topic_and_lmq_queue():
    pred = predict_recovery(Store.open(fixture_dir("498-crash-cq-lag") / "store"))
    got = {q.queue: q for q in pred.redispatched}
    assert got["TopicB/0"].created and got["TopicB/0"].old_end == 0 and got["TopicB/0"].count == 6
    assert got["%LMQ%room2/0"].created and got["%LMQ%room2/0"].count == 6
    assert not got["TopicA/0"].created and got["TopicA/0"].count == 2  # the two zeroed units come back
    assert "MqttTopic/0" not in got and "%LMQ%room1/0" not in got  # nothing lost: nothing re-added
    entries = {(m["topic"], m["queueId"], m["queueOffset"]): m["commitLogOffset"]
               for m in fixture_manifest("498-crash-cq-lag") if m["type"] == "cq_entry"}
    for q in got.values():
        topic, qid = q.queue.rsplit("/", 1)
        assert q.commitlog_offsets == [entries[(topic, int(qid), q.old_end + i)] for i in range(q.count)]


def test_normal_recovery_49_redispatches_nothing_53_from_after_the_cq_maximum():
    st = Store.open(fixture_dir("533-normal-cq-lag") / "store")
    assert predict_recovery(st, version="4.9").redispatched == []
    pred = predict_recovery(st, version="5.3")
    (q,) = pred.redispatched
    # the queue lost entries 6..8; the record starting at exactly maxPhyOffsetOfConsumeQueue (1761, queue
    # offset 6) is not re-dispatched, and the next one (queue offset 7) is written at queue offset 6
    assert pred.max_phy_offset_of_consume_queue == 1761
    assert (q.queue, q.old_end, q.new_end, q.commitlog_offsets) == ("TopicC/1", 6, 8, [1922, 2083])
    assert (q.misplaced, q.first_misplaced) == (2, (1922, 7, 6))
    entries = {m["queueOffset"]: m["commitLogOffset"] for m in fixture_manifest("533-normal-cq-lag")
               if m["type"] == "cq_entry" and m["queueId"] == 1}
    assert [entries[6], entries[7]] == q.commitlog_offsets  # where RocketMQ put them


def test_skip_rules_of_put_message_position_info():
    """The replay of ``putMessagePositionInfo`` on its own: built entries and earlier queue offsets are
    skipped, a queue offset past the write position is written AT the write position, queue offset 0
    is never 'repeated'."""

    class S:
        topic, queue_id, name, files = "T", 0, "T/0", [object()]
        max_offset, max_physic_offset = 5, 1000

    class R:
        sys_flag, topic, queue_id, properties_raw = 0, "T", 0, b""

        def __init__(self, offset, size, queue_offset):
            self.offset, self.size, self.queue_offset = offset, size, queue_offset

    m = DispatchModel([S()])
    for rec in (R(900, 100, 5), R(1000, 50, 4), R(1050, 50, 9), R(1100, 50, 0), R(1150, 50, 6)):
        m.dispatch(rec)
    (q,) = m.result()
    assert (q.old_end, q.new_end, q.commitlog_offsets) == (5, 7, [1050, 1100])


def test_verify_reports_the_redispatch():
    store = fixture_dir("498-crash-cq-lag") / "store"
    res = CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q"])
    assert res.exit_code in (0, 1), res.output
    rd = json.loads(res.stdout)["recovery"]["redispatched_cq_entries"]
    assert rd["count"] == 20 and set(rd["queues"]) == {"TopicA/0", "TopicB/0", "TopicB/1", "%LMQ%room2/0"}


def test_verify_warns_when_recovery_would_misnumber_a_queue():
    store = fixture_dir("533-normal-cq-lag") / "store"
    res = CliRunner().invoke(cli, ["verify", str(store), "--broker-version", "5.3", "-f", "json", "-q"])
    doc = json.loads(res.stdout)
    (f,) = [f for f in doc["findings"] if f["kind"] == "recovery_misplaces_cq_entries"]
    assert (f["severity"], f["file"], f["offset"]) == ("warning", "consumequeue/TopicC/1", 1922)
    res = CliRunner().invoke(cli, ["verify", str(store), "--broker-version", "4.9", "-f", "json", "-q"])
    assert "recovery_misplaces_cq_entries" not in res.stdout  # 4.9's reput service dispatches in order
