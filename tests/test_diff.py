"""`rmqdump diff`: where two copies of a real store differ (commitlog, consume queues, index, checkpoint, config)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_fingerprint import FIXTURES, change_cq_entry, copy_store, first_message, flip_body_byte

from rmqdump.analysis.diff import diff_stores, first_difference
from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.store.checkpoint import read_checkpoint, write_checkpoint
from rmqdump.store.commitlog import CommitLog


def pair(tmp_path: Path, src: Path = FIXTURES / "store") -> tuple[Path, Path]:
    return copy_store(src, tmp_path / "a"), copy_store(src, tmp_path / "b")


def run(*args: str):
    return CliRunner().invoke(cli, ["diff", *args])


def test_identical_copies(tmp_path):
    a, b = pair(tmp_path)
    doc = diff_stores(a, b)
    assert doc["identical"] and doc["differences"] == 0
    assert doc["commitlog"]["first_divergence"] is None and doc["commitlog"]["notes"] == []
    res = run(str(a), str(b))
    assert res.exit_code == 0, res.output
    assert "identical" in res.output


def test_body_flip_names_the_record(tmp_path):
    a, b = pair(tmp_path)
    at = flip_body_byte(b)
    msg = first_message(a, 4096)
    d = diff_stores(a, b)["commitlog"]["first_divergence"]
    assert d["offset"] == at and d["record_offset"] == msg.offset == 4096
    assert d["a"]["kind"] == "message" and d["a"]["crc_ok"] is True and d["a"]["topic"] == "TopicTest"
    assert d["b"]["kind"] == "invalid" and d["b"]["reason"] == "body_crc"
    res = run(str(a), str(b))
    assert res.exit_code == 1, res.output
    assert f"first divergence at offset {at}" in res.output and "record at 4096" in res.output
    res = run(str(a), str(b), "-f", "json")
    assert json.loads(res.stdout)["commitlog"]["first_divergence"]["offset"] == at


def test_slave_behind(tmp_path):
    a, b = pair(tmp_path)
    last = b / "commitlog" / "00000000000000012288"
    msg = first_message(b, 12288)
    data = bytearray(last.read_bytes())
    data[msg.size:] = bytes(len(data) - msg.size)
    last.write_bytes(bytes(data))
    end = 12288 + msg.size
    cl = diff_stores(a, b)["commitlog"]
    assert cl["first_divergence"] is None
    assert cl["b"]["end"] == end and cl["a"]["end"] == 12288 + 1560
    assert any(n.startswith(f"A continues past B's end at {end} ") for n in cl["notes"]), cl["notes"]
    res = run(str(b), str(a))
    assert res.exit_code == 1 and f"B continues past A's end at {end}" in res.output
    (b / "commitlog" / "00000000000000012288").unlink()  # the slave never got the last segment
    cl = diff_stores(a, b)["commitlog"]
    assert cl["first_divergence"] is None and any("A continues past B's end at 12288" in n for n in cl["notes"])


def test_cq_entry_changed_names_the_queue(tmp_path):
    a, b = pair(tmp_path)
    change_cq_entry(b, "TopicTest", 2, unit=3)
    cq = diff_stores(a, b)["consume_queues"]
    assert [(q["topic"], q["queue_id"]) for q in cq["queues"]] == [("TopicTest", 2)]
    f = cq["queues"][0]["first_difference"]
    assert f["queue_offset"] == 3 and f["a"]["tags_code"] ^ f["b"]["tags_code"] == 1
    assert f["a"]["commit_log_offset"] == f["b"]["commit_log_offset"]
    res = run(str(a), str(b))
    assert res.exit_code == 1 and "TopicTest/2" in res.output and "queue offset 3" in res.output


def test_checkpoint_config_and_index(tmp_path):
    a, b = pair(tmp_path)
    cp = read_checkpoint(b / "checkpoint")
    write_checkpoint(b / "checkpoint", replace(cp, physic_msg_timestamp=cp.physic_msg_timestamp + 1000))
    (b / "config" / "consumerOffset.json").write_text('{"offsetTable":{"TopicTest@other":{0:1}}}')
    index = next((b / "index").iterdir())
    index.rename(index.with_name("20261101000000001"))
    doc = diff_stores(a, b)
    assert doc["commitlog"]["first_divergence"] is None and doc["consume_queues"]["queues"] == []
    assert set(doc["checkpoint"]) == {"physic_msg_timestamp", "physic_msg_time"}
    cfg = {c["file"]: c for c in doc["config"]}
    assert set(cfg) == {"consumerOffset.json"}
    assert any(p.startswith("offsetTable.") for p in cfg["consumerOffset.json"]["paths"])
    assert sorted(i["detail"] for i in doc["index"]) == ["only in A", "only in B"]


def test_errors_exit_2(tmp_path):
    a, _ = pair(tmp_path)
    (tmp_path / "empty").mkdir()
    res = run(str(a), str(tmp_path / "empty"))
    assert res.exit_code == 2 and "rmqdump: error:" in res.output and "Traceback" not in res.output


def test_first_difference():
    assert first_difference(b"abc", bytearray(b"abc")) is None
    assert first_difference(bytes(9000) + b"x", bytes(9001)) == 9000
    assert first_difference(b"ab", b"abc") == 2


def test_index_header_difference(tmp_path):
    a, b = pair(tmp_path)
    index = next((b / "index").iterdir())
    data = bytearray(index.read_bytes())
    data[24:32] = (13000).to_bytes(8, "big")  # the header's endPhyOffset (was 13653)
    index.write_bytes(bytes(data))
    doc = diff_stores(a, b)
    assert [(i["file"], i["detail"]) for i in doc["index"]] == [
        (index.name, "header differs: end_phy_offset 13653 vs 13000")]
    assert not doc["identical"]


@pytest.mark.parametrize("engine", ["0", "1"])
def test_divergence_record_found_by_both_walks(engine, tmp_path, monkeypatch):
    """The record holding the first differing byte: pure walk or compiled batches give the same record."""
    from rmqdump.fast.engine import fast_available

    if engine == "1" and not fast_available():
        pytest.skip("no compiled path here")
    monkeypatch.setenv("RMQDUMP_FAST", engine)
    a, b = pair(tmp_path)
    msgs = [r for r in CommitLog.open(a).walk(start=8192) if isinstance(r, Message)][:6]
    target = msgs[5]
    p = b / "commitlog" / "00000000000000008192"
    data = bytearray(p.read_bytes())
    data[target.file_pos + target.size - 1] ^= 0x01  # the record's last byte
    p.write_bytes(bytes(data))
    d = diff_stores(a, b)["commitlog"]["first_divergence"]
    assert d["offset"] == target.offset + target.size - 1
    assert d["record_offset"] == target.offset and d["a"]["queue_offset"] == target.queue_offset


def _cq_file(d, entries: dict[int, bytes], size: int = 6_000_000, sparse: bool = True):
    from sparsefiles import write_sparse

    d.mkdir(parents=True, exist_ok=True)
    write_sparse(d / ("0" * 20), size, entries, sparse)
    return d


@pytest.mark.parametrize("case", ["same", "in data", "in a hole of one side", "across the 8 MiB read",
                                  "past the shorter file", "data only in B", "zeros written on one side"])
def test_queue_difference_is_the_whole_file_answer(tmp_path, monkeypatch, case):
    """Two queue files are compared only where either holds data (a store of 20,000 sparse LMQ queues took
    over 5 minutes to diff, reading 6 MB of zeros per file and side); the first differing entry is the one a
    comparison of every byte finds."""
    from rmqdump.analysis import diff as D

    unit = bytes(range(1, 21))
    a = {0: unit * 3}
    b = dict(a)
    size_b, sparse_b, size = 6_000_000, True, 6_000_000
    if case == "in data":
        b = {0: unit + bytes(range(2, 22)) + unit}
    elif case == "in a hole of one side":
        b = {**a, 3_000_000: unit}
    elif case == "across the 8 MiB read":
        size = size_b = 9_000_000
        a = {**a, (8 << 20) - 4: unit}
        b = {**a, (8 << 20) - 4: unit[:10] + b"\xff" + unit[11:]}
    elif case == "past the shorter file":
        size_b = 3_000_000
    elif case == "data only in B":
        a, b = {}, {100: unit}
    elif case == "zeros written on one side":
        sparse_b = False
    pa = _cq_file(tmp_path / "a", a, size)
    pb = _cq_file(tmp_path / "b", b, size_b, sparse_b)
    got = D._diff_queue(pa, pb)
    monkeypatch.setattr(D, "_spans", lambda x, y: [(0, max(x.size, y.size))])  # every byte
    assert got == D._diff_queue(pa, pb)
    assert (got is None) is (case in ("same", "zeros written on one side"))
