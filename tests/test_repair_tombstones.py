"""Salvage keeps every queue consistent: a destroyed message its ConsumeQueue entry still points at
becomes a tombstone of its own topic, queue and queue offset (TAGS and LMQ targets kept), not a
filler of another topic served to that queue's consumers.

``fixtures/oracle/498-flip-body-mid``: 20 records written by RocketMQ 4.9.8 (tags, keys, LMQ
multi-dispatch), then the magic of the record at 1862 zeroed and a body bit of the LMQ record at
2298 flipped; RocketMQ's recovery would end the commitlog at 1862 and lose 12 records.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_manifest, oracle_run, recipe

from rmqdump.cli import cli
from rmqdump.codec.encoder import FILLER_BODY_PREFIX
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueue

NAME = "498-flip-body-mid"
DAMAGED = {1862: ("TopicF", 0, 4, None), 2298: ("TopicF", 0, 5, "%LMQ%roomF")}


def _repair(store, tmp_path, salvage: str):
    res = CliRunner().invoke(cli, ["repair", str(store), "--apply", "--salvage", salvage, "--backup-dir",
                                   str(tmp_path / "bk"), "-q"])
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.parametrize("salvage", ["filler", "recrc"])
def test_tombstones_take_the_destroyed_messages_place(tmp_path, salvage):
    store = copy_store(NAME, tmp_path / "store")
    _repair(store, tmp_path, salvage)
    recs = {m.offset: m for m in CommitLog.open(store).walk(check_crc=True) if isinstance(m, Message)}
    assert len(recs) == 20  # nothing lost after the damage
    for off, (topic, qid, qoff, lmq) in DAMAGED.items():
        if salvage == "recrc" and off == 2298:  # only its body CRC was wrong: kept, flipped bit and all
            assert recs[off].body.startswith(b"salvage body 14 salvage body 10")
            continue
        t = recs[off]
        assert (t.topic, t.queue_id, t.queue_offset, t.body[:len(FILLER_BODY_PREFIX)]) == (topic, qid, qoff,
                                                                                           FILLER_BODY_PREFIX)
        assert t.properties.get("TAGS") == ("tag2" if off == 1862 else "tag1")  # from the damaged bytes
        assert t.properties.get("INNER_MULTI_DISPATCH") == lmq
        assert ConsumeQueue.open(store, topic, qid).entry_at(qoff).commit_log_offset == off
    doc = json.loads(CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q"]).stdout)
    errors = [f for f in doc["findings"] if f["severity"] == "error" and f["kind"] != "index_key_mismatch"]
    assert errors == []


def test_rocketmq_serves_the_tombstone_at_the_queue_offset(tmp_path):
    store = copy_store(NAME, tmp_path / "store")
    _repair(store, tmp_path, "filler")
    r = recipe(NAME)
    manifest = oracle_run(r["version"], store, tmp_path,
                          [*r["run_args"], *(f"--set={k}={v}" for k, v in r["run_sets"].items())])
    info = next(m for m in manifest if m["type"] == "store_info")
    assert info["commitlog_max_offset_after_recovery"] == max(
        m["commitLogOffset"] + m["storeSize"] for m in manifest if m["type"] == "message")
    entries = {(m["topic"], m["queueId"], m["queueOffset"]): m["commitLogOffset"] for m in manifest
               if m["type"] == "cq_entry"}
    msgs = {m["commitLogOffset"]: m for m in manifest if m["type"] == "message"}
    assert len(msgs) == 20 and len(fixture_manifest(NAME)) > 0
    for off, (topic, qid, qoff, lmq) in DAMAGED.items():
        assert entries[(topic, qid, qoff)] == off
        assert msgs[off]["topic"] == topic and msgs[off]["crc_recomputed_ok"]
        if lmq:
            assert any(k[0] == lmq and v == off for k, v in entries.items())
