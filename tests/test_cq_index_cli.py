"""`rmqdump cq`, `rmqdump index` and store geometry (inference, checks, overrides, broker.conf)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner
from test_lookup import fixture_specs

from conftest import FIXTURES, manifest, real_store
from rmqdump.cli import cli
from rmqdump.errors import FormatError
from rmqdump.store.geometry import parse_broker_conf, parse_java_properties, resolve_geometry
from rmqdump.store.root import Store

CLEAN = "clean"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def lines(name, kind):
    return [x for x in manifest(name) if x["type"] == kind]


def jsonl(result) -> list[dict]:
    return [json.loads(x) for x in result.stdout.splitlines() if x.strip()]


# --- cq ------------------------------------------------------------------------------------


def test_every_cq_entry_equals_rmqdump_cq():
    store = real_store(CLEAN)
    r = run("cq", store, "--entries", "-f", "jsonl")
    assert r.exit_code == 0, r.stderr
    got = [(e["topic"], e["queue_id"], e["queue_offset"], e["commit_log_offset"], e["size"], e["tags_code"])
           for e in jsonl(r)]
    want = [(e["topic"], e["queueId"], e["queueOffset"], e["commitLogOffset"], e["size"], e["tagsCode"])
            for e in lines(CLEAN, "cq_entry")]
    assert len(got) == len(want) == 232 and Counter(got) == Counter(want)
    assert all(e["status"] == "valid" for e in jsonl(r))
    # one queue at a time: entries are the default output, in queue-offset order
    for topic, qid in sorted({(e[0], e[1]) for e in want}):
        r = run("cq", store, "--topic", topic, "--queue", qid, "-f", "jsonl")
        assert r.exit_code == 0
        assert [tuple(e[k] for k in ("topic", "queue_id", "queue_offset", "commit_log_offset", "size", "tags_code"))
                for e in jsonl(r)] == sorted(x for x in want if (x[0], x[1]) == (topic, qid))


def test_cq_summary_matches_rocketmq_queues():
    store = real_store(CLEAN)
    r = run("cq", store, "-f", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["file_size"] == 600 and doc["file_size_source"] == "files" and not doc["errors"]
    ours = {(q["topic"], q["queue_id"]): q for q in doc["queues"]}
    for q in lines(CLEAN, "cq_queue"):
        mine = ours.pop((q["topic"], q["queueId"]), None)
        if mine is None:  # RocketMQ lists queues it only holds in memory (no directory, no entry)
            assert q["maxOffsetInQueue"] == 0 and q["maxPhysicOffset"] == -1
            continue
        assert (mine["min_offset"], mine["max_offset"], mine["max_physic_offset"]) == \
            (q["minOffsetInQueue"], q["maxOffsetInQueue"], q["maxPhysicOffset"])
        assert mine["holes"] == 0 and not mine["missing_files"] and not mine["truncated_by_recovery"]
    assert not ours
    two_files = [q for q in doc["queues"] if q["topic"] == "TopicTest"]
    assert all(len(q["files"]) == 2 for q in two_files)
    r = run("cq", store, "--topic", "TopicTest", "-f", "table")
    assert r.exit_code == 0 and "TopicTest" in r.stdout and "TopicOrder" not in r.stdout


def test_cq_findings_and_errors(store_copy):
    store = store_copy(CLEAN)
    qdir = store / "consumequeue" / "TopicTest" / "0"
    data = bytearray((qdir / "00000000000000000000").read_bytes())
    data[5 * 20:6 * 20] = bytes(20)  # a hole at queue offset 5 (an entry never written)
    (qdir / "00000000000000000000").write_bytes(bytes(data))
    r = run("cq", store, "--topic", "TopicTest", "--summary", "-f", "json")
    assert r.exit_code == 1
    (q0,) = [q for q in json.loads(r.stdout)["queues"] if q["queue_id"] == 0]
    # the broker's recovery scans from the third-last file; with two files it stops at the hole
    assert q0["max_offset"] == 5 and q0["truncated_by_recovery"] == ["00000000000000000600"]
    r = run("cq", store, "--topic", "TopicTest", "--queue", 0, "--raw", "-f", "jsonl")
    raw = jsonl(r)
    assert len(raw) == 32 and 5 not in [e["queue_offset"] for e in raw]  # the units past the hole are still shown
    for args in (("--topic", "Nope"), ("--topic", "TopicTest", "--queue", 7), ("-f", "csv")):
        r = run("cq", store, *args)
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 or "Usage" in r.stderr, args


def test_fixture_cq_entries_follow_the_specs():
    store = FIXTURES / "store"
    specs = fixture_specs()
    want = Counter((s["topic"], s["queue_id"]) for s in specs if s["tx"] in (0, 8))
    r = run("cq", store, "--entries", "-f", "jsonl")
    assert r.exit_code == 0
    rows = jsonl(r)
    assert Counter((e["topic"], e["queue_id"]) for e in rows) == want
    r = run("cq", store, "-f", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["file_size"] == 600
    assert {(q["topic"], q["queue_id"]): q["max_offset"] for q in doc["queues"]} == dict(want)


# --- index ---------------------------------------------------------------------------------


def test_index_summary_on_the_real_store():
    store = real_store(CLEAN)
    (hdr,) = lines(CLEAN, "index_file")
    r = run("index", store, "-f", "json")
    assert r.exit_code == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["geometry"] == {"hash_slot_num": 500, "index_num": 2000, "source": "files"}
    (f,) = doc["files"]
    assert f["file"] == hdr["file"] and f["size"] == 40 + 500 * 4 + 2000 * 20
    assert (f["begin_timestamp"], f["end_timestamp"], f["begin_phy_offset"], f["end_phy_offset"], f["hash_slot_count"],
            f["index_count"]) == (hdr["beginTimestamp"], hdr["endTimestamp"], hdr["beginPhyOffset"],
                                  hdr["endPhyOffset"], hdr["hashSlotCount"], hdr["indexCount"])
    assert f["used_slots"] == hdr["hashSlotCount"] and f["problems"] == [] and f["broken_links"] == 0
    hist = {int(k): v for k, v in f["chain_length_histogram"].items()}
    assert sum(hist.values()) == f["used_slots"]
    assert sum(k * v for k, v in hist.items()) == hdr["indexCount"] - 1  # every entry in exactly one chain
    # independent: entries per (topic#key) from the manifest's records
    per_key = Counter()
    for m in lines(CLEAN, "message"):
        if m["tranType"] != 12:
            for k in ([m["uniqKey"]] if m.get("uniqKey") else []) + [x for x in (m.get("keys") or "").split(" ") if x]:
                per_key[m["topic"] + "#" + k] += 1
    assert sum(per_key.values()) == hdr["indexCount"] - 1
    assert not f["deleted_by_abnormal_restart"] and not f["full"]
    r = run("index", store, "-f", "table")
    assert r.exit_code == 0 and "chain length" in r.stdout and "500 slots / 2000 entries (files)" in r.stdout


def test_index_analysis_without_numpy_is_identical(monkeypatch):
    import builtins

    from rmqdump.analysis.dumps import analyse_index_file
    from rmqdump.store.indexfile import IndexFile, list_index_files

    real_import = builtins.__import__

    def no_numpy(mod, *a, **k):
        if mod == "numpy":
            raise ImportError("numpy hidden")
        return real_import(mod, *a, **k)

    for name in (CLEAN, "crash_kill9"):
        (path,) = list_index_files(real_store(name))
        with IndexFile(path) as f:
            fast = analyse_index_file(f)
            with monkeypatch.context() as m:
                m.setattr(builtins, "__import__", no_numpy)
                slow = analyse_index_file(f)
        assert fast == slow and fast["problems"] == []


def test_index_entries_and_abnormal_restart_marker():
    store = real_store("crash_kill9")
    (hdr,) = lines("crash_kill9_after_rocketmq_recovery", "index_file")
    r = run("index", store, "-f", "json")
    (f,) = json.loads(r.stdout)["files"]
    assert f["deleted_by_abnormal_restart"] and f["problems"] == []
    # RocketMQ rebuilt the (deleted) index after recovery: same entries, so same counts
    assert (f["index_count"], f["hash_slot_count"], f["end_phy_offset"]) == \
        (hdr["indexCount"], hdr["hashSlotCount"], hdr["endPhyOffset"])
    r = run("index", store, "--entries", "-f", "jsonl")
    rows = jsonl(r)
    assert [e["number"] for e in rows] == list(range(1, hdr["indexCount"]))
    assert all(e["slot"] == e["key_hash"] % 500 and 0 <= e["prev_index"] < e["number"] for e in rows)
    r = run("index", store, "--entries", "--file", "nope")
    assert r.exit_code == 2


def test_index_on_the_fixture_store():
    store = FIXTURES / "store"
    specs = fixture_specs()
    expected_entries = sum(len(s["keys"]) + (1 if s["uniq"] else 0) for s in specs if s["tx"] != 0xC)
    r = run("index", store, "-f", "json")
    assert r.exit_code == 0
    (f,) = json.loads(r.stdout)["files"]
    assert f["entries"] == expected_entries and f["problems"] == []
    hist = {int(k): v for k, v in f["chain_length_histogram"].items()}
    assert sum(k * v for k, v in hist.items()) == expected_entries


def test_wrong_geometry_is_detected(tmp_path):
    store = real_store(CLEAN)
    # 400 slots + 2020 entries also makes 42,040 bytes, but the data says otherwise
    r = run("index", store, "--index-slots", 400, "-f", "json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["geometry"] == {"hash_slot_num": 400, "index_num": 2020, "source": "option"}
    assert doc["files"][0]["problems"]
    r = run("index", store, "--index-slots", 500, "--index-entries", 2000, "-f", "json")
    assert r.exit_code == 0
    r = run("index", store, "--index-entries", 1999)  # fits the size with 505 slots, but not the data
    assert r.exit_code == 1 and json.loads(r.stdout)["geometry"]["hash_slot_num"] == 505
    r = run("index", store, "--index-entries", 3000)
    assert r.exit_code == 2 and "does not fit 3000 entries" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    conf = tmp_path / "broker.conf"
    conf.write_text("# the shared broker\nmaxHashSlotNum=500\nmaxIndexNum=2000\nmappedFileSizeConsumeQueue=590\n")
    r = run("index", store, "--broker-config", conf, "-f", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["geometry"]["source"] == "broker.conf"
    r = run("cq", store, "--broker-config", conf, "-f", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["file_size"] == 600  # 590 rounds up to 600 like the getter
    conf.write_text("maxHashSlotNum=5000000\n")  # maxIndexNum stays at its default 20,000,000
    r = run("index", store, "--broker-config", conf, "-f", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["geometry"]["source"] == "files"
    assert "inferring from the files" in doc["geometry_problems"][0]


def test_geometry_inference_from_files():
    st = Store.open(real_store(CLEAN))
    g = resolve_geometry(st.root, commitlog_file_size=st.commitlog.file_size)
    assert (g.commitlog_file_size, g.cq_file_size, g.index_hash_slot_num, g.index_num) == (262144, 600, 500, 2000)
    assert g.sources["commitlog"] == g.sources["consumequeue"] == g.sources["index"] == "files"
    st = Store.open(FIXTURES / "store")
    g = resolve_geometry(st.root, commitlog_file_size=st.commitlog.file_size)
    assert (g.commitlog_file_size, g.cq_file_size, g.index_hash_slot_num, g.index_num) == (4096, 600, 500, 2000)


def test_java_properties_and_broker_conf(tmp_path):
    text = ("# comment\n! also a comment\n  brokerName = broker-a\nkey\\ with\\ spaces:v\n"
            "multi = one \\\n    two\nunicode=\\u00e9t\\u00e9\nmaxMessageSize 200000\n"
            "maxIndexNum=2000 \nmessageDelayLevel=1s 5s 2h\nempty=\n")
    props = parse_java_properties(text)
    assert props["brokerName"] == "broker-a" and props["key with spaces"] == "v" and props["multi"] == "one two"
    assert props["unicode"] == "été" and props["maxIndexNum"] == "2000 " and props["empty"] == ""
    p = tmp_path / "broker.conf"
    p.write_text(text + "maxHashSlotNum=5x\nmappedFileSizeConsumeQueue=6000001\n", encoding="latin-1")
    conf = parse_broker_conf(p)
    assert conf.max_message_size == 200000 and conf.message_delay_level == "1s 5s 2h"
    assert conf.delay_levels_ms == [1000, 5000, 7200000]
    assert conf.mapped_file_size_consume_queue == 6000020
    # Integer.parseInt("2000 ") and ("5x") fail; MixAll.properties2Object swallows it: defaults stay
    assert conf.max_index_num is None and conf.max_hash_slot_num is None and len(conf.problems) == 2
    with pytest.raises(FormatError):
        p.write_text("a=\\u12G4\n")
        parse_broker_conf(p)


def test_index_damage_is_reported(store_copy):
    import struct

    from rmqdump.store.indexfile import IndexFile

    store = store_copy(CLEAN)
    (path,) = (store / "index").iterdir()
    with IndexFile(path) as f:
        pos = f.geometry.entry_pos(300) + 16  # prevIndex of entry 300
        slot_pos = f.geometry.slot_pos(7)
    data = bytearray(path.read_bytes())
    data[pos:pos + 4] = struct.pack(">i", 299)
    data[slot_pos:slot_pos + 4] = struct.pack(">i", 5000)
    path.write_bytes(bytes(data))
    r = run("index", store, "-f", "json")
    assert r.exit_code == 1
    problems = json.loads(r.stdout)["files"][0]["problems"]
    assert any("prevIndex is not the previous entry" in p and "entry 300 prevIndex 299" in p for p in problems)
    assert any("slot 7 = 5000, outside [0, indexCount 602)" in p for p in problems)
