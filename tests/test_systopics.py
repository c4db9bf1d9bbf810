"""System-topic resolution and pending computation against the real broker498 store."""

from __future__ import annotations

import base64
import json

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, manifest, real_store
from rmqdump.broker.systopics import PendingTracker, parse_op_body, pending_states, resolve
from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.rows.schema import message_to_dict
from rmqdump.store.config import load_delay_offsets
from rmqdump.store.root import Store
from rmqdump.write.writer import MessageSpec, StoreWriter

CLEAN_END = 397358


def _messages(path) -> list[Message]:
    return [m for m in Store.open(path).commitlog.walk() if isinstance(m, Message)]


def _manifest_messages() -> dict[int, dict]:
    return {m["commitLogOffset"]: m for m in manifest("clean") if m["type"] == "message"}


def _pending(path) -> list:
    d = load_delay_offsets(path)
    return pending_states(_messages(path), d.data if d.path else None)


def test_resolve_matches_the_properties_rocketmq_wrote():
    man = _manifest_messages()
    seen = set()
    for m in _messages(real_store("clean")):
        r = resolve(m)
        p = man[m.offset]["properties"]
        seen.add(r["kind"])
        if m.topic == "SCHEDULE_TOPIC_XXXX":
            assert r["kind"] == "delay"
            assert (r["real_topic"], r["real_queue_id"], r["level"]) == (p["REAL_TOPIC"], int(p["REAL_QID"]),
                                                                         int(p["DELAY"]))
            assert r["level"] == m.queue_id + 1
            # the due time is what RocketMQ's dispatcher wrote into the CQ as tagsCode
            assert r["due_time"] == man[m.offset]["dispatch_tagsCode"]
            if p["REAL_TOPIC"].startswith("%RETRY%"):
                assert r["group"] == "cg-test" and r["origin_msg_id"] == p["ORIGIN_MESSAGE_ID"]
        elif m.topic == "RMQ_SYS_TRANS_HALF_TOPIC":
            assert r["kind"] == "tx_half" and r["real_topic"] == "TopicTx"
            assert r["real_queue_id"] == int(p["REAL_QID"])
            assert r["check_times"] == int(p.get("TRANSACTION_CHECK_TIMES", 0))
        elif m.topic == "RMQ_SYS_TRANS_OP_HALF_TOPIC":
            assert r["kind"] == "tx_op"
            assert r["half_queue_offsets"] == [int(base64.b64decode(man[m.offset]["body_b64"]))]
        elif m.topic == "%RETRY%cg-test":
            assert r["kind"] == "retry" and r["group"] == "cg-test" and r["real_topic"] == "TopicTest"
            assert r["via"] == "delay" and r["level"] == 3
        elif m.sys_flag & 0xC == 0x8:
            assert r["kind"] == "tx_commit" and m.topic == "TopicTx"
        elif m.topic == "TopicDelay":
            assert r["kind"] == "normal" and r["via"] == "delay" and r["level"] == int(p["DELAY"])
        else:
            assert r["kind"] == "normal" and r["via"] is None
            assert (r["real_topic"], r["real_queue_id"]) == (m.topic, m.queue_id)
    assert seen == {"delay", "tx_half", "tx_op", "retry", "tx_commit", "normal"}


def test_resolve_accepts_schema_dicts():
    for m in _messages(real_store("clean")):
        d = message_to_dict(m, "none")
        d["_body"] = m.body
        assert resolve(d) == resolve(m)


def test_op_body_forms():
    assert parse_op_body(b"7") == [7]
    assert parse_op_body(b"3,5,9") == [3, 5, 9]  # 5.x batched op bodies
    assert parse_op_body(b"x,4,-1,") == [4]
    assert parse_op_body(b"") == []


