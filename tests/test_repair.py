"""`rmqdump repair`: plan, apply, backup manifest, undo, rebuild — checked against RocketMQ's own recovery."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle_fixtures import tree_state

from conftest import manifest, real_store
from rmqdump.analysis.verify import verify_store
from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.errors import StoreError
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueue, discover_queues
from rmqdump.store.indexfile import IndexStore
from rmqdump.write.appender import inspect_store
from rmqdump.write.repair import apply_plan, filler_record, plan_repair, read_manifest, undo_backup


def tree_digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run(*args, input=None):
    return CliRunner().invoke(cli, list(map(str, args)), input=input)


def messages(path) -> list[Message]:
    return [m for m in CommitLog.open(path).walk() if isinstance(m, Message)]


def cq_entries(store) -> set[tuple]:
    out = set()
    for ref in discover_queues(store):
        for e in ConsumeQueue(ref.path, ref.topic, ref.queue_id).iter_entries():
            out.add((ref.topic, ref.queue_id, e.queue_offset, e.commit_log_offset, e.size, e.tags_code))
    return out


def manifest_cq(name: str) -> set[tuple]:
    return {(e["topic"], e["queueId"], e["queueOffset"], e["commitLogOffset"], e["size"], e["tagsCode"])
            for e in manifest(name) if e["type"] == "cq_entry"}


def errors(store) -> list:
    return [f for f in verify_store(store).findings if f.severity == "error"]


# --- crash_torn: the acceptance case -----------------------------------------------------------------------


def test_repair_crash_torn_matches_rocketmq_and_undo_restores(store_copy, tmp_path):
    store = store_copy("crash_torn")
    original = tree_digest(store)
    out = run("repair", store, "-f", "json")  # dry run
    assert out.exit_code == 1, out.output
    plan = json.loads(out.stdout)
    assert plan["broker_end"] == plan["end"] == 396985 and plan["needs_repair"] and not plan["salvage_needed"]
    actions = {(s["group"], s["action"]) for s in plan["steps"]}
    assert {("commitlog", "truncate"), ("consumequeue", "drop"), ("index", "rebuild"), ("abort", "remove")} <= actions
    assert tree_digest(store) == original  # the dry run changed nothing

    backup = tmp_path / "bk"
    out = run("repair", store, "--apply", "--backup-dir", backup, "-f", "json")
    assert out.exit_code == 0, out.output
    msgs = messages(store)
    rm = [e for e in manifest("crash_torn_after_rocketmq_recovery") if e["type"] == "store_info"][0]
    assert len(msgs) == 231 and msgs[-1].offset + msgs[-1].size == 396985
    assert rm["commitlog_max_offset_after_recovery"] == 396985
    assert [m.offset for m in msgs] == [e["commitLogOffset"] for e in manifest("crash_torn_after_rocketmq_recovery")
                                        if e["type"] == "message"]
    # the consume queues are exactly what RocketMQ's own recovery left
    assert cq_entries(store) == manifest_cq("crash_torn_after_rocketmq_recovery")
    # every index hit the broker's rebuilt index returns (below the end), we return too — and more:
    # the broker deleted the index file and re-indexed only the last commitlog file
    extra = 0
    with IndexStore(store) as idx:
        for q in manifest("crash_torn_after_rocketmq_recovery"):
            if q["type"] != "index_query":
                continue
            ours = idx.query(q["topic"], q["key"]).phy_offsets
            theirs = [o for o in q["phyOffsets_in_returned_order"] if o < 396985]
            assert set(theirs) <= set(ours), q
            extra += len(set(ours) - set(theirs))
    assert extra > 100
    assert not (store / "abort").exists() and errors(store) == []
    st = inspect_store(store)
    assert st.dirty == [] and st.overwrite == []  # appendable again

    doc = read_manifest(backup)
    assert doc["state"] == "applied" and doc["abort_before"] == ""
    assert all(i["sha256_before"] and (i["op"] != "write" or i["sha256_after"]) for i in doc["items"])
    out = run("repair", "--undo", backup, "-f", "json")
    assert out.exit_code == 0, out.output
    assert tree_digest(store) == original
    assert read_manifest(backup)["state"] == "undone"


def test_nothing_to_do_on_clean(store_copy, tmp_path):
    store = store_copy("clean")
    out = run("repair", store, "-f", "json")
    assert out.exit_code == 0 and not json.loads(out.stdout)["needs_repair"]
    plan, res = apply_plan(store, backup_dir=tmp_path / "bk")
    assert res is None and not (tmp_path / "bk").exists()


def test_apply_refuses_a_change_it_would_not_apply(store_copy, tmp_path, monkeypatch):
    """A planned change of a group apply does not know was skipped while apply reported it applied (the
    compaction leftovers' first version): apply refuses such a plan before writing anything."""
    import rmqdump.write.repair.apply as apply_mod
    from rmqdump.write.repair.model import Change

    store = store_copy("crash_torn")
    before = tree_digest(store)

    def planned(*a, **k):
        plan = plan_repair(*a, **k)
        plan.changes.append(Change("delete", "checkpoint", group="elsewhere", why="test"))
        return plan

    monkeypatch.setattr(apply_mod, "plan_repair", planned)
    with pytest.raises(StoreError, match="unknown group.*elsewhere"):
        apply_plan(store, backup_dir=tmp_path / "bk")
    assert tree_digest(store) == before and not (tmp_path / "bk").exists()


def test_repair_crash_kill9(store_copy, tmp_path):
    store = store_copy("crash_kill9")
    original = tree_digest(store)
    plan, res = apply_plan(store, backup_dir=tmp_path / "bk")
    assert plan.end == 338738 and len(messages(store)) == 464
    assert not (store / "commitlog" / "00000000000000524288").exists()  # the broker deletes it too
    assert cq_entries(store) == manifest_cq("crash_kill9_after_rocketmq_recovery")
    assert not (store / "abort").exists() and errors(store) == []
    item = [i for i in read_manifest(tmp_path / "bk")["items"] if i["op"] == "delete"][0]
    assert item["zero_filled"] and "backup" not in item  # an all-zero file is recorded, not copied
    undo_backup(tmp_path / "bk")
    assert tree_digest(store) == original


# --- damage in the middle: salvage choices -------------------------------------------------------------------


def test_corrupt_crc_offers_salvage_and_truncate_matches_rocketmq(store_copy, tmp_path):
    store = store_copy("corrupt_crc")
    original = tree_digest(store)
    out = run("repair", store, "-f", "json")
    assert out.exit_code == 1
    plan = json.loads(out.stdout)
    assert plan["salvage_needed"] and plan["broker_would_lose"] == 167
    assert {c["name"] for c in plan["choices"]} == {"truncate", "filler", "recrc"}
    out = run("repair", store, "--apply", "--backup-dir", tmp_path / "x")
    assert out.exit_code == 2 and "--salvage" in out.output  # no silent choice
    assert tree_digest(store) == original

    out = run("repair", store, "--apply", "--salvage", "truncate", "--backup-dir", tmp_path / "t", "-f", "json")
    assert out.exit_code == 0, out.output
    msgs = messages(store)
    assert len(msgs) == 64 and msgs[-1].offset + msgs[-1].size == 15458
    assert cq_entries(store) == manifest_cq("corrupt_crc_after_rocketmq_recovery")
    assert not (store / "commitlog" / "00000000000000262144").exists()
    assert errors(store) == []
    undo_backup(tmp_path / "t")
    assert tree_digest(store) == original


@pytest.mark.parametrize("mode", ["filler", "recrc"])
def test_corrupt_crc_salvage_keeps_everything_after_the_damage(store_copy, tmp_path, mode):
    store = store_copy("corrupt_crc")
    original = tree_digest(store)
    plan, res = apply_plan(store, salvage=mode, backup_dir=tmp_path / "bk")
    assert plan.end == 397358 and plan.records_lost == 0
    msgs = messages(store)
    clean = [e for e in manifest("clean") if e["type"] == "message"]
    assert [m.offset for m in msgs] == [e["commitLogOffset"] for e in clean]
    damaged = next(m for m in msgs if m.offset == 15458)
    if mode == "recrc":
        assert damaged.topic == "TopicTest" and damaged.crc_ok
        assert errors(store) == []  # consume queue and index stay valid
        assert res.bytes_backed_up == 4
    else:
        # a tombstone of the destroyed message: its own queue slot, no longer another topic's filler
        assert (damaged.topic, damaged.queue_id, damaged.queue_offset, damaged.transaction) == ("TopicTest", 2, 16,
                                                                                                "none")
        assert damaged.body.startswith(b"rmqdump repair filler: the message at offset 15458")
        assert not any("TopicTest/2 queue offset 16" in w for w in plan.warnings)
        assert errors(store) == []
        with IndexStore(store) as idx:  # the destroyed message's index entries were dropped with the rebuild
            assert all(15458 not in idx.query("TopicTest", k).phy_offsets for k in damaged.keys + ["key-48"])
    # the broker's recovery keeps everything now
    from rmqdump.broker.recovery import predict_recovery
    from rmqdump.store.root import Store

    assert predict_recovery(Store.open(store)).max_offset == 397358
    undo_backup(tmp_path / "bk")
    assert tree_digest(store) == original


def test_filler_record_is_accepted_and_exact():
    from rmqdump.codec.record import decode_record

    for n in (91, 100, 105, 4000):
        rec = filler_record(1000, n, 1795297369000)
        assert len(rec) == n
        m = decode_record(rec, 0, n, 1000, 0, "x")
        assert isinstance(m, Message) and m.size == n and m.transaction == "rollback" and m.physical_offset == 1000
    with pytest.raises(Exception, match="at least 91"):
        filler_record(0, 90, 0)


# --- an interrupted rmqdump append ---------------------------------------------------------------------------


def test_half_written_append_batch_is_cut_off(store_copy, tmp_path):
    from rmqdump.write.appender import LockedAppender
    from rmqdump.write.writer import MessageSpec

    store = store_copy("clean")
    app = LockedAppender(store).open()
    acked = []
    for i in range(20):
        app.append(MessageSpec("TopicTest", b"acked %d" % i, keys=f"a{i}"))
    acked += app.commit()
    for i in range(20):
        app.append(MessageSpec("TopicTest", b"lost %d" % i, keys=f"l{i}"))
    app.writer._flush_buffer()  # bytes of the unfinished batch reach the file, its first 8 bytes do not
    app.fail()  # the process "dies": nothing else happens
    assert (store / "abort").read_bytes().startswith(b"rmqdump append")
    plan = plan_repair(store)
    plan.cleanup()
    assert plan.salvage == "truncate" and plan.broker_would_lose == 19 and not plan.blocked
    plan, res = apply_plan(store, backup_dir=tmp_path / "bk")
    msgs = messages(store)
    assert [m.body for m in msgs[-20:]] == [b"acked %d" % i for i in range(20)]
    assert msgs[-1].offset + msgs[-1].size == plan.end == acked[-1].offset + acked[-1].size
    st = inspect_store(store)
    assert errors(store) == [] and st.dirty == [] and st.overwrite == []


# --- rebuild ------------------------------------------------------------------------------------------------


def test_rebuild_to_side_directory_reproduces_the_brokers_files(tmp_path):
    src = real_store("clean")
    out = run("repair", src, "--rebuild-cq", "--rebuild-index", "--to", tmp_path / "side", "-f", "json")
    assert out.exit_code == 0, out.output
    side = tmp_path / "side"
    produced = sorted(p.relative_to(side) for p in side.rglob("*") if p.is_file())
    assert len(produced) == 26  # 25 consume-queue files + 1 index file
    for rel in produced:  # byte for byte what RocketMQ 4.9.8 wrote
        assert (side / rel).read_bytes() == (src / rel).read_bytes(), rel
    out = run("repair", src, "--rebuild-cq", "--to", src / "inside")
    assert out.exit_code == 2


def test_rebuild_cq_in_place_repairs_a_damaged_queue(store_copy, tmp_path):
    store = store_copy("clean")
    q = store / "consumequeue" / "TopicTest" / "1" / "00000000000000000000"
    good = q.read_bytes()
    bad = bytearray(good)
    bad[200:240] = bytes(40)  # two entries lost in the middle: a hole the broker's recovery stops at
    q.write_bytes(bytes(bad))
    shutil.rmtree(store / "consumequeue" / "TopicOrder" / "1")  # a whole queue gone
    topic_dir = store / "consumequeue" / "TopicTx"
    tx_files = {p.relative_to(store): p.read_bytes() for p in topic_dir.rglob("*") if p.is_file()}
    shutil.rmtree(topic_dir)  # a whole topic gone: every directory level must be re-created
    damaged = tree_state(store)
    plan, res = apply_plan(store, rebuild_cq=True, backup_dir=tmp_path / "bk")
    assert q.read_bytes() == good
    assert {p: (store / p).read_bytes() for p in tx_files} == tx_files  # where RocketMQ keeps them
    assert not [p for p in topic_dir.iterdir() if p.is_file()]
    assert cq_entries(store) == manifest_cq("clean")
    undo_backup(tmp_path / "bk")
    assert tree_state(store) == damaged  # same files and directories, same bytes


def test_repair_dispatches_missing_consume_queue_and_index_entries(store_copy, tmp_path):
    """What the broker's re-dispatch would add after a crash, without deleting the index file."""
    store = store_copy("clean")
    q = store / "consumequeue" / "%RETRY%cg-test" / "0" / "00000000000000000000"
    data = bytearray(q.read_bytes())
    data[20:40] = bytes(20)  # the last entry of this queue was never written
    q.write_bytes(bytes(data))
    (store / "abort").write_bytes(b"")
    plan, res = apply_plan(store, backup_dir=tmp_path / "bk")
    assert any(s["action"] == "dispatch" for s in plan.steps)
    assert cq_entries(store) == manifest_cq("clean")
    assert errors(store) == []


def test_undo_refuses_when_the_store_changed(store_copy, tmp_path):
    store = store_copy("crash_torn")
    apply_plan(store, backup_dir=tmp_path / "bk")
    item = next(i for i in read_manifest(tmp_path / "bk")["items"] if i["path"].startswith("consumequeue"))
    p = store / item["path"]
    data = bytearray(p.read_bytes())
    data[item["offset"]] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="changed since the repair"):
        undo_backup(tmp_path / "bk")
    undo_backup(tmp_path / "bk", force=True)
    assert p.read_bytes() == (real_store("crash_torn") / item["path"]).read_bytes()


