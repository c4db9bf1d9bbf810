"""RocksDB consume queue and config tables (issue 18, item 3) on real RocksDB bytes.

``fixtures/rocksdb/store-rocks`` is ``fixtures/store`` with its consume queue and config JSON files written as
5.3.3's RocksDB CQ and v2 config tables by ``scripts/rocksdb_fixture.py`` (the real RocksDB library, the
layout RocketMQ's source documents; RocketMQ's oracle cannot write RocksDB). The same answers as on the file
store are expected, and the store must stay byte-identical (mtimes included) under every read command.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli

rocksdict = pytest.importorskip("rocksdict", reason="the rocksdb extra (rocksdict) is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import rocksdb_fixture  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FILE_STORE = ROOT / "fixtures" / "store"
ROCKS_STORE = ROOT / "fixtures" / "rocksdb" / "store-rocks"


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, env=env)


@pytest.fixture(autouse=True)
def _fresh_handles():
    from rmqdump.store.rocksdb import close_all
    from rmqdump.store.rocksdb.queue import close_stores

    yield
    close_stores()
    close_all()


@pytest.fixture
def stores(tmp_path):
    """(file-CQ store, RocksDB-CQ store), copies at paths of the same length (JSON outputs compare whole)."""
    f = tmp_path / "file"
    r = tmp_path / "rock"
    shutil.copytree(FILE_STORE, f, symlinks=True)
    shutil.copytree(ROCKS_STORE, r, symlinks=True)
    return f, r


def state(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its bytes and mtime (directories: their mtime)."""
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        out[os.path.relpath(dirpath, root)] = ("dir", os.stat(dirpath).st_mtime_ns)
        for n in filenames:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = (Path(p).read_bytes(), os.stat(p).st_mtime_ns)
    return out


def doc(*args, env=None) -> dict:
    res = run(*args, "-f", "json", env=env)
    assert res.exit_code in (0, 1), res.stderr
    return json.loads(res.stdout.replace("/rock", "/file"))


def test_verify_same_as_file_store(stores):
    f, r = stores
    want, got = doc("verify", f), doc("verify", r)
    for d in (want, got):  # the recovery cost counts CQ files to load; a RocksDB CQ has none
        _drop_key(d, "consume_queues")
    assert got == want
    assert doc("verify", r, env={"RMQDUMP_FAST": "1"}) == doc("verify", r)


def _drop_key(d, key):
    if isinstance(d, dict):
        d.pop(key, None)
        for v in d.values():
            _drop_key(v, key)
    elif isinstance(d, list):
        for v in d:
            _drop_key(v, key)


@pytest.mark.parametrize("pos", [("TopicTest", 1, 0), ("TopicTest", 1, 10), ("TopicTest", 3, 9), ("TopicTx", 0, 0)])
def test_lookup_by_queue_position_same(stores, pos):
    f, r = stores
    assert doc("lookup", r, "--queue", *pos) == doc("lookup", f, "--queue", *pos)


def test_lookup_past_the_queue_end_is_not_found(stores):
    f, r = stores
    a, b = run("lookup", f, "--queue", "TopicTest", 1, 11), run("lookup", r, "--queue", "TopicTest", 1, 11)
    assert a.exit_code == b.exit_code != 0
    assert "queue offset 11" in b.stderr or "11" in b.stdout


def test_consumers_same(stores):
    f, r = stores
    want, got = doc("consumers", f), doc("consumers", r)
    assert json.dumps(got, sort_keys=True).replace("config/rdb", "X") == \
        json.dumps(want, sort_keys=True).replace("config/consumerOffset.json", "X")
    assert "cg-test" in json.dumps(got)


def test_cq_entries_same(stores):
    f, r = stores
    keep = ("topic", "queue_id", "min_offset", "max_offset", "entries", "holes", "max_physic_offset")
    a = [{k: q.get(k) for k in keep} for q in doc("cq", f)["queues"]]
    b = [{k: q.get(k) for k in keep} for q in doc("cq", r)["queues"]]
    assert b == a and len(b) == 13


def test_v1_config_tables(tmp_path):
    """configManagerVersion=v1: one RocksDB per table, JSON values; consumers and info read them."""
    r = tmp_path / "rock"
    rocksdb_fixture.build(FILE_STORE, r, "v1")
    assert (r / "config" / "consumerOffsets" / "CURRENT").is_file()
    from rmqdump.store.config import load_consumer_offsets, load_subscription_groups, load_topics

    assert load_consumer_offsets(r).data.table == load_consumer_offsets(FILE_STORE).data.table
    assert load_topics(r).data == load_topics(FILE_STORE).data
    assert load_subscription_groups(r).data == load_subscription_groups(FILE_STORE).data