def test_pending_on_clean_is_exactly_the_level_18_message():
    man = _manifest_messages()
    cands = _pending(real_store("clean"))
    pending = [c for c in cands if c.state == "pending"]
    assert [(c.kind, c.offset) for c in pending] == [("delay", 390258)]
    (p,) = pending
    assert p.resolved["level"] == 18 and p.resolved["real_topic"] == "TopicDelay" and p.resolved["real_queue_id"] == 0
    assert p.resolved["due_time"] == man[390258]["dispatch_tagsCode"]
    delays = {c.offset: c for c in cands if c.kind == "delay"}
    # levels 1-3 and the two retries were delivered: the copy is the real-topic record with the same UNIQ_KEY
    for off in (389370, 389666, 389962, 393640, 394018):
        c = delays[off]
        assert c.state == "delivered"
        copy = man[c.delivered_offset]
        assert copy["uniqKey"] == man[off]["uniqKey"]
        assert copy["topic"] == man[off]["properties"]["REAL_TOPIC"]
    halves = {c.offset: c for c in cands if c.kind == "tx_half"}
    assert len(halves) == 8
    assert sorted(c.state for c in halves.values()) == ["resolved"] * 6 + ["superseded"] * 2
    # commits point back at their half record (preparedTransactionOffset), rollbacks have only an op
    for m in man.values():
        if m["topic"] == "TopicTx":
            assert halves[m["preparedTransactionOffset"]].delivered_offset == m["commitLogOffset"]
    assert {halves[o].detail.split(";")[1].strip() for o in (392050, 392368, 395049)} == {"rolled back"}


def test_pending_cli_lists_level_18_and_no_delivered(tmp_path):
    res = CliRunner().invoke(cli, ["pending", str(real_store("clean")), "-f", "jsonl", "--now", "1795297380000"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["kind"], r["offset"], r["level"], r["real_topic"], r["state"]) for r in rows] == \
        [("delay", 390258, 18, "TopicDelay", "pending")]
    assert rows[0]["overdue"] is False  # due 2 h after it was stored
    assert "1 pending" in res.stderr
    later = CliRunner().invoke(cli, ["pending", str(real_store("clean")), "-f", "jsonl", "--now",
                                     "2026-11-22T00:00:00Z", "--body", "text"])
    row = json.loads(later.stdout)
    assert row["overdue"] is True and row["body"] == "delayed by level 18"
    every = CliRunner().invoke(cli, ["pending", str(real_store("clean")), "-f", "csv", "--all"])
    assert every.exit_code == 0
    lines = every.stdout.splitlines()
    assert len(lines) == 1 + 14 and lines[0].startswith("kind,state,topic")
    table = CliRunner().invoke(cli, ["pending", str(real_store("clean")), "-f", "table", "--kind", "transaction",
                                     "--all"])
    body = table.stdout.splitlines()[1:]
    assert table.exit_code == 0 and len(body) == 8 and all(line.startswith("tx_half") for line in body)


def _rewrite_delay_offsets(store, text: str) -> None:
    for name in ("delayOffset.json", "delayOffset.json.bak"):
        (store / "config" / name).write_text(text)


def test_delay_offsets_and_copies_disagree(store_copy):
    s = store_copy("clean")
    # level 1 offset not persisted (copy exists) -> redeliver; level 18 offset says delivered, no copy -> lost
    _rewrite_delay_offsets(s, "{\n\t\"offsetTable\":{1:0,2:1,3:3,18:1\n\t}\n}")
    by_off = {c.offset: c for c in _pending(s)}
    assert by_off[389370].state == "redeliver"
    assert by_off[390258].state == "lost"
    assert by_off[389666].state == "delivered"
    res = CliRunner().invoke(cli, ["pending", str(s), "-f", "jsonl", "--all"])
    assert res.exit_code == 1
    assert "1 lost" in res.stderr and "1 redeliver" in res.stderr


def test_without_delay_offsets_copies_decide(store_copy):
    s = store_copy("clean")
    for name in ("delayOffset.json", "delayOffset.json.bak"):
        (s / "config" / name).unlink()
    cands = _pending(s)
    assert [c.offset for c in cands if c.state == "pending"] == [390258]
    res = CliRunner().invoke(cli, ["pending", str(s), "-f", "jsonl"])
    assert res.exit_code == 0 and "no config/delayOffset.json" in res.stderr


def test_torn_retry_copy_is_lost_on_crash_torn():
    # crash_torn zeroed the %RETRY% copy at 396985: its schedule record (394018) has no delivered copy any more
    cands = {c.offset: c for c in _pending(real_store("crash_torn"))}
    assert cands[394018].state == "lost"
    assert cands[393640].state == "delivered"
    res = CliRunner().invoke(cli, ["pending", str(real_store("crash_torn")), "-f", "jsonl"])
    assert res.exit_code == 1


