"""Every byte rmqdump writes, judged by RocketMQ's own ``load()``.

- ``append`` (every message kind, single and bulk, across segment/CQ/index rolls, 4.9.8 and 5.3.3 stores):
  RocketMQ keeps every acknowledged record, its ConsumeQueue entry and its index entries, and reads back
  exactly what rmqdump says it wrote;
- ``repair --apply`` on every damaged store of the matrix (and every salvage mode where damage sits in the
  middle): RocketMQ loads the result and truncates nothing rmqdump kept;
- ``repair --rebuild-cq/--rebuild-index --to``: byte-identical to the files RocketMQ wrote for the same
  records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli
from rmqdump.write.repair.queues import BATCH_CQ_UNWRITTEN

from .conftest import BASE_IDS, STORE_IDS
from .harness import (
    Built,
    batch_cq_topics,
    build_variant,
    cq_entries,
    cq_max_offsets,
    expected_row,
    load,
    writable_copy,
)
from .scenarios import DAMAGES, LONG127
from .test_read import _predicted_cq_max, invoke, scan_rows, verify_doc

pytestmark = [pytest.mark.oracle]

SINGLES = [
    ["--topic", "TopicA", "--queue", "1", "--tags", "TagW", "--keys", "w1", "--keys", "w2", "--property", "p=1",
     "--body", "written by rmqdump"],
    ["--topic", "TopicZip", "--compression", "zlib", "--keys", "wz", "--body", "zlib " * 100],
    ["--topic", "TopicZip", "--compression", "lz4", "--keys", "wl", "--body", "lz4 " * 100],
    ["--topic", "TopicZip", "--compression", "zstd", "--keys", "wzs", "--body", "zstd " * 100],
    ["--topic", "TopicTxW", "--transaction", "prepared", "--keys", "wtx", "--body", "prepared"],
    ["--topic", "TopicTxW", "--transaction", "commit", "--keys", "wtx", "--body", "commit"],
    ["--topic", "TopicTxW", "--transaction", "rollback", "--keys", "wtx", "--body", "rollback"],
    ["--topic", "TopicV6", "--born-host", "[2001:db8::9]:4000", "--keys", "w6", "--body", "ipv6 born host"],
    ["--topic", "TopicV6", "--store-host", "[2001:db8::1]:10911", "--keys", "w6s", "--body", "ipv6 store host"],
    ["--topic", "主题W", "--keys", "键", "--tags", "标签", "--body", "unicode ✓"],
    ["--topic", "TopicEmpty", "--body", ""],
    ["--topic", "TopicRc", "--record-crc", "--keys", "wrc", "--body", "with __CRC32#"],
    ["--topic", "TopicNoUniq", "--no-uniq-key", "--keys", "wnu", "--body", "no uniq key"],
    ["--topic", LONG127, "--keys", "w127", "--body", "127-char topic"],
]


def _acks(res) -> list[dict]:
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def judge_written(store: Path, b: Built, acks: list[dict]) -> None:
    """RocketMQ reads back every acknowledged record, with its CQ entry and index hits."""
    manifest = load(b.version, store, b.run_args)
    info = next(m for m in manifest if m["type"] == "store_info")
    assert info["load_ok"]
    end = max(a["offset"] + a["size"] for a in acks)
    assert info["commitlog_max_offset_after_recovery"] == end, "RocketMQ's recovery cut acknowledged records"
    msgs = {m["commitLogOffset"]: m for m in manifest if m["type"] == "message"}
    rows = {r["offset"]: r for r in scan_rows(store)}
    cq = cq_entries(manifest)
    hits: dict[tuple[str, str], set[int]] = {}
    for q in manifest:
        if q["type"] == "index_query":
            hits.setdefault((q["topic"], q["key"]), set()).update(q["phyOffsets_in_returned_order"])
    for a in acks:
        off = a["offset"]
        assert off in msgs, f"acknowledged record at {off} not read back by RocketMQ"
        exp = expected_row(msgs[off])
        assert {k: rows[off].get(k) for k in exp} == exp, f"record at {off} reads back differently"
        m = msgs[off]
        if m["tranType"] in (0, 8):  # prepared and rollback records get no ConsumeQueue entry
            assert cq.get((m["topic"], m["queueId"], m["queueOffset"]), (None,))[0] == off, f"no CQ entry for {off}"
        if m["tranType"] != 12:  # rollback records are not indexed
            for key in [*(m["keys"] or "").split(" "), m["uniqKey"]]:
                if key:
                    assert off in hits.get((m["topic"], key), set()), f"{m['topic']}#{key} misses {off}"
    before = {(f["kind"], f["offset"]) for f in verify_doc(b.store)[0]["findings"]
              if f["severity"] in ("error", "warning")}
    doc, _ = verify_doc(store)
    alarms = [f for f in doc["findings"]
              if f["severity"] in ("error", "warning") and (f["kind"], f["offset"]) not in before]
    assert alarms == [], "verify raises alarms the store did not have before rmqdump wrote to it"


APPEND_BASES = [n for n in BASE_IDS if n.endswith("-plain-clean") or n.endswith("-everything-crash")]


@pytest.mark.parametrize("name", APPEND_BASES)
def test_append_singles_read_back_by_rocketmq(matrix, name, tmp_path):
    b = matrix.get(name)
    store = writable_copy(b, tmp_path / "store")
    acks = []
    for args in SINGLES:
        acks += _acks(invoke("append", store, *args, "-f", "jsonl", "-q", "--force"))
    judge_written(store, b, acks)


@pytest.mark.parametrize("name", [n for n in BASE_IDS if n.endswith("-plain-clean")])
def test_append_bulk_copy_read_back_by_rocketmq(matrix, name, tmp_path):
    """``scan A | append B --jsonl -`` of every record of the "everything" store: rolls segments, CQ and
    index files in the small geometry."""
    b = matrix.get(name)
    source = matrix.get(name.replace("-plain-", "-everything-"))
    store = writable_copy(b, tmp_path / "store")
    src_rows = invoke("scan", source.store, "-f", "jsonl", "--body", "base64", "-q").stdout
    # inner-batch records of BatchCQ topics are refused by design (rmqdump writes no BatchConsumeQueue units)
    src_rows = "".join(line + "\n" for line in src_rows.splitlines() if json.loads(line)["topic"] != "BCQ")
    version = ["--broker-version", "5"] if b.version == "533" else []  # the operator knows the broker
    res = CliRunner().invoke(cli, ["append", str(store), "--jsonl", "-", "-f", "jsonl", "-q", "--batch-bytes", "2048",
                                   *version], input=src_rows, catch_exceptions=False)
    acks = _acks(res)
    assert len(acks) == len(src_rows.splitlines())
    judge_written(store, b, acks)


@pytest.mark.parametrize("name", [n for n in BASE_IDS if n.endswith("-plain-clean")])
def test_trailing_blank_needs_no_repair_and_takes_appends(matrix, name, tmp_path):
    """A broker killed between writing an end-of-file BLANK and creating the next file: RocketMQ keeps every
    record and ends at the BLANK. rmqdump verifies it clean, plans no change (it planned to zero the BLANK's
    header and exited 1: a false "repair needed") and appends records RocketMQ reads back."""
    base = matrix.get(name)
    b = build_variant(base, "blank-at-end", DAMAGES["blank-at-end"](base))
    assert b.info["load_ok"]
    assert b.info["commitlog_max_offset_after_recovery"] == base.info["commitlog_max_offset_after_recovery"]
    assert {m["commitLogOffset"] for m in b.of("message")} == {m["commitLogOffset"] for m in base.of("message")}
    doc, code = verify_doc(b.store)
    assert code == 0 and [f for f in doc["findings"] if f["severity"] != "info"] == []
    res = invoke("repair", b.store, "-f", "json", "-q")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["changes"] == []
    res = invoke("info", b.store, "-f", "json")
    assert json.loads(res.stdout)["commitlog"]["max_offset"] == b.info["commitlog_max_offset_after_recovery"]
    store = writable_copy(b, tmp_path / "store")
    acks = []
    for args in SINGLES:
        acks += _acks(invoke("append", store, *args, "-f", "jsonl", "-q", "--force"))
    judge_written(store, b, acks)


MID_DAMAGE = ("flip-body", "magic-mid", "totalsize-mid")


def _repair_params() -> list:
    out = []
    for name in (n for n in STORE_IDS if "~" in n):
        for salvage in ("truncate", "filler", "recrc"):
            if salvage != "truncate" and not any(d in name for d in MID_DAMAGE):
                continue  # salvage modes differ only where intact records follow damage
            out.append(pytest.param(name, salvage, id=f"{name}-{salvage}"))
    return out


#: damage the broker itself accepts and no repair can undo without losing the message: properties torn
#: (and the index entries of the keys they held), a body CRC in a file normal recovery does not check
UNREPAIRABLE_CONTENT = {"torn_properties", "index_key_mismatch", "body_crc"}


#: timer deliveries of records the repair removed or replaced (apache/rocketmq #10668): the repair plan warns of
#: them (write/repair/timer.py) and verify reports them after it; rmqdump does not rewrite the timer store yet
TIMER_LEFT = {"timer_unit_beyond_commitlog", "timer_unit_bad_record"}


@pytest.mark.parametrize("name,salvage", _repair_params())
def test_repair_result_loaded_by_rocketmq(matrix, name, salvage, tmp_path):
    b = matrix.get(name)
    store = writable_copy(b, tmp_path / "store")
    res = invoke("repair", store, "--apply", "--salvage", salvage, "--backup-dir", tmp_path / "backup", "-f", "json",
                 "--cq-file-size", b.settings["mappedFileSizeConsumeQueue"],
                 "--commitlog-file-size", b.settings["mappedFileSizeCommitLog"], "-q")
    assert res.exit_code in (0, 2), res.output
    if res.exit_code == 2 and BATCH_CQ_UNWRITTEN in res.stderr:
        # BatchCQ records only the broker's own recovery would dispatch (RocketMQ's crash before its dispatch,
        # timing-dependent): rmqdump cannot write their units, and a repaired store would never get them
        # (RocketMQ's recovery dispatches them: into consumequeue/ when nothing declares the topic BatchCQ, a crash
        # before the batchconsumequeue/ folder existed; seen in CI on a fresh 533-small-everything-crash-no-dispatch)
        pytest.skip(f"repair refuses: {res.stderr.strip()[:200]}")
    if res.exit_code == 2:
        # a refusal is RocketMQ's too or a bug (a skip here once hid 20 stores repair refused for nothing)
        assert not b.info["load_ok"], f"repair refuses a store RocketMQ loads: {res.stderr.strip()[:300]}"
        pytest.skip(f"repair refuses, as RocketMQ refuses to load the store: {res.stderr.strip()[:200]}")
    doc, _ = verify_doc(store)
    unrepaired = set(UNREPAIRABLE_CONTENT)
    if any(w.startswith("timerlog:") for w in json.loads(res.output).get("warnings", [])):
        unrepaired |= TIMER_LEFT  # the plan said so: repair does not rewrite the timer store yet
    errors = [f for f in doc["findings"] if f["severity"] == "error" and f["kind"] not in unrepaired]
    assert errors == [], "verify still finds errors after repair --apply"
    rec = doc["recovery"]
    manifest = load(b.version, store, b.run_args)
    info = next(m for m in manifest if m["type"] == "store_info")
    assert info["load_ok"], "RocketMQ refuses to load the repaired store"
    assert rec["dropped_records"]["count"] == 0
    assert info["commitlog_max_offset_after_recovery"] == rec["max_offset"], "RocketMQ cuts what repair kept"
    # damage recovery never reads (a body CRC in a file normal recovery skips) stays, as in the broker:
    # rmqdump steps over it as RocketMQ's read-back does
    kept = {r["offset"] for r in scan_rows(store, "--keep-going")}
    read = {m["commitLogOffset"] for m in manifest if m["type"] == "message"}
    assert kept == read
    bcq = batch_cq_topics(store)
    expected = {q: n for q, n in cq_max_offsets(manifest).items() if n > 0 and q[0] not in bcq}
    got = {q: n for q, n in _predicted_cq_max(store, rec).items() if n > 0}
    assert got == expected


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("what", ["cq", "index"])
@pytest.mark.parametrize("name", [n for n in BASE_IDS if n.endswith("-clean")])
def test_rebuild_byte_identical_to_rocketmq(matrix, name, what, tmp_path):
    b = matrix.get(name)
    res = invoke("repair", b.store, f"--rebuild-{what}", "--to", tmp_path / "out", "-q")
    assert res.exit_code == 0, res.output
    sub = {"cq": "consumequeue", "index": "index"}[what]
    rebuilt = _files(tmp_path / "out" / sub)
    original = _files(b.store / sub)
    if what == "index" and b.info["commitlog_min_offset"] > 0:
        # retention deleted the oldest files: RocketMQ's index still holds entries for their records, which no
        # rebuild from the commitlog can write (RocketMQ's own would not either). RocketMQ's queries over the
        # rebuilt files must find every record that is still there, as over its own files, and only records
        # with the key. They may find more: retention can delete the index file of records whose commitlog file
        # stays on disk (a CI run: index files from 7425 on, commitlog from 4096; RocketMQ keeps a file it fails
        # to destroy while it is still referenced, and deletes the index files below the minimum it believes)
        store = writable_copy(b, tmp_path / "store")
        shutil.rmtree(store / "index")
        shutil.copytree(tmp_path / "out" / "index", store / "index")

        def answers(manifest: list[dict]) -> dict:
            low = b.info["commitlog_min_offset"]
            out = {(q["topic"], q["key"]): sorted(o for o in q["phyOffsets_in_returned_order"] if o >= low)
                   for q in manifest if q["type"] == "index_query"}
            return {k: v for k, v in out.items() if v}

        got, want = answers(load(b.version, store, b.run_args)), answers(b.manifest)
        msgs = {m["commitLogOffset"]: m for m in b.manifest if m["type"] == "message"}

        def has_key(offset: int, topic: str, key: str) -> bool:
            m = msgs.get(offset)
            return m is not None and m["topic"] == topic and (key == m.get("uniqKey")
                                                                or key in (m.get("keys") or "").split())

        assert want, "RocketMQ's own index answers no query over the records still there"
        for q in sorted(set(got) | set(want)):
            assert set(got.get(q, ())) >= set(want.get(q, ())), f"{q}: the rebuilt index misses records"
            assert all(has_key(o, *q) for o in got.get(q, ())), f"{q}: the rebuilt index answers other records"
        return
    if what == "index":  # index files are named by the wall clock at creation: compare them in order
        findings = verify_doc(b.store)[0]["findings"]
        if any(f["kind"] == "index_chain_irregular" for f in findings):
            # a new index file got the millisecond name of one RocketMQ had just filled and mapped it again,
            # stale slots and all: bytes no clean rebuild reproduces (verify names the file, queries agree)
            pytest.skip("RocketMQ re-mapped a same-named index file (stale slots): not reproducible byte for byte")
        assert list(rebuilt.values()) == list(original.values()), "index files differ from RocketMQ's"
        return
    assert sorted(rebuilt) == sorted(original)
    for rel, data in original.items():
        assert rebuilt[rel] == data, f"{sub}/{rel} differs from RocketMQ's"
