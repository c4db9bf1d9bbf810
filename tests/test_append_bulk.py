"""The bulk append path (issue 7): same store bytes as before and as one-at-a-time appends."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import types

import pytest

import rmqdump.write.writer as writer_mod
from conftest import real_store
from rmqdump.codec.javahash import index_key_hash
from rmqdump.codec.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueueWriter
from rmqdump.write.appender import LockedAppender, StoreGeometry, bulk_append
from rmqdump.write.writer import MessageSpec, index_hashes

GEO = StoreGeometry(65536, 600, 100, 400)  # small files: segment, CQ and index rolls within a few hundred records
BASE = 1_700_000_000_000


def mixed_specs(n: int, base: int):
    """Records with mixed topics (V1, non-ASCII, schedule, half), queues, keys (str, list, repeated
    spaces), tags, properties, raw properties, compression, record CRC, IPv6 born host, store hosts,
    transaction types, pinned and generated uniq keys, flags."""
    topics = ["T1", "TopicB", "SCHEDULE_TOPIC_XXXX", "Ünïcode", "RMQ_SYS_TRANS_HALF_TOPIC", "X" * 100]
    for i in range(n):
        t = topics[i % 6] if i % 7 else "T1"
        kw = dict(topic=t, body=(b"b%d-" % i) * (i % 50 + 1), queue_id=i % 5,
                  born_timestamp=base + i * 37 if i % 3 else None, store_timestamp=base + i * 1000 if i % 4 else None)
        if i % 2:
            kw["keys"] = f"k{i} k{i % 13}  kk{i % 3}" if i % 5 else [f"l{i}", f"m{i}"]
        if i % 3 == 0:
            kw["tags"] = f"tag{i % 4}" if i % 9 else "Täg"
        if i % 11 == 0:
            kw["properties"] = {"a": str(i), "TAGS": "pt", "DELAY": str(i % 20)}
        if i % 17 == 0:
            kw["uniq_key"] = f"U{i:030d}"
        if i % 19 == 0:
            kw["properties_raw"] = b"KEYS\x01raw%d\x02x\x01y" % i
        if i % 23 == 0:
            kw["compression"] = ["zlib", "legacy-zlib"][i % 2]
        if i % 29 == 0:
            kw["record_crc"] = True
        if i % 31 == 0:
            kw["born_host"] = "[::1]:1234"
        if i % 37 == 0:
            kw["store_host"] = f"10.0.0.{i % 250}:10911"
        if i % 41 == 0:
            kw["transaction"] = [TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE][i % 3]
        if i % 43 == 0:
            kw["auto_uniq_key"] = False
        if i % 47 == 0:
            kw["flag"] = i
        if i % 53 == 0:
            kw["reconsume_times"] = 3
        yield MessageSpec(**kw)


def digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "lock"}


@pytest.fixture
def fixed_ids(monkeypatch):
    """Generated uniq keys depend on the pid, a random class-loader hash and counter start: pin them."""
    monkeypatch.setattr(writer_mod.secrets, "token_bytes", lambda n: bytes(range(1, n + 1)))
    monkeypatch.setattr(writer_mod.secrets, "randbelow", lambda n: 65530)
    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    fake_os.getpid = lambda: 4242
    monkeypatch.setattr(writer_mod, "os", fake_os)


def test_bulk_bytes_identical_to_previous_code_path(tmp_path, fixed_ids):
    """Digest of every file written by the mixed workload, recorded with the code before the bulk path
    (per-record encode_fields, per-unit CQ writes, IndexFileWriter puts): three appends onto one store
    (new store, continuation, one commit per record with on_ack) and one store of V2 (long topic) records."""
    out, v2 = tmp_path / "s", tmp_path / "s-v2"
    clk = itertools.count(BASE, 3)
    res = [bulk_append(out, mixed_specs(900, BASE), batch_bytes=8192, create=True, geometry=GEO,
                       clock=lambda: next(clk))]
    res.append(bulk_append(out, mixed_specs(400, BASE + 100_000_000), batch_bytes=30000, geometry=GEO,
                           clock=lambda: next(clk)))
    acks = []
    res.append(bulk_append(out, mixed_specs(300, BASE + 200_000_000), batch_bytes=1, geometry=GEO,
                           clock=lambda: next(clk), on_ack=acks.append))
    res.append(bulk_append(v2, (MessageSpec("Z" * 130, b"v2-%d" % i, queue_id=i % 2, keys=f"z{i}", tags="t")
                                for i in range(50)), batch_bytes=2000, create=True, geometry=GEO,
                           clock=lambda: next(clk), broker_version="5"))  # V2: only for a 5.x broker
    d = digest(out)
    d.update({"v2/" + k: v for k, v in digest(v2).items()})
    d["_res"] = [[r.records, r.bytes, r.first_offset, r.end_offset, r.commits] for r in res]
    d["_acks"] = hashlib.sha256(repr(acks).encode()).hexdigest()
    assert d["_res"] == [[900, 258841, 0, 259454, 31], [400, 113376, 259454, 373391, 4],
                         [300, 84533, 373391, 458113, 301], [50, 14180, 0, 14180, 7]]
    assert len(d) == 91
    assert hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest() == \
        "149c39e2f22b60f8aef09cdb2398111baaa02649eb885bd43427b565cc52a574"


def test_bulk_equals_single_appends(tmp_path, fixed_ids):
    """N records in 4 KiB batches == the same N records appended and committed one at a time."""
    specs = list(mixed_specs(700, BASE))
    a_acks: list = []
    bulk_append(tmp_path / "a", [MessageSpec(**{f: getattr(s, f) for f in s.__dataclass_fields__}) for s in specs],
                batch_bytes=4096, create=True, geometry=GEO, clock=lambda: BASE, on_ack=a_acks.append)
    b_acks = []
    with LockedAppender(tmp_path / "b", create=True, geometry=GEO, clock=lambda: BASE) as app:
        for s in specs:
            b_acks.append(app.append(s))
            assert app.commit() == [b_acks[-1]]
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    # generated uniq keys come from one counter per writer: equal sequences
    assert [(a.offset, a.size, a.queue_offset, a.msg_id, a.uniq_key, a.blank_at) for a in a_acks] == \
        [(a.offset, a.size, a.queue_offset, a.msg_id, a.uniq_key, a.blank_at) for a in b_acks]
    msgs = [m for m in CommitLog.open(tmp_path / "a").walk() if isinstance(m, Message)]
    assert len(msgs) == 700 and all(m.crc_ok for m in msgs)


def test_bulk_onto_real_store_matches_single(store_copy, fixed_ids):
    """On a real broker store (broker498/clean), continuing its queues and index: bulk == single."""
    a, b = store_copy("clean"), real_store("clean")
    b2 = a.parent / "single"
    import shutil

    shutil.copytree(b, b2, symlinks=True)
    specs = [MessageSpec("TopicTest", f"x{i}".encode() * 30, queue_id=i % 4, tags="TagA" if i % 2 else None,
                         keys=f"bk{i}", store_timestamp=BASE + i) for i in range(600)]
    bulk_append(a, [MessageSpec(**{f: getattr(s, f) for f in s.__dataclass_fields__}) for s in specs],
                batch_bytes=16384, clock=lambda: BASE)
    with LockedAppender(b2, clock=lambda: BASE) as app:
        for s in specs:
            app.append(s)
            app.commit()
    assert digest(a) == digest(b2)


def test_cq_put_many_equals_single_puts(tmp_path):
    """One pwrite per file: same bytes and skips as per-unit putMessagePositionInfo, across file ends."""
    units = []
    phys = 1000
    for q in range(5, 95):
        units += [phys, 100, q * 7 - 300, q]
        phys += 100
    units[8:12] = [units[4], 100, 1, 6]  # duplicate offset: skipped
    units[20:24] = [units[20], 100, 0, 2]  # queue offset behind the write position: skipped
    a, b = ConsumeQueueWriter(tmp_path / "a", 600), ConsumeQueueWriter(tmp_path / "b", 600)
    n_a = a.put_many(units[:40]) + a.put_many(units[40:])
    n_b = sum(b.put_message_position_info(*units[i:i + 4]) for i in range(0, len(units), 4))
    a.close()
    b.close()
    assert n_a == n_b == 88
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert len(list((tmp_path / "a").iterdir())) == 4  # pre-blank of queue offsets 0..4, then 3 file rolls


def test_index_hashes_are_java_hashcodes():
    rnd = random.Random(7)
    keys = ["T#a1", "", "polygenelubricants", "Ünï#é", "\ud800x", "😀#k" * 30]
    for _ in range(2000):
        keys.append("".join(chr(rnd.choice([rnd.randrange(32, 127), rnd.randrange(0x80, 0x3000),
                                             rnd.randrange(0x10000, 0x10400)])) for _ in range(rnd.randrange(60))))
    assert [int(h) for h in index_hashes(keys)] == [index_key_hash(k) for k in keys]
    assert [int(h) for h in index_hashes([k for k in keys if k.isascii()])] == \
        [index_key_hash(k) for k in keys if k.isascii()]
    assert index_key_hash("polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE
