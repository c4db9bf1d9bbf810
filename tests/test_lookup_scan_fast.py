"""A key lookup that walks the commitlog (``lookup --scan``, or no usable index) finds on the compiled walk
(``fast.keyscan``) exactly what the pure walk finds: the same hits, collisions, warnings, reasons, scanned ranges
and counts of records the index should have held.

Stores: the bundled ones (RocketMQ-written ``fixtures/oracle`` stores, ``fixtures/store``, ``fixtures/store-5x``)
with keys and client ids taken from their records, a prefix of a key (records whose properties hold its bytes but
no such key), a key no record has, with and without a topic and a time window; the same stores with an index
covering only their first half (the walk from the index's end counts the records it should have held); a store
written here with keys the pure decoder must judge, damaged (the kernel hands the walk over).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from oracle_fixtures import writable_copy
from twins import STORES, spy, store_id

from rmqdump.analysis.lookup import lookup_key
from rmqdump.codec.record import Message
from rmqdump.fast import keyscan
from rmqdump.fast.engine import fast_available
from rmqdump.store.indexfile import IndexBuilder
from rmqdump.store.root import Store
from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")



def _records(store: Path) -> list[Message]:
    return [r for r in Store.open(store).commitlog.walk(check_crc=False, keep_going=True) if isinstance(r, Message)]


def _doc(res) -> dict:
    d = {f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name != "geometry"}
    d["hits"] = [m.offset for m in res.hits]
    return d


def _lookups(store: Path, queries: list[tuple], monkeypatch, flag: str, batch_records: int | None) -> tuple[list, int]:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    calls = spy(monkeypatch, keyscan, "key_scan", batch_records)
    out = []
    for topic, key, lo, hi, force in queries:
        out.append(_doc(lookup_key(store, topic, key, lo, hi, force_scan=force)))
    return out, len(calls)


def _same(store: Path, queries: list[tuple], monkeypatch, batch_records: int | None = None) -> list[dict]:
    pure, n_pure = _lookups(store, queries, monkeypatch, "0", batch_records)
    fast, n_fast = _lookups(store, queries, monkeypatch, "1", batch_records)
    assert n_pure == 0 and n_fast > 0, "each engine ran its own walk"
    for q, a, b in zip(queries, pure, fast, strict=True):
        assert b == a, q
    return pure


def _queries(recs: list[Message], force: bool) -> list[tuple]:
    keyed = [r for r in recs if r.keys or r.uniq_key][:: max(1, len(recs) // 12)][:12]
    out = []
    for r in keyed:
        key = r.keys[0] if r.keys else r.uniq_key
        out.append((None, key, None, None, force))
        out.append((r.topic, key, None, None, force))
        out.append((None, key, r.store_timestamp, r.store_timestamp, force))
        if len(key) > 2:
            out.append((None, key[:-1], None, None, force))  # its bytes are in the record; no such key
    out.append((None, "no-such-key-anywhere", None, None, force))
    return out


@pytest.mark.parametrize("batch_records", [None, 2])
@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_scans_find_alike(store, batch_records, monkeypatch):
    recs = _records(store)
    docs = _same(store, _queries(recs, True), monkeypatch, batch_records)
    assert any(d["hits"] for d in docs)


def test_stale_index_counts_alike(tmp_path, monkeypatch):
    """An index of each store's first half: the walk of the rest counts the records it should have held."""
    counted = []
    for n, store in enumerate(s for s in STORES if (s / "index").is_dir()):
        root = writable_copy(store, tmp_path / str(n))
        recs = _records(root)
        split = recs[len(recs) // 2].offset
        shutil.rmtree(root / "index")
        with IndexBuilder(root / "index", 50, 400, clock_ms=lambda: 1_795_297_369_000, utc=True) as b:
            for r in recs:
                if r.offset < split:
                    b.add_message(r.topic, r.uniq_key, r.properties.get("KEYS"), r.offset, r.store_timestamp,
                                  r.sys_flag)
        docs = _same(root, _queries(recs, False), monkeypatch, 3)
        if any("are not in the index" in x for d in docs for x in d["reasons"]):
            counted.append(store)
    assert len(counted) >= 3, counted


def test_a_damaged_store_hands_the_walk_over(tmp_path, monkeypatch):
    root = tmp_path / "s"
    specs = [MessageSpec("T", b"x" * 40, keys=f"k{i} shared \u00fcber", tags="t") for i in range(40)]
    specs.insert(7, MessageSpec("T", b"y", properties_raw=b"KEYS\x01k7\xff\x02UNIQ_KEY\x01U7"))  # not UTF-8
    with StoreWriter(root, commitlog_file_size=2048, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for s in specs:
            w.append(s)
        w.sync()
    seg = sorted((root / "commitlog").iterdir())[1]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\xde\xad\xbe\xef"
    seg.write_bytes(bytes(data))
    queries = [(None, k, None, None, True) for k in ("k1", "k7", "shared", "\u00fcber", "k30", "U7")]
    docs = _same(root, queries, monkeypatch, 2)
    assert any(d["warnings"] for d in docs) and all(d["hits"] for d in docs[:4])
