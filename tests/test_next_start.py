"""The broker's next start, quantified (issue 21 item 1): the commitlog files and bytes recovery reads equal the
prediction's walk, why it starts where it does, the estimate and what would shorten it; verify and info show it."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess

import pytest
from click.testing import CliRunner
from oracle.harness import ORACLE, put, unavailable_reason

from conftest import FIXTURES
from rmqdump.broker.recovery import first_record_store_timestamp, predict_recovery_auto
from rmqdump.broker.recovery.cost import (
    DEFAULT_RATE,
    MIN_MEASURED_BYTES,
    measured_rate,
    next_start,
    quick_prediction,
)
from rmqdump.cli import cli
from rmqdump.store.root import Store

KEYS = {"estimated", "why_not", "mode", "starts", "start_file", "start_offset", "end_offset", "start_reason",
        "commitlog_files", "commitlog_files_total", "commitlog_bytes", "commitlog_bytes_total", "records", "exact",
        "crc_checked", "crc_note", "consume_queues", "redispatch", "index_files", "rate", "estimated_seconds",
        "shorter", "start_failures", "store_loads", "load_errors"}


def cost_of(path) -> tuple[dict, object, Store]:
    store = Store.open(path)
    pred, _ = predict_recovery_auto(store)
    return next_start(pred, store), pred, store


def walked_files(store: Store, pred) -> list[str]:
    """The files the prediction's walk covers: from its start file to the one holding processOffset."""
    w = pred.walk
    return [s.name for s in store.commitlog.segments if s.start >= w.start_offset and s.start <= w.process_offset
            and not (s.start == w.process_offset and s.start > w.start_offset)]


def set_checkpoint(root, physic: int, logics: int) -> None:
    with open(root / "checkpoint", "r+b") as f:
        f.write(struct.pack(">qq", physic, logics))


def crashed_copy(tmp_path, at_file: int):
    """fixtures/store with abort left and a checkpoint that selects file ``at_file``."""
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", root)
    (root / "abort").write_bytes(b"")
    ts = first_record_store_timestamp(Store.open(root).commitlog.segments[at_file]) + 3000
    set_checkpoint(root, ts, ts)
    return root


def test_clean_store_reads_the_last_three_files():
    doc, pred, store = cost_of(FIXTURES / "store")
    segs = store.commitlog.segments
    assert len(segs) == 4 and doc["mode"] == "normal"
    assert doc["start_file"] == segs[1].name == pred.start_file
    assert doc["commitlog_files"] == 3 == len(walked_files(store, pred))
    assert doc["commitlog_bytes"] == pred.walk.process_offset - segs[1].start == 13848 - 4096
    assert doc["records"] == pred.walk.records == 48
    assert "third-last of 4" in doc["start_reason"] and doc["shorter"] == []
    assert doc["redispatch"] == {"records": 0, "cq_entries_written": 0}
    assert doc["consume_queues"] == {"queues": 13, "files_loaded": 13, "files_recovered": 13}
    assert doc["index_files"] == {"loaded": 1, "deleted": 0}
    assert doc["crc_checked"] is True and set(doc) == KEYS


def test_crashed_fixture_counts_what_the_walk_covers():
    doc, pred, store = cost_of(FIXTURES / "oracle" / "498-crash-cq-lag" / "store")
    assert doc["mode"] == "abnormal" and store.abort_present
    files = walked_files(store, pred)
    assert files[0] == doc["start_file"] and doc["commitlog_files"] == len(files) == 3
    assert doc["commitlog_files_total"] == 4  # the pre-allocated last file is not read
    assert doc["commitlog_bytes"] == pred.max_offset - pred.start_offset == 8921
    # abnormal recovery hands every walked record to the dispatcher; 20 entries are missing
    assert doc["redispatch"] == {"records": pred.walk.records, "cq_entries_written": 20}
    assert doc["index_files"]["deleted"] == len(pred.deleted_index_files) == 1
    # entries missing from the first file on: no later start is safe
    assert not [s for s in doc["shorter"] if s["how"] == "checkpoint"]


def test_checkpoint_selects_the_start_and_a_zero_timestamp_scans_everything(tmp_path):
    root = crashed_copy(tmp_path, 3)
    doc, pred, store = cost_of(root)
    segs = store.commitlog.segments
    assert doc["start_file"] == segs[3].name and doc["commitlog_files"] == 1
    assert doc["commitlog_bytes"] == 13848 - segs[3].start and "selects file 4 of 4" in doc["start_reason"]
    cp = pred.checkpoint
    set_checkpoint(root, 0, cp.logics_msg_timestamp)  # apache/rocketmq #1456: physicMsgTimestamp 0
    doc, pred, store = cost_of(root)
    assert doc["start_file"] == segs[0].name == pred.start_file
    assert doc["commitlog_files"] == 4 == len(walked_files(store, pred))
    assert doc["commitlog_bytes"] == 13848 and doc["records"] == 69
    assert "physicMsgTimestamp = 0" in doc["start_reason"] and "every file from the first" in doc["start_reason"]
    by = {s["how"]: s for s in doc["shorter"]}
    assert by["checkpoint"]["start_file"] == segs[3].name and by["checkpoint"]["bytes_saved"] == segs[3].start
    assert "timestamp is 0" in by["checkpoint"]["detail"]
    # repair removes abort (after bringing queues and index in line): normal recovery from the third-last file
    assert by["repair"]["start_file"] == segs[1].name and by["repair"]["bytes_saved"] == segs[1].start
    assert "rmqdump repair" in by["repair"]["detail"]


