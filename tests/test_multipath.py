"""Multi-path commitlogs (issue 19, item 3) on the bundled ``fixtures/oracle/498-multipath``: 24 records written
by RocketMQ 4.9.8 with ``storePathCommitLog`` = ``commitlog,disk2/commitlog``, so its
``MultiPathMappedFileQueue`` put files 0 and 8192 in ``commitlog/`` and 4096 and 12288 in ``disk2/commitlog/``;
``manifest.jsonl`` is what RocketMQ's ``run --set commitLogPaths=...`` read back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle.harness import expected_row
from oracle_fixtures import copy_store, fixture_manifest

from rmqdump.cli import cli
from rmqdump.store.inventory import take_inventory

NAME = "498-multipath"
PATHS = "commitlog,disk2/commitlog"
MANIFEST = fixture_manifest(NAME)
MESSAGES = [m for m in MANIFEST if m["type"] == "message"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def store(tmp_path) -> Path:
    return copy_store(NAME, tmp_path / "store")


def findings(st: Path, *args) -> list[dict]:
    r = run("verify", st, "-f", "json", *args)
    return json.loads(r.stdout)["findings"]


def scan_rows(st: Path, *args) -> list[dict]:
    r = run("scan", st, "-f", "jsonl", "--body", "base64", *args)
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_scan_reads_every_folder_in_offset_order_as_rocketmq(store):
    rows = scan_rows(store, "--commitlog-path", PATHS)
    assert len(rows) == 24
    assert rows == [expected_row(m) for m in MESSAGES]
    assert {r["file"] for r in rows} == {"00000000000000000000", "00000000000000004096",
                                         "00000000000000008192", "00000000000000012288"}


def test_broker_config_names_the_folders(store, tmp_path):
    cfg = tmp_path / "broker.conf"
    cfg.write_text(f"brokerName=b\nstorePathCommitLog = {store / 'commitlog'},{store / 'disk2/commitlog'}\n")
    assert scan_rows(store, "--broker-config", cfg) == [expected_row(m) for m in MESSAGES]


def test_verify_clean_with_paths_and_hint_without(store):
    found = findings(store, "--commitlog-path", PATHS)
    assert [f for f in found if f["severity"] != "info"] == []
    alone = {f["kind"]: f for f in findings(store)}
    assert "segment_gap" in alone
    assert f"--commitlog-path {PATHS}" in alone["commitlog_path_unread"]["detail"]


def test_stats_and_info_count_both_folders(store):
    r = run("stats", store, "-f", "json", "--commitlog-path", PATHS)
    assert json.loads(r.stdout)["totals"]["records"] == 24
    info = json.loads(run("info", store, "-f", "json", "--commitlog-path", PATHS).stdout)["commitlog"]
    assert info["max_offset"] == 15608
    assert {Path(f["directory"]).relative_to(store).as_posix(): f["segments"] for f in info["folders"]} == {
        "commitlog": ["00000000000000000000", "00000000000000008192"],
        "disk2/commitlog": ["00000000000000004096", "00000000000000012288"]}


def test_same_segment_in_two_folders_is_an_overlap(store):
    shutil.copy(store / "commitlog/00000000000000000000", store / "disk2/commitlog/00000000000000000000")
    dup = [f for f in findings(store, "--commitlog-path", PATHS) if f["kind"] == "segment_duplicate"]
    assert len(dup) == 1 and dup[0]["severity"] == "error"
    assert dup[0]["file"].endswith("disk2/commitlog/00000000000000000000")


def test_segment_missing_from_every_folder_is_a_gap(store):
    (store / "disk2/commitlog/00000000000000004096").unlink()
    gaps = [f for f in findings(store, "--commitlog-path", PATHS) if f["kind"] == "segment_gap"]
    assert len(gaps) == 1 and "in none of them" in gaps[0]["detail"]


def test_missing_folder_is_reported(store):
    kinds = {f["kind"] for f in findings(store, "--commitlog-path", PATHS + ",disk3/commitlog")}
    assert "commitlog_path_missing" in kinds


def test_append_refuses_a_multipath_store(store):
    before = sorted(p.name for p in (store / "commitlog").iterdir())
    r = CliRunner().invoke(cli, ["append", str(store), "--topic", "T", "--body", "x"])
    assert r.exit_code == 2
    assert "multi-path" in r.output and "Traceback" not in r.output
    assert sorted(p.name for p in (store / "commitlog").iterdir()) == before


def test_inventory_counts_the_second_folder_as_read(store):
    inv = take_inventory(store)
    groups = {g["path"]: g for g in inv.to_dict()["groups"]}
    assert groups["<dir>/[commitlog/]<offset>"]["status"] == "read"
    assert inv.counts()["named"] == 0 and inv.counts()["unknown"] == 0
