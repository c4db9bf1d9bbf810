"""Field-for-field conformance with what RocketMQ 4.9.8 itself read back from its own stores."""

from __future__ import annotations

import base64
import json

import pytest
from click.testing import CliRunner
from oracle.harness import expected_row

from conftest import manifest, real_store
from rmqdump.cli import cli
from rmqdump.codec.encoder import encode_message
from rmqdump.codec.record import Blank, Message
from rmqdump.store.commitlog import CommitLog


def scan_jsonl(path, *args) -> tuple[list[dict], str, int]:
    res = CliRunner().invoke(cli, ["scan", str(path), "--format", "jsonl", "--body", "base64", *args])
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    return rows, res.stderr, res.exit_code


@pytest.mark.parametrize("store,name,count", [
    ("clean", "clean", 232),
    ("crash_kill9", "crash_kill9_after_rocketmq_recovery", 464),
])
def test_scan_matches_rocketmq_manifest(store, name, count):
    rows, err, code = scan_jsonl(real_store(store))
    expected = [expected_row(m) for m in manifest(name) if m["type"] == "message"]
    assert len(expected) == count
    assert len(rows) == count
    for got, exp in zip(rows, expected, strict=True):
        assert got == exp, f"record at {exp['offset']}"
    assert code == 0
    # the walk stops with a one-line reason at the end of valid data
    end = max(m["commitlog_max_offset_after_recovery"] for m in manifest(name) if m["type"] == "store_info")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"end of valid data at {end}: zero TOTALSIZE")


@pytest.mark.parametrize("store,name", [("clean", "clean"), ("crash_kill9", "crash_kill9_after_rocketmq_recovery")])
def test_blank_recognised(store, name):
    blanks = [m for m in manifest(name) if m["type"] == "blank"]
    got = [r for r in CommitLog.open(real_store(store)).walk() if isinstance(r, Blank)]
    assert [(b.offset, b.file, b.file_pos, b.size, b.bytes_to_end) for b in got] == [
        (m["commitLogOffset"], m["file"], m["filePos"], m["totalSizeField"], m["bytesToEndOfFile"]) for m in blanks]


def test_properties_raw_and_decompression_match():
    by_offset = {m["commitLogOffset"]: m for m in manifest("clean") if m["type"] == "message"}
    seen_compressed = 0
    for rec in CommitLog.open(real_store("clean")).walk():
        if not isinstance(rec, Message):
            continue
        m = by_offset[rec.offset]
        assert rec.properties_text == m["propertiesRaw"]
        assert len(rec.topic_raw) == m["topicLength"] and len(rec.properties_raw) == m["propertiesLength"]
        assert rec.crc_ok is (m["crc_recomputed_ok"] if m["bodyLength"] > 0 else None)
        if m.get("body_decompressed_b64"):
            seen_compressed += 1
            assert rec.decompressed_body() == base64.b64decode(m["body_decompressed_b64"])
    assert seen_compressed == 10


@pytest.mark.parametrize("store", ["clean", "crash_kill9", "corrupt_crc", "crash_torn", "crash_torn_props"])
def test_reencode_is_byte_identical(store):
    cl = CommitLog.open(real_store(store))
    n = 0
    for rec in cl.walk(keep_going=True):
        if isinstance(rec, Message):
            seg = cl.segment_for(rec.offset)
            with seg.open() as r:
                assert encode_message(rec) == r.read(rec.file_pos, rec.size)
            n += 1
    assert n >= 231


@pytest.mark.parametrize("use_mmap", [True, False])
def test_mmap_and_pread_agree(use_mmap):
    ref = [(r.offset, r.size, r.body) for r in CommitLog.open(real_store("clean")).walk() if isinstance(r, Message)]
    got = [(r.offset, r.size, r.body) for r in CommitLog.open(real_store("clean")).walk(use_mmap=use_mmap)
           if isinstance(r, Message)]
    assert got == ref


def test_damaged_stores_stop_where_rocketmq_stops():
    for store, name in [("corrupt_crc", "corrupt_crc_after_rocketmq_recovery"),
                        ("crash_torn", "crash_torn_after_rocketmq_recovery")]:
        rows, err, code = scan_jsonl(real_store(store))
        info = next(m for m in manifest(name) if m["type"] == "store_info")
        assert len(rows) == sum(1 for m in manifest(name) if m["type"] == "message")
        assert code == 1
        assert f"(offset {info['commitlog_max_offset_after_recovery']})" in err
        assert len(err.strip().splitlines()) == 1


def test_keep_going_salvages_records_after_damage():
    rows, err, code = scan_jsonl(real_store("corrupt_crc"), "--keep-going")
    assert code == 1
    assert len(rows) == 231 and sum(r["offset"] > 15458 for r in rows) == 167
    assert "skipped damaged bytes [15458, 15700)" in err
