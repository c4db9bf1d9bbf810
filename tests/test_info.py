"""`rmqdump info` against what RocketMQ reported for its own stores."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from click.testing import CliRunner

from conftest import FIXTURES, manifest, real_store
from rmqdump.cli import cli


def info_json(path) -> dict:
    res = CliRunner().invoke(cli, ["info", str(path), "-f", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_info_matches_rocketmq_on_clean_store():
    doc = info_json(real_store("clean"))
    m = manifest("clean")
    info = next(x for x in m if x["type"] == "store_info")
    assert doc["commitlog"]["max_offset"] == info["commitlog_max_offset_after_recovery"]
    assert doc["commitlog"]["file_size"] == info["mappedFileSizeCommitLog"]
    assert doc["consume_queues"]["file_size"] == info["mappedFileSizeConsumeQueue"]
    cq = {(q["topic"], q["queueId"]): q for q in m if q["type"] == "cq_queue"}
    got = {(q["topic"], q["queue_id"]): q for q in doc["consume_queues"]["queues"]}
    assert got  # queues with directories; the broker also lists empty in-memory ones
    for key, q in got.items():
        assert (q["min_offset"], q["max_offset"], q["max_physic_offset"]) == (
            cq[key]["minOffsetInQueue"], cq[key]["maxOffsetInQueue"], cq[key]["maxPhysicOffset"])
    assert {k for k, v in cq.items() if v["maxOffsetInQueue"] > 0} == set(got)
    idx = next(x for x in m if x["type"] == "index_file")
    f = doc["index_files"][0]
    assert (f["file"], f["begin_timestamp"], f["end_timestamp"], f["begin_phy_offset"], f["end_phy_offset"],
            f["hash_slot_count"], f["index_count"]) == (
        idx["file"], idx["beginTimestamp"], idx["endTimestamp"], idx["beginPhyOffset"], idx["endPhyOffset"],
        idx["hashSlotCount"], idx["indexCount"])
    assert (f["hash_slots"], f["max_entries"]) == (info["maxHashSlotNum"], info["maxIndexNum"])
    cp = doc["checkpoint"]
    assert cp["physic_msg_timestamp"] == info["checkpoint_physicMsgTimestamp"]
    assert cp["logics_msg_timestamp"] == info["checkpoint_logicsMsgTimestamp"]
    assert cp["index_msg_time"] is None
    assert doc["abort"] is False and doc["lock"] == {"present": True, "held_by_pid": None}
    assert doc["config"]["delay_offsets"]["entries"] == 3


def test_info_crash_store_shows_abort_and_three_segments():
    doc = info_json(real_store("crash_kill9"))
    assert doc["abort"] is True
    assert len(doc["commitlog"]["segments"]) == 3
    assert doc["commitlog"]["max_offset"] == 338738


def test_info_names_the_pid_holding_the_broker_lock(store_copy):
    root = store_copy("clean")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl,os,sys,time\n"
        "fd=os.open(sys.argv[1], os.O_RDWR)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX|fcntl.LOCK_NB, 1, 0)\n"
        "print('locked', flush=True)\n"
        "time.sleep(30)\n"), str(root / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (root / "lock").read_bytes()
        doc = info_json(root)
        assert doc["lock"]["held_by_pid"] == holder.pid
        res = CliRunner().invoke(cli, ["info", str(root), "-f", "table"])
        assert f"held by PID {holder.pid}" in res.stdout
        assert (root / "lock").read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.05)
    assert info_json(root)["lock"]["held_by_pid"] is None


def test_info_on_fixture_and_single_segment():
    doc = info_json(FIXTURES / "store")
    assert len(doc["commitlog"]["segments"]) == 4 and doc["commitlog"]["problems"] == []
    seg = FIXTURES / "store" / "commitlog" / "00000000000000000000"
    one = info_json(seg)
    assert "consume_queues" not in one and one["commitlog"]["segments"][0]["size"] == 4096
