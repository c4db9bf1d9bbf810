"""No false alarms on healthy stores RocketMQ itself wrote (fixtures/oracle/*-healthy-*).

Each store was written by RocketMQ's own DefaultMessageStore (``put``) and read back without
complaint by RocketMQ (``run``: ``manifest.jsonl``); rmqdump must not call any of it damage:
- ``498-healthy-tx-v6``: 4.x store-API transactions (PREPARED, then COMMIT/ROLLBACK pointing at it
  in the same topic), one record with IPv6 born/store hosts between IPv4 neighbours, no config/;
- ``533-healthy-bcq``: a 5.x BatchCQ topic (inner batches and a plain message, dispatched into
  ``batchconsumequeue/`` units only);
- ``498-healthy-lmq``: LMQ multi-dispatch (one record in MqttTopic/0 and in ``%LMQ%room1/0`` /
  ``%LMQ%room2/0``);
- ``498-healthy-retention``: RocketMQ's own retention deleted its oldest files (``fileReservedTime`` 0): the
  commitlog starts at 16384, consume-queue files below it are gone and the first index file's first entries
  point into deleted files.
"""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_manifest

from conftest import FIXTURES
from rmqdump.analysis.lookup import lookup_queue
from rmqdump.analysis.verify import verify_store
from rmqdump.cli import cli
from rmqdump.codec.layout import INDEX_HEADER
from rmqdump.fast import walk as fastwalk
from rmqdump.write.appender import inspect_store
from rmqdump.write.repair import apply_plan, plan_repair, rebuild_to

ORACLE = FIXTURES / "oracle"
SEG0 = "00000000000000000000"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def oracle_store(tmp_path):
    """A writable copy of fixtures/oracle/NAME/store (nothing may write into the fixture)."""
    return lambda name: copy_store(name, tmp_path / name)


def findings(report) -> list[tuple[str, str, int | None]]:
    return [(f.severity, f.kind, f.offset) for f in report.findings]


