"""The 5.x timer store on fixtures/oracle/533-timer (written by RocketMQ 5.3.3's own TimerMessageStore):
``rmqdump timer``, its verify findings, and hostile timer files."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_dir, fixture_manifest

from rmqdump.cli import cli
from rmqdump.cli.output import utc_ms
from rmqdump.errors import RmqdumpError
from rmqdump.store.timer import TimerLog, read_timer_checkpoint, read_wheel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from timer_wheel_fixture import rebuild  # noqa: E402

NAME = "533-timer"
NOW = "2026-11-26T16:00:00Z"
TIMER_TOPIC = "rmq_sys_wheel_timer"
TL = "timerlog/00000000000000000000"


@pytest.fixture
def store(tmp_path) -> Path:
    """A writable copy of the fixture with its wheel rebuilt from timerwheel.slots.jsonl."""
    root = copy_store(NAME, tmp_path / "s")
    rebuild(fixture_dir(NAME) / "timerwheel.slots.jsonl", root / "timerwheel")
    return root


def run(*args: str) -> tuple[int, object]:
    res = CliRunner().invoke(cli, [*args], catch_exceptions=False)
    try:
        return res.exit_code, json.loads(res.stdout)
    except json.JSONDecodeError:
        return res.exit_code, res.output


def timer_json(root: Path, *extra: str) -> tuple[int, dict]:
    return run("timer", str(root), "-f", "json", "--now", NOW, *extra)


def timer_findings(root: Path) -> list[dict]:
    code, doc = run("verify", str(root), "-f", "json")
    return [f for f in doc["findings"] if f["kind"].startswith("timer_")]


def manifest_timer_messages() -> dict[int, dict]:
    """RocketMQ's read-back of the timer topic's records, by commitlog offset."""
    return {m["commitLogOffset"]: m for m in fixture_manifest(NAME)
            if m["type"] == "message" and m["topic"] == TIMER_TOPIC}


def delivered_uniq_keys() -> set[str]:
    """UNIQ_KEYs RocketMQ's timer delivered into their real topic during the run (copies outside the timer topic)."""
    timer_keys = {m["uniqKey"] for m in manifest_timer_messages().values()}
    return {m["uniqKey"] for m in fixture_manifest(NAME)
            if m["type"] == "message" and m["topic"] != TIMER_TOPIC and m["uniqKey"] in timer_keys}


def patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def test_pending_deliveries_are_the_timerlog_units_rocketmq_wrote(store):
    code, doc = timer_json(store, "--all")
    assert code == 0, doc
    recs = manifest_timer_messages()
    delivered = delivered_uniq_keys()
    entries = doc["entries"]
    # one unit per timer-topic record RocketMQ wrote, each naming that record
    assert sorted(e["offset_py"] for e in entries) == sorted(recs)
    for e in entries:
        m = recs[e["offset_py"]]
        assert e["size_py"] == m["storeSize"] and e["record"] == "ok"
        assert (e["topic"], e["queue_id"], e["keys"]) == (m["properties"]["REAL_TOPIC"],
                                                          int(m["properties"]["REAL_QID"]), m["keys"])
        assert e["due_ms"] == int(m["properties"]["TIMER_OUT_MS"]) == e["bucket_ms"]
        # pending exactly when the timer has not delivered a copy into the real topic
        assert (e["state"] == "pending") == (m["uniqKey"] not in delivered), e
    assert {e["keys"] for e in entries if e["state"] == "pending"} == {"hour-a", "hour-b", "hour-c", "rem-1", "rem-day"}
    assert [e["keys"] for e in entries if e["state"] == "delivered"] == ["soon"]
    # per delivery-time bucket: the three hour-* messages share one second, one slot, one chain
    assert [b["count"] for b in doc["buckets"]] == [3, 1, 1]
    assert doc["buckets"][0]["topics"] == {"Orders": 3}
    cp = next(m for m in fixture_manifest(NAME) if m["type"] == "timer_checkpoint")
    got = doc["summary"]["checkpoint"]
    assert (got["last_read_time_ms"], got["last_timer_log_flush_pos"], got["last_timer_queue_offset"],
            got["master_timer_queue_offset"]) == (cp["lastReadTimeMs"], cp["lastTimerLogFlushPos"],
                                                  cp["lastTimerQueueOffset"], cp["masterTimerQueueOffset"])
    assert doc["summary"]["precision_source"] == "wheel" and doc["findings"] == []


