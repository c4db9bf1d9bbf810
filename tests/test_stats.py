"""`rmqdump stats` against the manifests RocketMQ wrote when it read the real stores back."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, manifest, real_store
from rmqdump.analysis.stats import BODY_SIZE_EDGES, compute_stats, stats_rows
from rmqdump.cli import cli

SYSTEM = ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC")


def _man(name="clean") -> list[dict]:
    return [m for m in manifest(name) if m["type"] == "message"]


@pytest.fixture(scope="module")
def clean_doc() -> dict:
    return compute_stats(real_store("clean"))


def test_totals_and_topics_equal_the_manifest(clean_doc):
    msgs = _man()
    t = clean_doc["totals"]
    assert t["records"] == len(msgs) == 232
    assert t["bytes"] == sum(m["storeSize"] for m in msgs)
    assert t["body_bytes"] == sum(m["bodyLength"] for m in msgs)
    assert t["blanks"] == 1 and t["findings"] == 0
    assert t["end_offset"] == 397358
    assert (t["first_store_time"], t["last_store_time"]) == (min(m["storeTimestamp"] for m in msgs),
                                                             max(m["storeTimestamp"] for m in msgs))
    per_topic = Counter(m["topic"] for m in msgs)
    assert {e["topic"]: e["records"] for e in clean_doc["topics"]} == per_topic
    size = defaultdict(int)
    for m in msgs:
        size[m["topic"]] += m["storeSize"]
    assert {e["topic"]: e["bytes"] for e in clean_doc["topics"]} == size


def test_queues_tags_hosts_hours(clean_doc):
    msgs = _man()
    assert {(e["topic"], e["queue_id"]): e["records"] for e in clean_doc["queues"]} == \
        Counter((m["topic"], m["queueId"]) for m in msgs)
    # every queue of the walk has a consume queue with as many entries (cq_queue lines of the manifest)
    cq = {(q["topic"], q["queueId"]): q["maxOffsetInQueue"] - q["minOffsetInQueue"]
          for q in manifest("clean") if q["type"] == "cq_queue" and q["maxOffsetInQueue"] > 0}
    dispatched = Counter((m["topic"], m["queueId"]) for m in msgs)
    assert cq == dispatched
    assert {(e["topic"], e["tag"]): e["records"] for e in clean_doc["tags"]} == \
        Counter((m["topic"], m["tags"]) for m in msgs)
    assert {e["host"]: e["records"] for e in clean_doc["producer_hosts"]} == \
        Counter(m["bornHost"].split("|")[0] for m in msgs)
    hours = Counter(datetime.fromtimestamp(m["storeTimestamp"] / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:00Z")
                    for m in msgs)
    assert {e["hour"]: e["records"] for e in clean_doc["hours"]} == hours


def test_body_sizes_compression_and_skew(clean_doc):
    msgs = _man()
    hist = {e["bucket"]: e["records"] for e in clean_doc["body_sizes"]}
    assert sum(hist.values()) == 232
    assert hist["0"] == sum(1 for m in msgs if m["bodyLength"] == 0)
    assert hist["<=64"] == sum(1 for m in msgs if 0 < m["bodyLength"] <= 64)
    assert hist[">4M"] == sum(1 for m in msgs if m["bodyLength"] > BODY_SIZE_EDGES[-1])
    c = clean_doc["compression"]
    compressed = [m for m in msgs if m["compressed"]]
    assert c["compressed_records"] == len(compressed) == 10
    assert c["compressed_body_bytes"] == sum(m["bodyLength"] for m in compressed)
    assert {e["compression"]: e["records"] for e in c["by_type"]} == {"zlib": 10, "none": 222}
    producer = [m for m in msgs if m["topic"] not in SYSTEM and not m["topic"].startswith("%")
                and m["sysFlag"] & 0xC == 0 and "REAL_TOPIC" not in m["properties"]]
    skew = [m["storeTimestamp"] - m["bornTimestamp"] for m in producer]
    s = clean_doc["clock_skew"]
    assert s["records"] == len(producer) and s["excluded"] == 232 - len(producer)
    assert (s["min_ms"], s["max_ms"]) == (min(skew), max(skew))
    assert s["born_after_store"] == sum(1 for d in skew if d < 0)
    assert sum(e["records"] for e in s["histogram"]) == len(producer)


def test_segments_and_system_kinds(clean_doc):
    msgs = _man()
    assert {e["file"]: e["records"] for e in clean_doc["segments"]} == Counter(m["file"] for m in msgs)
    assert [e["blanks"] for e in clean_doc["segments"]] == [1, 0]
    kinds = {(e["kind"], e["real_topic"]): e["records"] for e in clean_doc["system_kinds"]}
    assert kinds[("delay", "TopicDelay")] == 4 and kinds[("delay", "%RETRY%cg-test")] == 2
    assert kinds[("tx_half", "TopicTx")] == 8 and kinds[("tx_commit", "TopicTx")] == 3
    assert kinds[("retry", "TopicTest")] == 2


def test_damage_is_counted_per_segment_and_exits_1():
    doc = compute_stats(real_store("corrupt_crc"))
    assert doc["totals"]["records"] == 231  # the flipped record is skipped, the walk resynchronises
    (f,) = doc["findings"]
    assert f["kind"] == "body_crc" and f["offset"] == 15458
    assert [e["findings"] for e in doc["segments"]] == [1, 0]
    res = CliRunner().invoke(cli, ["stats", str(real_store("corrupt_crc")), "-f", "json"])
    assert res.exit_code == 1 and "1 findings" in res.stderr
    assert json.loads(res.stdout)["findings"][0]["offset"] == 15458


def test_cli_formats(clean_doc):
    path = str(real_store("clean"))
    js = CliRunner().invoke(cli, ["stats", path, "-f", "json"])
    assert js.exit_code == 0
    doc = json.loads(js.stdout)
    assert doc["totals"] == clean_doc["totals"] and doc["topics"] == clean_doc["topics"]
    rows = list(csv.DictReader(io.StringIO(CliRunner().invoke(cli, ["stats", path, "-f", "csv"]).stdout)))
    assert rows[0]["section"] == "total" and int(rows[0]["records"]) == 232
    assert {r["topic"]: int(r["records"]) for r in rows if r["section"] == "topic"} == \
        Counter(m["topic"] for m in _man())
    jl = [json.loads(x) for x in CliRunner().invoke(cli, ["stats", path, "-f", "jsonl"]).stdout.splitlines()]
    assert jl == [json.loads(json.dumps(r)) for r in stats_rows(clean_doc)]
    table = CliRunner().invoke(cli, ["stats", path, "-f", "table"])
    assert table.exit_code == 0
    assert "232 records" in table.stdout and "TopicTest" in table.stdout and "per segment" in table.stdout


def test_fixture_store():
    doc = compute_stats(FIXTURES / "store")
    assert doc["totals"]["records"] == 69 and doc["totals"]["blanks"] == 3
    assert {e["compression"] for e in doc["compression"]["by_type"]} == {"none", "zlib", "lz4", "zstd"}
    assert {e["host"] for e in doc["producer_hosts"]} == {"127.0.0.1", "[fd00::2]"}