def test_backup_records_every_changed_byte(store_copy, tmp_path):
    store = store_copy("crash_torn")
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    apply_plan(store, backup_dir=tmp_path / "bk")
    doc = read_manifest(tmp_path / "bk")
    covered = defaultdict(set)
    for it in doc["items"]:
        assert it["op"] == "write"
        blob = (tmp_path / "bk" / "blobs" / it["backup"]).read_bytes()
        assert blob == before[store / it["path"]][it["offset"]:it["offset"] + it["length"]]
        covered[it["path"]].update(range(it["offset"], it["offset"] + it["length"]))
    for p, old in before.items():
        if p.name == "abort":
            assert not p.exists()
            continue
        new = p.read_bytes()
        changed = {i for i in range(len(old)) if old[i] != new[i]}
        assert changed <= covered[str(p.relative_to(store))], p


# --- crash artefacts: files created but never extended --------------------------------------------------------

CRASH_ZERO = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "crash-zero-length" / "store"


def test_zero_length_files_left_by_a_crash_are_repaired(tmp_path):
    """fixtures/bugs/crash-zero-length: an appender killed between creating a file and extending it
    (CI failure in test_kill9_at_random_points_then_repair: ``write [0, 20) past the end of a 0-byte
    file``). Zero-length last files go; a zero-length CQ file that needs entries is replaced whole."""
    store = tmp_path / "s"
    shutil.copytree(CRASH_ZERO, store)
    original = tree_digest(store)
    assert any(f.kind == "zero_length_segment" for f in errors(store))
    records = [m for m in messages(store / "commitlog") if m.topic == "CrashTopic"]
    assert [(m.queue_id, m.queue_offset) for m in records] == [(0, 0), (0, 1), (1, 0)]

    plan = plan_repair(store)
    assert plan.blocked is None
    ops = [(c.op, c.path) for c in plan.changes]
    assert ("delete", "commitlog/00000000000000016384") in ops
    assert ("delete", "index/20261122000000000") in ops
    assert ("delete", "consumequeue/CrashTopic/1/00000000000000000600") in ops
    q0 = "consumequeue/CrashTopic/0/00000000000000000000"
    assert [op for op, p in ops if p == q0] == ["delete", "create"]
    plan.cleanup()

    _, result = apply_plan(store, backup_dir=tmp_path / "bk")
    assert result is not None
    assert errors(store) == []
    assert (store / q0).stat().st_size == 600
    q0_entries = sorted(e for e in cq_entries(store) if e[0] == "CrashTopic")
    assert [(e[1], e[2], e[3], e[4]) for e in q0_entries] == [
        (m.queue_id, m.queue_offset, m.offset, m.size) for m in sorted(records, key=lambda m: (m.queue_id, m.offset))]
    assert not (store / "commitlog" / "00000000000000016384").exists()
    assert not (store / "abort").exists()

    undo_backup(tmp_path / "bk")
    assert tree_digest(store) == original


