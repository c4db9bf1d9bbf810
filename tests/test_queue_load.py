"""Whether RocketMQ's ``DefaultMessageStore.load()`` succeeds with odd entries in its queue folders
(``consumequeue/`` and the 5.x ``batchconsumequeue/``): 5.3.3's ``MappedFileQueue.load`` skips sub-folders,
deletes a zero-length last file and fails on any other file that is no mapped file (its size differs, or
``Long.parseLong`` throws); 4.9.8's fails on a sub-folder and on an empty file too; a queue folder that is no int
is skipped. verify predicted a normal start for a stray file in a BatchConsumeQueue folder (it never looked
there) and for a sub-folder under 4.9. Judged by ``533/run`` / ``498/run`` where the oracle is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, rocketmq_loads

from rmqdump.cli import cli

NAME = "533-batchcq"
B, C = Path("batchconsumequeue/BCQ"), Path("consumequeue/TopicA")


def _first(d: Path) -> Path:
    return sorted(d.iterdir())[0]


#: an entry added to a queue folder -> whether RocketMQ 5.3.3's load() fails on it (each seen with 533/run)
CASES = {
    "a small stray file in a BatchCQ queue": (lambda s: (s / B / "0" / "junk").write_bytes(b"x"), True),
    "a full-size stray file in a BatchCQ queue": (
        lambda s: (s / B / "0" / "junk").write_bytes(_first(s / B / "0").read_bytes()), True),
    "a zero-length last file in a BatchCQ queue, its name no offset": (
        lambda s: (s / B / "0" / ("9" * 20)).write_bytes(b""), False),
    "a BatchCQ queue folder that is no int": (lambda s: (s / B / "x").mkdir(), False),
    "a small stray file in a consume queue": (lambda s: (s / C / "0" / "junk").write_bytes(b"x"), True),
    "a zero-length last file in a consume queue, its name no offset": (
        lambda s: (s / C / "0" / "zz").write_bytes(b""), False),
    "a zero-length stray file before a sub-folder": (
        lambda s: ((s / C / "0" / "zz").write_bytes(b""), (s / C / "0" / "zzz").mkdir()), True),
    "a sub-folder in a consume queue": (lambda s: (s / C / "0" / "sub").mkdir(), False),
    "a consume queue folder that is no int": (lambda s: (s / C / "x").mkdir(), False),
}
#: the same questions to RocketMQ 4.9.8 (its MappedFileQueue.load neither skips folders nor deletes empty files)
C49 = Path("consumequeue/TopicB")
CASES_49 = {
    "a sub-folder in a consume queue": (lambda s: (s / C49 / "0" / "sub").mkdir(), True),
    "a zero-length last file in a consume queue, its name no offset": (
        lambda s: (s / C49 / "0" / "zz").write_bytes(b""), True),
    "a consume queue folder that is no int": (lambda s: (s / C49 / "x").mkdir(), False),
}


def _verify(store: Path, *extra: str) -> dict:
    return json.loads(CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q", *extra]).stdout)


@pytest.mark.parametrize(("name", "case"), [(NAME, c) for c in CASES] + [("498-multi-topic", c) for c in CASES_49])
def test_verify_predicts_rocketmqs_load_of_queue_folders(name, case, tmp_path):
    store = copy_store(name, tmp_path / "s")
    mutate, refuses = (CASES if name == NAME else CASES_49)[case]
    mutate(store)
    rec = _verify(store)["recovery"]
    assert (rec["mode"] == "refuses_to_start") is refuses, rec["load_errors"]
    assert rocketmq_loads(name, store, tmp_path) in (None, not refuses)  # RocketMQ's verdict where the oracle is
    info = json.loads(CliRunner().invoke(cli, ["info", str(store), "-f", "json"]).stdout)["next_start"]
    assert info["store_loads"] is not refuses and info["load_errors"] == rec["load_errors"]  # info said "normal"


def test_a_4_9_broker_never_reads_batch_consume_queues(tmp_path):
    """BatchCQ is 5.x only: under the 4.9 model a stray file there stops nothing."""
    store = copy_store(NAME, tmp_path / "s")
    (store / B / "0" / "junk").write_bytes(b"x")
    assert _verify(store, "--broker-version", "5.3")["recovery"]["mode"] == "refuses_to_start"
    assert _verify(store, "--broker-version", "4.9")["recovery"]["mode"] != "refuses_to_start"


@pytest.mark.parametrize("folder", [C, B])
def test_repair_refuses_a_stray_the_broker_fails_on(folder, tmp_path):
    """repair said "the store needs no repair" (exit 0) of a store whose broker does not start (a stray file in a
    queue folder, left alone with a warning): it refuses, naming the file, and writes nothing."""
    store = copy_store(NAME, tmp_path / "s")
    (store / folder / "0" / "junk").write_bytes(b"x")
    r = CliRunner().invoke(cli, ["repair", str(store), "--apply", "-q"])
    assert r.exit_code == 2
    assert f"{folder.as_posix()}/0/junk: not a mapped file" in r.output and "move it out of the store" in r.output
    assert (store / folder / "0" / "junk").read_bytes() == b"x"
    (store / folder / "0" / "junk").write_bytes(b"")  # a zero-length last file: 5.x deletes it, no refusal
    assert CliRunner().invoke(cli, ["repair", str(store), "-q"]).exit_code == 0


def test_repair_refuses_a_sub_folder_a_4_9_broker_fails_on(tmp_path):
    store = copy_store("498-multi-topic", tmp_path / "s")
    (store / C49 / "0" / "sub").mkdir()
    r = CliRunner().invoke(cli, ["repair", str(store), "--apply", "-q"])
    assert r.exit_code == 2 and "consumequeue/TopicB/0/sub: not a mapped file (a folder" in r.output


def test_repair_refuses_batch_records_only_the_brokers_recovery_would_dispatch(tmp_path):
    """A crash before the dispatch wrote a BatchCQ topic's units: the broker's own (abnormal) recovery of the
    store dispatches them; repair, which cannot write those units, removed the abort and raised the queues' end,
    so the repaired store's recovery never would (seen in CI: RocketMQ 5.3.3 read them back before the repair,
    verify found them undispatched after). It refuses, writing nothing."""
    store = copy_store(NAME, tmp_path / "s")
    for f in (store / B / "0").iterdir():
        f.unlink()
    (store / "abort").write_text("")
    before = sorted((p.relative_to(store), p.stat().st_size) for p in store.rglob("*") if p.is_file())
    r = CliRunner().invoke(cli, ["repair", str(store), "--apply", "-q"])
    assert r.exit_code == 2 and "have no BatchConsumeQueue unit, which rmqdump cannot write" in r.output
    assert sorted((p.relative_to(store), p.stat().st_size) for p in store.rglob("*") if p.is_file()) == before


def test_one_queue_file_cut_short_is_the_one_named_and_repaired(tmp_path):
    """One damaged file set the store's CQ file size: the first queue's first file cut to 40 bytes made every
    other queue's 320-byte files "the wrong size" (verify named five healthy files as why the broker refuses;
    repair planned 40-byte files). The size is the one most files have: verify names the cut file, repair rewrites
    its queue, and RocketMQ loads the repaired store reading back every consume-queue entry of the fixture."""
    import os

    from oracle_fixtures import fixture_manifest, run_args

    name = "498-multi-topic"
    store = copy_store(name, tmp_path / "s")
    os.truncate(_first(store / "consumequeue" / "TopicA" / "0"), 40)
    rec = _verify(store)["recovery"]
    assert rec["mode"] == "refuses_to_start"
    assert [e.split(":")[0] for e in rec["load_errors"]] == ["consumequeue/TopicA/0/00000000000000000000"]
    plan = json.loads(CliRunner().invoke(cli, ["repair", str(store), "-f", "json"]).stdout)
    assert plan["mode"] == "normal"  # the recovery once the queue is rewritten; the header said only that
    assert "today the broker's load() fails on consumequeue/TopicA/0/00000000000000000000 (40 bytes" in plan["reason"]
    r = CliRunner().invoke(cli, ["repair", str(store), "--apply", "--backup-dir", str(tmp_path / "bk"), "-q"])
    assert r.exit_code == 0, r.output
    assert _verify(store)["recovery"]["mode"] == "normal"
    assert {p.stat().st_size for p in (store / "consumequeue").rglob("0000*")} == {320}
    from oracle.harness import load, unavailable_reason

    if unavailable_reason("498") is None:  # RocketMQ's own reading of the repaired store
        back = load("498", store, run_args(name))
        want = [m for m in fixture_manifest(name) if m["type"] == "cq_entry"]
        assert next(m for m in back if m["type"] == "store_info")["load_ok"]
        assert [m for m in back if m["type"] == "cq_entry"] == want
