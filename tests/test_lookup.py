"""`rmqdump lookup` and rmqdump.analysis.lookup against the real RocketMQ 4.9.8 stores and the fixture store.

Expectations come from the manifests RocketMQ's own classes wrote (message, cq_entry and
index_query lines) and, for the fixture store, from the specs in scripts/make_fixtures.py —
never from rmqdump's decoder.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REPO, manifest, real_store
from rmqdump.analysis.lookup import lookup_key, lookup_msg_id, lookup_queue, lookup_uniq_key
from rmqdump.cli import cli
from rmqdump.codec.javahash import index_key_hash
from rmqdump.store.indexfile import IndexBuilder

CLEAN = "clean"


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def offsets(result) -> list[int]:
    return [json.loads(line)["offset"] for line in result.stdout.splitlines() if line.strip()]


def lines(name: str, kind: str) -> list[dict]:
    return [x for x in manifest(name) if x["type"] == kind]


def split_keys(keys: str | None) -> list[str]:
    """Java ``keys.split(" ")`` minus empty elements (what IndexService indexes)."""
    return [k for k in (keys or "").split(" ") if k]


def expected_hits(messages: list[dict], topic: str | None, key: str) -> list[int]:
    """Offsets (newest first) of manifest records of ``topic`` whose KEYS or UNIQ_KEY contains ``key``."""
    return sorted((m["commitLogOffset"] for m in messages
                   if (topic is None or m["topic"] == topic)
                   and (key in split_keys(m.get("keys")) or key == m.get("uniqKey"))), reverse=True)


def colliding(key: str) -> str | None:
    """Another string with the same Java hashCode (adjacent chars a,b -> a+1, b-31)."""
    for i in range(len(key) - 1):
        a, b = ord(key[i]), ord(key[i + 1])
        if b >= 31 + 0x21 and a + 1 < 0xD800 and not 0xD800 <= b <= 0xDFFF and not 0xD800 <= a <= 0xDFFF:
            return key[:i] + chr(a + 1) + chr(b - 31) + key[i + 2:]
    return None


# --- every index query of the manifest ------------------------------------------------------


def test_every_index_query_of_the_manifest():
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    uniq = {m["uniqKey"] for m in msgs if m.get("uniqKey")}
    queries = lines(CLEAN, "index_query")
    assert len(queries) == 452
    for q in queries:
        want = expected_hits(msgs, q["topic"], q["key"])
        assert want, q
        opt = "--uniq-key" if q["key"] in uniq else "--key"
        r = run("lookup", store, opt, q["key"], "--topic", q["topic"], "-f", "jsonl")
        assert r.exit_code == 0, (q, r.stderr)
        got = offsets(r)
        assert got == want, q  # exactly the matching records, newest first, each once
        # RocketMQ's raw answer: the same records (in this store no other key shares a hash)
        raw = q["phyOffsets_in_returned_order"]
        assert set(raw) == set(want)
        assert "via the index" in r.stderr and "commitlog scan" not in r.stderr
        for line in r.stdout.splitlines():
            rec = json.loads(line)
            assert rec["topic"] == q["topic"] and (q["key"] in rec["keys"] or q["key"] == rec["uniq_key"])


def test_hash_collisions_are_counted_never_returned():
    """A key with the same 31-bit hash reaches exactly the records RocketMQ would return for it."""
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    real_keys = {(m["topic"], k) for m in msgs for k in split_keys(m.get("keys")) + [m.get("uniqKey") or ""]}
    checked = 0
    for q in lines(CLEAN, "index_query"):
        other = colliding(q["key"])
        if other is None or (q["topic"], other) in real_keys:
            continue
        assert index_key_hash(f"{q['topic']}#{other}") == index_key_hash(q["indexKey"])
        res = lookup_key(store, q["topic"], other)
        assert res.hits == [] and res.source == "index"
        # what the broker's queryOffset returns for this key = RocketMQ's raw list for the original
        assert sorted((c.offset for c in res.collisions), reverse=True) == \
            sorted(set(q["phyOffsets_in_returned_order"]), reverse=True)
        assert all(c.reason == "key differs" and c.topic == q["topic"] for c in res.collisions)
        checked += 1
    assert checked > 400


def test_cross_topic_collision_cli():
    store = real_store(CLEAN)
    # "TopicTetU#key-0" has the hashCode of "TopicTest#key-0": another topic's record in the chain
    assert index_key_hash("TopicTetU#key-0") == index_key_hash("TopicTest#key-0")
    r = run("lookup", store, "--key", "key-0", "--topic", "TopicTetU", "-f", "jsonl")
    assert r.exit_code == 1 and r.stdout == ""
    assert "1 hash collision skipped" in r.stderr
    r = run("lookup", store, "--key", "key-0", "--topic", "TopicTetU", "-f", "jsonl", "--show-collisions")
    assert r.exit_code == 1 and r.stdout == ""
    assert "collision: offset 0: topic differs: topic 'TopicTest'" in r.stderr


def test_uniq_key_without_topic_finds_every_copy():
    """Retries and delay-topic copies keep UNIQ_KEY: without --topic all of them are found."""
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    by_uniq = defaultdict(list)
    for m in msgs:
        if m.get("uniqKey"):
            by_uniq[m["uniqKey"]].append(m["commitLogOffset"])
    multi = [u for u, offs in by_uniq.items() if len(offs) > 1]
    assert multi  # e.g. the RECONSUME_LATER retries and delayed deliveries
    for u in multi:
        r = run("lookup", store, "--uniq-key", u, "-f", "jsonl")
        assert r.exit_code == 0, r.stderr
        assert offsets(r) == expected_hits(msgs, None, u)
        assert "topics searched" in r.stderr


# --- msg id, queue, offset -------------------------------------------------------------------


def test_msg_id_and_queue_find_every_message():
    store = real_store(CLEAN)
    msgs = {m["commitLogOffset"]: m for m in lines(CLEAN, "message")}
    for off, m in msgs.items():
        r = run("lookup", store, "--msg-id", m["msgId_offset"], "-f", "jsonl", "--body", "base64")
        assert r.exit_code == 0, r.stderr
        (rec,) = [json.loads(x) for x in r.stdout.splitlines()]
        assert rec["offset"] == off and rec["topic"] == m["topic"] and rec["msg_id"] == m["msgId_offset"]
        assert rec["store_timestamp"] == m["storeTimestamp"] and rec["body"] == m["body_b64"]
        assert "warning" not in r.stderr
    entries = lines(CLEAN, "cq_entry")
    assert len(entries) == 232
    for e in entries:
        r = run("lookup", store, "--queue", e["topic"], e["queueId"], e["queueOffset"], "-f", "jsonl")
        assert r.exit_code == 0, r.stderr
        (rec,) = [json.loads(x) for x in r.stdout.splitlines()]
        m = msgs[e["commitLogOffset"]]
        assert rec["offset"] == e["commitLogOffset"] and rec["size"] == e["size"] == m["storeSize"]
        assert rec["topic"] == e["topic"] and rec["queue_id"] == e["queueId"] and rec["queue_offset"] == e["queueOffset"]
        assert rec["tags_code"] == e["tagsCode"]
    r = run("lookup", store, "--offset", 15458, "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == [15458]


@pytest.mark.parametrize("args", [
    ("--msg-id", "zz"),
    ("--msg-id", "7F00000100002A9F00000000000000GG"),
    ("--msg-id", "7F00000100002A9F0000000000000001"),  # mid-record
    ("--msg-id", "7F00000100002A9F00000000FFFFFFFF"),  # beyond the commitlog
    ("--uniq-key", "not-a-client-id"),
    ("--queue", "NoSuchTopic", "0", "0"),
    ("--queue", "TopicTest", "9", "0"),
    ("--queue", "TopicTest", "0", "33"),  # == max offset
    ("--queue", "TopicTest", "0", "-1"),
    ("--queue", "../TopicTest", "0", "0"),
    ("--offset", "1"),
    ("--offset", "99999999"),
])
def test_bad_inputs_exit_2_with_one_line(args):
    r = run("lookup", real_store(CLEAN), *args)
    assert r.exit_code == 2, (args, r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rmqdump: error: "), err
    assert r.stdout == ""


def test_usage_errors():
    store = real_store(CLEAN)
    for args in ((), ("--key", "a", "--offset", "0"), ("--offset", "0", "--topic", "T"), ("--msg-id", "x", "--max", 3),
                 ("--key", "key-0", "--begin", "2026-11-22", "--end", "2026-11-21")):
        r = run("lookup", store, *args)
        assert r.exit_code == 2, args


def test_msg_id_of_another_broker_warns():
    store = real_store(CLEAN)
    r = run("lookup", store, "--msg-id", "0A00000500002A9F0000000000000000", "-f", "jsonl")  # 10.0.0.5
    assert r.exit_code == 0 and offsets(r) == [0]
    assert "names store host 10.0.0.5:10911 but the record at offset 0 was stored by 127.0.0.1:10911" in r.stderr
    r = run("lookup", store, "--msg-id", "0A00000500002A9F00000000FFFFFFFF")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "outside the commitlog" in r.stderr and "probably another broker's id" in r.stderr


def test_index_entry_pointing_at_a_torn_record(store_copy):
    """crash_torn without its abort file: the index still names the zeroed last record."""
    store = store_copy("crash_torn")
    (store / "abort").unlink()
    m = next(x for x in lines(CLEAN, "message") if x["commitLogOffset"] == 396985)
    r = run("lookup", store, "--uniq-key", m["uniqKey"].lower(), "--topic", m["topic"], "-f", "jsonl")
    assert r.exit_code == 1 and r.stdout == ""
    assert "the index points at offset 396985, where no valid record starts" in r.stderr
    assert "index stale" not in r.stderr  # the walk from the index's end stops at the torn bytes


def test_damaged_body_is_still_found_with_a_warning():
    """corrupt_crc: one bit flipped in the body at 15458 (RocketMQ's recovery stops there)."""
    store = real_store("corrupt_crc")
    m = next(x for x in lines(CLEAN, "message") if x["commitLogOffset"] == 15458)
    key = split_keys(m["keys"])[0]
    r = run("lookup", store, "--key", key, "--topic", m["topic"], "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == [15458]
    assert "fails its body CRC" in r.stderr


# --- --max and the time window ---------------------------------------------------------------


@pytest.mark.parametrize("max_num", [1, 3, 9, 10, 11])
def test_max_stops_the_chain_walk_early_with_the_same_answer(monkeypatch, max_num):
    """--max ends the chain walk once max + 1 hits are confirmed in chain order; the answer is the full one's prefix."""
    import rmqdump.analysis.lookup as lib

    store = real_store(CLEAN)
    full = lookup_key(store, "TopicTest", "order-0")
    decoded: list[int] = []
    real_read = lib.read_message
    monkeypatch.setattr(lib, "read_message", lambda cl, off, **kw: decoded.append(off) or real_read(cl, off, **kw))
    res = lookup_key(store, "TopicTest", "order-0", max_num=max_num)
    want = [m.offset for m in full.hits]
    assert [m.offset for m in res.hits] == want[:max_num] and res.truncated == (len(want) > max_num)
    cut = want[max_num] if len(want) > max_num else -1
    assert [c.offset for c in res.collisions] == [c.offset for c in full.collisions if c.offset > cut]
    assert (res.source, res.reasons, res.unreadable) == (full.source, full.reasons, full.unreadable)
    assert len(decoded) == len(set(decoded))  # every record decoded once
    if max_num < 9:  # the walk stopped: older entries of the chain were never decoded
        assert min(decoded) == want[max_num]


def test_max_on_a_chain_out_of_commitlog_order_walks_it_all(tmp_path):
    """A chain whose offsets rise as it is read (not what a broker writes): no early stop, same answer."""
    from rmqdump.store.indexfile import IndexFile, IndexFileWriter

    store = tmp_path / "s"
    shutil.copytree(real_store(CLEAN), store)
    want = expected_hits(lines(CLEAN, "message"), "TopicTest", "order-0")
    (old,) = (store / "index").iterdir()
    with IndexFile(old) as f:
        h = f.header
        geo = f.geometry
    old.unlink()
    key_hash = index_key_hash("TopicTest#order-0")
    with IndexFileWriter.create(store / "index" / old.name, geo.hash_slot_num, geo.index_num) as w:
        read = [want[3], want[0], *want[4:], want[1], want[2]]  # chain order (newest entry first), rising once
        order = read[::-1]
        for off in order:
            w.put_hash(key_hash, off, h.begin_timestamp)
        w.header.end_phy_offset = h.end_phy_offset
    for max_num in (1, 2, 5):  # a stop after 3 entries would miss want[1] and want[2]
        res = lookup_key(store, "TopicTest", "order-0", max_num=max_num)
        assert [m.offset for m in res.hits] == want[:max_num] and res.truncated


def test_max_with_truncated_marker():
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    want = expected_hits(msgs, "TopicTest", "order-0")
    assert len(want) == 10
    r = run("lookup", store, "--key", "order-0", "--topic", "TopicTest", "--max", 3, "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == want[:3]
    assert "truncated: more than 3 records match" in r.stderr
    r = run("lookup", store, "--key", "order-0", "--topic", "TopicTest", "--max", 10, "-f", "jsonl", "-q")
    assert offsets(r) == want and "truncated" not in r.stderr
    r = run("lookup", store, "--key", "order-0", "--topic", "TopicTest", "--max", 9, "-f", "jsonl", "-q")
    assert offsets(r) == want[:9] and "truncated" in r.stderr  # the marker survives --quiet


def test_time_window_inside_the_index():
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    hits = [m for m in msgs if "order-0" in split_keys(m.get("keys")) and m["topic"] == "TopicTest"]
    ts = sorted(m["storeTimestamp"] for m in hits)
    lo, hi = ts[2], ts[6]
    want = sorted((m["commitLogOffset"] for m in hits if lo <= m["storeTimestamp"] <= hi), reverse=True)
    r = run("lookup", store, "--key", "order-0", "--topic", "TopicTest", "--begin", lo, "--end", hi, "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == want and len(want) == 5
    assert "commitlog scan" not in r.stderr


def test_time_window_outside_the_index_is_announced():
    store = real_store(CLEAN)
    (idx,) = lines(CLEAN, "index_file")
    r = run("lookup", store, "--key", "key-0", "--topic", "TopicTest", "--end", idx["beginTimestamp"] - 1)
    assert r.exit_code == 1 and r.stdout == ""
    assert "commitlog scan: index does not cover the time window" in r.stderr
    r = run("lookup", store, "--key", "key-0", "--topic", "TopicTest", "--begin", "2026-11-21T21:00:00Z",
            "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == [0]
    assert "does not cover the time window" in r.stderr


# --- fallbacks -------------------------------------------------------------------------------


def _sample(queries, n):
    return queries[:: max(1, len(queries) // n)]


def test_fallback_when_the_index_is_missing(store_copy):
    store = store_copy(CLEAN)
    shutil.rmtree(store / "index")
    msgs = lines(CLEAN, "message")
    for q in _sample(lines(CLEAN, "index_query"), 40):
        r = run("lookup", store, "--key", q["key"], "--topic", q["topic"], "-f", "jsonl")
        assert r.exit_code == 0
        assert offsets(r) == expected_hits(msgs, q["topic"], q["key"])
        assert "commitlog scan: index missing: no index/ directory" in r.stderr
    (store / "index").mkdir()
    r = run("lookup", store, "--key", "key-1", "--topic", "TopicTest", "-f", "jsonl")
    assert "index missing: index/ holds no files" in r.stderr and offsets(r) == expected_hits(msgs, "TopicTest", "key-1")


def test_fallback_when_recovery_would_delete_the_index(store_copy):
    store = store_copy(CLEAN)
    (store / "abort").write_bytes(b"")
    msgs = lines(CLEAN, "message")
    for q in _sample(lines(CLEAN, "index_query"), 20):
        r = run("lookup", store, "--key", q["key"], "--topic", q["topic"], "-f", "jsonl")
        assert offsets(r) == expected_hits(msgs, q["topic"], q["key"])
        assert "commitlog scan: index deleted by recovery: abort present" in r.stderr
        assert "via a commitlog scan" in r.stderr


def test_crash_kill9_real_crash_scans_and_matches_rocketmq_after_recovery():
    """The SIGKILLed broker: abort present, checkpoint zero, so its index file is doomed."""
    name = "crash_kill9_after_rocketmq_recovery"
    store = real_store("crash_kill9")
    msgs = lines(name, "message")
    queries = lines(name, "index_query")
    for q in _sample(queries, 30):
        want = expected_hits(msgs, q["topic"], q["key"])
        res = (lookup_uniq_key(store, q["key"], q["topic"]) if len(q["key"]) == 56
               else lookup_key(store, q["topic"], q["key"]))
        assert [m.offset for m in res.hits] == want, q
        raw = q["phyOffsets_in_returned_order"]  # RocketMQ's own answer: silently capped at 64
        assert raw == want[:len(raw)] and (len(raw) == len(want) or len(raw) == 64 < len(want))
        assert res.source == "scan" and any("index deleted by recovery" in x for x in res.reasons)


def _partial_index(store, msgs, keep) -> None:
    """Rebuild index/ from the manifest's records for which keep(offset) holds (RocketMQ's putKey rules)."""
    shutil.rmtree(store / "index")
    with IndexBuilder(store / "index", 500, 2000, clock_ms=lambda: 1795297369000, utc=True) as b:
        for m in msgs:
            if keep(m["commitLogOffset"]):
                b.add_message(m["topic"], m.get("uniqKey"), m.get("keys"), m["commitLogOffset"], m["storeTimestamp"],
                              m["tranType"])


def test_stale_index_scans_only_the_tail_and_merges(store_copy):
    store = store_copy(CLEAN)
    msgs = lines(CLEAN, "message")
    split = 34000  # inside the TopicOrder run: ORD-n keys on both sides
    _partial_index(store, msgs, lambda off: off < split)
    last_indexed = max(m["commitLogOffset"] for m in msgs if m["commitLogOffset"] < split)
    tail_keys = {(m["topic"], k) for m in msgs if m["commitLogOffset"] >= split for k in split_keys(m.get("keys"))}
    head_keys = {(m["topic"], k) for m in msgs if m["commitLogOffset"] < split for k in split_keys(m.get("keys"))}
    both = sorted(tail_keys & head_keys)
    assert len(both) == 5  # ORD-0 .. ORD-4
    for topic, key in both + sorted(tail_keys - head_keys)[:10]:
        res = lookup_key(store, topic, key)
        assert [m.offset for m in res.hits] == expected_hits(msgs, topic, key)
        assert res.source == "index+scan"
        assert any(r.startswith("index stale:") for r in res.reasons)
        assert res.scanned == [(last_indexed, 397358)]  # only the tail was walked
    r = run("lookup", store, "--key", "ORD-2", "--topic", "TopicOrder", "-f", "jsonl")
    assert "commitlog scan: index stale:" in r.stderr and "are not in the index" in r.stderr
    assert offsets(r) == expected_hits(msgs, "TopicOrder", "ORD-2")


def test_index_not_covering_the_commitlog_head(store_copy):
    store = store_copy(CLEAN)
    msgs = lines(CLEAN, "message")
    _partial_index(store, msgs, lambda off: off >= 100000)
    for q in _sample(lines(CLEAN, "index_query"), 30):
        res = lookup_key(store, q["topic"], q["key"])
        assert [m.offset for m in res.hits] == expected_hits(msgs, q["topic"], q["key"])
        assert any("index does not cover the commitlog" in r for r in res.reasons)
        assert res.scanned[0] == (0, 150998)  # up to the first record the index holds


def test_scan_flag_forces_a_walk():
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    r = run("lookup", store, "--key", "key-5", "--topic", "TopicTest", "--scan", "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == expected_hits(msgs, "TopicTest", "key-5")
    assert "--scan given" in r.stderr


def test_wrong_index_geometry_falls_back(tmp_path):
    store = real_store(CLEAN)
    msgs = lines(CLEAN, "message")
    r = run("lookup", store, "--key", "key-5", "--topic", "TopicTest", "--index-slots", 400, "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == expected_hits(msgs, "TopicTest", "key-5")
    assert "does not fit geometry 400/2020 (option)" in r.stderr
    r = run("lookup", store, "--key", "key-5", "--topic", "TopicTest", "--index-slots", 7)
    assert r.exit_code == 2 and "does not fit 7 slots" in r.stderr
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName = broker-a\nmaxHashSlotNum=500\nmaxIndexNum : 2000\n")
    r = run("lookup", store, "--key", "key-5", "--topic", "TopicTest", "--broker-config", conf, "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == expected_hits(msgs, "TopicTest", "key-5")
    assert "commitlog scan" not in r.stderr


# --- the bundled fixture store -----------------------------------------------------------------


def fixture_specs():
    spec = importlib.util.spec_from_file_location("make_fixtures", REPO / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = []
    for s in mod.messages(mod.Clock()):
        if s.properties_raw is not None:  # parse the raw string by hand: name\x01value\x02...
            props = dict(p.split("\x01", 1) for p in s.properties_raw.decode().split("\x02") if "\x01" in p)
            keys, uniq = props.get("KEYS"), props.get("UNIQ_KEY")
        else:
            keys = s.keys if isinstance(s.keys, str) or s.keys is None else " ".join(s.keys)
            uniq = s.uniq_key
        out.append({"topic": s.topic, "keys": split_keys(keys), "uniq": uniq, "tx": s.transaction, "body": s.body,
                    "queue_id": s.queue_id})
    return out


def test_fixture_store_key_lookups():
    store = FIXTURES / "store"
    specs = fixture_specs()
    pairs = {(s["topic"], k) for s in specs for k in s["keys"] + ([s["uniq"]] if s["uniq"] else [])}
    assert len(pairs) > 80
    for topic, key in sorted(pairs):
        # the broker does not index ROLLBACK records (TRANSACTION 0xC), so the index cannot find them
        want = [s for s in specs if s["topic"] == topic and (key in s["keys"] or key == s["uniq"])]
        indexed = [s for s in want if s["tx"] != 0xC]
        res = lookup_key(store, topic, key)
        assert sorted(m.uniq_key for m in res.hits) == sorted(s["uniq"] for s in indexed), (topic, key)
        assert [m.offset for m in res.hits] == sorted((m.offset for m in res.hits), reverse=True)
        assert res.source == "index" and not res.collisions and not res.unreadable
        scanned = lookup_key(store, topic, key, force_scan=True)
        assert sorted(m.uniq_key for m in scanned.hits) == sorted(s["uniq"] for s in want)
        assert all(m.body == s["body"] or m.compression != "none"
                   for m, s in zip(sorted(scanned.hits, key=lambda m: m.uniq_key),
                                   sorted(want, key=lambda s: s["uniq"]), strict=True))


def test_fixture_store_queue_and_msg_id():
    store = FIXTURES / "store"
    specs = fixture_specs()
    next_qoff: Counter = Counter()
    checked = 0
    for s in specs:
        if s["tx"] not in (0, 8):  # PREPARED / ROLLBACK records get no consume queue entry
            continue
        qoff = next_qoff[(s["topic"], s["queue_id"])]
        next_qoff[(s["topic"], s["queue_id"])] += 1
        res = lookup_queue(store, s["topic"], s["queue_id"], qoff)
        (m,) = res.hits
        assert (m.topic, m.queue_id, m.queue_offset, m.uniq_key) == (s["topic"], s["queue_id"], qoff, s["uniq"])
        assert not res.warnings
        by_id = lookup_msg_id(store, m.msg_id)
        assert [x.offset for x in by_id.hits] == [m.offset] and not by_id.warnings
        checked += 1
    assert checked == sum(next_qoff.values()) > 60
    # the 5.x fixture's IPv6 store host gives 56-char offsetMsgIds
    v6 = lookup_key(FIXTURES / "store-5x", "TopicV6", "v6-3").hits[0]
    assert len(v6.msg_id) == 56 and lookup_msg_id(FIXTURES / "store-5x", v6.msg_id).hits[0].offset == v6.offset


@pytest.mark.parametrize("field,value", [(0, 123456789), (16, 1999), (12, -5), (16, "head")])
def test_damaged_chain_scans_the_files_range(store_copy, field, value):
    """One entry of a key's chain damaged (keyHash, prevIndex or timeDiff): detected, and nothing is lost."""
    import struct

    from rmqdump.store.indexfile import IndexFile

    store = store_copy(CLEAN)
    (path,) = (store / "index").iterdir()
    key_hash = index_key_hash("TopicTest#order-0")
    with IndexFile(path) as f:
        chain = [e.number for e in f.walk(key_hash % 500)]
        victim = chain[len(chain) // 2]
        pos = f.geometry.entry_pos(victim) + field
        if value == "head":  # a link to a later entry (a cycle): the broker only writes prevIndex < its number
            value = chain[0]
    data = bytearray(path.read_bytes())
    data[pos:pos + 4] = struct.pack(">i", value)
    path.write_bytes(bytes(data))
    msgs = lines(CLEAN, "message")
    r = run("lookup", store, "--key", "order-0", "--topic", "TopicTest", "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == expected_hits(msgs, "TopicTest", "order-0")
    assert f"commitlog scan: index file {path.name} is damaged (entry" in r.stderr
    if field == 16 and value == chain[0]:
        assert "not an earlier entry" in r.stderr


@pytest.mark.parametrize("seed", range(6))
def test_hostile_index_bytes_never_escape(store_copy, seed):
    """Garbage in the index: an announced fallback or confirmed hits only, never a traceback."""
    import random

    store = store_copy(CLEAN)
    (path,) = (store / "index").iterdir()
    data = bytearray(path.read_bytes())
    rnd = random.Random(seed)
    if seed % 3 == 0:  # everything after the header
        data[40:] = rnd.randbytes(len(data) - 40)
    elif seed % 3 == 1:  # a few slots and entries
        for _ in range(40):
            pos = rnd.randrange(40, len(data) - 4)
            data[pos:pos + 4] = rnd.randbytes(4)
    else:  # the header
        data[:40] = rnd.randbytes(40)
    path.write_bytes(bytes(data))
    msgs = lines(CLEAN, "message")
    for q in _sample(lines(CLEAN, "index_query"), 15):
        r = CliRunner().invoke(cli, ["lookup", str(store), "--key", q["key"], "--topic", q["topic"], "-f", "jsonl"])
        assert r.exit_code in (0, 1), (r.exit_code, r.stderr, r.exception)
        want = expected_hits(msgs, q["topic"], q["key"])
        got = offsets(r)
        assert set(got) <= set(want)  # never a wrong record
        if "commitlog scan" in r.stderr and "index stale" not in r.stderr:
            assert got == want
    path.unlink()
    path.write_bytes(bytes(data[:1000]))  # truncated: no geometry fits
    r = run("lookup", store, "--key", "key-1", "--topic", "TopicTest", "-f", "jsonl")
    assert r.exit_code == 0 and offsets(r) == expected_hits(msgs, "TopicTest", "key-1")
    assert "commitlog scan: index unusable" in r.stderr or "commitlog scan: index file" in r.stderr


def test_live_broker_abort_marker_keeps_the_index(store_copy):
    """A running broker holds the lock and keeps an abort file: its index is live, not doomed."""
    import subprocess
    import sys

    store = store_copy(CLEAN)
    (store / "abort").write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'r+b'); fcntl.lockf(f, fcntl.LOCK_EX, 1, 0);"
         " print('locked', flush=True); time.sleep(60)", str(store / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = run("lookup", store, "--key", "key-1", "--topic", "TopicTest", "-f", "jsonl")
        assert r.exit_code == 0 and offsets(r) == expected_hits(lines(CLEAN, "message"), "TopicTest", "key-1")
        assert f"a broker (PID {holder.pid}) holds the store's lock" in r.stderr
        assert "commitlog scan" not in r.stderr and "via the index" in r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_key_lookup_to_a_pipe_loads_no_renderer():
    """`lookup --key -f jsonl` (summary on a non-terminal stderr) never imports rich or csv (start-up cost); bodies
    render through scan's ``--body`` contract (rows.bodyfmt, about 0.5 ms of imports)."""
    import subprocess
    import sys

    code = ("import sys\nfrom rmqdump.cli import cli\n"
            "try:\n    cli.main(args=sys.argv[1:], prog_name='rmqdump')\nexcept SystemExit:\n    pass\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'csv'))\n"
            "sys.stderr.write('LOADED ' + ' '.join(bad) + '\\n')\n")
    r = subprocess.run([sys.executable, "-c", code, "lookup", str(real_store(CLEAN)), "--key", "order-0", "--topic",
                        "TopicTest", "--max", "2", "-f", "jsonl"], capture_output=True, text=True, timeout=120)
    assert len(r.stdout.splitlines()) == 2
    assert "2 records found (truncated) via the index" in r.stderr
    assert r.stderr.splitlines()[-1] == "LOADED ", r.stderr