def test_wheel_slots_and_their_chain(store):
    wheel = read_wheel(store / "timerwheel")
    log = TimerLog.open(store / "timerlog")
    (f, units, stop), = list(log.walk())
    assert stop.reason == "zero" and stop.pos == 6 * 52
    by_pos = {u.pos: u for u in units}
    chain = next(s for s in wheel.slots.values() if s.num == 3)
    pos, seen = chain.last_pos, []
    while pos != -1:
        seen.append(pos)
        pos = by_pos[pos].prev_pos
    assert seen[::-1] == [chain.first_pos, 104, chain.last_pos] == [52, 104, 156]


def test_without_the_wheel_recovery_relinks_every_unit(tmp_path, store):
    """The fixture as committed has no timerwheel: the broker creates an empty one and re-links the slots of
    every unit from the file holding lastTimerLogFlushPos - fileSize (here the only file)."""
    _, with_wheel = timer_json(store)
    _, without = timer_json(fixture_dir(NAME) / "store")
    assert without["summary"]["wheel_size"] is None
    assert without["entries"] == with_wheel["entries"] and without["findings"] == []


def test_verify_healthy_timer_store_has_no_timer_finding(store):
    assert timer_findings(store) == []


def test_unit_past_truncated_commitlog_is_a_finding(store):
    """apache/rocketmq #10668: the commitlog loses its tail (zeroed from the hour-b record on: recovery ends it
    there) while the timerlog keeps units pointing into it."""
    recs = manifest_timer_messages()
    cut = next(o for o, m in recs.items() if m["keys"] == "hour-b")
    cl = store / "commitlog" / "00000000000000000000"
    patch(cl, cut, bytes(os.path.getsize(cl) - cut))
    found = timer_findings(store)
    beyond = [f for f in found if f["kind"] == "timer_unit_beyond_commitlog"]
    want = sorted(52 * i for i in range(1, 6) if sorted(recs)[i] >= cut)
    assert sorted(f["offset"] for f in beyond) == want and want
    assert all(f["file"] == TL and f["severity"] == "error" for f in beyond)
    code, doc = timer_json(store)
    assert code == 1 and {e["record"] for e in doc["entries"] if e["offset_py"] >= cut} == {"beyond_end"}


def test_broken_chain_orphans_units_and_crossing_chain(store):
    tl = store / TL
    patch(tl, 156 + 4, struct.pack(">q", -1))  # hour-c no longer links to hour-b
    found = timer_findings(store)
    assert sorted(f["offset"] for f in found if f["kind"] == "timer_unit_orphaned") == [52, 104]
    patch(tl, 156 + 4, struct.pack(">q", 208))  # ... but to rem-1, filed two hours later
    found = timer_findings(store)
    cross = [f for f in found if f["kind"] == "timer_chain_crosses_slot"]
    assert len(cross) == 1 and cross[0]["file"] == "timerwheel"


def test_slot_first_pos_not_of_its_slot(store):
    wheel = read_wheel(store / "timerwheel")
    chain = next(s for s in wheel.slots.values() if s.num == 3)
    patch(store / "timerwheel", chain.index * 32 + 8, struct.pack(">q", 208))  # rem-1's unit, another slot
    found = timer_findings(store)
    assert [(f["kind"], f["severity"], f["offset"]) for f in found] == [("timer_slot_first", "info", chain.index * 32)]


def test_checkpoint_ahead_and_metrics_mismatch(store):
    patch(store / "config" / "timercheck", 8, struct.pack(">q", 5000))
    text = (store / "config" / "timermetrics").read_text().replace('"count":3', '"count":7')
    (store / "config" / "timermetrics").write_text(text)
    kinds = {(f["kind"], f["severity"]) for f in timer_findings(store)}
    assert kinds == {("timer_checkpoint_ahead", "warning"), ("timer_metrics_mismatch", "info")}


def test_read_time_after_now(store):
    """A checkpoint whose lastReadTimeMs is a day after --now: nothing is delivered before then."""
    from rmqdump.cli.options import parse_time

    patch(store / "config" / "timercheck", 0, struct.pack(">q", parse_time(NOW, "now") + 86_400_000))
    code, doc = timer_json(store)
    assert code == 1 and {f["kind"] for f in doc["findings"]} == {"timer_read_time_ahead", "timer_metrics_mismatch"}
    assert doc["summary"]["states"]["delivered"] == 6  # the broker takes every slot before it as done


@pytest.mark.parametrize("damage", ["wheel-size", "log-short", "log-magic", "metrics-garbage", "log-fifo",
                                    "sparse-log"])
