"""DLedger commitlog stores (issue 19, item 1) written by RocketMQ 4.9.8's own ``DLedgerCommitLog`` and read
back by its ``run`` (DLedger's recovery, then every entry and record): ``scan`` equals the read-back field for
field, ``verify`` raises no false alarm and predicts what DLedger keeps (clean, ``--crash``, a torn last entry
body, a torn last entry header)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli

from .harness import (
    CACHE,
    CACHE_FORMAT,
    Base,
    Built,
    _atomic_dir,
    _digest,
    build_base,
    build_variant,
    expected_row,
    load,
    oracle_version_stamp,
    put,
    read_jsonl,
    run_args,
    unavailable_reason,
)

pytestmark = [pytest.mark.oracle]

SETTINGS = {"type": "settings", "mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 320,
            "maxHashSlotNum": 64, "maxIndexNum": 256, "enableDLegerCommitLog": True, "dLegerGroup": "broker-a",
            "dLegerSelfId": "n0"}


def _spec(port: int, n: int = 260) -> tuple[str, ...]:
    lines = [dict(SETTINGS, dLegerPeers=f"n0-127.0.0.1:{port}")]
    for i in range(n):
        lines.append({"topic": f"DTopic{i % 3}", "queueId": i % 2, "keys": [f"k{i}"], "tags": f"t{i % 4}",
                      "body": f"dledger body {i} " + "x" * (i % 50)})
    return tuple(json.dumps(line) for line in lines)


# one port per base: put runs the member's RPC server (builds may run in parallel)
BASES = {"dledger-clean": Base("dledger-clean", "498", _spec(40951)),
         "dledger-crash": Base("dledger-crash", "498", _spec(40952), ("--crash",)),
         "dledger-533-crash": Base("dledger-533-crash", "533", _spec(40954), ("--crash",)),
         "dledger-no-dispatch": Base("dledger-no-dispatch", "498", _spec(40955), ("--crash-no-dispatch",))}


def _last_entry(b: Built) -> tuple[str, int, int]:
    """(data file, position of the last entry, its size) from put's last status line."""
    st = b.statuses[-1]
    start = st["wroteOffset"] - 48
    seg = start // 65536 * 65536
    return f"dledger-n0/data/{seg:020d}", start - seg, st["wroteBytes"] + 48


def _torn_body(b: Built) -> list[dict]:
    path, pos, size = _last_entry(b)
    return [{"op": "zero", "path": path, "offset": pos + size - 100, "length": 100}]


def _torn_header(b: Built) -> list[dict]:
    path, pos, size = _last_entry(b)
    return [{"op": "zero", "path": path, "offset": pos + 20, "length": size - 20}]


def _mixed_specs() -> tuple[list[dict], list[dict]]:
    """A broker that ran with a plain commitlog, then with enableDLegerCommitLog on the same store."""
    plain = {k: v for k, v in SETTINGS.items() if not k.startswith(("enableDLeger", "dLeger"))}
    plain["mappedFileSizeCommitLog"] = 4096
    old = [plain] + [{"topic": "OldT", "queueId": i % 2, "keys": [f"o{i}"], "body": f"old {i}"} for i in range(20)]
    new = [dict(SETTINGS, mappedFileSizeCommitLog=4096, dLegerPeers="n0-127.0.0.1:40953")]
    new += [{"topic": "OldT", "queueId": i % 2, "keys": [f"n{i}"], "body": f"new {i} " + "z" * i} for i in range(20)]
    return old, new


def build_mixed() -> Built:
    old, new = _mixed_specs()
    final = CACHE / f"dledger-mixed-{_digest(CACHE_FORMAT, 'mixed', old, new, oracle_version_stamp('498'))}"
    args = run_args("498", new[0])
    if not (final / "manifest.jsonl").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)

        def make(tmp):
            statuses = put("498", tmp / "store", old) + put("498", tmp / "store", new)
            (tmp / "statuses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in statuses))
            manifest = load("498", tmp / "store", args)
            (tmp / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest))
        _atomic_dir(final, make)
    return Built("dledger-mixed", "498", final / "store", read_jsonl(final / "statuses.jsonl"),
                 read_jsonl(final / "manifest.jsonl"), args, settings=new[0])


def _no_checkpoint(b: Built) -> list[dict]:
    """A member that crashed before DLedger's first checkpoint flush (the base has the file or not, run to run)."""
    cp = "dledger-n0/checkpoint"
    return [{"op": "delete", "path": cp}] if (b.store / cp).exists() else []


VARIANTS = {"dledger-crash~torn-body": ("dledger-crash", _torn_body),
            "dledger-crash~torn-header": ("dledger-crash", _torn_header),
            "dledger-no-dispatch~no-checkpoint": ("dledger-no-dispatch", _no_checkpoint)}
NAMES = [*BASES, *VARIANTS, "dledger-mixed"]
_built: dict[str, Built] = {}


def get(name: str) -> Built:
    reason = unavailable_reason("533" if "533" in name else "498")
    if reason:
        pytest.skip(reason)
    if name not in _built:
        if name == "dledger-mixed":
            _built[name] = build_mixed()
        elif name in BASES:
            _built[name] = build_base(BASES[name])
        else:
            base, damage = VARIANTS[name]
            b = get(base)
            _built[name] = build_variant(b, name.split("~")[1], damage(b))
    return _built[name]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("name", NAMES)
