"""`rmqdump verify` on the real broker498 stores and on copies with targeted damage."""

from __future__ import annotations

import json
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import manifest, real_store
from rmqdump.analysis.verify import verify_segment, verify_store
from rmqdump.analysis.verify.records import merge_segments
from rmqdump.broker.lock import StoreLock
from rmqdump.cli import cli
from rmqdump.codec.encoder import encode_fields, with_record_crc
from rmqdump.findings import ERROR
from rmqdump.store.commitlog import CommitLog

SEG0, SEG1 = "00000000000000000000", "00000000000000262144"
CL0 = f"commitlog/{SEG0}"
# record 0 of broker498/clean: TopicTest queue 2, queue offset 0, 239 bytes; body [88, 104), properties [116, 239)
# TopicTest queue 2 continues at 956 (queue offset 1), 1912 (2), 2874 (3)
IDX = "index/20261121214249121"
ENTRIES = 40 + 500 * 4  # entry table of the 42,040-byte index files (500 slots, 2000 entries)


def run(path, *args):
    res = CliRunner().invoke(cli, ["verify", str(path), *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def kinds_at(report, offset):
    return {f.kind for f in report.findings_at(offset)}


def patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def after_info(name):
    return next(m for m in manifest(f"{name}_after_rocketmq_recovery") if m["type"] == "store_info")


# --- acceptance on the real stores ------------------------------------------------------------------


def test_clean_store_is_clean():
    r = verify_store(real_store("clean"))
    assert r.errors == [] and r.exit_code == 0
    assert r.summary["records"] == 232 and r.summary["valid_end"] == 397358
    assert r.recovery.max_offset == 397358 == next(
        m for m in manifest("clean") if m["type"] == "store_info")["commitlog_max_offset_after_recovery"]
    assert r.summary["cq_records_checked"] == 232 and r.summary["consume_queues"] == 21
    assert r.findings == []  # no warnings either: every CQ entry, index entry and header checks out


def test_clean_store_cli_json():
    res = run(real_store("clean"), "-f", "json")
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert set(doc) >= {"findings", "recovery", "summary"}
    assert doc["findings"] == []
    rec = doc["recovery"]
    assert {"mode", "start_file", "max_offset", "dropped_records", "dropped_cq_entries",
            "deleted_index_files"} <= set(rec)
    assert rec["mode"] == "normal" and rec["max_offset"] == 397358 and rec["start_file"] == SEG0
    assert rec["dropped_records"]["count"] == 0 and rec["dropped_cq_entries"]["count"] == 0
    assert rec["deleted_index_files"] == []
    assert doc["summary"]["status"] == "clean" and doc["summary"]["errors"] == 0


def test_corrupt_crc():
    r = verify_store(real_store("corrupt_crc"))
    crc = [f for f in r.findings if f.kind == "body_crc"]
    assert len(crc) == 1 and crc[0].offset == 15458 and crc[0].file == CL0 and crc[0].severity == ERROR
    p = r.recovery
    info = after_info("corrupt_crc")
    assert p.mode == "normal" and p.max_offset == 15458 == info["commitlog_max_offset_after_recovery"]
    kept = sum(m["type"] == "message" for m in manifest("corrupt_crc_after_rocketmq_recovery"))
    assert p.walk.records == kept == 64
    assert p.dropped.count == 232 - 64
    assert p.dropped_cq_entries == 232 - 64
    assert "recovery_truncates" in kinds_at(r, 15458)
    assert r.salvage is None  # only with --keep-going
    assert r.exit_code == 1


def test_corrupt_crc_keep_going_salvage():
    r = verify_store(real_store("corrupt_crc"), keep_going=True)
    s = r.salvage
    assert s["first_damage"] == 15458 and s["intact_records_after_damage"] == 167
    assert s["damaged_ranges"] == [{"start": 15458, "end": 15700, "kind": "body_crc", "file": CL0}]
    assert s["broker_would_drop_intact"] == 167 and s["first_intact_offsets"][0] == 15700
    assert r.summary["records"] == 231
    # the skipped damaged record keeps its queue slot: no spurious queue-offset gap after it
    assert "queue_offset_gap" not in r.summary["by_kind"]


def test_corrupt_crc_cli_keep_going_table():
    res = run(real_store("corrupt_crc"), "--keep-going", "-f", "table")
    assert res.exit_code == 1
    out = res.stdout
    assert "Errors (" in out and "Recovery prediction" in out and "Salvage" in out
    assert f"{CL0}:15458" in out and "body_crc" in out
    assert "167 intact records after the first damage at 15458" in out


def test_crash_torn():
    r = verify_store(real_store("crash_torn"))
    torn = [f for f in r.findings if f.kind == "torn_record"]
    assert [f.offset for f in torn] == [396985]
    p = r.recovery
    assert p.mode == "abnormal" and p.max_offset == 396985 == after_info("crash_torn")["commitlog_max_offset_after_recovery"]
    assert p.dropped_cq_entries == 1
    d = r.to_dict()["recovery"]
    assert d["dropped_cq_entries"]["queues"]["%RETRY%cg-test/0"]["count"] == 1
    assert d["deleted_index_files"][0]["file"] == "20261121214249121"
    assert "cq_entry_dangling" in r.summary["by_kind"]  # the CQ still references the torn record


def test_crash_torn_props_accepted_but_flagged():
    r = verify_store(real_store("crash_torn_props"))
    assert r.recovery.max_offset == 397358 == after_info("crash_torn_props")["commitlog_max_offset_after_recovery"]
    assert r.recovery.dropped.count == 0
    assert "torn_properties" in kinds_at(r, 396985)
    assert {"offset": 396985, "kind": "torn_properties", "file": f"commitlog/{SEG1}"} in r.accepted_damaged
    assert r.exit_code == 1
    # its consequences: the CQ tagsCode and the index keys no longer match the record
    assert {"cq_tags_mismatch", "index_key_mismatch"} <= set(r.summary["by_kind"])


def test_crash_kill9():
    r = verify_store(real_store("crash_kill9"))
    p = r.recovery
    assert p.mode == "abnormal" and p.walk.records == 464 and p.max_offset == 338738
    assert after_info("crash_kill9")["commitlog_max_offset_after_recovery"] == 338738
    assert r.errors == []
    assert {"abort_present", "checkpoint_zero", "preallocated_segment"} <= set(r.summary["by_kind"])


def test_single_segment_and_commitlog_dir():
    r = verify_store(real_store("corrupt_crc") / "commitlog" / SEG0)
    assert [f.offset for f in r.findings if f.kind == "body_crc"] == [15458]
    r = verify_store(real_store("clean") / "commitlog")
    assert r.errors == [] and r.recovery.max_offset == 397358


def test_could_not_run_is_exit_2(tmp_path):
    res = run(tmp_path)
    assert res.exit_code == 2
    assert res.stderr.startswith("rmqdump: error: ") and len(res.stderr.strip().splitlines()) == 1


def test_csv_is_refused():
    assert run(real_store("clean"), "-f", "csv").exit_code == 2


# --- the record loop is reusable per segment ------------------------------------------------------------


def test_verify_segment_in_parallel_matches_sequential():
    cl = CommitLog.open(real_store("corrupt_crc"))
    seq = [verify_segment(s, keep_going=True) for s in cl.segments]
    with ProcessPoolExecutor(max_workers=2) as ex:
        par = list(ex.map(_verify_one, cl.segments))
    for a, b in zip(seq, par, strict=True):
        assert a.findings == b.findings and a.records == b.records and a.stats() == b.stats()
    assert sum(r.records for r in par) == 231
    assert merge_segments(par, cl.file_size, zero_start=True) == merge_segments(seq, cl.file_size, zero_start=True)


def _verify_one(seg):
    return verify_segment(seg, keep_going=True)


# --- targeted damage on copies ---------------------------------------------------------------------------


def test_physical_offset_mismatch_is_accepted_damage(store_copy):
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 28, struct.pack(">q", 5))
    r = verify_store(root)
    assert "physical_offset_mismatch" in kinds_at(r, 0)
    assert r.recovery.max_offset == 397358  # the broker does not compare the field with the position
    assert {"offset": 0, "kind": "physical_offset_mismatch", "file": CL0} in r.accepted_damaged


@pytest.mark.parametrize("offset", [0, 956, 1912])
def test_queue_offset_outlier(store_copy, offset):
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, offset + 20, struct.pack(">q", 1000))
    r = verify_store(root)
    qf = [f for f in r.findings if f.kind.startswith("queue_offset")]
    assert [(f.kind, f.offset) for f in qf] == [("queue_offset_outlier", offset)]
    assert r.recovery.max_offset == 397358


def test_duplicate_queue_offset(store_copy):
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 1912 + 20, struct.pack(">q", 1))  # qoff 2 -> 1, then 3 follows
    r = verify_store(root)
    assert "queue_offset_outlier" in kinds_at(r, 1912)
    assert "cq_entry_misplaced" in r.summary["by_kind"]  # CQ slot 2 points at a record claiming slot 1


def test_properties_nul_and_malformed(store_copy):
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 116 + 10, b"\x00")
    patch(root / "commitlog" / SEG0, 956 + 116 + 4, b"x")  # KEYS\x01 -> KEYSx: the pair loses its separator
    r = verify_store(root)
    assert "properties_nul" in kinds_at(r, 0)
    assert "properties_malformed" in kinds_at(r, 956)
    assert r.recovery.max_offset == 397358


def test_tx_commit_must_point_at_a_half_message(store_copy):
    root = store_copy("clean")
    # COMMIT record of TopicTx at 391186 points at the half message at 390558; make it point at record 0
    patch(root / "commitlog" / SEG1, 391186 - 262144 + 76, struct.pack(">q", 0))
    r = verify_store(root)
    assert "tx_half_missing" in kinds_at(r, 391186)
    assert verify_store(real_store("clean")).summary["by_kind"].get("tx_half_missing") is None