def test_estimate_at_a_measured_or_default_rate(tmp_path):
    root = crashed_copy(tmp_path, 0)
    store = Store.open(root)
    pred, _ = predict_recovery_auto(store)
    small = next_start(pred, store, measured_rate(16384, 0.5))
    assert small["rate"]["source"] == "default" and small["rate"]["bytes_per_second"] == DEFAULT_RATE
    assert small["estimated_seconds"] == round(small["commitlog_bytes"] / DEFAULT_RATE, 3)
    rate = measured_rate(MIN_MEASURED_BYTES * 2, 4.0)
    doc = next_start(pred, store, rate)
    assert doc["rate"]["source"] == "measured" and doc["rate"]["bytes_per_second"] == MIN_MEASURED_BYTES // 2
    assert doc["estimated_seconds"] == round(13848 / (MIN_MEASURED_BYTES / 2), 3)


def test_verify_and_info_show_the_next_start(tmp_path):
    root = crashed_copy(tmp_path, 3)
    set_checkpoint(root, 0, 0)
    res = CliRunner().invoke(cli, ["verify", str(root), "-f", "json", "-q"])
    ns = json.loads(res.stdout)["next_start"]
    assert set(ns) == KEYS and ns["exact"] is True and ns["commitlog_files"] == 4
    assert ns["rate"]["source"] == "default"  # 16 KiB: too small to time
    table = CliRunner().invoke(cli, ["verify", str(root)])
    assert "Next start (an estimate)" in table.stdout and "physicMsgTimestamp and logicsMsgTimestamp = 0" in \
        table.stdout.replace("\n", " ").replace("  ", " ")
    info = json.loads(CliRunner().invoke(cli, ["info", str(root), "-f", "json"]).stdout)["next_start"]
    assert set(info) == KEYS and info["exact"] is False and info["records"] is None and info["redispatch"] is None
    for k in ("start_file", "commitlog_files", "commitlog_bytes", "start_reason"):
        assert info[k] == ns[k], k
    assert "next start: abnormal recovery reads 4 of 4" in CliRunner().invoke(cli, ["info", str(root)]).stdout


def test_info_says_the_store_does_not_load(tmp_path):
    """A commitlog file of another size: the broker's load() fails. info's next-start line said "normal recovery
    reads ..." (it did not look at load refusals); now it says what verify's prediction says."""
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", root)
    seg = sorted((root / "commitlog").iterdir())[1]
    os.truncate(seg, seg.stat().st_size - 1)
    rec = json.loads(CliRunner().invoke(cli, ["verify", str(root), "-f", "json", "-q"]).stdout)["recovery"]
    assert rec["mode"] == "refuses_to_start" and seg.name in rec["load_errors"][0]
    info = json.loads(CliRunner().invoke(cli, ["info", str(root), "-f", "json"]).stdout)["next_start"]
    assert info["starts"] is info["store_loads"] is False and info["load_errors"] == rec["load_errors"]
    text = " ".join(CliRunner().invoke(cli, ["info", str(root)], terminal_width=200).stdout.split())
    assert f"next start: the broker does not start until load() succeeds (it fails: commitlog/{seg.name} is" in text


def test_dledger_store_is_not_estimated():
    store = Store.open(FIXTURES / "oracle" / "498-dledger" / "store")
    pred, _ = predict_recovery_auto(store)
    assert next_start(pred, store) == {"estimated": False,
                                       "why_not": "not estimated for DLedger stores (DLedger's own recovery)"}
    assert quick_prediction(store, 0) is None


@pytest.mark.oracle
def test_start_file_matches_rocketmq_recovery(tmp_path):
    """RocketMQ 4.9.8 writes a crashed store over six 4 KiB files; with a checkpoint selecting the fourth, its
    recoverAbnormally logs the file it recovers from and each next file: the files rmqdump counts."""
    reason = unavailable_reason("498")
    if reason:
        pytest.skip(reason)
    store = tmp_path / "store"
    spec = [{"type": "settings", "mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 320,
             "maxHashSlotNum": 64, "maxIndexNum": 256}]
    spec += [{"topic": "T", "queueId": i % 2, "keys": [f"k{i}"], "body": "x" * 150} for i in range(60)]
    put("498", store, spec, ("--crash",))
    segs = Store.open(store).commitlog.segments
    assert len(segs) >= 5 and (store / "abort").exists()
    ts = first_record_store_timestamp(segs[3]) + 3000
    set_checkpoint(store, ts, ts)
    for checkpoint in ((ts, ts), (0, ts)):
        set_checkpoint(store, *checkpoint)
        doc, pred, _ = cost_of(store)
        copy = tmp_path / f"copy{checkpoint[0]}"
        shutil.copytree(store, copy)
        env = dict(os.environ, RMQ_ORACLE_LOG="info")
        res = subprocess.run([str(ORACLE / "498" / "run"), str(copy), str(tmp_path / "out.jsonl"), "4096", "320",
                              "64", "256"], capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        logged = [line.rsplit("/", 1)[-1] for line in res.stderr.splitlines()
                  if "recover from this mapped file" in line or "recover next physics file" in line]
        # no file matched: recovery starts at the first file without naming it
        files = logged if "recover from this mapped file" in res.stderr else [segs[0].name, *logged]
        assert files[0] == doc["start_file"] and len(files) == doc["commitlog_files"], (files, doc)
        info = next(json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines() if '"store_info"' in x)
        assert info["commitlog_max_offset_after_recovery"] == doc["end_offset"] == pred.max_offset
    assert doc["start_file"] == segs[0].name and "physicMsgTimestamp = 0" in doc["start_reason"]
