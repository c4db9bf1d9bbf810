"""What stops the broker's start around its store (rmqdump.broker.recovery.start): verify's recovery prediction
said "mode normal" and its next start estimate "normal recovery reads ..." on stores whose broker does not start
(config tables that do not load, the 5.x timer store), while a finding said "does not start". The prediction
now carries the start failures, with whether the store's recovery runs before the broker stops.

Judged by RocketMQ where its oracle can: 4.9.8 loads ``delayOffset.json`` at the end of its store's own
``load()`` (``498/run``); the 5.x timer cases are judged by ``533/put`` in tests/test_timer_load.py. The config
tables ``BrokerController`` loads before its store are read from its source (the oracle runs no controller)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, rocketmq_loads

from rmqdump.cli import cli

NAME49 = "498-multi-topic"


def _verify(store: Path, *extra: str) -> dict:
    res = CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q", *extra])
    return json.loads(res.stdout)


def _bad(store: Path, name: str, bak: bool = True) -> None:
    cdir = store / "config"
    cdir.mkdir(exist_ok=True)
    (cdir / name).write_text("{bad")
    if bak:
        (cdir / f"{name}.bak").write_text("[[[")


@pytest.mark.parametrize("name", ["topics.json", "consumerOffset.json", "subscriptionGroup.json",
                                  "consumerFilter.json"])
def test_a_config_table_that_does_not_load_stops_the_start_before_the_store(name, tmp_path):
    store = copy_store(NAME49, tmp_path / "s")
    _bad(store, name)
    doc = _verify(store)
    fails = doc["recovery"]["start_failures"]
    assert [(f["file"], f["stage"]) for f in fails] == [(f"config/{name}", "before the store loads")]
    assert doc["next_start"]["starts"] is False
    assert doc["recovery"]["mode"] == "normal"  # the recovery it will run once the table loads
    text = CliRunner().invoke(cli, ["verify", str(store)]).stdout
    assert "does not start" in text and f"once config/{name} loads" in text
    info = " ".join(CliRunner().invoke(cli, ["info", str(store)]).stdout.split())
    assert f"the broker does not start until config/{name} loads" in info  # info said "normal recovery reads"
    # no .bak: ConfigManager.loadBak finds nothing and the broker starts with the table empty
    (store / "config" / f"{name}.bak").unlink()
    doc = _verify(store)
    assert doc["recovery"]["start_failures"] == [] and doc["next_start"]["starts"] is True


def test_a_file_the_broker_does_not_load_stops_nothing(tmp_path):
    """A config file no ConfigManager loads at start: a warning, never "does not start"."""
    store = copy_store(NAME49, tmp_path / "s")
    _bad(store, "myTool.json")
    doc = _verify(store)
    assert doc["recovery"]["start_failures"] == []
    (f,) = [f for f in doc["findings"] if f["kind"] == "config_parse"]
    assert f["severity"] == "warning" and "does not start" not in f["detail"]


def test_5x_tables_only_on_5x(tmp_path):
    store = copy_store(NAME49, tmp_path / "s")
    _bad(store, "consumerOrderInfo.json")
    assert _verify(store, "--broker-version", "4.9")["recovery"]["start_failures"] == []
    fails = _verify(store, "--broker-version", "5.3")["recovery"]["start_failures"]
    assert [f["file"] for f in fails] == ["config/consumerOrderInfo.json"]


@pytest.mark.parametrize("bak", [True, False])
def test_delay_offsets_stop_4_9s_store_load_after_its_recovery(bak, tmp_path):
    """4.9.8's DefaultMessageStore.load() loads delayOffset.json after the recovery: RocketMQ's load() fails
    exactly when its .bak holds bytes that do not decode."""
    store = copy_store(NAME49, tmp_path / "s")
    _bad(store, "delayOffset.json", bak)
    doc = _verify(store)
    fails = doc["recovery"]["start_failures"]
    assert [(f["file"], f["stage"]) for f in fails] == (
        [("config/delayOffset.json", "after the store's recovery")] if bak else [])
    assert doc["next_start"]["starts"] is not bak
    if bak:
        text = " ".join(CliRunner().invoke(cli, ["verify", str(store)]).stdout.split())
        assert "then the broker stops" in text
        info = " ".join(CliRunner().invoke(cli, ["info", str(store)]).stdout.split())
        assert "then the broker stops: config/delayOffset.json" in info
    assert rocketmq_loads(NAME49, store, tmp_path) in (None, not bak)  # RocketMQ's verdict where the oracle is


@pytest.mark.parametrize("name", ["topics.json", "delayOffset.json"])
def test_repair_does_not_say_needs_no_repair_of_a_store_that_does_not_start(name, tmp_path):
    """repair said "the store needs no repair" (exit 0) of a store whose broker does not start on a config table
    with no decodable copy: it refuses, naming the file, and writes nothing."""
    store = copy_store(NAME49, tmp_path / "s")
    _bad(store, name)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    r = CliRunner().invoke(cli, ["repair", str(store), "--apply", "-q"])
    assert r.exit_code == 2 and f"config/{name}: it and its .bak do not decode" in r.output
    assert "the broker does not start" in r.output
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    (store / "config" / f"{name}.bak").unlink()  # no .bak: the broker starts (that table empty)
    assert CliRunner().invoke(cli, ["repair", str(store), "-q"]).exit_code == 0


def test_a_table_kept_in_rocksdb_is_not_read_from_its_json(tmp_path):
    """A 5.x store whose config tables are in RocksDB (``config/rdb``): the broker reads topics from there, so an
    undecodable topics.json and .bak stop nothing (verify's prediction and its finding agree)."""
    import shutil

    from conftest import FIXTURES

    store = shutil.copytree(FIXTURES / "rocksdb" / "store-rocks", tmp_path / "s")
    _bad(store, "topics.json")
    doc = _verify(store)
    assert doc["recovery"]["start_failures"] == []
    (f,) = [f for f in doc["findings"] if f["kind"] == "config_parse"]
    assert f["severity"] == "warning" and "does not start" not in f["detail"]


def test_a_store_load_refusal_and_a_timer_stop_are_both_told(tmp_path):
    """The store's load() fails (a stray consume-queue file) and, once that is fixed, the timer store stops the
    broker after its recovery: the next start says both (it dropped "until load() succeeds" when a start failure
    came after the recovery)."""
    from rmqdump.broker.recovery.cost import summary_lines

    store = copy_store("533-timer", tmp_path / "s")
    queue = next(p for p in (store / "consumequeue").glob("*/*") if p.is_dir())
    (queue / "junk").write_bytes(b"x")
    (store / "timerlog" / "junk").write_bytes((store / "timerlog" / "00000000000000000000").read_bytes())
    doc = _verify(store)
    assert doc["recovery"]["mode"] == "refuses_to_start"
    assert [f["stage"] for f in doc["recovery"]["start_failures"]] == ["after the store's recovery"]
    text = " ".join(CliRunner().invoke(cli, ["verify", str(store)]).stdout.split())
    assert f"once load() succeeds (it fails: {queue.relative_to(store)}/junk" in text
    assert "then the broker stops: timerlog/junk" in text
    summary = " ".join(summary_lines(doc["next_start"]))  # info's lines, from verify's full prediction
    assert f"the broker does not start until load() succeeds (it fails: {queue.relative_to(store)}/junk" in summary
    assert "the broker's load fails on it); then" in summary
    assert "then the broker stops: timerlog/junk" in summary