def test_compressed_flag_on_a_plain_body(store_copy):
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 36, struct.pack(">i", 0x301))
    r = verify_store(root)
    assert "bad_compression" in kinds_at(r, 0)


def test_record_crc_property(tmp_path):
    props = b"TAGS\x01A\x02KEYS\x01k1"
    rec = with_record_crc(encode_fields(topic=b"TopicTest", body=b"hello", properties=props,
                                        store_timestamp=1795297369037, born_timestamp=1795297369037))
    seg = bytearray(4096)
    seg[:len(rec)] = rec
    d = tmp_path / "commitlog"
    d.mkdir()
    (d / SEG0).write_bytes(bytes(seg))
    r = verify_store(d)
    assert "record_crc" not in r.summary["by_kind"] and r.summary["records"] == 1
    seg[16] ^= 1  # FLAG: covered by nothing but the whole-record CRC
    (d / SEG0).write_bytes(bytes(seg))
    r = verify_store(d)
    assert "record_crc" in kinds_at(r, 0) and r.exit_code == 1


def test_zeroed_blank(store_copy):
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 167227, bytes(8))
    r = verify_store(root)
    assert "missing_blank" in kinds_at(r, 167227)
    assert r.recovery.max_offset == 167227 and r.recovery.dropped.intact == 57


def test_cq_entry_checks(store_copy):
    root = store_copy("clean")
    cq = root / "consumequeue" / "TopicTest" / "2" / SEG0
    patch(cq, 8, struct.pack(">i", 240))  # entry 0: size 239 -> 240
    patch(cq, 20 + 12, struct.pack(">q", 12345))  # entry 1: tagsCode
    e2, e3 = cq.read_bytes()[40:60], cq.read_bytes()[60:80]
    patch(cq, 40, e3)
    patch(cq, 60, e2)  # entries 2 and 3 swapped
    r = verify_store(root)
    label = f"consumequeue/TopicTest/2/{SEG0}"
    got = {(f.kind, f.file, f.offset) for f in r.findings}
    assert ("cq_size_mismatch", label, 8) in got
    assert ("cq_tags_mismatch", label, 32) in got
    assert ("cq_entry_misplaced", label, 40) in got and ("cq_entry_misplaced", label, 60) in got
    assert r.exit_code == 1


def test_cq_duplicate_and_missing(store_copy):
    root = store_copy("clean")
    cq = root / "consumequeue" / "TopicTest" / "2" / SEG0
    patch(cq, 20, cq.read_bytes()[0:20])  # entry 1 := entry 0
    r = verify_store(root)
    label = f"consumequeue/TopicTest/2/{SEG0}"
    assert ("cq_entry_duplicate", label, 20) in {(f.kind, f.file, f.offset) for f in r.findings}
    assert "cq_entry_missing" in kinds_at(r, 956)  # the record of queue offset 1 lost its entry


def test_index_checks(store_copy):
    root = store_copy("clean")
    idx = root / IDX
    patch(idx, ENTRIES + 20 * 5, struct.pack(">i", 12345))  # entry 5 keyHash
    patch(idx, ENTRIES + 20 * 9 + 16, struct.pack(">i", 9))  # entry 9 prevIndex -> itself
    r = verify_store(root)
    got = {(f.kind, f.offset) for f in r.findings if f.file == IDX}
    assert ("index_key_mismatch", ENTRIES + 100) in got
    assert ("index_slot_mismatch", ENTRIES + 100) in got
    assert ("index_chain_cycle", ENTRIES + 20 * 9 + 16) in got or ("index_chain_order", ENTRIES + 196) in got


def test_checkpoint_config_and_lock(store_copy):
    root = store_copy("clean")
    patch(root / "checkpoint", 0, struct.pack(">q", 1895297380545))  # physicMsgTimestamp in the future
    (root / "config" / "topics.json").write_text("{not json")
    r = verify_store(root)
    byk = {f.kind: f for f in r.findings}
    assert byk["checkpoint_ahead"].file == "checkpoint" and byk["checkpoint_ahead"].offset == 0
    assert byk["config_parse"].severity == "warning" and ".bak" in byk["config_parse"].detail  # falls back
    (root / "config" / "topics.json.bak").write_text("[[[")
    (got,) = [f for f in verify_store(root).findings if f.kind == "config_parse"]
    assert got.severity == ERROR and "ConfigManager.load fails and the broker does not start" in got.detail
    # no .bak: ConfigManager.loadBak finds nothing and returns true (the TimerMetrics twin is judged by
    # RocketMQ in test_timer_load): the broker starts with the table empty
    (root / "config" / "topics.json.bak").unlink()
    (got,) = [f for f in verify_store(root).findings if f.kind == "config_parse"]
    assert got.severity == ERROR and "the broker starts with this table empty" in got.detail
    with StoreLock(root):
        r = verify_store(root)
    assert [f.detail for f in r.findings if f.kind == "store_in_use"] == [
        f"the broker lock is held by PID {os.getpid()}: the store is live and may change under us"]


def test_stray_and_mis_sized_segments(store_copy):
    root = store_copy("crash_kill9")
    os.truncate(root / "commitlog" / "00000000000000524288", 4096)
    r = verify_store(root)
    assert {"segment_size", "recovery_refuses_start"} <= set(r.summary["by_kind"])
    assert r.recovery.mode == "refuses_to_start"


def test_findings_json_fields_are_stable():
    res = run(real_store("crash_torn"), "-f", "json", "--keep-going")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    for f in doc["findings"]:
        assert set(f) == {"severity", "kind", "file", "offset", "detail"}
        assert f["severity"] in ("error", "warning", "info") and f["kind"].replace("_", "").isalpha()
    assert doc["recovery"]["dropped_records"]["damaged_ranges"][0]["start"] == 396985
    assert doc["summary"]["predicted_max_offset"] == 396985


