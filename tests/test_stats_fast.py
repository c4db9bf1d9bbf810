"""``rmqdump stats`` on the compiled walk (``fast.statswalk``: rows grouped on the bytes the statistics key on,
one record a group decoded) gives the pure walk's document, number for number.

Stores: the bundled ones (RocketMQ-written: IPv6 hosts, transactions, the timer store, LMQ, V2 records, damage;
``fixtures/store`` with zlib, lz4 and zstd bodies) at batch sizes 1, 3 and the default; a store written here
with tags alike in hash but not in text, non-ASCII and non-UTF-8 properties, delivered copies (DELAY, TIMER_*),
system topics, transaction kinds, hosts, clocks ahead and behind, store times across hours and far outside the
calendar; and that store damaged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from twins import STORES, spy, store_id

from rmqdump.analysis.stats import compute_stats
from rmqdump.codec.javahash import java_string_hash
from rmqdump.codec.layout import (
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rmqdump.fast import statswalk
from rmqdump.fast.engine import fast_available
from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")



def _stats(store: Path, monkeypatch, flag: str, batch_records: int | None) -> tuple[dict, int]:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    seen = spy(monkeypatch, statswalk, "stats_batches", batch_records)
    return compute_stats(store), sum(isinstance(i, statswalk.StatsBatch) for i in seen)


def _same(store: Path, monkeypatch, batch_records: int | None = None) -> dict:
    pure, n_pure = _stats(store, monkeypatch, "0", batch_records)
    fast, n_fast = _stats(store, monkeypatch, "1", batch_records)
    assert n_pure == 0 and n_fast > 0, "each engine ran its own walk"
    for section in pure:
        assert fast[section] == pure[section], section
    return pure


@pytest.mark.parametrize("batch_records", [None, 1, 3])
@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_bundled_stores_count_alike(store, batch_records, monkeypatch):
    doc = _same(store, monkeypatch, batch_records)
    assert doc["totals"]["records"] > 0


def _colliding_tags() -> tuple[str, str]:
    """Two tags with the same Java hash ("Aa" and "BB" hash alike)."""
    a, b = "tagAa", "tagBB"
    assert java_string_hash(a) == java_string_hash(b)
    return a, b


def _awkward_store(root: Path) -> Path:
    ta, tb = _colliding_tags()
    base = 1_700_000_000_000
    specs = [
        MessageSpec("T", b"a" * 10, tags=ta, born_timestamp=base - 5),
        MessageSpec("T", b"b" * 300, tags=tb, born_timestamp=base + 7),  # born after stored
        MessageSpec("T", b"c", tags="caf\u00e9", born_host="10.0.0.2:1234"),
        MessageSpec("T", b"d", properties_raw=b"TAGS\x01x\xff\x02KEYS\x01k"),  # not UTF-8
        MessageSpec("T", b"e", tags="x", born_host="[::1]:999"),
        MessageSpec("T", b"f", properties={"DELAY": "3", "REAL_TOPIC": "T"}),  # a delivered delay copy
        MessageSpec("T", b"g", properties={"TIMER_OUT_MS": "1700000001000"}),
        MessageSpec(SCHEDULE_TOPIC, b"h", queue_id=2, properties={"DELAY": "3", "REAL_TOPIC": "T", "REAL_QID": "0"}),
        MessageSpec("%RETRY%grp", b"i", properties={"RETRY_TOPIC": "T"}),
        MessageSpec("T", b"j", transaction=TRANSACTION_PREPARED_TYPE),
        MessageSpec("T", b"k", transaction=TRANSACTION_COMMIT_TYPE),
        MessageSpec("T", b"l", transaction=TRANSACTION_ROLLBACK_TYPE),
        MessageSpec("U", b"m" * 5000, queue_id=3, compression="zlib"),
        MessageSpec("T", b"n", born_timestamp=-(1 << 62)),  # its skew passes 2**63 (an int64 would wrap)
    ]
    times = [base + n * 977_000 for n in range(4 * len(specs) - 1)] + [(1 << 63) - 1, -5, 253_402_300_800_000 + 5,
                                                                       1 << 62]
    with StoreWriter(root, commitlog_file_size=8192, build_index=False, clock=lambda: base) as w:
        for n, s in enumerate([*specs * 4, *specs[:3]]):  # the last three stored before 1970, after 9999, beyond
            w.append(dataclasses.replace(s, store_timestamp=times[n], uniq_key=f"{n:032X}"))
        w.sync()
    return root


def test_the_rows_the_columns_cannot_settle_alike(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    for batch_records in (None, 1, 2, 5):
        doc = _same(root, monkeypatch, batch_records)
    ta, tb = _colliding_tags()
    tags = {e["tag"]: e["records"] for e in doc["tags"] if e["topic"] == "T"}
    assert tags[ta] == tags[tb] == 5
    assert "invalid" in {e["hour"] for e in doc["hours"]} and len(doc["hours"]) > 3
    assert doc["clock_skew"]["born_after_store"] > 0 and doc["system_kinds"]


def test_a_damaged_store_hands_the_walk_over(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    seg = sorted((root / "commitlog").iterdir())[1]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\xde\xad\xbe\xef"
    seg.write_bytes(bytes(data))
    doc = _same(root, monkeypatch, 2)
    assert doc["findings"]
