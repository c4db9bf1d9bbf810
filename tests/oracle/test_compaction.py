"""Compaction stores (issue 19, item 4) written and compacted by RocketMQ 5.3.3's own ``CompactionLog``
(``533/put`` with ``enableCompaction``, a topic with ``cleanup.policy=COMPACTION``, small log/sparse-CQ files and
a compaction pass every second, so several passes run): the compacted records rmqdump reads are exactly those
``shouldRetainMsg`` keeps of the records RocketMQ's ``run`` reads back, byte for byte but PHYSICALOFFSET, each
addressed by its sparse CQ unit, and ``verify`` raises no compaction finding, clean or crashed."""

from __future__ import annotations

import base64
import json

import pytest
from click.testing import CliRunner
from compaction_rules import failed_passes, kept_offsets

from rmqdump.cli import cli
from rmqdump.store.compaction import open_compaction, stray_files

from .harness import load, put, unavailable_reason

pytestmark = [pytest.mark.oracle]

SETTINGS = {"type": "settings", "mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 320,
            "maxHashSlotNum": 64, "maxIndexNum": 256, "enableCompaction": True,
            "compactionMappedFileSize": 3000, "compactionCqMappedFileSize": 460, "compactionScheduleInternal": 1000,
            "topics": {"KV": {"queues": 3, "attributes": {"cleanup.policy": "COMPACTION"}}}}
RUN_ARGS = ["65536", "320", "64", "256", "--set=compactionMappedFileSize=3000", "--set=compactionCqMappedFileSize=460"]


def _spec() -> list[dict]:
    spec: list[dict] = [SETTINGS]
    for i in range(240):
        m = {"topic": "KV", "queueId": i % 3, "body": "" if i % 17 == 5 else f"value-{i}-" + "v" * (i * 7 % 90)}
        if i % 23 != 7:
            m["keys"] = f"key{i * 5 % 11}" if i % 13 else ["a", f"b{i % 4}"]
        spec.append(m)
        if i % 80 == 79:
            spec += [{"type": "wait_dispatch"}, {"type": "sleep", "ms": 2500}]
        if i % 30 == 0:
            spec.append({"topic": "Plain", "keys": "key1", "body": f"p{i}"})
    return spec


def _written(tmp_path_factory, flags: tuple[str, ...]):
    reason = unavailable_reason("533")
    if reason:
        pytest.skip(reason)
    store = tmp_path_factory.mktemp("compaction") / "store"
    put("533", store, _spec(), flags, log=store.parent / "rocketmq.log")
    copy = store.parent / "copy"
    import shutil

    shutil.copytree(store, copy)
    manifest = load("533", copy, RUN_ARGS)
    if not next(m for m in manifest if m["type"] == "store_info")["load_ok"]:
        # RocketMQ's own pass can leave a ".delete" file its load() then refuses (seen in CI with a clean end):
        # rmqdump must predict that refusal, naming the file; its repair deletes the file and RocketMQ then loads
        # the store: the records are judged on that
        strays = stray_files(store)
        assert strays, "RocketMQ refuses its own compaction store for another reason"
        r = CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q"], catch_exceptions=False)
        errors = json.loads(r.stdout)["recovery"]["load_errors"]
        named = [e.split(":")[0] for e in errors]  # the broker's load stops at a queue's first bad folder
        assert named and set(named) <= {p.relative_to(store).as_posix() for p in strays}
        shutil.rmtree(copy)  # RocketMQ's refused load ran in it: repair the store as RocketMQ wrote it
        shutil.copytree(store, copy)
        fixed = CliRunner().invoke(cli, ["repair", str(copy), "--apply", "-q", "--backup-dir",
                                         str(store.parent / "backup")], catch_exceptions=False)
        assert fixed.exit_code == 0, fixed.output
        assert not stray_files(copy)
        manifest = load("533", copy, RUN_ARGS)
    return store, manifest


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _written(tmp_path_factory, ())


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    return _written(tmp_path_factory, ("--crash",))


def _compaction_findings(store) -> list[dict]:
    r = CliRunner().invoke(cli, ["verify", str(store), "-f", "json"], catch_exceptions=False)
    return [f for f in json.loads(r.stdout)["findings"] if f["kind"].startswith("compaction")]


