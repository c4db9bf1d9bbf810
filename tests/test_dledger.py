"""DLedger commitlog stores (issue 19, item 1) on the bundled ``fixtures/oracle/498-dledger``: 16 records written
by RocketMQ 4.9.8's own ``DLedgerCommitLog`` (a single-member group) into two 4 KiB DLedger data files, and
what its ``run`` read back (``manifest.jsonl``). The DLedger index file is bundled cut to its first 4096 bytes
(the 16 units); :func:`dledger_store` extends a copy to DLedger's 167,772,160 bytes (sparse) as DLedger has it.
Damage is made on copies; what DLedger's recovery does with it follows ``DLedgerMmapFileStore.recover``
(judged on real crashed and torn stores by ``tests/oracle/test_dledger.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle.harness import expected_row
from oracle_fixtures import copy_store, fixture_manifest, tree_state

from rmqdump.cli import cli

NAME = "498-dledger"
INDEX = "dledger-n0/index/00000000000000000000"
DATA0 = "dledger-n0/data/00000000000000000000"
MANIFEST = fixture_manifest(NAME)
ENTRIES = [m for m in MANIFEST if m["type"] == "dledger_entry"]
END = next(m for m in MANIFEST if m["type"] == "store_info")["commitlog_max_offset_after_recovery"]


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, env=env)


@pytest.fixture
def dledger_store(tmp_path) -> Path:
    st = copy_store(NAME, tmp_path / "store")
    os.truncate(st / INDEX, 167772160)
    return st


def scan_rows(store, *args, env=None) -> list[dict]:
    res = run("scan", store, "-f", "jsonl", "--body", "base64", "-q", *args, env=env)
    return [json.loads(line) for line in res.stdout.splitlines()]


def verify_doc(store, *args) -> tuple[dict, int]:
    res = run("verify", store, "-f", "json", "-q", *args)
    return json.loads(res.stdout), res.exit_code


def patch(store: Path, rel: str, pos: int, data: bytes) -> None:
    with open(store / rel, "r+b") as f:
        f.seek(pos)
        f.write(data)


@pytest.mark.parametrize("fast", ["0", "1"])
def test_scan_equals_rocketmq(dledger_store, fast):
    """Every record at its entry + 48, field for field as RocketMQ read it back; the compiled engine, even
    forced, leaves DLedger data files to the pure walk."""
    expected = [expected_row(m) for m in MANIFEST if m["type"] == "message"]
    got = scan_rows(dledger_store, env={"RMQDUMP_FAST": fast})
    assert len(got) == len(expected) == 16
    for g, e in zip(got, expected, strict=True):
        assert {k: g.get(k) for k in e} == dict(e, file=e["file"].rsplit("/", 1)[-1])
    assert [g["offset"] for g in got] == [e["commitLogOffset"] for e in ENTRIES]


def test_verify_clean_and_predicts_dledger(dledger_store):
    doc, code = verify_doc(dledger_store)
    assert code == 0
    assert [f for f in doc["findings"] if f["severity"] != "info"] == []
    rec = doc["recovery"]
    assert rec["mode"] == "dledger" and rec["max_offset"] == END
    assert rec["records_walked"] == len(ENTRIES) and rec["dropped_records"]["count"] == 0
    assert doc["summary"]["records"] == 16 and doc["summary"]["blanks"] == 1


def test_info_stats_lookup_export(dledger_store, tmp_path):
    info = run("info", dledger_store)
    assert info.exit_code == 0 and "2 segments" in info.stdout
    stats = run("stats", dledger_store, "-f", "json")
    assert stats.exit_code == 0 and json.loads(stats.stdout)["totals"]["records"] == 16
    want = next(m for m in MANIFEST if m["type"] == "message" and m["keys"] == "dk7")
    found = run("lookup", dledger_store, "--key", "dk7", "-f", "jsonl")
    assert found.exit_code == 0
    assert [json.loads(x)["offset"] for x in found.stdout.splitlines()] == [want["commitLogOffset"]]
    by_offset = run("lookup", dledger_store, "--offset", want["commitLogOffset"], "-f", "jsonl")
    assert json.loads(by_offset.stdout)["uniq_key"] == want["uniqKey"]
    out = tmp_path / "out.jsonl"
    assert run("export", dledger_store, "--to", out).exit_code == 0
    assert [json.loads(x)["offset"] for x in out.read_text().splitlines()] == [e["commitLogOffset"] for e in ENTRIES]


@pytest.mark.parametrize("cmd", [["append", "--topic", "T", "--body", "x"], ["repair"], ["repair", "--apply"]])
def test_writers_refuse(dledger_store, cmd):
    before = tree_state(dledger_store)
    res = run(cmd[0], dledger_store, *cmd[1:])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "DLedger store" in res.stderr
    assert tree_state(dledger_store) == before


def test_bundled_cut_index_file_is_reported():
    """As bundled (index file cut short) DLedger's load would fail: verify says so, scan still reads."""
    from oracle_fixtures import fixture_dir

    st = fixture_dir(NAME) / "store"
    doc, code = verify_doc(st)
    assert code == 1
    assert [(f["kind"], f["file"]) for f in doc["findings"] if f["severity"] == "error"] == [
        ("dledger_index_file", INDEX)]
    assert len(scan_rows(st)) == 16


