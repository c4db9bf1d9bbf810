"""rmqdump's read commands against RocketMQ's own read-back, on every store of the matrix.

- ``scan`` equals RocketMQ's records field for field;
- ``verify`` raises no error and no warning on a store RocketMQ wrote and closed cleanly;
- ``verify`` predicts RocketMQ's recovery: whether ``load()`` succeeds, the commitlog end, each consume
  queue's end and the index files that survive;
- ``lookup --key`` finds what ``IndexService.queryOffset`` finds.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli

from .conftest import BASE_IDS, CLEAN_IDS, STORE_IDS
from .harness import Built, batch_cq_topics, cq_max_offsets, expected_row

pytestmark = [pytest.mark.oracle]


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def verify_doc(store, *args: str) -> tuple[dict, int]:
    res = invoke("verify", store, "-f", "json", "-q", *args)
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout), res.exit_code


def scan_rows(store, *args: str) -> list[dict]:
    res = invoke("scan", store, "-f", "jsonl", "--body", "base64", "-q", *args)
    assert res.exit_code in (0, 1), res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("name", STORE_IDS)
def test_scan_equals_rocketmq(matrix, name):
    b: Built = matrix.get(name)
    if not b.info["load_ok"]:
        pytest.skip("RocketMQ refuses to load this store; nothing was read back")
    end = b.info["commitlog_max_offset_after_recovery"]
    expected = {m["commitLogOffset"]: expected_row(m) for m in b.of("message") if m["commitLogOffset"] < end}
    got = {r["offset"]: {k: r.get(k) for k in next(iter(expected.values()), {})}
           for r in scan_rows(b.store, "--keep-going") if r["offset"] < end}
    assert sorted(got) == sorted(expected), "records found differ"
    for off, exp in expected.items():
        assert got[off] == exp, f"record at {off}"


@pytest.mark.parametrize("name", CLEAN_IDS)
def test_verify_no_alarm_on_clean_store(matrix, name):
    b = matrix.get(name)
    doc, code = verify_doc(b.store)
    alarms = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert alarms == [], f"false alarms on a store RocketMQ wrote and closed cleanly: {alarms}"
    assert code == 0


def _predicted_cq_max(store, rec: dict) -> dict[tuple[str, int], int]:
    """Each queue's max offset after the predicted recovery (rmqdump's own CQ reader for the rest)."""
    res = invoke("cq", store, "-f", "json", "-q")
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    queues = {(q["topic"], q["queue_id"]): q["max_offset"] for q in doc["queues"]}
    # truncation first (entries dropped, an invalid first unit kept), then re-dispatch
    changes = [*rec["dropped_cq_entries"]["queues"].items(), *rec["invalid_cq_units_kept"].items(),
               *rec["redispatched_cq_entries"]["queues"].items()]
    for qname, q in changes:
        topic, qid = qname.rsplit("/", 1)
        queues[(topic, int(qid))] = q["new_max_offset"]
    return queues


@pytest.mark.parametrize("name", STORE_IDS)
def test_verify_predicts_recovery(matrix, name):
    b = matrix.get(name)
    # the user names their broker: a 5.3.3 store need not hold anything only 5.x writes
    doc, _ = verify_doc(b.store, "--broker-version", "5.3" if b.version == "533" else "auto")
    rec = doc["recovery"]
    if not b.info["load_ok"]:
        assert rec["load_errors"], "RocketMQ refuses to load this store; rmqdump predicted a start"
        return
    assert not rec["load_errors"], f"rmqdump predicts a refusal RocketMQ does not make: {rec['load_errors']}"
    assert rec["max_offset"] == b.info["commitlog_max_offset_after_recovery"]
    # every consume queue ends where RocketMQ's recovery leaves it
    # ordinary consume queues (BatchConsumeQueue topics are compared by their own tests)
    bcq = batch_cq_topics(b.store)
    expected = {q: n for q, n in cq_max_offsets(b.manifest).items() if n > 0 and q[0] not in bcq}
    got = {q: n for q, n in _predicted_cq_max(b.store, rec).items() if n > 0}
    assert got == expected
    # the index files that survive
    on_disk = {p.name for p in (b.store / "index").iterdir()} if (b.store / "index").is_dir() else set()
    deleted = {d["file"] for d in rec["deleted_index_files"]}
    survivors = {m["file"] for m in b.of("index_file")}
    assert on_disk - deleted == survivors & on_disk


@pytest.mark.parametrize("name", BASE_IDS)
def test_lookup_equals_index_query(matrix, name):
    b = matrix.get(name)
    queries = b.of("index_query")
    assert queries or not b.of("message")
    # rmqdump may find more than RocketMQ's index holds: where the index does not cover the commitlog (after
    # a crash, or entries an abnormal recovery loses), lookup also scans the records the index lacks.
    # Every extra hit must be a record of that topic RocketMQ read back with that key.
    keyed = {}
    for m in b.of("message"):
        for k in (m.get("keys") or "").split() + [m.get("uniqKey") or ""]:
            keyed.setdefault((m["topic"], k), set()).add(m["commitLogOffset"])
    for q in queries[:: max(1, len(queries) // 25)]:
        res = invoke("lookup", b.store, "--key", q["key"], "--topic", q["topic"], "-f", "jsonl", "-q")
        assert res.exit_code in (0, 1), res.output
        got = [json.loads(line)["offset"] for line in res.stdout.splitlines() if line.strip()]
        # entries into files retention deleted: the broker's queryMessage drops them too (no record to read)
        want = [o for o in q["phyOffsets_in_returned_order"] if o >= b.info["commitlog_min_offset"]]
        if len(q["phyOffsets_in_returned_order"]) < 64:  # RocketMQ caps its answer at 64 hits; rmqdump does not
            # a record indexed twice (abnormal recovery re-dispatches what the index already held) is one hit
            extra = set(got) - set(want)
            assert set(want) <= set(got) and extra <= keyed.get((q["topic"], q["key"]), set()), \
                f"{q['topic']}#{q['key']}"
            assert len(got) == len(set(got))
        else:
            assert set(want) <= set(got), f"{q['topic']}#{q['key']}"
