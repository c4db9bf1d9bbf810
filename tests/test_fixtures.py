"""The bundled fixture store: regenerable byte for byte, and covering the decoder's features."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REPO
from rmqdump.cli import cli
from rmqdump.codec.crc import reference_body_crc
from rmqdump.codec.encoder import encode_message
from rmqdump.codec.msgid import decode_offset_msg_id, decode_uniq_key
from rmqdump.codec.record import Blank, Message, record_crc_property
from rmqdump.store.commitlog import CommitLog

STORE = FIXTURES / "store"
STORE_5X = FIXTURES / "store-5x"


def tree_digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_fixtures_regenerate_byte_identically(tmp_path):
    spec = importlib.util.spec_from_file_location("make_fixtures", REPO / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert tree_digest(mod.build(tmp_path / "store")) == tree_digest(STORE)
    assert tree_digest(mod.build_5x(tmp_path / "store-5x")) == tree_digest(STORE_5X)


def records(store=STORE):
    return list(CommitLog.open(store).walk())


def test_fixture_covers_the_format():
    recs = records()
    msgs = [r for r in recs if isinstance(r, Message)]
    blanks = [r for r in recs if isinstance(r, Blank)]
    assert len(blanks) >= 3 and all(b.offset + b.size == b.offset - b.file_pos + 4096 for b in blanks)
    assert {m.magic_name for m in msgs} == {"v1"}  # a 4.9 broker knows no V2
    assert {m.transaction for m in msgs} == {"none", "prepared", "commit", "rollback"}
    half = next(m for m in msgs if m.topic == "RMQ_SYS_TRANS_HALF_TOPIC")
    assert {m.prepared_transaction_offset for m in msgs if m.transaction in ("commit", "rollback")} == {half.offset}
    assert {m.compression for m in msgs} == {"none", "zlib", "lz4", "zstd"}
    assert {m.store_host for m in msgs} == {"127.0.0.1:10911"}
    assert any(m.born_host == "[fd00::2]:40001" for m in msgs)
    for m in msgs:
        assert m.physical_offset == m.offset
        assert m.body_crc == reference_body_crc(m.body)  # crcmod reference == zlib hot path
        if m.compression != "none":
            assert m.decompressed_body().startswith(b"rocket alpha beta commit")
        if m.uniq_key:
            u = decode_uniq_key(m.uniq_key, m.born_timestamp)
            assert u.pid == 12345 and abs(u.timestamp - m.born_timestamp) < 5000, m
    spaces = next(m for m in msgs if m.tags == "spaces")
    assert spaces.keys == ["k1", "k2", "k3"]
    dup = next(m for m in msgs if m.properties.get("KEYS") == "dup-1")
    assert dup.properties_text.count("WAIT\x01true") == 2 and dup.tags == "batchTag"
    delay = next(m for m in msgs if m.tags == "delay3")
    assert delay.tags_code() == delay.store_timestamp + 10_000
    assert next(m for m in msgs if m.body_length == 0).body == b""


def test_5x_fixture_v2_ipv6_broker_and_record_crc():
    msgs = [r for r in records(STORE_5X) if isinstance(r, Message)]
    assert {m.magic_name for m in msgs} == {"v1", "v2"}
    v2 = next(m for m in msgs if m.magic_name == "v2")
    assert len(v2.topic) == 130 and v2.reconsume_times == 2
    cl = CommitLog.open(STORE_5X)
    for m in msgs:
        assert m.store_host == "[2001:db8::1]:10911" and len(m.msg_id) == 56
        assert decode_offset_msg_id(m.msg_id).offset == m.offset
        with cl.segment_for(m.offset).open() as r:
            stored, computed = record_crc_property(m, r.read(m.file_pos, m.size))
        assert stored == computed and stored is not None


@pytest.mark.parametrize("store", [STORE, STORE_5X])
def test_fixture_reencodes_byte_identically(store):
    cl = CommitLog.open(store)
    for m in cl.walk():
        if isinstance(m, Message):
            with cl.segment_for(m.offset).open(use_mmap=False) as r:
                assert encode_message(m) == r.read(m.file_pos, m.size)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "table"])
def test_scan_formats_on_fixture(fmt):
    res = CliRunner().invoke(cli, ["scan", str(STORE), "-f", fmt, "--body", "text", "--decompress"])
    assert res.exit_code == 0, res.output
    n = sum(isinstance(r, Message) for r in records())
    if fmt == "jsonl":
        rows = [json.loads(x) for x in res.stdout.splitlines()]
        assert len(rows) == n and all(r["body"].startswith("rocket alpha") for r in rows if r["compression"] != "none")
    elif fmt == "json":
        assert len(json.loads(res.stdout)) == n
    elif fmt == "csv":
        assert len(res.stdout.splitlines()) == n + 1  # header; no embedded newlines in these bodies
    else:
        assert "TopicBatch" in res.stdout and "OFFSET" in res.stdout


def test_scan_filters_on_fixture():
    def run(*args):
        res = CliRunner().invoke(cli, ["scan", str(STORE), "-f", "jsonl", *args])
        assert res.exit_code == 0, res.output
        return [json.loads(x) for x in res.stdout.splitlines()]

    assert {r["topic"] for r in run("--topic", "TopicBatch")} == {"TopicBatch"}
    assert len(run("--topic", "TopicBatch", "--queue", "1")) == 5
    assert [r["keys"] for r in run("--key", "k2")] == [["k1", "k2", "k3"]]
    assert len(run("--tag", "TagA", "--topic", "TopicTest")) == 15  # 14 + the IPv6-born one
    assert len(run("-n", "3")) == 3
    assert run("-n", "0") == [] and run("-n", "0", "--topic", "TopicBatch") == []  # printed one record before
    all_rows = run()
    mid = all_rows[10]["store_timestamp"]
    assert all(r["store_timestamp"] >= mid for r in run("--since", str(mid)))
    assert run("--from-offset", str(all_rows[5]["offset"]), "-n", "1")[0] == all_rows[5]
    assert all(r["offset"] < 4096 for r in run("--to-offset", "4096"))
    assert run("--since", "2030-01-01T00:00:00Z") == []