# --- options --------------------------------------------------------------------------------------------


def test_progress_callback_reaches_the_total():
    calls = []
    verify_store(real_store("crash_kill9"), progress=lambda done, total: calls.append((done, total)))
    total = 3 * 262144
    assert calls and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_commitlog_only_and_broker_version():
    res = run(real_store("crash_torn_props"), "-f", "json", "--commitlog-only")
    doc = json.loads(res.stdout)
    kinds = {f["kind"] for f in doc["findings"]}
    assert "torn_properties" in kinds and not kinds & {"cq_tags_mismatch", "index_key_mismatch", "abort_present"}
    assert doc["recovery"]["max_offset"] == 397358
    res = run(real_store("corrupt_crc"), "-f", "json", "--broker-version", "5.3")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1  # the bad CRC is still an error ...
    assert doc["recovery"]["max_offset"] == 397358  # ... but a 5.3.2+ broker would not truncate
    assert any("4.9" in n and "15458" in n for n in doc["recovery"]["version_notes"])


def test_bad_delay_levels_is_a_usage_error():
    assert run(real_store("clean"), "--delay-levels", "1x 2y").exit_code == 2


def test_header_outliers(store_copy):
    # record 956: store time moved by years; neighbours agree
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 956 + 56, b"\x00\x00\x02")
    r = verify_store(root)
    assert [f.offset for f in r.findings if f.kind == "header_outlier"] == [956]
    assert r.recovery.max_offset == 397358
    assert {"offset": 956, "kind": "header_outlier", "file": CL0} in r.accepted_damaged


def test_a_different_store_host_is_no_outlier(store_copy):
    # record 956: store host 127.0.0.1 -> 10.0.0.1 between neighbours of 127.0.0.1: records of another
    # broker (or an IPv6 host) are legitimate, and RocketMQ does not check the field
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 956 + 64, b"\x0a")
    assert verify_store(root).summary["by_kind"].get("header_outlier") is None


def test_cq_file_problems(store_copy):
    root = store_copy("clean")
    q = root / "consumequeue" / "TopicTest" / "1"
    os.truncate(q / SEG0, 300)
    r = verify_store(root)
    [f] = [f for f in r.findings if f.kind == "cq_file"]
    assert f.severity == ERROR and f.file == f"consumequeue/TopicTest/1/{SEG0}" and "300 bytes" in f.detail
    assert r.recovery.mode == "refuses_to_start"


@pytest.mark.parametrize("name", ["corrupt_crc", "crash_torn", "crash_torn_props"])
def test_pread_reader_gives_the_same_report(name):
    a = verify_store(real_store(name), keep_going=True).to_dict()
    b = verify_store(real_store(name), keep_going=True, use_mmap=False).to_dict()
    assert a == b


def test_body_damage_keeps_the_queue_slot(store_copy):
    # record 0 is the first of TopicTest/2; its body is damaged, its header still claims queue offset 0
    root = store_copy("clean")
    patch(root / "commitlog" / SEG0, 90, b"\xff")
    r = verify_store(root, keep_going=True)
    assert "body_crc" in kinds_at(r, 0)
    assert not any(k.startswith("queue_offset") for k in r.summary["by_kind"])
    assert r.salvage["intact_records_after_damage"] == 231 and r.recovery.max_offset == 0


def test_table_report_escapes_data(tmp_path):
    # a topic with a newline and an escape sequence must not forge report rows or reach the terminal raw
    rec = encode_fields(topic=b"T\nSPOOF\x1b[31m", body=b"x", properties=b"TAGS\x01A", queue_offset=5,
                        store_timestamp=1795297369037, born_timestamp=1795297369037)
    seg = bytearray(4096)
    seg[:len(rec)] = rec
    d = tmp_path / "commitlog"
    d.mkdir()
    (d / SEG0).write_bytes(bytes(seg))
    res = run(d, "-f", "table")
    assert "queue_offset_gap" in res.stdout
    assert "\x1b[31m" not in res.stdout
    assert not any(line.lstrip().startswith("SPOOF") for line in res.stdout.splitlines())