def test_index_unit_mismatch(dledger_store):
    e = ENTRIES[5]
    patch(dledger_store, INDEX, 5 * 32 + 24, (7).to_bytes(8, "big"))  # the unit's term
    doc, _ = verify_doc(dledger_store)
    bad = [f for f in doc["findings"] if f["kind"] == "dledger_index_mismatch"]
    assert [(f["file"], f["offset"]) for f in bad] == [(INDEX, 5 * 32)]
    assert "term 7 != entry term 0" in bad[0]["detail"] and f"entry at {e['pos']}" in bad[0]["detail"]
    rec = doc["recovery"]
    assert rec["max_offset"] == END and any("rewrites the index" in n for n in rec["notes"])


def test_damaged_entry_header_ends_what_dledger_keeps(dledger_store):
    """Entry 3's pos field zeroed: DLedger's recovery ends the data at entry 3 and caps committedIndex at 2."""
    e = ENTRIES[3]
    patch(dledger_store, DATA0, e["filePos"] + 24, bytes(8))
    rows = scan_rows(dledger_store)
    assert [r["offset"] for r in rows] == [x["commitLogOffset"] for x in ENTRIES[:3]]
    kept = scan_rows(dledger_store, "--keep-going")
    assert [r["offset"] for r in kept] == [x["commitLogOffset"] for x in ENTRIES if x is not e]
    doc, code = verify_doc(dledger_store)
    assert code == 1
    kinds = {(f["kind"], f["file"], f["offset"]) for f in doc["findings"] if f["severity"] == "error"}
    assert ("dledger_entry", DATA0, e["pos"]) in kinds
    rec = doc["recovery"]
    assert rec["truncated_file"] == {"file": "00000000000000000000", "position": e["pos"]}
    assert rec["max_offset"] == e["pos"] and rec["records_walked"] == 3
    assert rec["deleted_commitlog_files"] == ["00000000000000004096"]
    assert rec["dropped_records"]["intact"] == 12  # entries 4..15 (entry 3's own record is damaged space)
    assert ("recovery_truncates", DATA0, e["pos"]) in kinds


def test_damaged_record_in_a_sound_entry_is_kept(dledger_store):
    """A flipped body byte: DLedger checks headers only, RocketMQ's reput skips the record and reads on."""
    m = next(m for m in MANIFEST if m["type"] == "message" and m["keys"] == "dk5")
    patch(dledger_store, DATA0, m["filePos"] + 100, b"\xff")  # inside the body (it starts at +96)
    rows = scan_rows(dledger_store)
    assert len(rows) == 15 and m["commitLogOffset"] not in [r["offset"] for r in rows]
    doc, _ = verify_doc(dledger_store)
    errors = [(f["kind"], f["offset"]) for f in doc["findings"] if f["severity"] == "error"]
    assert ("body_crc", m["commitLogOffset"]) in errors
    assert not any(k == "recovery_truncates" for k, _ in errors)
    assert doc["recovery"]["max_offset"] == END


