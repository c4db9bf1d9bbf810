"""`rmqdump append` never writes a record the store's broker version cannot read.

A 4.x broker's recovery truncates the commitlog at the first V2-magic record (topic over 127
chars), dropping it and every later record; so V2 is written only with evidence that a 5.x broker
owns the store (a V2 record already there, a file only 5.x creates) or ``--broker-version 5``.
Stores: ``fixtures/oracle/*`` (written by RocketMQ 4.9.8 / 5.3.3's own store code); judged by
RocketMQ's ``run`` when ``../shared/oracle`` and java are there.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, oracle_run, recipe, tree_state

from rmqdump.broker.recovery import predict_recovery_auto
from rmqdump.broker.version import BrokerVersionError
from rmqdump.cli import cli
from rmqdump.store.root import Store
from rmqdump.write.appender import LockedAppender, StoreGeometry, bulk_append
from rmqdump.write.writer import MessageSpec

GEO = StoreGeometry(65536, 320, 64, 256)
LONG = "L" * 130  # 130 UTF-16 units: the V2 magic
V2_MAGIC = "0xDAA320AB"


def run(*args, input=None):
    return CliRunner().invoke(cli, list(map(str, args)), input=input)


def acks(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def model(store) -> str:
    return predict_recovery_auto(Store.open(store))[0].version


def refused(out) -> str:
    """The one-line error of a refused append (exit 2)."""
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0], out.output
    return lines[0]


# --- 4.9.8 store: refused, byte-identical -------------------------------------------------------------------


def test_v2_topic_refused_on_a_498_store(tmp_path):
    store = copy_store("498-multi-topic", tmp_path / "s")
    before = tree_state(store)
    msg = refused(run("append", store, "--topic", LONG, "--body", "x"))
    assert "V2" in msg and "4.x broker" in msg and "--broker-version 5" in msg
    assert tree_state(store) == before  # every file and directory byte-identical
    assert model(store) == "4.9"


def test_dry_run_refuses_too(tmp_path):
    store = copy_store("498-multi-topic", tmp_path / "s")
    before = tree_state(store)
    refused(run("append", store, "--topic", LONG, "--body", "x", "--dry-run"))
    assert tree_state(store) == before


@pytest.mark.parametrize("via", ["file", "stdin"])
def test_bulk_jsonl_with_one_v2_record_writes_nothing(tmp_path, via):
    """The V2 record is the third of three: the first two are not written either."""
    store = copy_store("498-multi-topic", tmp_path / "s")
    before = tree_state(store)
    rows = [{"topic": "TopicA", "body": "b2s=", "keys": ["bulk1"]}, {"topic": "TopicC", "body": "b2s="},
            {"topic": LONG, "body": "b2s="}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if via == "file":
        src = tmp_path / "in.jsonl"
        src.write_text(text)
        out = run("append", store, "--jsonl", src, "--batch-bytes", "1")
    else:
        out = run("append", store, "--jsonl", "-", "--batch-bytes", "1", input=text)
    msg = refused(out)
    assert "JSONL line 3" in msg and "V2" in msg
    assert tree_state(store) == before
    # --topic overrides every record's topic: checked once, refused as well
    refused(run("append", store, "--jsonl", "-", "--topic", LONG, input=text))
    assert tree_state(store) == before


def test_bulk_append_api_checks_every_record_first(tmp_path):
    store = copy_store("498-multi-topic", tmp_path / "s")
    before = tree_state(store)
    gen = (MessageSpec(t, b"x") for t in ("TopicA", "TopicA", LONG))
    with pytest.raises(BrokerVersionError, match="record 2"):
        bulk_append(store, gen, batch_bytes=1)
    with pytest.raises(BrokerVersionError):
        bulk_append(store, [{"topic": "TopicA", "body": "eA=="}, {"topic": LONG, "body": "eA=="}], batch_bytes=1)
    with pytest.raises(BrokerVersionError), LockedAppender(store) as app:
        app.append(MessageSpec(LONG, b"x"))
    assert tree_state(store) == before


def test_new_store_defaults_to_4x_and_explicit_5_writes_v2(tmp_path):
    """A store rmqdump creates has no evidence of 5.x: V2 only when told."""
    with pytest.raises(BrokerVersionError):
        bulk_append(tmp_path / "n", [MessageSpec(LONG, b"x")], create=True, geometry=GEO)
    assert not [p for p in (tmp_path / "n").rglob("*") if p.is_file() and p.name != "lock"]  # no record
    res = bulk_append(tmp_path / "n5", [MessageSpec(LONG, b"x")], create=True, geometry=GEO, broker_version="5")
    assert res.records == 1 and model(tmp_path / "n5") == "5.3"


def test_append_into_498_store_read_back_by_rocketmq_498(tmp_path):
    """What rmqdump appends to a 4.9.8 store, RocketMQ 4.9.8 recovers and reads: message, cq_entry, index hits."""
    store = copy_store("498-multi-topic", tmp_path / "s")
    out = run("append", store, "--topic", "TopicA", "--queue", "1", "--tags", "TagA", "--keys", "ap1",
              "--body", "appended one", "--uniq-key", "APPEND-0001", "-f", "jsonl")
    assert out.exit_code == 0, out.output
    got = acks(out.output)
    rows = [{"topic": "TopicB", "queue_id": 1, "body": "YnVsaw==", "keys": [f"ap{i}"],
             "properties": {"UNIQ_KEY": f"APPEND-B{i}", "KEYS": f"ap{i}"}} for i in (2, 3)]
    out = run("append", store, "--jsonl", "-", "-f", "jsonl", input="".join(json.dumps(r) + "\n" for r in rows))
    assert out.exit_code == 0, out.output
    got += acks(out.output)
    assert len(got) == 3
    assert run("verify", store, "-q").exit_code == 0 and model(store) == "4.9"
    man = oracle_run("498", store, tmp_path, recipe("498-multi-topic")["run_args"])
    info = next(r for r in man if r["type"] == "store_info")
    end = max(a["offset"] + a["size"] for a in got)
    assert info["commitlog_max_offset_after_recovery"] == end
    msgs = {r["commitLogOffset"]: r for r in man if r["type"] == "message"}
    cq = {(r["topic"], r["queueId"], r["queueOffset"]): r for r in man if r["type"] == "cq_entry"}
    hits = {(r["topic"], r["key"]): r["phyOffsets_in_returned_order"] for r in man if r["type"] == "index_query"}
    for a, key in zip(got, ("ap1", "ap2", "ap3"), strict=True):
        m = msgs[a["offset"]]
        assert (m["topic"], m["queueId"], m["queueOffset"], m["uniqKey"]) == \
            (a["topic"], a["queue_id"], a["queue_offset"], a["uniq_key"])
        assert m["crc_recomputed_ok"] is True and m["magicCode"] != V2_MAGIC
        e = cq[(a["topic"], a["queue_id"], a["queue_offset"])]
        assert (e["commitLogOffset"], e["size"]) == (a["offset"], a["size"])
        assert a["offset"] in hits[(a["topic"], key)]
        assert a["offset"] in hits[(a["topic"], a["uniq_key"])]


# --- 5.3.3 stores ---------------------------------------------------------------------------------------------


def _read_back_v2(tmp_path, store, fixture, ack):
    man = oracle_run("533", store, tmp_path, recipe(fixture)["run_args"])
    info = next(r for r in man if r["type"] == "store_info")
    assert info["commitlog_max_offset_after_recovery"] == ack["offset"] + ack["size"]
    m = next(r for r in man if r["type"] == "message" and r["commitLogOffset"] == ack["offset"])
    assert (m["topic"], m["magicCode"], m["messageVersion"]) == (LONG, V2_MAGIC, "V2")
    assert any(r["type"] == "cq_entry" and r["topic"] == LONG and r["commitLogOffset"] == ack["offset"]
               for r in man)
    q = next(r for r in man if r["type"] == "index_query" and r["topic"] == LONG and r["key"] == "v2key")
    assert ack["offset"] in q["phyOffsets_in_returned_order"]


def test_533_store_without_5x_evidence_needs_broker_version_5(tmp_path):
    """533/put with one plain message leaves nothing only 5.x writes (abort.bak is not evidence):
    auto refuses; --broker-version 5 writes a V2 record RocketMQ 5.3.3 reads back as V2."""
    store = copy_store("533-plain", tmp_path / "s")
    before = tree_state(store)
    assert (store / "abort.bak").exists()
    refused(run("append", store, "--topic", LONG, "--body", "x"))
    refused(run("append", store, "--topic", LONG, "--body", "x", "--broker-version", "4.9"))
    assert tree_state(store) == before
    out = run("append", store, "--topic", LONG, "--body", "v2 body", "--keys", "v2key", "--broker-version", "5",
              "-f", "jsonl")
    assert out.exit_code == 0, out.output
    (ack,) = acks(out.output)
    _read_back_v2(tmp_path, store, "533-plain", ack)


@pytest.mark.parametrize("fixture", ["533-v2", "533-batchcq"])
def test_533_store_with_5x_evidence_takes_v2_and_keeps_its_model(tmp_path, fixture):
    """A V2 record already there (533-v2) or batchconsumequeue/ (533-batchcq): auto appends V2, and the
    model verify applies is the 5.x one before and after — rmqdump's write does not change it."""
    store = copy_store(fixture, tmp_path / "s")
    assert model(store) == "5.3"
    out = run("append", store, "--topic", LONG, "--body", "v2 body", "--keys", "v2key", "-f", "jsonl")
    assert out.exit_code == 0, out.output
    (ack,) = acks(out.output)
    assert model(store) == "5.3"
    v = json.loads(run("verify", store, "-q", "-f", "json").output)
    assert v["summary"]["broker_model"] == "5.3"
    # an explicit 4.9 still refuses
    before = tree_state(store)
    refused(run("append", store, "--topic", LONG, "--body", "x", "--broker-version", "4.9"))
    assert tree_state(store) == before
    _read_back_v2(tmp_path, store, fixture, ack)
