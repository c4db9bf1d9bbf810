"""The store inventory of ``rmqdump info``: every file and directory of a store is read, named as present but
not read, or reported unknown; and the broker features a store shows."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle.harness import put, unavailable_reason

from conftest import FIXTURES, REAL
from rmqdump.cli import cli
from rmqdump.store.inventory import detect_features, take_inventory

BUNDLED = [FIXTURES / "store", FIXTURES / "store-5x", *sorted((FIXTURES / "oracle").glob("*/store")),
           *sorted((FIXTURES / "bugs").glob("*/store"))]
REAL_STORES = sorted(p for p in REAL.glob("*") if p.is_dir()) if REAL.is_dir() else []


def info(path: Path, *args: str):
    res = CliRunner().invoke(cli, ["info", str(path), *args])
    assert res.exit_code == 0, res.output
    return res


def info_json(path: Path) -> dict:
    return json.loads(info(path, "-f", "json").stdout)


def entries_on_disk(root: Path) -> int:
    """Files and directories under ``root`` (symlinks counted, not followed)."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


def features(doc: dict) -> dict[str, dict]:
    return {f["feature"]: f for f in doc["features"] if f["present"]}


@pytest.mark.parametrize("store", BUNDLED + REAL_STORES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_info_names_every_entry_of_every_store(store):
    inv = info_json(store)["inventory"]
    c = inv["counts"]
    assert c["unknown"] == 0, inv["unknown"]
    assert c["read"] + c["named"] == c["examined"] == entries_on_disk(store)
    assert inv["stopped"] is None


def test_stray_file_and_directory_are_unknown(tmp_path):
    root = shutil.copytree(FIXTURES / "oracle" / "533-plain" / "store", tmp_path / "s")
    (root / "notes.txt").write_text("left by an operator")
    (root / "stray-dir").mkdir()
    (root / "stray-dir" / "inside").write_text("never listed: an unknown directory is not entered")
    (root / "consumequeue" / "TopicA" / "0" / "00000000000000000000.old").write_bytes(b"\0" * 20)
    (root / "index" / "20261125070955499.tmp").write_bytes(b"")
    (root / "commitlog" / "hs_err_pid1.log").write_text("crash")
    inv = info_json(root)["inventory"]
    assert {u["path"]: u["type"] for u in inv["unknown"]} == {
        "notes.txt": "file", "stray-dir": "directory", "consumequeue/TopicA/0/00000000000000000000.old": "file",
        "index/20261125070955499.tmp": "file", "commitlog/hs_err_pid1.log": "file"}
    assert inv["counts"]["unknown"] == 5
    assert inv["counts"]["read"] + inv["counts"]["unknown"] == entries_on_disk(root) - 1  # stray-dir/inside
    res = info(root)
    assert "5 unknown" in res.stdout and "unknown files" in res.stdout
    assert "stray-dir" in res.stdout and "notes.txt" in res.stdout


def test_hostile_store_is_bounded(tmp_path):
    root = shutil.copytree(FIXTURES / "oracle" / "533-plain" / "store", tmp_path / "s")
    junk = root / "consumequeue" / "TopicA" / "0"
    for i in range(60):
        (junk / f"junk{i:03d}").write_bytes(b"")
    inv = take_inventory(root, list_cap=20)
    d = inv.to_dict()
    assert [u["path"] for u in d["unknown"]] == [f"consumequeue/TopicA/0/junk{i:03d}" for i in range(20)]
    assert d["unknown_unlisted"] == [{"directory": "consumequeue/TopicA/0", "more": 40}]
    assert d["counts"]["unknown"] == 60
    small = take_inventory(root, max_entries=10).to_dict()
    assert small["counts"]["examined"] == 10 and small["stopped"].startswith("stopped after 10 entries")


def test_symlinks_are_listed_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for i in range(5):
        (outside / f"{i:020d}").write_bytes(b"")
    root = shutil.copytree(FIXTURES / "oracle" / "533-plain" / "store", tmp_path / "s")
    (root / "timerlog").symlink_to(outside)
    (root / "elsewhere").symlink_to(outside)
    inv = take_inventory(root).to_dict()
    assert {"path": "timerlog", "type": "symlink", "what": "timer log directory"} in inv["irregular"]
    assert {"path": "elsewhere", "type": "symlink"} in inv["unknown"]
    assert not any(g["path"] == "timerlog/<offset>" for g in inv["groups"])  # the target was not entered
    assert inv["counts"]["examined"] == entries_on_disk(root)


def test_5x_files_named_by_name_only(tmp_path):
    """The names RocketMQ 5.3.3 gives its other files (empty here: the inventory never opens a file)."""
    root = tmp_path / "s"
    names = ["commitlog/00000000000000000000", "timerwheel", "timerlog/00000000000000000000", "config/timercheck",
             "config/timermetrics", "config/timermetrics.bak", "config/topics.json.tmp", "config/broker.properties",
             "config/consumerFilter.json", "config/lmqConsumerOffset.json.bak",
             "config/topics/CURRENT", "config/topics/MANIFEST-000005", "config/topics/000009.sst",
             "config/rdb/OPTIONS-000007", "config/consumerOffsets/000003.log", "config/consumerOffsets/LOCK",
             "consumequeue/CURRENT", "consumequeue/IDENTITY", "consumequeue/000012.sst", "consumequeue/LOG.old.1",
             "consumequeue/archive/000002.log",
             "dledger-n0/data/00000000000000000000", "dledger-n0/index/00000000000000000000",
             "dledger-n0/checkpoint", "dledger-n0/currterm", "epochFileCheckpoint", "epochFileCheckpoint.bak",
             "brokerIdentity", "compaction/position-checkpoint", "compaction/compactionLog/T/0/00000000000000000000",
             "compaction/compactionCq/T/0/00000000000000000000", "consumequeue_ext/T/0/00000000000000000000",
             "disk2/commitlog/00000000000000004096", "commitlog2/00000000000000008192", "abort.bak"]
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(b"")
    inv = take_inventory(root)
    d = inv.to_dict()
    assert d["counts"]["unknown"] == 0, d["unknown"]
    assert d["counts"]["read"] + d["counts"]["named"] == entries_on_disk(root)
    found = {f["feature"]: f for f in detect_features(inv) if f["present"]}
    assert set(found) == {"timer", "rocksdb_cq", "rocksdb_config", "dledger", "controller", "multi_path",
                          "compaction", "cq_ext"}
    assert all(found[f]["rmqdump"] == ("reads" if f in ("timer", "dledger", "rocksdb_cq", "rocksdb_config", "multi_path", "controller", "compaction") else "names only") for f in found)
    assert found["compaction"]["evidence"].startswith("compaction/")
    assert "position-checkpoint only" not in found["compaction"]["evidence"]


def test_features_from_records_and_batch_topics():
    assert features(info_json(FIXTURES / "oracle" / "533-batchcq" / "store"))["batchcq"]["rmqdump"] == "reads"
    v2 = features(info_json(FIXTURES / "oracle" / "533-v2" / "store"))["v2"]
    assert v2["evidence"].startswith("V2 record at commitlog offset ")
    assert set(features(info_json(FIXTURES / "store"))) == set()


TIMER_SPEC = [
    {"type": "settings", "mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 320, "maxHashSlotNum": 64,
     "maxIndexNum": 256, "mapperFileSizeBatchConsumeQueue": 736, "timerWheelEnable": True,
     "timerPrecisionMs": 1000, "mappedFileSizeTimerLog": 3328, "enableCompaction": True,
     "enabledAppendPropCRC": True, "topics": {"BCQ": {"queues": 2, "batchCQ": True}}},
    {"topic": "TopicA", "queueId": 1, "tags": "TagA", "keys": ["k1"], "body": "hello"},
    {"topic": "BCQ", "queueId": 0, "batch": [{"body": "i1", "keys": "ik1"}, {"body": "i2"}]},
    {"topic": "TimerT", "timerDelaySec": 3600, "keys": "tk", "body": "in an hour"},
    {"topic": "T" * 134, "body": "V2 record"},
]


@pytest.mark.oracle
@pytest.mark.parametrize("flags", [(), ("--crash",)], ids=["clean", "crash"])
def test_oracle_533_timer_store_every_file_named(tmp_path, flags):
    reason = unavailable_reason("533")
    if reason:
        pytest.skip(reason)
    root = tmp_path / "store"
    put("533", root, TIMER_SPEC, flags)
    doc = info_json(root)
    c = doc["inventory"]["counts"]
    assert c["unknown"] == 0 and c["read"] + c["named"] == entries_on_disk(root)
    got = features(doc)
    assert {"timer", "batchcq", "crc32", "v2"} <= set(got)
    assert got["timer"]["rmqdump"] == "reads" and got["crc32"]["rmqdump"] == "reads"
    assert ("compaction" in got) == (not flags)  # a clean 5.3.3 shutdown writes compaction/position-checkpoint


def test_dledger_store_without_commitlog_dir_gets_an_inventory(tmp_path):
    """DLedger mode keeps no ``commitlog/``: info still summarises the rest and names dledger-<id>/."""
    root = shutil.copytree(FIXTURES / "oracle" / "533-plain" / "store", tmp_path / "s")
    (root / "dledger-n0" / "index").mkdir(parents=True)
    (root / "commitlog").rename(root / "dledger-n0" / "data")
    (root / "dledger-n0" / "checkpoint").write_text("committedIndex=0\n")
    doc = info_json(root)
    # dledger-n0/data/ is read as the store's commitlog (issue 19; this one holds plain records, not entries)
    assert doc["commitlog"]["directory"].endswith("dledger-n0/data") and doc["consume_queues"]["queues"]
    assert features(doc)["dledger"]["evidence"] == "dledger-n0/"
    assert doc["inventory"]["counts"]["unknown"] == 0
    assert "DLedger" in info(root).stdout
    shutil.rmtree(root / "dledger-n0")
    res = CliRunner().invoke(cli, ["info", str(root)])
    assert res.exit_code != 0 and "not a RocketMQ store" in res.output
