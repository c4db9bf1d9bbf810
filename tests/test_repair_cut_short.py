"""A store's only commitlog file cut short (a partial copy, a disk that filled up): RocketMQ's ``load()``
refuses it ("length not matched message store config value"), and nothing in the file says how long it
should be. ``fixtures/oracle/498-cut-short``: 12 records written by RocketMQ 4.9.8 into a 65536-byte
file, then cut to 2400 bytes, inside the last record; RocketMQ's manifest records the refusal.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_dir, fixture_manifest, oracle_run, recipe, tree_state

from rmqdump.cli import cli

NAME = "498-cut-short"


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_verify_predicts_the_refusal():
    info = next(m for m in fixture_manifest(NAME) if m["type"] == "store_info")
    assert info["load_ok"] is False
    res = _run("verify", fixture_dir(NAME) / "store", "-f", "json", "-q")
    rec = json.loads(res.stdout)["recovery"]
    assert rec["mode"] == "refuses_to_start" and "cut short" in rec["load_errors"][0]
    assert rec["max_offset"] == 2261  # where the recovery would end once the file has its length


def test_info_says_the_store_does_not_load():
    """info's next start said "normal recovery reads ..." of this store (a cut needs the recovery walk's stop,
    which info did not run); it walks the lone file when its last bytes are data, and agrees with verify."""
    res = _run("verify", fixture_dir(NAME) / "store", "-f", "json", "-q")
    errors = json.loads(res.stdout)["recovery"]["load_errors"]
    ns = json.loads(_run("info", fixture_dir(NAME) / "store", "-f", "json").stdout)["next_start"]
    assert ns["store_loads"] is False and ns["load_errors"] == errors


def test_repair_asks_for_the_file_size_then_restores_it(tmp_path):
    store = copy_store(NAME, tmp_path / "store")
    before = tree_state(store)
    res = _run("repair", store, "--apply", "--backup-dir", tmp_path / "bk0", "-q")
    assert res.exit_code == 2 and "--commitlog-file-size" in res.output
    assert tree_state(store) == before
    res = _run("repair", store, "--apply", "--commitlog-file-size", 65536, "--backup-dir", tmp_path / "bk", "-q")
    assert res.exit_code == 0, res.output
    seg = store / "commitlog" / "00000000000000000000"
    assert seg.stat().st_size == 65536
    doc = json.loads(_run("verify", store, "-f", "json", "-q").stdout)
    assert doc["summary"]["errors"] == 0 and doc["recovery"]["max_offset"] == 2261
    r = recipe(NAME)
    manifest = oracle_run(r["version"], store, tmp_path, r["run_args"])
    info = next(m for m in manifest if m["type"] == "store_info")
    assert info["commitlog_max_offset_after_recovery"] == 2261
    assert sum(m["type"] == "message" for m in manifest) == 11
    assert _run("repair", "--undo", tmp_path / "bk").exit_code == 0
    assert tree_state(store) == before