def test_hostile_timer_files_are_findings_not_tracebacks(store, damage):
    tl = store / TL
    if damage == "wheel-size":
        os.truncate(store / "timerwheel", 1000)
        want = "timer_wheel_size"
    elif damage == "log-short":
        os.truncate(tl, 100)
        want = "timer_log_damaged"
    elif damage == "log-magic":
        patch(tl, 104 + 12, struct.pack(">i", 0x40))
        want = "timer_log_damaged"
    elif damage == "metrics-garbage":
        (store / "config" / "timermetrics").write_text("{not json")
        (store / "config" / "timermetrics.bak").write_text("[1,")
        want = "timer_unreadable"
    elif damage == "log-fifo":
        tl.unlink()
        os.mkfifo(tl)
        want = "timer_log_files"
    else:
        with open(tl, "r+b") as f:
            f.truncate(1 << 32)  # 4 GiB, a hole after the units
        want = None
    found = timer_findings(store)
    assert (want is None) == (not found) and (want is None or want in {f["kind"] for f in found}), found
    code, out = run("timer", str(store), "-f", "json", "--now", NOW)
    assert code in (0, 1) and isinstance(out, dict)


def test_readers_raise_rmqdump_errors(tmp_path):
    fifo = tmp_path / "timercheck"
    os.mkfifo(fifo)
    with pytest.raises(RmqdumpError) as e:
        read_timer_checkpoint(fifo)
    assert e.value.file == str(fifo)
    short = tmp_path / "short"
    short.write_bytes(b"\x00\x00\x01")
    cp = read_timer_checkpoint(short)  # the broker maps 4096 bytes: zeros past the end
    assert cp.last_read_time_ms == 1 << 40 and cp.last_timer_log_flush_pos == 0 and cp.file_size == 3
    res = CliRunner().invoke(cli, ["timer", str(fixture_dir("533-plain") / "store")])
    assert res.exit_code == 0 and "no timer store" in res.stderr and res.stdout == ""
    code, out = run("timer", str(fixture_dir(NAME) / "store"), "-f", "csv")
    assert code == 2 and "timer prints one document" in out


def test_where_the_timer_enqueue_resumes(store):
    """recover(): the last unit's record's queue offset + 1, at most the checkpoint's masterTimerQueueOffset
    (a slave's checkpoint keeps 0 there): records from there on are filed again, the ones with units twice."""
    _, doc = timer_json(store)
    s = doc["summary"]
    assert (s["timer_queue_max_offset"], s["last_unit_queue_offset"], s["enqueue_from"], s["not_enqueued"]) == (6, 5, 6, 0)
    patch(store / "config" / "timercheck", 16, struct.pack(">q", 2))  # lastTimerQueueOffset: not used here
    assert timer_json(store)[1]["summary"]["enqueue_from"] == 6
    patch(store / "config" / "timercheck", 24, struct.pack(">q", 4))  # masterTimerQueueOffset
    code, doc = timer_json(store)
    s = doc["summary"]
    assert (s["enqueue_from"], s["not_enqueued"], s["enqueued_again"]) == (4, 2, 2)
    assert code == 1 and [(f["kind"], f["offset"]) for f in doc["findings"]] == [("timer_enqueued_again", 24)]


def test_lookup_shows_a_timer_messages_state(store):
    recs = manifest_timer_messages()
    hour_b = next(o for o, m in recs.items() if m["keys"] == "hour-b")
    res = CliRunner().invoke(cli, ["lookup", str(store), "--offset", str(hour_b), "-f", "jsonl"])
    assert res.exit_code == 0
    due = utc_ms(int(recs[hour_b]["properties"]["TIMER_OUT_MS"]))
    assert f"timer: the record at {hour_b} is pending (timer), due {due}" in res.stderr
    assert f"{TL}@104" in res.stderr
    soon = next(o for o, m in recs.items() if m["keys"] == "soon")
    res = CliRunner().invoke(cli, ["lookup", str(store), "--offset", str(soon), "-f", "jsonl"])
    assert f"timer: the record at {soon} is delivered" in res.stderr


def test_repair_plan_says_what_it_leaves_the_timer_pointing_at(store):
    """The repair of a store whose commitlog lost its tail under timer units: rmqdump does not rewrite the timer
    store, so its plan says how many units point past the repaired end (#10668) instead of staying silent."""
    from rmqdump.write.repair import plan_repair

    recs = manifest_timer_messages()
    cut = next(o for o, m in recs.items() if m["keys"] == "hour-b")
    cl = store / "commitlog" / "00000000000000000000"
    patch(cl, cut, bytes(os.path.getsize(cl) - cut))
    past = sum(1 for o in recs if o >= cut)
    plan = plan_repair(store)
    try:
        timer = [w for w in plan.warnings if w.startswith("timerlog:")]
        assert plan.changes and len(timer) == 1 and f"{past} past the repaired end" in timer[0], plan.warnings
    finally:
        plan.cleanup()
