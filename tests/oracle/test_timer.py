"""``rmqdump timer`` and verify's timer findings against RocketMQ 5.3.3's own timer store (the matrix's
``533-mid-timer-*`` stores: written with ``timerWheelEnable`` by ``533/put``, which runs the broker's
``TimerMessageStore``).

- every pending delivery is one of RocketMQ's timer-topic records (put's status lines), with the real topic,
  keys and due time RocketMQ reads back; clean and crashed;
- no timer finding on any of those stores or their damaged variants except units whose record RocketMQ's
  recovery no longer keeps (apache/rocketmq #10668), and those exactly;
- the commitlog truncated after the timer wrote its units (the tail zeroed: RocketMQ's recovery ends the
  commitlog there) gives the #10668 finding for each unit past the end.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli

from .conftest import BASE_IDS, STORE_IDS
from .harness import Built, build_variant

pytestmark = [pytest.mark.oracle]

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_BASES = [n for n in BASE_IDS if "-timer-" in n]
TIMER_STORES = [n for n in STORE_IDS if "-timer-" in n]


def invoke_json(*args) -> tuple[int, dict]:
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def timer_statuses(b: Built) -> list[dict]:
    return [s for s in b.statuses if s["topic"] == TIMER_TOPIC and s["status"] == "PUT_OK"]


def timer_findings(store) -> list[dict]:
    _, doc = invoke_json("verify", store, "-f", "json", "-q")
    return [f for f in doc["findings"] if f["kind"].startswith("timer_")]


def test_the_matrix_has_timer_stores():
    assert len(TIMER_BASES) >= 2 and any(n.endswith("-crash") for n in TIMER_BASES)


@pytest.mark.parametrize("name", TIMER_BASES)
def test_timer_lists_every_pending_delivery(matrix, name):
    b = matrix.get(name)
    _, doc = invoke_json("timer", b.store, "-f", "json")
    recs = {m["commitLogOffset"]: m for m in b.of("message") if m["topic"] == TIMER_TOPIC}
    put = timer_statuses(b)
    assert put, "the spec has timer messages"
    pending = [e for e in doc["entries"] if e["state"] == "pending"]
    # the spec's delays are hours: nothing was delivered, every timer-topic record is a pending unit
    assert sorted(e["offset_py"] for e in pending) == sorted(s["wroteOffset"] for s in put)
    for e in pending:
        m = recs[e["offset_py"]]
        assert e["record"] == "ok" and e["size_py"] == m["storeSize"]
        assert (e["topic"], e["keys"], e["due_ms"]) == (m["properties"]["REAL_TOPIC"], m["keys"],
                                                        int(m["properties"]["TIMER_OUT_MS"]))
    assert doc["summary"]["commitlog_end"] == b.info["commitlog_max_offset_after_recovery"]
    cp = b.of("timer_checkpoint")[0]
    got = doc["summary"]["checkpoint"]
    assert (got["last_read_time_ms"], got["last_timer_log_flush_pos"], got["last_timer_queue_offset"]) == (
        cp["lastReadTimeMs"], cp["lastTimerLogFlushPos"], cp["lastTimerQueueOffset"])
    assert sum(b["count"] for b in doc["buckets"]) == len(put)


@pytest.mark.parametrize("name", TIMER_STORES)
def test_no_false_timer_finding(matrix, name):
    """The only timer findings on these stores are units whose record RocketMQ's recovery drops."""
    b = matrix.get(name)
    if not b.info["load_ok"]:
        pytest.skip("RocketMQ refuses to load this store")
    end = b.info["commitlog_max_offset_after_recovery"]
    _, doc = invoke_json("timer", b.store, "-f", "json")
    lost = sorted(e["timerlog_pos"] for e in doc["entries"] if e["offset_py"] + e["size_py"] > end)
    found = timer_findings(b.store)
    assert sorted(f["offset"] for f in found if f["kind"] == "timer_unit_beyond_commitlog") == lost
    assert [f for f in found if f["kind"] != "timer_unit_beyond_commitlog"] == []


def test_truncated_commitlog_gives_the_10668_finding(matrix):
    b = matrix.get(next(n for n in TIMER_BASES if n.endswith("-clean")))
    offsets = sorted(s["wroteOffset"] for s in timer_statuses(b))
    cut = offsets[1]
    seg = b.store / "commitlog" / "00000000000000000000"
    v = build_variant(b, "timer-commitlog-cut", [
        {"op": "zero", "path": "commitlog/00000000000000000000", "offset": cut, "length": os.path.getsize(seg) - cut}])
    assert v.info["commitlog_max_offset_after_recovery"] == cut, "RocketMQ's recovery ends the commitlog at the cut"
    found = timer_findings(v.store)
    beyond = [f for f in found if f["kind"] == "timer_unit_beyond_commitlog"]
    _, doc = invoke_json("timer", v.store, "-f", "json")
    want = sorted(e["timerlog_pos"] for e in doc["entries"] if e["offset_py"] >= cut)
    assert len(want) == len(offsets) - 1
    assert sorted(f["offset"] for f in beyond) == want
    assert all(f["severity"] == "error" and f["file"].startswith("timerlog/") for f in beyond)