def test_half_without_op_is_pending_until_its_op(store_copy):
    s = store_copy("clean")
    with StoreWriter(s, commitlog_file_size=262144, cq_file_size=600, start_offset=CLEAN_END,
                     build_index=False) as w:
        half = w.append(MessageSpec("RMQ_SYS_TRANS_HALF_TOPIC", b"open tx", tags="tx", keys="open-1",
                                    properties={"REAL_TOPIC": "TopicTx", "REAL_QID": "1", "TRAN_MSG": "true",
                                                "PGROUP": "pg-tx"}))
        w.sync()
    assert half.queue_offset == 8
    pend = [c for c in _pending(s) if c.state == "pending" and c.kind == "tx_half"]
    assert [(c.offset, c.resolved["real_topic"], c.resolved["real_queue_id"]) for c in pend] == \
        [(half.offset, "TopicTx", 1)]
    res = CliRunner().invoke(cli, ["pending", str(s), "-f", "jsonl", "--kind", "transaction"])
    assert [json.loads(x)["offset"] for x in res.stdout.splitlines()] == [half.offset]
    with StoreWriter(s, commitlog_file_size=262144, cq_file_size=600, start_offset=half.offset + half.size,
                     build_index=False) as w:
        w.append(MessageSpec("RMQ_SYS_TRANS_OP_HALF_TOPIC", str(half.queue_offset).encode(), tags="d",
                             auto_uniq_key=False))
        w.sync()
    assert not [c for c in _pending(s) if c.state == "pending" and c.kind == "tx_half"]


def test_timer_messages(tmp_path):
    t0 = 1795297000000
    with StoreWriter(tmp_path / "s", commitlog_file_size=4096, clock=lambda: t0) as w:
        due = w.append(MessageSpec("rmq_sys_wheel_timer", b"timer due", uniq_key="AA01",
                                   properties={"TIMER_OUT_MS": str(t0 + 60000), "REAL_TOPIC": "TopicT",
                                               "REAL_QID": "2"}))
        w.append(MessageSpec("rmq_sys_wheel_timer", b"timer done", uniq_key="AA02",
                             properties={"TIMER_OUT_MS": str(t0 + 1000), "REAL_TOPIC": "TopicT", "REAL_QID": "0"}))
        w.append(MessageSpec("rmq_sys_wheel_timer", b"timer cancelled", uniq_key="AA03",
                             properties={"TIMER_OUT_MS": str(t0 + 5000), "REAL_TOPIC": "TopicT", "REAL_QID": "0"}))
        w.append(MessageSpec("rmq_sys_wheel_timer", b"", uniq_key="AA04",
                             properties={"TIMER_DEL_UNIQKEY": "TopicT+AA03", "REAL_TOPIC": "TopicT"}))
        w.append(MessageSpec("TopicT", b"timer done", uniq_key="AA02",
                             properties={"TIMER_OUT_MS": str(t0 + 1000), "REAL_TOPIC": "TopicT", "REAL_QID": "0"}))
        w.sync()
    msgs = _messages(tmp_path / "s")
    assert resolve(msgs[0])["due_time"] == t0 + 60000 and resolve(msgs[0])["real_queue_id"] == 2
    assert resolve(msgs[3])["kind"] == "timer_delete"
    assert resolve(msgs[4])["via"] == "timer"
    t = PendingTracker(None)
    for m in msgs:
        t.add(m)
    states = {c.uniq_key: c.state for c in t.finish()}
    assert states == {"AA01": "pending", "AA02": "delivered", "AA03": "cancelled"}
    res = CliRunner().invoke(cli, ["pending", str(tmp_path / "s"), "-f", "jsonl", "--kind", "timer"])
    assert [json.loads(x)["offset"] for x in res.stdout.splitlines()] == [due.offset]


def test_fixture_store_pending_states():
    cands = _pending(FIXTURES / "store")
    assert {(c.kind, c.state) for c in cands} == {("tx_half", "resolved"), ("tx_prepared", "pending"),
                                                  ("delay", "lost"), ("delay", "pending")}


@pytest.mark.parametrize("store", ["corrupt_crc", "crash_torn_props"])
def test_pending_on_damaged_stores_does_not_crash(store):
    res = CliRunner().invoke(cli, ["pending", str(real_store(store)), "-f", "jsonl"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert 390258 in [json.loads(x)["offset"] for x in res.stdout.splitlines()]
