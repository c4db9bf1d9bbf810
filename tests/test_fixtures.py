"""The bundled fixture store: regenerable byte for byte, and covering the decoder's features."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REPO
from rmqdump.cli import cli
from rmqdump.commitlog import CommitLog
from rmqdump.crc import reference_body_crc
from rmqdump.encoder import encode_message
from rmqdump.msgid import decode_offset_msg_id, decode_uniq_key
from rmqdump.record import Blank, Message, record_crc_property

STORE = FIXTURES / "store"


def tree_digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_fixtures_regenerate_byte_identically(tmp_path):
    spec = importlib.util.spec_from_file_location("make_fixtures", REPO / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.build(tmp_path / "store")
    assert tree_digest(out) == tree_digest(STORE)


def records():
    return list(CommitLog.open(STORE).walk())


def test_fixture_covers_the_format():
    recs = records()
    msgs = [r for r in recs if isinstance(r, Message)]
    blanks = [r for r in recs if isinstance(r, Blank)]
    assert len(blanks) >= 3 and all(b.offset + b.size == b.offset - b.file_pos + 4096 for b in blanks)
    assert {m.magic_name for m in msgs} == {"v1", "v2"}
    assert {m.transaction for m in msgs} == {"none", "prepared", "commit", "rollback"}
    assert {m.compression for m in msgs} == {"none", "zlib", "lz4", "zstd"}
    v6 = [m for m in msgs if m.store_host.startswith("[")]
    assert v6 and len(v6[0].msg_id) == 56 and v6[0].born_host == "[fd00::2]:40001"
    assert decode_offset_msg_id(v6[0].msg_id).offset == v6[0].offset
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
    crc = next(m for m in msgs if m.tags == "crc")
    with CommitLog.open(STORE).segment_for(crc.offset).open() as r:
        stored, computed = record_crc_property(crc, r.read(crc.file_pos, crc.size))
    assert stored == computed
    delay = next(m for m in msgs if m.tags == "delay3")
    assert delay.tags_code() == delay.store_timestamp + 10_000
    assert next(m for m in msgs if m.body_length == 0).body == b""


def test_fixture_reencodes_byte_identically():
    cl = CommitLog.open(STORE)
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
        assert len(rows) == n and rows[26]["body"].startswith("rocket alpha")
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
    assert len(run("--tag", "TagA", "--topic", "TopicTest")) == 15  # 14 + the IPv6 one
    assert len(run("-n", "3")) == 3
    all_rows = run()
    mid = all_rows[10]["store_timestamp"]
    assert all(r["store_timestamp"] >= mid for r in run("--since", str(mid)))
    assert run("--from-offset", str(all_rows[5]["offset"]), "-n", "1")[0] == all_rows[5]
    assert all(r["offset"] < 4096 for r in run("--to-offset", "4096"))
    assert run("--since", "2030-01-01T00:00:00Z") == []
