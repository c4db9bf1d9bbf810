"""``repair --rebuild-index`` on the compiled walk (``fast.indexkeys``, kernel ``record_keys``) writes the index
files the pure loop writes, byte for byte.

Stores: the bundled ones (RocketMQ-written ``fixtures/oracle`` stores, ``fixtures/store``, ``fixtures/store-5x``)
at batch sizes 1, 3 and the default, from the first offset and from one in the middle with the first keys of that
record skipped and records excluded, into index files small enough to roll over; and a store written here with
what only the pure decoder settles (properties that are not valid UTF-8, keys past a batch's room) beside
UNIQ_KEY, KEYS with empty elements, non-ASCII keys and ROLLBACK records; and that store damaged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twins import STORES, spy, store_id

from rmqdump.codec.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from rmqdump.codec.record import Message
from rmqdump.fast import indexkeys
from rmqdump.fast.engine import fast_available
from rmqdump.store.root import Store
from rmqdump.write.message import MessageSpec
from rmqdump.write.repair.index import build_index_files
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")



def _build(store: Path, out: Path, monkeypatch, flag: str, batch_records: int | None, **kw):
    """The files built and what the compiled walk gave: (batches, hand-over offsets)."""
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    seen = spy(monkeypatch, indexkeys, "index_keys", batch_records)
    out.mkdir(parents=True)
    cl = Store.open(store).commitlog
    made = build_index_files(cl, out, 7, 50, first_name="20261126000000000", name_clock=lambda: 1_800_000_000_000,
                             **kw)
    files = {p.name: p.read_bytes() for p in made}
    batches = sum(isinstance(i, indexkeys.BatchKeys) for i in seen)
    return files, batches, [i.offset for i in seen if isinstance(i, indexkeys.HandOver)]


def _same(store: Path, tmp_path: Path, monkeypatch, batch_records=None, handed=None, **kw) -> dict[str, bytes]:
    pure = _build(store, tmp_path / "pure", monkeypatch, "0", batch_records, **kw)
    fast = _build(store, tmp_path / "fast", monkeypatch, "1", batch_records, **kw)
    assert pure[1] == 0 and (fast[1] > 0 or fast[2]), "each engine ran its own walk"
    if handed is not None:
        assert fast[2] == handed
    assert fast[0].keys() == pure[0].keys()
    for name in pure[0]:
        assert fast[0][name] == pure[0][name], name
    return pure[0]


def _records(store: Path) -> list[Message]:
    return [r for r in Store.open(store).commitlog.walk(check_crc=False) if isinstance(r, Message)]


@pytest.mark.parametrize("batch_records", [None, 1, 3])
@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_bundled_stores_index_alike(store, batch_records, tmp_path, monkeypatch):
    recs = _records(store)
    end = recs[-1].offset + recs[-1].size
    _same(store, tmp_path / "all", monkeypatch, batch_records, start=recs[0].offset, end=end)
    mid = recs[len(recs) // 2]
    _same(store, tmp_path / "mid", monkeypatch, batch_records, start=mid.offset, end=end, skip_first_keys=1,
          exclude={r.offset for r in recs[len(recs) // 2 + 1::3]}, seed_phy=mid.offset - 1, seed_ts=1)


def _awkward_store(root: Path) -> Path:
    specs = [
        MessageSpec("T", b"a", keys="k1 k2  k3 ", uniq_key="7F0000010F15C283855547B76000DB2C"),
        MessageSpec("T\u00e9", b"b", keys="\u00fcber \U0001f600"),  # non-ASCII topic and keys (4-byte UTF-8)
        MessageSpec("T", b"c", keys="rolled", transaction=TRANSACTION_ROLLBACK_TYPE),
        MessageSpec("T", b"d", keys="half", transaction=TRANSACTION_PREPARED_TYPE),
        MessageSpec("T", b"e", keys="commit", transaction=TRANSACTION_COMMIT_TYPE),
        MessageSpec("T", b"f", properties_raw=b"KEYS\x01bad\xff\xfeutf8\x02UNIQ_KEY\x01U1"),  # not UTF-8
        MessageSpec("T", b"g", keys=" ".join(f"m{i}" for i in range(300))),  # more keys than a batch's room
        MessageSpec("T", b"h", properties_raw=b"KEYS\x01x\x02KEYS\x01y z\x02\x02KEYS\x01\x02a"),  # repeats
        MessageSpec("T", b"i"),  # no keys: only its UNIQ_KEY
    ]
    with StoreWriter(root, commitlog_file_size=4096, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for _ in range(6):
            for s in specs:
                w.append(s)
        w.sync()
    return root


def test_the_pure_decoders_records_alike(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    monkeypatch.setattr(indexkeys, "ROOM", 256)
    walk = Store.open(root).commitlog.walk(check_crc=False)
    recs = [r for r in walk if isinstance(r, Message)]
    assert walk.stop.kind == "end_of_data"
    for batch_records in (None, 1, 2, 5):
        files = _same(root, tmp_path / f"b{batch_records}", monkeypatch, batch_records, handed=[],
                      start=recs[0].offset, end=walk.end_offset)
    assert len(files) > 1  # rolled over


def test_a_damaged_record_hands_the_walk_to_the_pure_loop(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    seg = sorted((root / "commitlog").iterdir())[1]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\xde\xad\xbe\xef"  # the file's first record's MAGICCODE
    seg.write_bytes(bytes(data))
    end = Store.open(root).commitlog.segments[-1].end
    _same(root, tmp_path / "out", monkeypatch, 2, handed=[4096], start=0, end=end)
