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


def _multi_file_base():
    from .harness import Base

    settings = {"type": "settings", "mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 320,
                "maxHashSlotNum": 64, "maxIndexNum": 256, "mapperFileSizeBatchConsumeQueue": 736,
                "timerWheelEnable": True, "timerPrecisionMs": 1000, "mappedFileSizeTimerLog": 3328}
    lines = [settings] + [{"topic": f"TimerT{i % 3}", "queueId": i % 2, "timerDelaySec": 3600 + (i // 2) * 7,
                           "keys": f"m-{i}", "body": f"timer {i}"} for i in range(140)]
    return Base("533-timer-3-files", "533", tuple(json.dumps(x) for x in lines))


def test_timer_over_three_timerlog_files(matrix):
    """140 units over three 3328-byte timerlog files (63 units and RocketMQ's 16-byte blank each), two units
    put in the same second share a slot: every one pending, chained, no finding."""
    from .harness import build_base

    b = build_base(_multi_file_base())
    code, doc = invoke_json("timer", b.store, "-f", "json")
    put = timer_statuses(b)
    assert len(put) == 140 and code == 0
    assert sorted(e["offset_py"] for e in doc["entries"] if e["state"] == "pending") == sorted(
        s["wroteOffset"] for s in put)
    assert doc["summary"]["timerlog_files"] == 3 and doc["summary"]["timerlog_end"] == 2 * 3328 + 14 * 52
    counts = [b["count"] for b in doc["buckets"]]
    assert sum(counts) == 140 and max(counts) >= 2  # pairs put within one second share a slot (a chain)
    assert timer_findings(b.store) == []


def test_lost_wheel_orphans_what_recovery_does_not_rescan(matrix, tmp_path):
    """Without ``timerwheel`` the broker starts from an empty wheel and its recovery re-links only the units
    from the timerlog file holding lastTimerLogFlushPos - fileSize on: a unit of an earlier file is delivered
    only if a later unit of its slot chains back to it."""
    from .harness import build_base, writable_copy

    b = build_base(_multi_file_base())
    store = writable_copy(b, tmp_path / "s")
    (store / "timerwheel").unlink()
    # the timerlog's flushedWhere advances one file per flush: put's last flush left it at the first file's
    # end (the broker's next flush cycles would bring it to the log end, as written here)
    _, doc = invoke_json("timer", store, "-f", "json")
    assert doc["summary"]["recovery_begin"] == 0 and doc["summary"]["states"]["orphaned"] == 0
    with open(store / "config" / "timercheck", "r+b") as f:
        f.seek(8)
        f.write(doc["summary"]["timerlog_end"].to_bytes(8, "big"))
    _, doc = invoke_json("timer", store, "-f", "json")
    assert doc["summary"]["recovery_begin"] == doc["summary"]["timerlog_end"] - 3328
    rescanned = {e["slot"] for e in doc["entries"] if e["timerlog_pos"] >= 3328}
    want = sorted(e["timerlog_pos"] for e in doc["entries"] if e["timerlog_pos"] < 3328 and e["slot"] not in rescanned)
    assert want, "some slots have units in the first file only"
    assert sorted(e["timerlog_pos"] for e in doc["entries"] if e["state"] == "orphaned") == want
    found = timer_findings(store)
    assert sorted(f["offset"] for f in found if f["kind"] == "timer_unit_orphaned") == want


def test_lost_timerlog_tail_relinks_from_the_wheel(matrix, tmp_path):
    """Slots whose two units lie in the first and the third timerlog file (one absolute deliver time each), the
    third file's units lost after its first (zeroed), the checkpoint flushed to the third file's end: the
    recovery's first pass rescans the third file only, then the slots that still end past the new log end make
    it re-link from their first units (checkPhyPos), so their surviving units are delivered."""
    import time

    from .harness import put

    lines = [json.loads(x) for x in _multi_file_base().spec]
    base = (int(time.time()) + 7200) * 1000 + 500
    for i, m in enumerate(lines[1:]):
        del m["timerDelaySec"]
        m["timerDeliverMs"] = base + (i % 70) * 1000  # units i and i + 70 share a slot
    store = tmp_path / "s"
    assert all(s["status"] == "PUT_OK" for s in put("533", store, lines))
    _, before = invoke_json("timer", store, "-f", "json")
    assert before["summary"]["timerlog_files"] == 3 and before["findings"] == []
    with open(store / "config" / "timercheck", "r+b") as f:
        f.seek(8)
        f.write((3 * 3328).to_bytes(8, "big"))
    cut = 2 * 3328 + 52
    with open(store / "timerlog" / f"{2 * 3328:020d}", "r+b") as f:
        f.seek(52)
        f.write(bytes(3328 - 52))
    _, doc = invoke_json("timer", store, "-f", "json")
    assert doc["summary"]["timerlog_end"] == cut and doc["summary"]["recovery_begin"] == 2 * 3328
    lost = {e["slot"] for e in before["entries"] if e["timerlog_pos"] >= cut}
    survivors = [e for e in doc["entries"] if e["slot"] in lost]
    assert len(survivors) == len(lost) == 13 and all(e["timerlog_pos"] < 2 * 3328 for e in survivors)
    assert {e["state"] for e in survivors} == {"pending"}
    assert doc["summary"]["states"]["pending"] == 127
    found = timer_findings(store)
    # lastTimerLogFlushPos is past the new end: flushed units are gone; metrics still count the lost ones
    assert {f["kind"] for f in found} == {"timer_checkpoint_ahead", "timer_metrics_mismatch"}


def test_killed_before_the_timer_flushed(matrix, tmp_path):
    """``put --crash-no-dispatch``: halted right after the puts, the timer's files as its threads left them (a
    race: units written or not, the checkpoint usually not). Every timer-topic record is either a pending
    unit or still to be filed from where the enqueue resumes; units the resumed enqueue files again are the
    only finding."""
    from .harness import put
    from .scenarios import base

    b = base("533", "mid", "timer", "crash-no-dispatch")
    store = tmp_path / "s"
    statuses = put("533", store, b.lines, b.flags)
    offsets = sorted(s["wroteOffset"] for s in statuses if s["topic"] == TIMER_TOPIC and s["status"] == "PUT_OK")
    _, doc = invoke_json("timer", store, "-f", "json")
    s = doc["summary"]
    assert s["timer_queue_max_offset"] == len(offsets) > 0
    filed = sorted(e["offset_py"] for e in doc["entries"] if e["state"] == "pending")
    assert filed == offsets[:len(filed)]  # the timer files in queue order
    assert s["enqueue_from"] <= len(filed) and s["not_enqueued"] == len(offsets) - s["enqueue_from"]
    assert s["enqueued_again"] == len(filed) - s["enqueue_from"]
    kinds = [f["kind"] for f in timer_findings(store)]
    assert kinds == (["timer_enqueued_again"] if s["enqueued_again"] else [])
