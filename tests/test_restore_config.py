"""`repair --restore-config`: corrupt, empty or missing config/*.json restored from .bak; planned, undoable."""

from __future__ import annotations

import hashlib
import json
import shutil

from click.testing import CliRunner

from conftest import FIXTURES
from rmqdump.cli import cli
from rmqdump.store.config import load_consumer_offsets, load_topics


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def power_loss_store(tmp_path):
    """The bundled store after a power loss: topics.json cut short, consumerOffset.json empty."""
    store = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", store)
    cfg = store / "config"
    data = (cfg / "topics.json").read_bytes()
    (cfg / "topics.json").write_bytes(data[:len(data) // 2])
    (cfg / "consumerOffset.json").write_bytes(b"")
    return store


def test_restore_config_plans_applies_and_undoes(tmp_path):
    store = power_loss_store(tmp_path)
    cfg = store / "config"
    before = tree(store)
    corrupt = {n: (cfg / n).read_bytes() for n in ("topics.json", "consumerOffset.json")}

    r = run("repair", store, "--restore-config", "-f", "json")  # a dry run by default
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    steps = {s["file"]: s for s in doc["steps"] if s["group"] == "config"}
    assert set(steps) == {"config/topics.json", "config/consumerOffset.json"}
    assert steps["config/consumerOffset.json"]["detail"] == "empty (0 bytes)"
    assert tree(store) == before

    backup = tmp_path / "bk"
    r = run("repair", store, "--restore-config", "--apply", "--backup-dir", backup, "-f", "json")
    assert r.exit_code == 0, r.output
    for name in corrupt:
        assert (cfg / name).read_bytes() == (cfg / f"{name}.bak").read_bytes()
    topics, offsets = load_topics(store), load_consumer_offsets(store)
    assert not topics.used_backup and topics.path == cfg / "topics.json" and "TopicTest" in topics.data
    assert not offsets.used_backup and offsets.data.offsets("TopicTest", "cg-test") == {0: 5, 1: 3, 2: 0, 3: 10}
    assert not (store / "abort").exists()
    assert run("repair", store, "--restore-config").exit_code == 0  # nothing left to restore

    r = run("repair", "--undo", backup)
    assert r.exit_code == 0, r.output
    assert tree(store) == before
    for name, data in corrupt.items():
        assert (cfg / name).read_bytes() == data


def test_restore_config_missing_main_is_created_and_undo_removes_it(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", store)
    (store / "config" / "delayOffset.json").unlink()  # string2File: killed between delete and rename
    before = tree(store)
    r = run("repair", store, "--restore-config", "--apply", "--backup-dir", tmp_path / "bk", "-q")
    assert r.exit_code == 0, r.output
    assert (store / "config" / "delayOffset.json").read_bytes() == (store / "config" / "delayOffset.json.bak").read_bytes()
    assert run("repair", "--undo", tmp_path / "bk").exit_code == 0
    assert tree(store) == before


def test_restore_config_refuses_a_bad_bak(tmp_path):
    store = power_loss_store(tmp_path)
    (store / "config" / "topics.json.bak").write_bytes(b"\0" * 64)  # the .bak is no better
    before = tree(store)
    for extra in ((), ("--apply", "--backup-dir", tmp_path / "bk")):
        r = run("repair", store, "--restore-config", *extra)
        assert r.exit_code == 2, r.output
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "config/topics.json" in err[0] and ".bak cannot replace it" in err[0], r.stderr
        assert "Traceback" not in r.output
    assert tree(store) == before
    assert not (tmp_path / "bk").exists()


def test_without_restore_config_the_plan_only_warns(tmp_path):
    store = power_loss_store(tmp_path)
    before = tree(store)
    r = run("repair", store, "-f", "json")
    doc = json.loads(r.stdout)
    assert not [c for c in doc["changes"] if c["group"] == "config"]
    assert any("config/topics.json is unusable" in w and "--restore-config" in w for w in doc["warnings"])
    assert tree(store) == before