def test_every_emitted_kind_is_documented():
    import re

    import rmqdump.analysis.verify as V
    from rmqdump.codec import record

    root = Path(V.__file__).parent
    pattern = re.compile(r'(?:emit|Finding|_add|add)\(\s*[A-Za-z_ ]+(?:if [^,]+ else [A-Z]+)?,\s*"([a-z_]+)"')
    kinds = set()
    for f in root.glob("*.py"):
        kinds |= set(pattern.findall(f.read_text(encoding="utf-8")))
    kinds |= {record.BAD_MAGIC, record.BAD_TOTALSIZE, record.TRUNCATED, record.LENGTH_MISMATCH, record.BODY_CRC,
              record.BAD_FIELD, record.BAD_BLANK}  # the decoder's verdicts, reported under their own name
    assert len(kinds) > 60
    undocumented = sorted(k for k in kinds if f"``{k}``" not in V.__doc__)
    assert undocumented == []
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in kinds)


def test_broker_version_auto_detects_a_5x_store():
    """fixtures/store-5x holds a V2-magic record (a topic > 127 bytes), which only a 5.x broker writes:
    the default model is then 5.3 (clean), while --broker-version 4.9 predicts the truncation a 4.x
    broker would do; a 4.9-faithful store stays on the 4.9 model."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    auto = verify_store(fixtures / "store-5x")
    assert auto.to_dict()["summary"]["broker_model"] == "5.3"
    assert "V2-magic record at 1434" in auto.to_dict()["summary"]["broker_model_reason"]
    assert [f for f in auto.findings if f.severity == ERROR] == []
    forced = verify_store(fixtures / "store-5x", version="4.9")
    assert forced.recovery.max_offset == 1434
    assert "recovery_truncates" in {f.kind for f in forced.findings if f.severity == ERROR}
    res = CliRunner().invoke(cli, ["verify", str(fixtures / "store"), "-f", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["summary"]["broker_model"] == "4.9"
    res = CliRunner().invoke(cli, ["verify", str(fixtures / "store-5x"), "-f", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["summary"]["broker_model"] == "5.3"


def _slots(idx) -> list[int]:
    data = idx.read_bytes()
    n = (len(data) - 40) // 84  # RocketMQ's default ratio: 4 entries per slot
    return [struct.unpack_from(">i", data, 40 + 4 * i)[0] for i in range(n)]


def _link_empty_slot(store_copy):
    """The clean store with an empty slot of its index file pointing at the head of a later slot's chain."""
    root = store_copy("clean")
    idx = root / IDX
    slots = _slots(idx)
    empty = next(i for i, v in enumerate(slots) if v == 0)
    busy = next(i for i, v in enumerate(slots) if v > 0 and i > empty)
    patch(idx, 40 + 4 * empty, struct.pack(">i", slots[busy]))
    return root, idx, busy


def test_index_irregular_chains_that_still_find_every_key_are_info(store_copy):
    """An empty slot pointing into another slot's chain (RocketMQ leaves such files after a crash): every
    entry stays on its own slot's chain, queries find every key - info, not an error."""
    root, _idx, _busy = _link_empty_slot(store_copy)
    r = verify_store(root)
    kinds = {(f.kind, f.severity) for f in r.findings if f.file == IDX}
    assert ("index_chain_irregular", "info") in kinds
    assert not {k for k, sev in kinds if sev == "error"}


def test_index_chain_moved_to_a_foreign_slot_is_an_error(store_copy):
    """The same link with the entry's own slot emptied: queries for those keys find nothing."""
    root, idx, busy = _link_empty_slot(store_copy)
    patch(idx, 40 + 4 * busy, struct.pack(">i", 0))
    r = verify_store(root)
    assert "index_slot_mismatch" in {f.kind for f in r.findings if f.file == IDX and f.severity == "error"}
