"""`rmqdump consumers`: consumerOffset.json against the ConsumeQueues of the real store."""

from __future__ import annotations

import base64
import csv
import io
import json
import re

from click.testing import CliRunner

from conftest import FIXTURES, manifest, real_store
from rmqdump.analysis.consumers import NOTE_AHEAD, NOTE_NO_COMMIT, consumer_lag
from rmqdump.cli import cli
from rmqdump.store.root import Store


def _strict_json(text: str) -> dict:
    """fastjson's unquoted integer keys quoted, then the standard parser (independent of rmqdump)."""
    return json.loads(re.sub(r"([{,]\s*)(-?\d+)(\s*:)", r'\1"\2"\3', text))


def _offset_table(store) -> dict[tuple[str, str, int], int]:
    doc = _strict_json((store / "config" / "consumerOffset.json").read_text())
    out = {}
    for key, queues in doc["offsetTable"].items():
        topic, group = key.split("@")
        for q, off in queues.items():
            out[(group, topic, int(q))] = off
    return out


def _cq_queues(name="clean") -> dict[tuple[str, int], dict]:
    return {(q["topic"], q["queueId"]): q for q in manifest(name) if q["type"] == "cq_queue"}


def _write_offsets(store, table: dict[str, dict[int, int]]) -> None:
    """consumerOffset.json as fastjson writes it (tabs, unquoted int keys), main and .bak."""
    body = ",\n".join(f'\t\t"{k}":{{' + ",".join(f"{q}:{o}" for q, o in v.items()) + "\n\t\t}"
                      for k, v in table.items())
    text = '{\n\t"offsetTable":{\n' + body + "\n\t}\n}"
    for name in ("consumerOffset.json", "consumerOffset.json.bak"):
        (store / "config" / name).write_text(text)


def test_reproduces_consumer_offsets_and_lag():
    store = real_store("clean")
    offsets = _offset_table(store)
    cq = _cq_queues()
    rep = consumer_lag(store)
    assert not rep.used_backup and not rep.problems
    got = {(r.group, r.topic, r.queue_id): r for r in rep.rows}
    assert set(got) == set(offsets)  # every topic@group/queue of the file, nothing else (all queues committed)
    for key, committed in offsets.items():
        r = got[key]
        q = cq[(r.topic, r.queue_id)]
        assert r.committed == committed
        assert (r.min_offset, r.max_offset) == (q["minOffsetInQueue"], q["maxOffsetInQueue"])
        assert r.lag == q["maxOffsetInQueue"] - committed
        assert r.note == ""
    assert rep.total_lag() == {"cg-test": 0, "CID_RMQ_SYS_TRANS": 0}


