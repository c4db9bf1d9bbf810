"""``rmqdump pending`` on the compiled walk (``fast.pendingwalk``) decides what the pure walk decides: the same
candidates in the same states, the same records counted, the same damage.

Stores: the bundled ones (RocketMQ-written: transactions with IPv6 hosts, the 5.x timer store, LMQ, a flipped
body, a cut-short file, ...) at batch sizes 1, 3 and the default; a store written here whose delayed and timer
messages are delivered as copies later in the same batch, in a topic first met before the candidate (the set of
topics that matter grows inside a batch), with transaction halves, ops, commits and rollbacks; and that store
damaged (the kernel hands the walk over).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twins import STORES, spy, store_id

from rmqdump.analysis.pending import walk_pending
from rmqdump.codec.layout import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rmqdump.fast import pendingwalk
from rmqdump.fast.engine import fast_available
from rmqdump.store.root import Store
from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")



def _pending(store: Path, monkeypatch, flag: str, batch_records: int | None) -> tuple[dict, int]:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    calls = spy(monkeypatch, pendingwalk, "feed_pending", batch_records)
    cl = Store.open(store).commitlog
    w = walk_pending(cl, {1: 2, 3: 1}, max_record_size=4 << 20)
    doc = {"candidates": [c.to_dict() for c in w.candidates], "records": w.records,
           "skipped": [(s.start, s.end, s.reason.kind) for s in w.skipped],
           "stop": None if w.stop is None else (w.stop.offset, w.stop.kind)}
    return doc, len(calls)


def _same(store: Path, monkeypatch, batch_records: int | None = None) -> dict:
    pure, n_pure = _pending(store, monkeypatch, "0", batch_records)
    fast, n_fast = _pending(store, monkeypatch, "1", batch_records)
    assert n_pure == 0 and n_fast == 1, "each engine ran its own walk"
    assert fast == pure
    return pure


@pytest.mark.parametrize("batch_records", [None, 1, 3])
@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_bundled_stores_pend_alike(store, batch_records, monkeypatch):
    doc = _same(store, monkeypatch, batch_records)
    assert doc["records"] > 0


def _awkward_store(root: Path) -> Path:
    def delayed(uniq: str, level: int = 3) -> MessageSpec:
        return MessageSpec(SCHEDULE_TOPIC, b"d", queue_id=level - 1, uniq_key=uniq,
                           properties={"DELAY": str(level), "REAL_TOPIC": "Late", "REAL_QID": "0"})

    def copy(uniq: str, level: int = 3) -> MessageSpec:
        return MessageSpec("Late", b"d", uniq_key=uniq, properties={"DELAY": str(level), "REAL_TOPIC": "Late"})

    specs = [
        MessageSpec("Late", b"before", uniq_key="AA000000000000000000000000000001"),
        delayed("AA000000000000000000000000000002"),
        MessageSpec("Other", b"x"),
        copy("AA000000000000000000000000000002"),  # the copy, later in the same batch
        delayed("AA000000000000000000000000000003", 1),  # never copied
        MessageSpec(TIMER_TOPIC, b"t", uniq_key="AA000000000000000000000000000004",
                    properties={"REAL_TOPIC": "Timed", "REAL_QID": "0", "TIMER_OUT_MS": "1700000005000"}),
        MessageSpec("Timed", b"t", uniq_key="AA000000000000000000000000000004",
                    properties={"TIMER_OUT_MS": "1700000005000"}),
        MessageSpec(RMQ_SYS_TRANS_HALF_TOPIC, b"h", uniq_key="AA000000000000000000000000000005",
                    properties={"REAL_TOPIC": "Tx", "REAL_QID": "0"}),
        MessageSpec("Tx", b"p", transaction=TRANSACTION_PREPARED_TYPE, uniq_key="AA000000000000000000000000000006"),
        MessageSpec("Tx", b"c", transaction=TRANSACTION_COMMIT_TYPE, uniq_key="AA000000000000000000000000000007"),
        MessageSpec("Tx", b"r", transaction=TRANSACTION_ROLLBACK_TYPE),
        MessageSpec("%RETRY%g", b"r", properties={"RETRY_TOPIC": "Late"}),
    ]
    with StoreWriter(root, commitlog_file_size=4096, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for _ in range(4):
            for s in specs:
                w.append(s)
        w.sync()
    return root


def test_copies_in_the_same_batch_and_every_kind_alike(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    for batch_records in (None, 2, 5):
        doc = _same(root, monkeypatch, batch_records)
    states = {(c["kind"], c["state"]) for c in doc["candidates"]}
    assert ("delay", "delivered") in states and ("delay", "pending") in states
    assert {"timer", "tx_half", "tx_prepared"} <= {k for k, _ in states}


def test_a_damaged_store_hands_the_walk_over(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    seg = sorted((root / "commitlog").iterdir())[1]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\xde\xad\xbe\xef"  # the file's first MAGICCODE
    seg.write_bytes(bytes(data))
    doc = _same(root, monkeypatch, 2)
    assert doc["skipped"]


def test_a_body_crc_mismatch_alike(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    rec = [r for r in Store.open(root).commitlog.walk() if getattr(r, "body", None) and r.offset > 4096][1]
    seg = root / "commitlog" / rec.file
    data = bytearray(seg.read_bytes())
    at = data.index(rec.body, rec.file_pos, rec.file_pos + rec.size)
    data[at] ^= 0xFF  # the body's first byte
    seg.write_bytes(bytes(data))
    doc = _same(root, monkeypatch, 2)
    assert [k for *_, k in doc["skipped"]] == ["body_crc"]
