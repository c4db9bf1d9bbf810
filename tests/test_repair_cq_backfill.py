"""Repair gives back consume-queue entries the broker would never restore, and not those of a deleted topic.

``fixtures/oracle/498-cq-hole``: 28 records written by RocketMQ 4.9.8 (3-entry CQ files), then
``consumequeue/TopicH/0/00000000000000000060`` (queue offsets 3..5) and the whole ``consumequeue/TopicH/1``
deleted. RocketMQ's manifest shows what its own recovery keeps: the hole stays and queue 1 stays gone,
because its re-dispatch starts after the records concerned.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_manifest, oracle_run, recipe

from rmqdump.cli import cli

NAME = "498-cq-hole"


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _missing(store) -> dict[tuple[str, int], int]:
    doc = json.loads(_run("verify", store, "-f", "json", "-q").stdout)
    out: dict[tuple[str, int], int] = {}
    for f in doc["findings"]:
        if f["kind"] == "cq_entry_missing":
            q = f["detail"].split(" ", 1)[0]
            topic, qid = q.rsplit("/", 1)
            out[(topic, int(qid))] = out.get((topic, int(qid)), 0) + 1
    return out


def test_rocketmq_itself_leaves_the_hole_and_the_lost_queue():
    queues = {(m["topic"], m["queueId"]) for m in fixture_manifest(NAME) if m["type"] == "cq_entry"}
    offsets = {m["queueOffset"] for m in fixture_manifest(NAME) if m["type"] == "cq_entry" and m["topic"] == "TopicH"}
    assert ("TopicH", 1) not in queues and not {3, 4, 5} & offsets


def test_repair_fills_the_hole_and_recreates_the_queue(tmp_path):
    store = copy_store(NAME, tmp_path / "store")
    # (TopicH/1's last record lies after the dispatch point: the broker's reput owes it, not an error)
    assert _missing(store) == {("TopicH", 0): 3, ("TopicH", 1): 11}
    res = _run("repair", store, "--apply", "--backup-dir", tmp_path / "bk", "-q")
    assert res.exit_code == 0, res.output
    assert _missing(store) == {}
    doc = json.loads(_run("verify", store, "-f", "json", "-q").stdout)
    assert doc["summary"]["errors"] == 0
    r = recipe(NAME)
    manifest = oracle_run(r["version"], store, tmp_path, r["run_args"])
    msgs = {m["commitLogOffset"]: m for m in manifest if m["type"] == "message"}
    entries = [m for m in manifest if m["type"] == "cq_entry" and m["topic"] == "TopicH"]
    assert len(entries) == 24
    for e in entries:  # every entry RocketMQ reads points at the record with that queue id and queue offset
        m = msgs[e["commitLogOffset"]]
        assert (m["queueId"], m["queueOffset"]) == (e["queueId"], e["queueOffset"])


def test_a_deleted_topic_is_not_resurrected(tmp_path):
    store = copy_store(NAME, tmp_path / "store")
    (store / "config").mkdir()
    (store / "config" / "topics.json").write_text(json.dumps({
        "topicConfigTable": {"TopicH": {"topicName": "TopicH", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}},
        "dataVersion": {"counter": 1, "timestamp": 0}}))
    for p in sorted((store / "consumequeue" / "TopicGone").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (store / "consumequeue" / "TopicGone").rmdir()
    doc = json.loads(_run("verify", store, "-f", "json", "-q").stdout)
    gone = [f for f in doc["findings"] if f["kind"] == "cq_topic_deleted"]
    assert len(gone) == 1 and gone[0]["severity"] == "info" and "4 record(s) of TopicGone" in gone[0]["detail"]
    assert _run("repair", store, "--apply", "--backup-dir", tmp_path / "bk", "-q").exit_code == 0
    assert not (store / "consumequeue" / "TopicGone").exists()
    assert (store / "consumequeue" / "TopicH" / "1").is_dir()


# --- a queue whose only file is zero-length and whose first record the repair replaced with a filler ----------

FILLED = "498-healthy-tx-v6"


def _filled_queue_store(tmp_path):
    """TopicA/0 of a RocketMQ store: its first record's body damaged (salvage writes a filler in its place, which
    is not dispatched) and its consume-queue file cut to zero bytes (a crash between creating and extending it),
    as a fresh oracle-matrix store first showed."""
    from oracle.scenarios import _body_pos

    store = copy_store(FILLED, tmp_path / "store")
    msgs = [m for m in fixture_manifest(FILLED) if m["type"] == "message" and m["topic"] == "TopicA"
            and m["queueId"] == 0]
    first, second = sorted(msgs, key=lambda m: m["queueOffset"])[:2]
    assert (first["queueOffset"], second["queueOffset"]) == (0, 1)
    seg = store / "commitlog" / first["file"]
    data = bytearray(seg.read_bytes())
    data[_body_pos(first)] ^= 1
    seg.write_bytes(bytes(data))
    cq = next((store / "consumequeue" / "TopicA" / "0").iterdir())
    cq.write_bytes(b"")
    return store, first, second


def test_repair_numbers_a_recreated_queue_from_its_records(tmp_path):
    """RocketMQ's first dispatch into a queue with no file creates it with placeholders up to the record's queue
    offset (``fillPreBlank``); repair put queue offset 1's unit at position 0 (cq_entry_misplaced after it)."""
    import struct

    store, first, second = _filled_queue_store(tmp_path)
    res = _run("repair", store, "--apply", "--salvage", "filler", "--backup-dir", tmp_path / "bk", "-q")
    assert res.exit_code == 0, res.output
    doc = json.loads(_run("verify", store, "-f", "json", "-q").stdout)
    assert [f for f in doc["findings"] if f["severity"] == "error"] == []
    raw = next((store / "consumequeue" / "TopicA" / "0").iterdir()).read_bytes()
    assert struct.unpack_from(">qiq", raw, 0) == (0, 0x7FFFFFFF, 0)  # the filler's slot: a placeholder
    assert struct.unpack_from(">qi", raw, 20) == (second["commitLogOffset"], second["storeSize"])
    r = recipe(FILLED)
    manifest = oracle_run(r["version"], store, tmp_path, r["run_args"])
    entries = {e["queueOffset"]: e["commitLogOffset"] for e in manifest
               if e["type"] == "cq_entry" and (e["topic"], e["queueId"]) == ("TopicA", 0)}
    assert entries.get(1) == second["commitLogOffset"]