def test_checkpoint_missing_or_behind(dledger_store):
    cp = dledger_store / "dledger-n0" / "checkpoint"
    cp.write_text("committedIndex=9\nendIndex=15\n")
    doc, _ = verify_doc(dledger_store)
    assert doc["recovery"]["max_offset"] == ENTRIES[9]["pos"] + ENTRIES[9]["size"]
    assert [f["kind"] for f in doc["findings"] if f["kind"].startswith("dledger_")] == ["dledger_uncommitted"]
    cp.unlink()  # a member that crashed before DLedger's first flush: committedIndex -1, as flushed -1 reads
    doc, _ = verify_doc(dledger_store)
    found = [f for f in doc["findings"] if f["kind"].startswith("dledger_")]
    assert [(f["kind"], f["severity"]) for f in found] == [("dledger_uncommitted", "info")]
    assert "no checkpoint file" in found[0]["detail"] and "16 later entries" in found[0]["detail"]
    assert doc["recovery"]["max_offset"] == 0
    cp.write_text("committedIndex=x\n")  # Long.valueOf fails on it: worth a warning
    doc, _ = verify_doc(dledger_store)
    assert [f["kind"] for f in doc["findings"] if f["kind"].startswith("dledger_")] == ["dledger_checkpoint"]


def test_mixed_store_overlapping_is_refused(dledger_store):
    """An old commitlog/ file reaching past DLedger's first data offset is no layout RocketMQ writes (a real
    mixed store, old files then DLedger's from dividedCommitlogOffset, is read: tests/oracle/test_dledger.py)."""
    (dledger_store / "commitlog").mkdir()
    (dledger_store / "commitlog" / "00000000000000000000").write_bytes(bytes(4096))
    res = run("scan", dledger_store)
    assert res.exit_code == 2 and "mixed store" in res.stderr and res.stderr.count("\n") == 1


def test_offset_ranges_name_records(dledger_store):
    """--from-offset/--to-offset are record offsets (entry + 48), as everywhere else; a lookup sees the index
    cover every record (the entry headers between records are no uncovered commitlog)."""
    offs = [e["commitLogOffset"] for e in ENTRIES]
    rows = scan_rows(dledger_store, "--from-offset", offs[5], "--to-offset", offs[8])
    assert [r["offset"] for r in rows] == offs[5:8]
    res = run("lookup", dledger_store, "--key", "dk12", "-f", "jsonl")
    assert res.exit_code == 0 and "does not cover" not in res.stderr and "commitlog scan" not in res.stderr


def test_data_files_given_alone(dledger_store, tmp_path):
    """A DLedger data file given alone (in its folder, or copied anywhere: its first entry header says what it
    is) is read entry by entry; without index and checkpoint every entry counts as committed."""
    first = [e["commitLogOffset"] for e in ENTRIES if e["file"].endswith(DATA0.rsplit("/", 1)[-1])]
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "00000000000000000000").write_bytes((dledger_store / DATA0).read_bytes())
    for path in (dledger_store / DATA0, lone / "00000000000000000000", dledger_store / "dledger-n0" / "data"):
        rows = scan_rows(path)
        assert [r["offset"] for r in rows][:len(first)] == first
    doc, code = verify_doc(lone / "00000000000000000000")
    assert code == 0 and [f for f in doc["findings"] if f["severity"] != "info"] == []
    assert doc["recovery"]["mode"] == "dledger" and doc["recovery"]["records_walked"] == len(first)
    last = ENTRIES[len(first) - 1]
    assert doc["recovery"]["max_offset"] == last["pos"] + last["size"]


def test_resync_skips_holes(dledger_store, tmp_path):
    """--keep-going past damage in a sparse DLedger data file asks the filesystem for the next data (SEEK_DATA)
    instead of reading gigabytes of holes (on tmpfs a mapped read of a hole allocates it)."""
    from rmqdump.disk.segment import Segment
    from rmqdump.store.dledger.files import resync_entry

    big = tmp_path / "dledger-n0" / "data" / "00000000000000000000"
    big.parent.mkdir(parents=True)
    big.write_bytes((dledger_store / DATA0).read_bytes()[:1000])
    os.truncate(big, 1 << 32)
    r = Segment(big, 0, 1 << 32).open(True)
    viewed = []
    view = r.view
    r.view = lambda pos, n: viewed.append(n) or view(pos, n)
    try:
        assert resync_entry(r, 1001) is None
    finally:
        r.close()
    assert sum(viewed) < 1 << 22, f"{sum(viewed)} bytes of holes read"
    rows = scan_rows(tmp_path, "--keep-going")
    offs = [r["offset"] for r in rows]  # the cut entry's header is sound: its torn record is read as RocketMQ does
    assert offs == [e["commitLogOffset"] for e in ENTRIES[:len(offs)]] and len(offs) >= 3 and offs[-1] < 1000