@pytest.mark.parametrize("size", [580, 620])
def test_a_wrong_size_queue_file_is_replaced_and_undone(store_copy, tmp_path, size):
    """A CQ file cut short or grown (the broker's load refuses both) becomes a full-size file holding
    its first bytes; undo restores the original length and bytes."""
    store = tmp_path / "s"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "store", store)
    target = store / "consumequeue" / "TopicTest" / "1" / "00000000000000000000"
    before = cq_entries(store)
    data = target.read_bytes()
    target.write_bytes((data + bytes(40))[:size])
    original = tree_digest(store)
    _, result = apply_plan(store, backup_dir=tmp_path / "bk")
    assert result is not None
    assert target.stat().st_size == 600
    assert errors(store) == []
    assert cq_entries(store) == before  # entries lost with the cut are dispatched again from the commitlog
    undo_backup(tmp_path / "bk")
    assert tree_digest(store) == original


def test_a_5x_store_is_not_repaired_as_damage(tmp_path):
    """fixtures/store-5x's V2-magic record is a 5.x broker's, not damage: the 4.9 model would cut the
    commitlog there; repair and append follow verify's auto model (5.3 once a V2 record is seen)."""
    store = tmp_path / "s"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "store-5x", store)
    plan = plan_repair(store)
    assert plan.blocked is None and not plan.needs_repair and plan.end == 1798
    assert any("5.3" in w and "V2-magic record at 1434" in w for w in plan.warnings)
    assert inspect_store(store).dirty == []