def test_cli_formats():
    path = str(real_store("clean"))
    res = CliRunner().invoke(cli, ["consumers", path, "-f", "jsonl"])
    assert res.exit_code == 0
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert [(r["group"], r["topic"], r["queue_id"], r["committed"], r["max_offset"], r["lag"]) for r in rows] == [
        ("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_HALF_TOPIC", 0, 8, 8, 0),
        ("CID_RMQ_SYS_TRANS", "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0, 6, 6, 0),
        ("cg-test", "%RETRY%cg-test", 0, 2, 2, 0),
        ("cg-test", "TopicTest", 0, 33, 33, 0), ("cg-test", "TopicTest", 1, 31, 31, 0),
        ("cg-test", "TopicTest", 2, 32, 32, 0), ("cg-test", "TopicTest", 3, 32, 32, 0)]
    assert "total lag: CID_RMQ_SYS_TRANS 0, cg-test 0" in res.stderr
    c = list(csv.DictReader(io.StringIO(CliRunner().invoke(cli, ["consumers", path, "-f", "csv", "-g",
                                                                 "cg-test"]).stdout)))
    assert len(c) == 5 and {r["group"] for r in c} == {"cg-test"}
    t = CliRunner().invoke(cli, ["consumers", path, "-f", "table", "-t", "TopicTest"])
    assert t.exit_code == 0 and len(t.stdout.splitlines()) == 5 and "COMMITTED" in t.stdout


def test_unconsumed_messages_are_the_cq_tail(store_copy):
    s = store_copy("clean")
    _write_offsets(s, {"TopicTest@cg-test": {0: 30, 1: 31, 2: 0, 3: 32}, "%RETRY%cg-test@cg-test": {0: 1}})
    msgs = [m for m in manifest("clean") if m["type"] == "message"]
    expect = [m for m in msgs if m["topic"] == "%RETRY%cg-test" and m["queueOffset"] >= 1] + \
        sorted((m for m in msgs if m["topic"] == "TopicTest" and
                ((m["queueId"] == 0 and m["queueOffset"] >= 30) or m["queueId"] == 2)),
               key=lambda m: (m["queueId"], m["queueOffset"]))
    res = CliRunner().invoke(cli, ["consumers", str(s), "--unconsumed", "-f", "jsonl", "--group", "cg-test"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert [r["offset"] for r in rows] == [m["commitLogOffset"] for m in expect]
    assert len(rows) == 3 + 32 + 1
    for r, m in zip(rows, expect, strict=True):
        assert r["group"] == "cg-test"
        assert (r["topic"], r["queue_id"], r["queue_offset"]) == (m["topic"], m["queueId"], m["queueOffset"])
        assert r["body"] == m["body_b64"]
    assert "36 unconsumed messages in 3 queues" in res.stderr
    text = CliRunner().invoke(cli, ["consumers", str(s), "--unconsumed", "-f", "jsonl", "-t", "%RETRY%cg-test",
                                    "--body", "text", "--resolve"])
    (row,) = [json.loads(x) for x in text.stdout.splitlines()]
    assert row["body"] == base64.b64decode(expect[0]["body_b64"]).decode()
    assert row["resolved"]["kind"] == "retry" and row["resolved"]["real_topic"] == "TopicTest"


def test_missing_queue_offsets_and_offsets_ahead(store_copy):
    s = store_copy("clean")
    _write_offsets(s, {"TopicTest@cg-new": {0: 40}, "TopicOrder@cg-new": {5: 3}})
    rep = consumer_lag(s)
    rows = {(r.topic, r.queue_id): r for r in rep.rows}
    cq = _cq_queues()
    assert rows[("TopicTest", 0)].note == NOTE_AHEAD and rows[("TopicTest", 0)].lag == 33 - 40
    for q in (1, 2, 3):
        r = rows[("TopicTest", q)]
        assert r.committed is None and r.note == NOTE_NO_COMMIT
        assert r.lag == cq[("TopicTest", q)]["maxOffsetInQueue"]
    assert rows[("TopicOrder", 5)].max_offset is None  # no such queue on disk
    res = CliRunner().invoke(cli, ["consumers", str(s), "--unconsumed", "-f", "jsonl", "-t", "TopicTest"])
    assert len(res.stdout.splitlines()) == 31 + 32 + 32  # queues 1-3, never committed


def test_bak_fallback(store_copy):
    s = store_copy("clean")
    (s / "config" / "consumerOffset.json").write_text("{\"offsetTable\":{")  # torn write of the main file
    res = CliRunner().invoke(cli, ["consumers", str(s), "-f", "jsonl"])
    assert res.exit_code == 0
    assert "consumerOffset.json.bak" in res.stderr
    assert len(res.stdout.splitlines()) == 7


def test_bad_cq_entry_in_unconsumed_range_exits_1(store_copy):
    s = store_copy("crash_torn")  # the %RETRY% record at 396985 is zeroed, its CQ entry remains
    _write_offsets(s, {"%RETRY%cg-test@cg-test": {0: 0}})
    res = CliRunner().invoke(cli, ["consumers", str(s), "--unconsumed", "-f", "jsonl"])
    assert res.exit_code == 1
    assert [json.loads(x)["offset"] for x in res.stdout.splitlines()] == [396612]
    assert "396985" in res.stderr


def test_store_without_offsets_is_a_one_line_error(tmp_path):
    import shutil

    shutil.copytree(FIXTURES / "store", tmp_path / "s", ignore=shutil.ignore_patterns("config"))
    for args in (["consumers", str(tmp_path / "s")],
                 ["consumers", str(FIXTURES / "store" / "commitlog" / "00000000000000000000")]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("rmqdump: error:")


def test_fixture_lags():
    from collections import Counter

    from rmqdump.codec.record import Message

    store = Store.open(FIXTURES / "store")
    counts = Counter(m.queue_id for m in store.commitlog.walk() if isinstance(m, Message) and m.topic == "TopicTest")
    committed = {0: 5, 1: 3, 2: 0, 3: 10}  # scripts/make_fixtures.py
    rep = consumer_lag(FIXTURES / "store", commitlog_min_offset=store.commitlog.min_offset)
    assert {r.queue_id: r.lag for r in rep.rows if r.topic == "TopicTest"} == \
        {q: counts[q] - committed[q] for q in range(4)}
