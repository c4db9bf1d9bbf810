"""The 5.x compaction store (issue 19, item 4) on the bundled ``fixtures/oracle/533-compaction``: RocketMQ 5.3.3
wrote it (``533/put``, ``enableCompaction``, topic C with ``cleanup.policy=COMPACTION``, 2208-byte log files,
368-byte sparse CQ files, a compaction pass every second): 42 keyed records and one without KEYS in C, one
in T. ``manifest.jsonl`` is the commitlog RocketMQ's ``run`` read back; the compacted records are judged
against it by ``CompactionLog.shouldRetainMsg``'s rule."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from compaction_rules import failed_passes, kept_offsets
from oracle_fixtures import copy_store, fixture_dir, fixture_manifest, recipe, rocketmq_loads, tree_state

from rmqdump.cli import cli
from rmqdump.store.compaction import open_compaction
from rmqdump.store.inventory import COMPACTION, READ, detect_features, take_inventory

NAME = "533-compaction"
MANIFEST = fixture_manifest(NAME)
MESSAGES = [m for m in MANIFEST if m["type"] == "message"]
FIXTURE = fixture_dir(NAME) / "store"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def store(tmp_path) -> Path:
    return copy_store(NAME, tmp_path / "store")


def compaction_findings(st: Path) -> list[dict]:
    r = run("verify", st, "-f", "json")
    return [f for f in json.loads(r.stdout)["findings"] if f["kind"].startswith("compaction")]


def expected_kept(topic: str, qid: int, last: int) -> list[int]:
    """Queue offsets shouldRetainMsg keeps: after ``last`` everything keyed; up to it the latest with a body."""
    return kept_offsets([m for m in MESSAGES if m["topic"] == topic and m["queueId"] == qid], last)


def test_records_are_what_compaction_keeps_byte_for_byte():
    comp = open_compaction(FIXTURE)
    assert comp.positions.offsets == {("C", 0): 13, ("C", 1): 20}
    assert sorted(comp.queues) == [("C", 0), ("C", 1)]
    commitlog = (FIXTURE / "commitlog" / "00000000000000000000").read_bytes()
    by_q = {(m["topic"], m["queueId"], m["queueOffset"]): m for m in MESSAGES}
    total = 0
    for (topic, qid), q in comp.queues.items():
        recs = [r for _, r in q.records()]
        assert [r.queue_offset for r in recs] == expected_kept(topic, qid, comp.positions.offset(topic, qid))
        for path, r in q.records():
            m = by_q[(topic, qid, r.queue_offset)]
            raw = path.read_bytes()[r.file_pos:r.file_pos + r.size]
            orig = commitlog[m["commitLogOffset"]:m["commitLogOffset"] + m["storeSize"]]
            # only PHYSICALOFFSET (bytes 28..36) is rewritten: to the record's offset in the compaction log
            assert raw[:28] + raw[36:] == orig[:28] + orig[36:]
            assert struct.unpack_from(">q", raw, 28)[0] == r.offset == r.physical_offset
            assert r.body == base64.b64decode(m["body_b64"])
            total += 1
        units = [u for u in q.units() if not u.is_end]
        assert [(u.entry.commit_log_offset, u.entry.size, u.entry.msg_base_offset) for u in units] == [
            (r.offset, r.size, r.queue_offset) for r in recs]
    q0 = comp.queues[("C", 0)]
    assert q0.record_at(4618).queue_offset == 15 and q0.record_at(3000) is None  # 3000: past file 0's 2208 bytes
    assert total == 18  # 11 + 7: of 43 records of C (one without KEYS never enters)


def test_verify_is_clean_and_inventory_reads_compaction():
    assert compaction_findings(FIXTURE) == []
    inv = take_inventory(FIXTURE)
    assert COMPACTION.status == READ and inv.groups[COMPACTION].files == 10  # 4 logs, 4 sparse CQs, checkpoint+.bak
    assert inv.to_dict()["counts"]["unknown"] == 0
    found = {f["feature"]: f for f in detect_features(inv)}
    assert found["compaction"]["present"] and found["compaction"]["rmqdump"] == "reads"


def test_scan_reads_one_compaction_log_file():
    f = FIXTURE / "compaction" / "compactionLog" / "C" / "0" / "00000000000000004416"
    rows = [json.loads(x) for x in run("scan", f).stdout.splitlines()]
    assert [(r["queue_offset"], r["offset"]) for r in rows] == [(14 + i, 4416 + 202 * i) for i in range(6)]


def _log(st: Path, qid: int, name: str) -> Path:
    return st / "compaction" / "compactionLog" / "C" / str(qid) / name


def test_missing_kept_record_is_reported(store):
    # zero the records of queue offsets 11..13 in C/0's compacted file: the latest values of k2, k4, k1
    p = _log(store, 0, "00000000000000000000")
    b = bytearray(p.read_bytes())
    b[404:1010] = bytes(606)
    p.write_bytes(bytes(b))
    got = {f["kind"]: f for f in compaction_findings(store)}
    assert "queue offset 11" in got["compaction_record_missing"]["detail"]
    assert "3 commitlog record(s)" in got["compaction_record_missing"]["detail"]
    assert got["compaction_cq_dangling"]["severity"] == "error"


def test_record_differing_from_commitlog_is_reported(store):
    p = _log(store, 1, "00000000000000006624")
    b = bytearray(p.read_bytes())
    b[4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 3] ^= 1  # a BORNTIMESTAMP byte of the first record: body CRC still holds
    p.write_bytes(bytes(b))
    got = [f for f in compaction_findings(store) if f["kind"] == "compaction_record_mismatch"]
    assert len(got) == 1 and "born_timestamp" in got[0]["detail"] and got[0]["offset"] == 6624


def test_damaged_log_and_unpaired_files(store):
    p = _log(store, 0, "00000000000000004416")
    b = bytearray(p.read_bytes())
    b[202 + 4] ^= 0xFF  # the second record's MAGICCODE
    p.write_bytes(bytes(b))
    (store / "compaction" / "compactionCq" / "C" / "1" / "00000000000000000000").unlink()
    got = {f["kind"]: f for f in compaction_findings(store)}
    assert got["compaction_log_damaged"]["offset"] == 4416 + 202
    assert got["compaction_log_damaged"]["file"] == "compaction/compactionLog/C/0/00000000000000004416"
    kinds = set(got)
    assert got["compaction_files_mismatch"]["file"] == "compaction/compactionLog/C/1/00000000000000000000"
    assert got["compaction_files_mismatch"]["severity"] == "error"
    assert "compaction_record_unindexed" in kinds


def test_position_checkpoint_fallback(store):
    d = store / "compaction"
    (d / "position-checkpoint").write_text("{not json")
    got = compaction_findings(store)
    assert [(f["kind"], f["severity"]) for f in got] == [("compaction_position_bad", "warning")]
    (d / "position-checkpoint.bak").write_text("")
    got = compaction_findings(store)
    assert {(f["kind"], f["severity"]) for f in got} >= {("compaction_position_bad", "error")}


# --- RocketMQ's own compaction losing a record (fixtures/oracle/533-compaction-lost) ------------------------

LOST = "533-compaction-lost"


def test_a_record_rocketmqs_compaction_lost_is_reported():
    """RocketMQ 5.3.3 wrote this store (crashed at the end) while one of its compaction passes raced the
    dispatch into the same queue: its log names the failed pass (``replaceCqFiles`` renaming one sparse CQ file
    twice) and the queue's compaction log lacks a record ``shouldRetainMsg`` keeps. Consumers of the compacted
    topic would read an older value of that key, or none: verify reports it, in that queue only."""
    store = fixture_dir(LOST) / "store"
    failed = failed_passes((fixture_dir(LOST) / "rocketmq.log").read_text())
    comp = open_compaction(store)
    messages = [m for m in fixture_manifest(LOST) if m["type"] == "message" and m["topic"] == "KV"]
    lost = {}
    for (topic, qid), q in comp.queues.items():
        last = comp.positions.offsets[(topic, qid)]
        mine = [m for m in messages if m["queueId"] == qid]
        in_log = {r.queue_offset for f in q.log_files for r in q.walk_file(f)[0]}
        kept = set(kept_offsets(mine, last))
        gone = [m for m in mine if m["queueOffset"] <= last and m["queueOffset"] in kept and m["queueOffset"] not in in_log]
        if gone:
            lost[f"{topic}/{qid}"] = gone
    assert lost and set(lost) <= failed  # RocketMQ's judgement of its own pass, the bytes of the rest
    found = [f for f in compaction_findings(store) if f["severity"] != "info"]
    assert [(f["kind"], f["file"]) for f in found] == [
        ("compaction_record_missing", f"compaction/compactionLog/{q}") for q in sorted(lost)]
    for f in found:
        gone = lost[f["detail"].split(":")[0]]
        assert f"{len(gone)} commitlog record(s)" in f["detail"]
        assert f"queue offset {gone[0]['queueOffset']}, commitlog offset {gone[0]['commitLogOffset']}" in f["detail"]


@pytest.mark.parametrize("folder", ["compactionLog", "compactionCq"])
def test_a_delete_file_a_pass_left_is_a_refusal(store, tmp_path, folder):
    """A compaction pass renames the files it replaces to ``.delete`` before destroying them; one left behind (a
    clean RocketMQ 5.3.3 store of the oracle tests had one) makes the compaction store's load throw
    (``Long.parseLong``) and ``DefaultMessageStore.load()`` return false. verify predicted a normal start."""
    qdir = store / "compaction" / folder / "C" / "0"
    first = sorted(qdir.iterdir())[0]
    (qdir / (first.name + ".delete")).write_bytes(first.read_bytes())
    doc = json.loads(run("verify", store, "-f", "json", "-q").stdout)
    rec = doc["recovery"]
    assert rec["mode"] == "refuses_to_start"
    assert [e.split(":")[0] for e in rec["load_errors"]] == [f"compaction/{folder}/C/0/{first.name}.delete"]
    assert "recovery_refuses_start" in {f["kind"] for f in doc["findings"] if f["severity"] == "error"}
    assert rocketmq_loads(NAME, store, tmp_path) in (None, False)  # RocketMQ's verdict where the oracle is


@pytest.mark.parametrize("folder", ["compactionLog", "compactionCq"])
def test_repair_deletes_a_delete_file_a_pass_left(store, tmp_path, folder):
    """Repair completes what the pass meant to do (destroy the ``.delete`` file, kept in the backup): the broker
    then loads the store, RocketMQ reading back what it read before; ``--undo`` restores the tree byte for byte."""
    qdir = store / "compaction" / folder / "C" / "0"
    first = sorted(qdir.iterdir())[0]
    before = tree_state(store)
    leftover = qdir / (first.name + ".delete")
    leftover.write_bytes(first.read_bytes())
    damaged = tree_state(store)
    plan = run("repair", store, "-f", "json", "-q")
    assert plan.exit_code == 1, plan.output
    doc = json.loads(plan.stdout)
    rel = leftover.relative_to(store).as_posix()
    assert [(c["op"], c["path"]) for c in doc["changes"]] == [("delete", rel)]
    assert "its replacement is in place" in doc["changes"][0]["why"]
    assert tree_state(store) == damaged  # the dry run wrote nothing
    backup = tmp_path / "backup"
    applied = run("repair", store, "--apply", "--backup-dir", backup, "-q")
    assert applied.exit_code == 0, applied.output
    assert tree_state(store) == before
    rec = json.loads(run("verify", store, "-f", "json", "-q").stdout)["recovery"]
    assert rec["mode"] != "refuses_to_start" and not rec["load_errors"]
    from oracle.harness import load, unavailable_reason

    if unavailable_reason("533") is None:
        r = recipe(NAME)
        args = [*r["run_args"], *(f"--set={k}={v}" for k, v in r.get("run_sets", {}).items())]
        import shutil

        back = load("533", shutil.copytree(store, tmp_path / "loaded"), args)
        assert next(m for m in back if m["type"] == "store_info")["load_ok"]
        assert [m for m in back if m["type"] == "message"] == MESSAGES
    undo = run("repair", "--undo", backup, "-q")
    assert undo.exit_code == 0, undo.output
    assert tree_state(store) == damaged


def test_repair_refuses_a_stray_file_rocketmq_does_not_write(store):
    """Only a pass's ``<offset>.delete`` is deleted: another name the load fails on is refused, named (the user's
    file); a stray of another size only leaves the queue unloaded (no refusal) and repair leaves it alone."""
    odd = _log(store, 0, "notes.txt")
    odd.write_bytes(_log(store, 0, "00000000000000000000").read_bytes())
    r = run("repair", store, "--apply", "-q")
    assert r.exit_code == 2
    assert "compaction/compactionLog/C/0/notes.txt: not a numeric file name" in r.output
    odd.write_text("mine")
    r = run("repair", store, "-f", "json", "-q")
    assert r.exit_code == 0 and odd.read_text() == "mine"
    assert any(w.startswith("compaction/compactionLog/C/0: the broker leaves this compaction queue unloaded")
               for w in json.loads(r.stdout)["warnings"])


def test_repair_refuses_when_the_leftover_is_the_only_copy(store, tmp_path):
    """A pass that renamed a sparse-CQ file to ``.delete`` and failed before moving its replacement in: deleting
    the leftover would leave its log file unpaired (the broker still refuses), so repair refuses, naming it."""
    cq = store / "compaction" / "compactionCq" / "C" / "1" / "00000000000000000000"
    cq.rename(cq.with_name(cq.name + ".delete"))
    before = tree_state(store)
    r = run("repair", store, "--apply", "-q", "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 2
    assert "compaction/compactionLog/C/1/00000000000000000000: a log file without its sparse consume queue" in r.output
    assert tree_state(store) == before and not (tmp_path / "bk").exists()


L, Q = Path("compaction/compactionLog/C"), Path("compaction/compactionCq/C")


def _nth(d: Path, i: int) -> Path:
    return sorted(d.iterdir())[i]


#: damage to the compaction store -> whether RocketMQ 5.3.3's load() fails on it (each seen with 533/run)
LOAD_CASES = {
    "last sparse-CQ file gone (the log is cut after its last unit)": (lambda s: _nth(s / Q / "1", -1).unlink(), False),
    "first sparse-CQ file gone (its log file unpaired)": (lambda s: _nth(s / Q / "1", 0).unlink(), True),
    "a log file gone (its sparse-CQ file unpaired)": (lambda s: _nth(s / L / "0", 0).unlink(), True),
    "a small stray file (the queue is left unloaded)": (lambda s: (s / L / "0" / "notes.txt").write_text("x"), False),
    "a full-size stray file (Long.parseLong throws)": (
        lambda s: (s / L / "0" / "notes.txt").write_bytes(_nth(s / L / "0", 0).read_bytes()), True),
    "a queue folder that is no queue id": (lambda s: (s / L / "x").mkdir(), True),
    "a log folder without its sparse-CQ folder": (lambda s: (s / L / "7").mkdir(), False),
    "a log file of another size": (lambda s: _nth(s / L / "0", 0).open("ab").write(b"\0"), False),
    "a zero-length last sparse-CQ file (deleted)": (lambda s: (s / Q / "1" / ("9" * 20)).write_bytes(b""), False),
}


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_verify_predicts_rocketmqs_load_of_the_compaction_store(case, store, tmp_path):
    """``CompactionStore.load`` (``broker.compaction_load``): a name ``Integer/Long.parseLong`` rejects or a file
    without its partner after the load's truncation makes the broker's load() fail; a missing folder or a file of
    another size leaves only that queue unloaded. verify predicted a normal start for unpaired files and a refusal
    for any stray name."""
    mutate, refuses = LOAD_CASES[case]
    mutate(store)
    doc = json.loads(run("verify", store, "-f", "json", "-q").stdout)
    assert (doc["recovery"]["mode"] == "refuses_to_start") is refuses, doc["recovery"]["load_errors"]
    errors = [f for f in doc["findings"] if f["kind"].startswith("compaction") and f["severity"] == "error"]
    assert bool([f for f in errors if f["kind"] == "compaction_files_mismatch"]) is (refuses and "unpaired" in case)
    assert rocketmq_loads(NAME, store, tmp_path) in (None, not refuses)  # RocketMQ's verdict where the oracle is


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 14])
def test_the_loads_log_cut_is_the_same_at_any_read_size(chunk, store, monkeypatch):
    """The sparse-CQ units behind the load's log cut are read a chunk at a time (memory bounded whatever the
    file's size): the same cut whatever the chunk."""
    import rmqdump.broker.compaction_load as cl

    _nth(store / Q / "1", -1).unlink()
    monkeypatch.setattr(cl, "_CHUNK_UNITS", chunk)
    got = cl.compaction_load(store)
    assert (got.refusals, got.unloaded) == ([], [])
    assert got.deleted == ["compaction/compactionLog/C/1/00000000000000006624"]
    units = [u.entry for u in open_compaction(store).queues[("C", 1)].units()]
    last = [e for e in units if e.commit_log_offset >= 0 and e.size > 0][-1]
    assert cl._max_offset_in_log(store / Q / "1", _nth(store / Q / "1", -1).name, 368) == \
        last.commit_log_offset + last.size