def patch(path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


# --- 1-3: old-style transactions, IPv6 neighbours, no config/ -------------------------------------------


def test_old_style_transactions_ipv6_hosts_and_no_config_are_healthy(oracle_store):
    store = oracle_store("498-healthy-tx-v6")
    msgs = {m["commitLogOffset"]: m for m in fixture_manifest("498-healthy-tx-v6") if m["type"] == "message"}
    # what RocketMQ read back: COMMIT at 532 and ROLLBACK at 919 point at their PREPARED records
    assert msgs[532]["preparedTransactionOffset"] == 344 and msgs[344]["tranType"] == 4
    assert msgs[919]["preparedTransactionOffset"] == 730 and msgs[730]["tranType"] == 4
    assert "2001" in msgs[169]["storeHost"] and msgs[0]["storeHost"] == msgs[344]["storeHost"] == "127.0.0.1|10911"
    r = verify_store(store)
    assert findings(r) == [("info", "config_missing", None)]
    assert r.summary["status"] == "clean" and r.accepted_damaged == []
    assert run("verify", store, "-f", "json").exit_code == 0


def test_commit_pointing_at_no_half_or_prepared_record_is_info(oracle_store):
    """RocketMQ's own 4.x store API writes COMMIT/ROLLBACK records with any offset (0 when none is set):
    worth a note, never an alarm."""
    store = oracle_store("498-healthy-tx-v6")
    patch(store / "commitlog" / SEG0, 532 + 76, struct.pack(">q", 0))  # COMMIT -> the TopicA record at 0
    r = verify_store(store)
    tx = [f for f in r.findings if f.kind == "tx_half_missing"]
    assert [(f.severity, f.offset) for f in tx] == [("info", 532)]
    assert "neither a half message nor a PREPARED record" in tx[0].detail


@pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")
@pytest.mark.parametrize("name", ["498-healthy-tx-v6", "533-healthy-bcq", "498-healthy-lmq", "498-healthy-retention"])
def test_compiled_verify_matches_pure_on_healthy_oracle_stores(name, oracle_store, monkeypatch):
    from test_verify_fast import assert_same

    doc = assert_same(oracle_store(name), monkeypatch)
    assert doc["summary"]["errors"] == 0 and doc["summary"]["warnings"] == 0


# --- 4: BatchConsumeQueue ------------------------------------------------------------------------------


def test_batch_cq_units_count_as_dispatch_in_verify(oracle_store):
    store = oracle_store("533-healthy-bcq")
    units = [m for m in fixture_manifest("533-healthy-bcq") if m["type"] == "batch_cq_entry"]
    assert {(u["topic"], u["queueId"], u["commitLogOffset"]) for u in units} == \
        {("BCQ", 0, 0), ("BCQ", 0, 677), ("BCQ", 1, 1095)}
    r = verify_store(store)
    assert findings(r) == [("info", "config_missing", None)]


def test_batch_cq_unit_with_wrong_size_is_reported(oracle_store):
    store = oracle_store("533-healthy-bcq")
    patch(store / "batchconsumequeue" / "BCQ" / "0" / SEG0, 46 + 8, struct.pack(">i", 1))  # unit 1's size
    kinds = [(f.kind, f.file) for f in verify_store(store).findings if f.severity == "error"]
    assert kinds == [("cq_size_mismatch", "batchconsumequeue/BCQ/0")]


def test_append_accepts_a_healthy_store_with_batch_cq(oracle_store):
    store = oracle_store("533-healthy-bcq")
    st = inspect_store(store)
    assert st.dirty == [] and st.batch_topics == {"BCQ"}
    out = run("append", store, "-t", "TopicA", "--body", "more")
    assert out.exit_code == 0, out.output
    assert not (store / "consumequeue" / "BCQ").exists()
    # a record of the BatchCQ topic would need a BatchConsumeQueue unit: refused, nothing written
    before = (store / "commitlog" / SEG0).read_bytes()
    out = run("append", store, "-t", "BCQ", "--body", "x")
    assert out.exit_code == 2 and "BatchCQ topic" in out.output
    assert (store / "commitlog" / SEG0).read_bytes() == before
    assert not (store / "consumequeue" / "BCQ").exists()


def test_repair_does_not_dispatch_batch_records_into_consume_queues(oracle_store, tmp_path):
    store = oracle_store("533-healthy-bcq")
    plan = plan_repair(store)
    assert plan.changes == [] and not plan.needs_repair
    plan, res = apply_plan(store, backup_dir=tmp_path / "bk")
    assert res is None and not (store / "consumequeue" / "BCQ").exists()


def test_rebuild_cq_leaves_batch_topics_alone_and_says_so(oracle_store, tmp_path):
    store = oracle_store("533-healthy-bcq")
    plan = plan_repair(store, rebuild_cq=True)
    assert not any("consumequeue/BCQ" in c.path for c in plan.changes)
    assert any("BatchConsumeQueue" in w and "not supported" in w for w in plan.warnings)
    apply_plan(store, rebuild_cq=True, backup_dir=tmp_path / "bk")
    assert not (store / "consumequeue" / "BCQ").exists()
    assert verify_store(store).summary["errors"] == 0
    doc = rebuild_to(ORACLE / "533-healthy-bcq" / "store", tmp_path / "side", cq=True, index=False)
    assert not (tmp_path / "side" / "consumequeue" / "BCQ").exists()
    assert (tmp_path / "side" / "consumequeue" / "TopicA" / "0" / SEG0).read_bytes() == \
        (store / "consumequeue" / "TopicA" / "0" / SEG0).read_bytes()
    assert any("not supported" in w for w in doc["warnings"])


# --- 5: LMQ multi-dispatch ----------------------------------------------------------------------------


def test_lmq_queue_entries_are_not_wrong_queue(oracle_store):
    store = oracle_store("498-healthy-lmq")
    entries = {(m["topic"], m["queueOffset"]): m["commitLogOffset"]
               for m in fixture_manifest("498-healthy-lmq") if m["type"] == "cq_entry"}
    assert entries[("%LMQ%room1", 0)] == 142 and entries[("%LMQ%room1", 1)] == 486
    assert entries[("%LMQ%room2", 0)] == 486
    for topic, qoff in (("%LMQ%room1", 0), ("%LMQ%room1", 1), ("%LMQ%room2", 0)):
        res = lookup_queue(store, topic, 0, qoff)
        assert res.hits[0].offset == entries[(topic, qoff)] and res.warnings == []
    assert verify_store(store).summary["errors"] == 0
    out = run("lookup", store, "--queue", "%LMQ%room1", "0", "1")
    assert out.exit_code == 0 and "warning" not in out.output


def test_lmq_entry_at_the_wrong_queue_offset_is_still_reported(oracle_store):
    store = oracle_store("498-healthy-lmq")
    q = store / "consumequeue" / "%LMQ%room1" / "0" / SEG0
    data = q.read_bytes()
    patch(q, 0, data[20:40] + data[0:20])  # swap the two entries: each now contradicts INNER_MULTI_QUEUE_OFFSET
    errs = [(f.kind, f.offset) for f in verify_store(store).findings if f.severity == "error"]
    assert errs == [("cq_entry_misplaced", 0), ("cq_entry_misplaced", 20)]
    assert lookup_queue(store, "%LMQ%room1", 0, 0).warnings  # points at a record not dispatched there


# --- 6: an end-of-file BLANK with no next file ----------------------------------------------------------


@pytest.mark.parametrize("name", ["498-healthy-tx-v6", "533-plain"])
def test_blank_at_the_end_needs_no_repair_and_takes_appends(name, oracle_store):
    """A broker killed between writing an end-of-file BLANK and creating the next file leaves that BLANK after
    the last record. RocketMQ's recovery ends at it and its next write covers it (RocketMQ's own judgement of
    this store and of rmqdump's appends to it: tests/oracle/test_write.py). repair planned to zero the BLANK's
    header (exit 1, "repair needed") and append refused to overwrite it."""
    store = oracle_store(name)
    end = inspect_store(store).end
    seg = store / "commitlog" / SEG0
    size = seg.stat().st_size
    assert 8 <= size - end and end < size
    patch(seg, end, struct.pack(">iI", size - end, 0xCBD43194))
    assert inspect_store(store).overwrite == []
    plan = plan_repair(store)
    assert plan.changes == [] and plan.end == end
    res = run("repair", store)
    assert res.exit_code == 0 and "needs no repair" in res.output
    # anything else after the end is stale all the same: a byte after the BLANK's header
    patch(seg, end + 8, b"\x01")
    assert inspect_store(store).overwrite != []
    (change,) = plan_repair(store).changes
    assert end < change.offset and change.offset + change.length == end + 9
    patch(seg, end + 8, b"\x00")
    res = run("append", store, "--topic", "TopicB", "--body", "after the blank", "-f", "jsonl", "-q")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["offset"] == end
    res = run("verify", store, "-q")
    assert res.exit_code == 0, res.output


def _end_style(store) -> str:
    """The style ``verify``'s report gives the broker's commitlog end on a colour terminal."""
    import io

    from rich.console import Console

    from rmqdump.cli.verify import render_report

    doc = json.loads(run("verify", store, "-q", "-f", "json").stdout)
    out = io.StringIO()
    render_report(Console(file=out, force_terminal=True, color_system="standard", width=200), doc)
    line = next(x for x in out.getvalue().splitlines() if "commitlog end" in x)
    return "red" if "\x1b[1;31m" in line else "green" if "\x1b[32m" in line else line


def test_blank_at_the_end_is_not_shown_as_a_cut(oracle_store):
    """verify's report showed the end RocketMQ's start keeps in bold red on such a store (the walk's own end
    is past the BLANK): red means records the start would cut. The HTML report drew the BLANK as "dropped"."""
    store = oracle_store("498-healthy-tx-v6")
    end = inspect_store(store).end
    seg = store / "commitlog" / SEG0
    patch(seg, end, struct.pack(">iI", seg.stat().st_size - end, 0xCBD43194))
    assert _end_style(store) == "green"
    assert _end_style(oracle_store("498-flip-body-mid")) == "red"  # recovery drops 11 records
    page = store.parent / "report.html"
    assert run("report", store, "--to", page, "-q").exit_code in (0, 1)
    text = page.read_text()
    assert f"recovery cut {end}" in text and "dropped by recovery" not in text


# --- 7: files deleted by retention ------------------------------------------------------------------------


def test_files_retention_deleted_are_healthy(oracle_store, monkeypatch):
    """Every long-running broker deletes its oldest files. The first index file's header keeps the times of
    its first entry, whose record is gone: verify warned "index_header_mismatch" (its first *readable* record
    is younger) on both engines."""
    store = oracle_store("498-healthy-retention")
    manifest = fixture_manifest("498-healthy-retention")
    info = next(m for m in manifest if m["type"] == "store_info")
    assert info["load_ok"] and info["commitlog_min_offset"] > 0
    for flag in ("0", "1"):
        monkeypatch.setenv("RMQDUMP_FAST", flag)
        kinds = {(s, k) for s, k, _ in findings(verify_store(store))}
        assert {s for s, _ in kinds} == {"info"}, flag
        assert {("info", "cq_entry_expired"), ("info", "index_entry_expired")} <= kinds
    res = run("cq", store, "-f", "json")
    got = {(q["topic"], q["queue_id"]): (q["min_offset"], q["max_offset"]) for q in json.loads(res.stdout)["queues"]}
    want = {(m["topic"], m["queueId"]): (m["minOffsetInQueue"], m["maxOffsetInQueue"]) for m in manifest
            if m["type"] == "cq_queue" and m["maxOffsetInQueue"] > 0}
    assert got == want
    assert plan_repair(store).changes == []
    st = inspect_store(store)
    assert st.dirty == [] and st.overwrite == []
    kept = [m for m in manifest if m["type"] == "message" and m["keys"]]
    res = run("lookup", store, "--key", kept[0]["keys"].split()[0], "--topic", kept[0]["topic"], "-f", "jsonl", "-q")
    assert kept[0]["commitLogOffset"] in [json.loads(line)["offset"] for line in res.stdout.splitlines()]


@pytest.mark.parametrize("flag", ["0", "1"])
def test_rebuilt_queues_keep_the_units_of_deleted_files(flag, oracle_store, tmp_path, monkeypatch):
    """No record is left to rebuild a queue's units into deleted commitlog files from: the rebuild dropped the
    queues whose records were all deleted (their max offset back to 0, the next record numbered 0 again) and put
    placeholders over the rest. It carries them over: the files are RocketMQ's, byte for byte."""
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    store = oracle_store("498-healthy-retention")
    manifest = fixture_manifest("498-healthy-retention")
    kept = {(m["topic"], m["queueId"]) for m in manifest if m["type"] == "message"}
    gone = {(m["topic"], m["queueId"]) for m in manifest if m["type"] == "cq_queue" and m["maxOffsetInQueue"] > 0}
    assert gone - kept, "a queue whose records retention deleted"
    res = run("repair", store, "--rebuild-cq", "--to", tmp_path / "out", "-q")
    assert res.exit_code == 0, res.output
    cq = store / "consumequeue"
    files = sorted(p.relative_to(cq) for p in cq.rglob("*") if p.is_file())
    assert sorted(p.relative_to(tmp_path / "out" / "consumequeue")
                  for p in (tmp_path / "out" / "consumequeue").rglob("*") if p.is_file()) == files
    for rel in files:
        assert (tmp_path / "out" / "consumequeue" / rel).read_bytes() == (cq / rel).read_bytes(), rel
    assert plan_repair(store, rebuild_cq=True).changes == []


# --- 8: an index file rolled to just before a kill ---------------------------------------------------------


def test_an_index_file_with_no_entry_yet_takes_its_siblings_geometry(oracle_store, monkeypatch):
    """A broker killed right after rolling to a new index file leaves it with its header only (the previous
    file's end as its begin and end, no slot, no entry): with a geometry its size alone does not tell (RocketMQ's
    8 slots and 16 entries here), verify called it an ``index_file_size`` error and predicted that abnormal
    recovery keeps it, where RocketMQ deletes it with the previous one (seen in CI's oracle matrix)."""
    from rmqdump.store.indexfile import IndexFile

    store = oracle_store("498-healthy-retention")
    last = sorted((store / "index").iterdir())[-1]
    head = IndexFile(last).header
    fresh = store / "index" / f"{int(last.name) + 1}"
    fresh.write_bytes(INDEX_HEADER.pack(head.end_timestamp, head.end_timestamp, head.end_phy_offset,
                                        head.end_phy_offset, 0, 0) + bytes(last.stat().st_size - 40))
    geo = IndexFile(fresh).geometry
    assert (geo.hash_slot_num, geo.index_num) == (8, 16)
    for flag in ("0", "1"):
        monkeypatch.setenv("RMQDUMP_FAST", flag)
        assert [f for f in findings(verify_store(store)) if f[0] != "info"] == [], flag


# --- 8: a zero-length last consume-queue file on a 5.x store ------------------------------------------------


def test_zero_length_last_cq_file_is_no_refusal_on_5x(oracle_store, tmp_path):
    """A crash between creating a consume-queue file and extending it leaves it zero-length (the oracle matrix's
    5.3.3 crash stores have them). RocketMQ 5.3.3 loads such a store (it deletes the file); verify called it an
    error, "the broker refuses to load it", under the 5.x model too. A 4.9 broker does refuse it."""
    from oracle_fixtures import oracle_run, recipe

    store = oracle_store("533-plain")
    empty = store / "consumequeue" / "TopicA" / "1" / SEG0
    empty.parent.mkdir()
    empty.write_bytes(b"")

    def cq_file(version: str) -> tuple[list, int]:
        res = run("verify", store, "--broker-version", version, "-f", "json", "-q")
        doc = json.loads(res.stdout)
        return [(f["severity"], f["file"]) for f in doc["findings"] if f["kind"] == "cq_file"], res.exit_code

    rel = "consumequeue/TopicA/1/" + SEG0
    assert cq_file("5.3") == ([("info", rel)], 0)
    assert cq_file("4.9")[0] == [("error", rel)]
    r = recipe("533-plain")
    oracle_run(r["version"], store, tmp_path, r["run_args"])  # RocketMQ 5.3.3 loads it (where the oracle is)