def test_compacted_records_are_what_rocketmq_keeps(clean):
    store, manifest = clean
    msgs = [m for m in manifest if m["type"] == "message" and m["topic"] == "KV"]
    assert len(msgs) == 240
    comp = open_compaction(store)
    assert sorted(comp.queues) == [("KV", 0), ("KV", 1), ("KV", 2)]
    failed = _failed_passes(store)
    passes = 0
    for (topic, qid), q in comp.queues.items():
        mine = sorted((m for m in msgs if m["queueId"] == qid), key=lambda m: m["queueOffset"])
        last = comp.positions.offset(topic, qid)
        passes += last >= 0
        recs = [r for _, r in q.records()]
        if f"{topic}/{qid}" not in failed:  # else RocketMQ's race lost records (and kept stale ones): see below
            assert [r.queue_offset for r in recs] == kept_offsets(mine, last)
        by_q = {m["queueOffset"]: m for m in mine}
        for r in recs:
            m = by_q[r.queue_offset]
            assert (r.body, r.store_timestamp, r.properties_text, r.size) == (
                base64.b64decode(m["body_b64"]), m["storeTimestamp"], m["propertiesRaw"], m["storeSize"])
            assert r.physical_offset == r.offset
        units = [u.entry for u in q.units() if not u.is_end]
        assert [(e.commit_log_offset, e.size, e.msg_base_offset) for e in units] == [
            (r.offset, r.size, r.queue_offset) for r in recs]
        assert len(q.log_files) >= 2
    assert passes == 3  # every queue was compacted at least once
    _assert_only_rocketmqs_losses([f for f in _compaction_findings(store) if f["severity"] != "info"],
                                  _failed_passes(store))


def test_scan_of_each_log_file_equals_the_reader(clean):
    store, _ = clean
    q = open_compaction(store).queues[("KV", 1)]
    for f in q.log_files:
        r = CliRunner().invoke(cli, ["scan", str(f)], catch_exceptions=False)
        rows = [json.loads(x) for x in r.stdout.splitlines()]
        assert [(x["offset"], x["queue_offset"]) for x in rows] == [
            (m.offset, m.queue_offset) for m in q.walk_file(f)[0]]


def _failed_passes(store) -> set[str]:
    """Queues ("KV/0") whose compaction pass RocketMQ's log (kept by ``_written``) shows failing."""
    return failed_passes((store.parent / "rocketmq.log").read_text())


def _assert_only_rocketmqs_losses(found: list[dict], failed: set[str]) -> None:
    """No compaction finding but the records RocketMQ's own compaction lost: 1 in ~20 of these stores (clean or
    crashed) has a queue whose log lacks the latest value of a key (holding an older one) or a key whole, always
    in a queue where RocketMQ logged its own pass failing (54 stores checked). verify must say so: consumers of the
    compacted topic read the stale value."""
    loss = {"compaction_record_missing", "compaction_key_missing"}
    assert [f for f in found if f["kind"] not in loss] == []
    assert [f for f in found if f["detail"].split(":")[0] not in failed] == [], (
        f"a loss in a queue whose compaction RocketMQ did not log as failed (failed: {sorted(failed)})")


def test_crashed_store_has_no_false_compaction_finding(crashed):
    store, _ = crashed
    _assert_only_rocketmqs_losses([f for f in _compaction_findings(store) if f["severity"] != "info"],
                                  _failed_passes(store))


def test_a_pass_that_crashed_before_persisting_its_position_is_no_loss(clean, tmp_path):
    """``compactAndReplace`` swaps the compacted files in, then persists the position: a crash in between (the
    full suite once caught RocketMQ's own ``--crash`` store there) leaves a log compacted past the position. With
    the ``abort`` file left, the records that pass dropped are not reported missing; with no crash the position
    is the horizon, and the same log is a loss."""
    import shutil

    from rmqdump.store.compaction import COMPACTION_DIR, POSITION_FILE

    store = tmp_path / "store"
    shutil.copytree(clean[0], store)
    for name in (POSITION_FILE, POSITION_FILE + ".bak"):
        p = store / COMPACTION_DIR / name
        if p.exists():  # every queue back to "never compacted", as before the first pass persisted
            doc = json.loads(p.read_text())
            doc["queueOffsetMap"] = {k: -1 for k in doc.get("queueOffsetMap", {})}
            p.write_text(json.dumps(doc))
    kinds = {f["kind"] for f in _compaction_findings(store) if f["severity"] == "error"}
    assert kinds == {"compaction_record_missing"}  # no crash: the position is the horizon
    (store / "abort").write_bytes(b"")
    _assert_only_rocketmqs_losses([f for f in _compaction_findings(store) if f["severity"] != "info"],
                                  _failed_passes(clean[0]))