def test_read_commands_leave_the_store_byte_identical(stores):
    _, r = stores
    before = state(r)
    for args in (["verify", r], ["lookup", r, "--queue", "TopicTest", 0, 3], ["consumers", r], ["cq", r],
                 ["info", r], ["stats", r]):
        res = run(*args)
        assert res.exit_code in (0, 1), (args, res.stderr)
    from rmqdump.store.rocksdb import close_all

    close_all()
    assert state(r) == before
    assert not (r / "consumequeue" / "rocksdict-config.json").exists()


def test_a_missing_unit_is_a_finding(stores):
    """The CQ <-> commitlog checks run on the RocksDB units: a unit deleted from the database is found."""
    f, r = stores
    from rmqdump.store.rocksdb.cq import cq_key

    db = rocksdict.Rdict(str(r / "consumequeue"), rocksdict.Options(raw_mode=True),
                         column_families={"offset": rocksdict.Options(raw_mode=True)})
    del db[cq_key("TopicTest", 2, 4)]
    db.close()
    (r / "consumequeue" / "rocksdict-config.json").unlink(missing_ok=True)
    base = {(x["kind"], x.get("file")) for x in doc("verify", f)["findings"]}
    got = [x for x in doc("verify", r)["findings"] if (x["kind"], x.get("file")) not in base]
    assert got and any("TopicTest/2" in json.dumps(x) for x in got), got


def test_units_compacted_below_the_min_are_no_holes(stores):
    """RocksDB deletes the units below the commitlog minimum (its compaction filter) and moves the min entry:
    the queue starts at its first unit (a file CQ would still hold them in its first file)."""
    _, r = stores
    from rmqdump.store.rocksdb.cq import cq_key, offset_key, offset_value

    db = rocksdict.Rdict(str(r / "consumequeue"), rocksdict.Options(raw_mode=True),
                         column_families={"offset": rocksdict.Options(raw_mode=True)})
    for i in range(3):
        del db[cq_key("TopicTest", 1, i)]
    unit3 = db[cq_key("TopicTest", 1, 3)]
    db.get_column_family("offset")[offset_key("TopicTest", 1, "min")] = offset_value(
        int.from_bytes(unit3[:8], "big"), 3)
    db.close()
    (r / "consumequeue" / "rocksdict-config.json").unlink(missing_ok=True)
    q = [x for x in doc("cq", r)["queues"] if (x["topic"], x["queue_id"]) == ("TopicTest", 1)][0]
    assert (q["min_offset"], q["max_offset"], q["holes"]) == (3, 11, 0)


@pytest.mark.parametrize("cmd", [["append", "--topic", "T", "--body", "x"], ["repair"], ["repair", "--apply"]])
def test_writers_refuse(stores, cmd):
    _, r = stores
    before = state(r)
    res = run(cmd[0], r, *cmd[1:])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "RocksDB" in res.stderr and f"refusing to {cmd[0]}" in res.stderr
    assert state(r) == before


def test_corrupt_database_is_one_line(stores):
    _, r = stores
    (r / "consumequeue" / "CURRENT").write_bytes(b"MANIFEST-999999\n")
    for args in (["cq", r], ["lookup", r, "--queue", "TopicTest", 0, 0]):
        res = run(*args)
        assert res.exit_code == 2, (args, res.stdout)
        assert res.stderr.count("\n") == 1 and "cannot open RocksDB database" in res.stderr
        assert "MANIFEST-999999" in res.stderr and "rmqdump-rocksdb-" not in res.stderr
    found = [x for x in doc("verify", r)["findings"] if x["kind"] == "cq_unavailable"]
    assert found and "cannot open RocksDB database" in found[0]["detail"]


def test_without_the_binding_the_extra_is_named(stores, monkeypatch):
    _, r = stores
    real = builtins.__import__

    def no_rocksdict(name, *a, **k):
        if name == "rocksdict" or name.startswith("rocksdict."):
            raise ImportError("No module named 'rocksdict'", name="rocksdict")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_rocksdict)
    for args in (["consumers", r], ["verify", r], ["lookup", r, "--queue", "TopicTest", 0, 0]):
        res = run(*args)
        assert res.exit_code != 0
        assert "pip install 'rmqdump[rocksdb]'" in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_file_level_tools_name_the_rocksdb_queue(stores):
    """diff and fingerprint compare CQ files: a RocksDB queue has none, and they say so (was: cannot list)."""
    _, r = stores
    from rmqdump.errors import UnsupportedError
    from rmqdump.store.consumequeue import list_mapped_files

    with pytest.raises(UnsupportedError, match="RocksDB consume queue has no mapped files"):
        list_mapped_files(r / "consumequeue" / "TopicTest" / "0")
