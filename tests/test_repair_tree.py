"""`repair --apply` / `--undo` on a store whose whole ``consumequeue/<topic>/`` directory is gone.

Store: ``fixtures/oracle/498-multi-topic`` (RocketMQ 4.9.8's own store code; TopicA queues 0-2, queue 0
over two 320-byte CQ files, TopicB queues 0-1). The rebuilt CQ files must land in
``consumequeue/<topic>/<queueId>/`` byte-equal to what RocketMQ wrote, verify must be clean, and undo
must give back the damaged tree exactly — the same files *and directories*, the same bytes.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_dir, fixture_manifest, oracle_run, recipe, tree_state

from rmqdump.analysis.verify import verify_store
from rmqdump.cli import cli
from rmqdump.errors import StoreError
from rmqdump.write.repair import apply_plan, read_manifest, undo_backup

FIXTURE = "498-multi-topic"


def run(*args, input=None):
    return CliRunner().invoke(cli, list(map(str, args)), input=input)


def cq_files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*"))
            if p.is_file()}


def damaged(tmp_path):
    store = copy_store(FIXTURE, tmp_path / "s")
    shutil.rmtree(store / "consumequeue" / "TopicA")
    return store


def test_repair_recreates_a_deleted_topic_directory_and_undo_is_exact(tmp_path):
    original = fixture_dir(FIXTURE) / "store"
    store = damaged(tmp_path)
    before = tree_state(store)
    out = run("repair", store, "--apply", "--backup-dir", tmp_path / "bk", "-q")
    assert out.exit_code == 0, out.output
    # every CQ file where RocketMQ keeps it, byte for byte what RocketMQ 4.9.8 wrote; nothing else
    assert cq_files(store) == cq_files(original)
    assert {k for k in tree_state(store) if k.startswith("consumequeue")} == \
        {k for k in tree_state(original) if k.startswith("consumequeue")}
    assert [f for f in verify_store(store).findings if f.severity == "error"] == []
    assert run("verify", store, "-q").exit_code == 0
    # the manifest names every directory the repair made, each once
    made = [d for it in read_manifest(tmp_path / "bk")["items"] for d in it.get("created_dirs", [])]
    assert sorted(made) == ["consumequeue/TopicA", "consumequeue/TopicA/0", "consumequeue/TopicA/1",
                            "consumequeue/TopicA/2"]
    out = run("repair", "--undo", tmp_path / "bk", "-q")
    assert out.exit_code == 0, out.output
    assert tree_state(store) == before


def test_repaired_store_read_back_by_rocketmq_498(tmp_path):
    """RocketMQ 4.9.8 loads the repaired store and reads every record with the cq_entry it had written."""
    store = damaged(tmp_path)
    apply_plan(store, backup_dir=tmp_path / "bk")
    man = oracle_run("498", store, tmp_path, recipe(FIXTURE)["run_args"])
    orig = fixture_manifest(FIXTURE)

    def pick(rows, kind, keys):
        return sorted(tuple(r[k] for k in keys) for r in rows if r["type"] == kind)

    cq_keys = ("topic", "queueId", "queueOffset", "commitLogOffset", "size", "tagsCode")
    msg_keys = ("commitLogOffset", "topic", "queueId", "queueOffset", "uniqKey", "body_b64")
    assert pick(man, "cq_entry", cq_keys) == pick(orig, "cq_entry", cq_keys)
    assert pick(man, "message", msg_keys) == pick(orig, "message", msg_keys)
    assert len(pick(man, "cq_entry", cq_keys)) == len(pick(orig, "message", msg_keys)) == 34
    info = next(r for r in man if r["type"] == "store_info")
    assert info["commitlog_max_offset_after_recovery"] == \
        next(r for r in orig if r["type"] == "store_info")["commitlog_max_offset_after_recovery"]


def test_undo_refuses_when_a_created_directory_holds_foreign_files(tmp_path):
    """Undo removes only what the repair made: a file that appeared since in a directory the repair created
    means the store changed (e.g. a broker ran) — refused, nothing touched."""
    store = damaged(tmp_path)
    apply_plan(store, backup_dir=tmp_path / "bk")
    (store / "consumequeue" / "TopicA" / "1" / "00000000000000000320").write_bytes(bytes(320))
    after = tree_state(store)
    with pytest.raises(StoreError, match="changed since the repair"):
        undo_backup(tmp_path / "bk")
    assert tree_state(store) == after
    assert json.loads((tmp_path / "bk" / "manifest.json").read_text())["state"] == "applied"


def test_repair_refuses_to_guess_the_cq_file_size(tmp_path):
    """With every ConsumeQueue file gone, nothing in the store tells mappedFileSizeConsumeQueue; a CQ file of
    the default 6,000,000 bytes made RocketMQ 4.9.8's load() fail ("length not matched message store config
    value"), so repair refuses until --cq-file-size is given, and then writes files RocketMQ loads."""
    store = copy_store(FIXTURE, tmp_path / "s")
    shutil.rmtree(store / "consumequeue")
    before = tree_state(store)
    out = run("repair", store, "--apply", "--backup-dir", tmp_path / "bk", "-q")
    assert out.exit_code == 2 and "--cq-file-size" in out.stderr
    assert tree_state(store) == before
    out = run("repair", store, "--apply", "--backup-dir", tmp_path / "bk2", "--cq-file-size", 320, "-q")
    assert out.exit_code == 0, out.output
    assert cq_files(store) == cq_files(fixture_dir(FIXTURE) / "store")


def test_append_refuses_to_guess_the_cq_file_size(tmp_path):
    """The appender, like repair, does not guess mappedFileSizeConsumeQueue for a store without CQ files."""
    store = copy_store("498-multi-topic", tmp_path / "store")
    shutil.rmtree(store / "consumequeue")
    before = tree_state(store)
    runner = CliRunner()
    res = runner.invoke(cli, ["append", str(store), "--topic", "TopicNew", "--body", "x", "--force", "-q"])
    assert res.exit_code == 2 and "--cq-file-size" in res.output
    assert tree_state(store) == before
    res = runner.invoke(cli, ["append", str(store), "--topic", "TopicNew", "--body", "x", "--force",
                               "--cq-file-size", "320", "-q"])
    assert res.exit_code == 0, res.output
    assert (store / "consumequeue" / "TopicNew" / "0" / "00000000000000000000").stat().st_size == 320


def test_an_empty_checkpoint_left_by_a_kill_is_read_as_zeros(tmp_path):
    """kill -9 between creating the checkpoint and writing it leaves 0 bytes (the broker maps it and
    reads zeros): repair and append go on instead of failing on it (found by the kill -9 campaign)."""
    store = copy_store("498-multi-topic", tmp_path / "store")
    (store / "checkpoint").write_bytes(b"")
    runner = CliRunner()
    res = runner.invoke(cli, ["repair", str(store), "--apply", "--backup-dir", str(tmp_path / "bk"), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["append", str(store), "--topic", "TopicNew", "--body", "x", "-q"])
    assert res.exit_code == 0, res.output
    assert (store / "checkpoint").stat().st_size == 4096