def test_scan_equals_rocketmq(name):
    b = get(name)
    assert b.info["load_ok"]
    end = b.info["commitlog_max_offset_after_recovery"]
    expected = {m["commitLogOffset"]: expected_row(m) for m in b.of("message")}
    assert all(off < end for off in expected)
    res = invoke("scan", b.store, "-f", "jsonl", "--body", "base64", "-q")
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    # past committedPos RocketMQ reads no record: scan shows the uncommitted entries' records still on disk
    uncommitted = [m["commitLogOffset"] for m in b.of("dledger_entry") if not m["committed"]]
    assert [r["offset"] for r in rows if r["offset"] >= end] == uncommitted
    got = {r["offset"]: {k: r.get(k) for k in expected_row(b.of("message")[0])} if expected else {}
           for r in rows if r["offset"] < end}
    assert sorted(got) == sorted(expected), "records found differ"
    for off, exp in expected.items():
        exp = dict(exp, file=exp["file"].rsplit("/", 1)[-1])
        assert got[off] == exp, f"record at {off}"
    # what RocketMQ could not read as a message (the torn body) is what scan reports as damage
    bad = {m["commitLogOffset"] for m in b.manifest if m["type"] in ("invalid", "invalid_crc")
           and m["commitLogOffset"] < end}
    keep = invoke("scan", b.store, "-f", "jsonl", "--keep-going")
    assert ("skipped" in keep.stderr or "damaged" in keep.stderr) == bool(bad), keep.stderr


@pytest.mark.parametrize("name", NAMES)
def test_verify_predicts_dledger_recovery(name):
    b = get(name)
    res = invoke("verify", b.store, "-f", "json", "-q", "--broker-version", "5.3" if b.version == "533" else "4.9")
    doc = json.loads(res.stdout)
    info = b.of("dledger_info")[0]
    rec = doc["recovery"]
    assert rec["mode"] == "dledger"
    # DLedger's processOffset (the data end after recovery) and RocketMQ's read end (committedPos)
    assert rec["truncated_file"]["file"] == [f for f in info["data_files"]][-1]["file"].rsplit("/", 1)[-1]
    assert rec["truncated_file"]["position"] == info["data_files"][-1]["wrotePosition"]
    assert rec["max_offset"] == b.info["commitlog_max_offset_after_recovery"]
    assert info["committedPos"] in (rec["max_offset"], -1)  # -1: nothing committed, RocketMQ reads from 0
    entries = [m for m in b.manifest if m["type"] == "dledger_entry"]
    assert rec["records_walked"] == len(entries) == info["ledgerEndIndex"] + 1
    # abnormal load: the index files RocketMQ no longer lists are the ones verify says it deletes
    on_disk = {p.name for p in (b.store / "index").iterdir()}
    kept = {m["file"] for m in b.of("index_file")}
    assert {f["file"] for f in rec["deleted_index_files"]} == on_disk - kept
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    warnings = [f for f in doc["findings"] if f["severity"] == "warning"]
    last = b.statuses[-1]["wroteOffset"]
    # consume queues after recovery: the entries verify says recovery drops leave RocketMQ's maxima
    cq_max = {(m["topic"], m["queueId"]): m["maxOffsetInQueue"] for m in b.of("cq_queue")}
    cq = json.loads(invoke("cq", b.store, "-f", "json", "-q").stdout)
    predicted = {(q["topic"], q["queue_id"]): q["max_offset"] for q in cq["queues"]}
    for change in ("dropped_cq_entries", "redispatched_cq_entries"):
        for q, d in rec[change]["queues"].items():
            topic, qid = q.rsplit("/", 1)
            predicted[(topic, int(qid))] = d["new_max_offset"]
    assert predicted == {k: v for k, v in cq_max.items() if v or k in predicted}  # (empty schedule queues too)
    if name.endswith("torn-body"):
        # RocketMQ reads the torn record as a message with NULs in its properties: every error is about it
        assert rec["dropped_records"]["count"] == 0 and errors
        assert all(f["offset"] == last or f"record at {last}" in f["detail"] for f in errors), errors
        assert {f["kind"] for f in errors if f["offset"] == last} == {"torn_properties"}
        assert [f["file"] for f in errors if f["offset"] == last] == ["dledger-n0/data/00000000000000065536"]
    elif name.endswith("torn-header"):
        # DLedger drops the torn entry (its record was never read): verify names it, nothing else is wrong
        assert rec["stop"]["offset"] == last - 48 and rec["dropped_records"]["count"] == 0
        assert all(f["offset"] == last - 48 or f"at {last}" in f["detail"] for f in errors), errors
        assert {f["kind"] for f in errors} == {"dledger_entry", "cq_entry_beyond_end"}
        assert rec["dropped_cq_entries"]["count"] == 1
        # the flushed checkpoint and index name the lost record: true, and only warnings
        assert {w["kind"] for w in warnings} <= {"abort_present", "checkpoint_ahead", "index_entry_beyond_end",
                                                 "index_header_mismatch"}
    if not name.endswith("torn-header"):
        assert [w for w in warnings if w["kind"] != "abort_present"] == []
    if "no-dispatch" in name:  # DLedger's checkpoint not flushed, or flushed before a commit: committedIndex -1
        assert info["committedIndex"] == -1 and rec["max_offset"] == 0
        assert [f["kind"] for f in doc["findings"] if f["kind"].startswith("dledger_")] == ["dledger_uncommitted"]
    if not name.endswith(("torn-body", "torn-header")):
        assert errors == [] and res.exit_code == 0
    if name == "dledger-mixed":  # old commitlog files, then DLedger's data from dividedCommitlogOffset
        assert info["dividedCommitlogOffset"] > 0 and doc["summary"]["records"] == 40
        assert any("dividedCommitlogOffset" in n for n in rec["notes"])
