"""``repair --rebuild-cq`` on the compiled walk (``fast.cqrebuild``) writes the files and the warnings the pure
loop writes, byte for byte and in order.

Stores: the bundled ones (RocketMQ-written ``fixtures/oracle`` stores: LMQ, transactions, BatchCQ, IPv6, V2
records, several files; ``fixtures/store``, ``fixtures/store-5x``), with every batch size from one record up,
and a store written here with what only the row-by-row rules settle: delay-topic records (a good and a
malformed ``DELAY``), TAGS that are not ASCII, LMQ multi-dispatch, transaction halves and rollbacks, queue
offsets with a gap, a repeat and a step back, a new queue starting past 0 (pre-blank fill), a topic that
cannot be a directory, a BatchCQ topic; and that store with a damaged record (the kernel hands the walk over).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twins import STORES, spy, store_id

from rmqdump.codec.layout import (
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rmqdump.fast import cqrebuild
from rmqdump.fast.engine import fast_available
from rmqdump.store.root import Store
from rmqdump.write.message import MessageSpec
from rmqdump.write.repair.queues import rebuild_consume_queues
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")

def _rebuild(store: Path, out: Path, monkeypatch, flag: str, batch_records: int | None = None,
             batch_topics: frozenset[str] = frozenset()) -> tuple[dict[str, bytes], list[str], int]:
    """The files, the warnings, how many batches the compiled walk gave and where it handed over."""
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    seen = spy(monkeypatch, cqrebuild, "dispatch_units", batch_records)
    warnings: list[str] = []
    out.mkdir(parents=True)
    cl = Store.open(store).commitlog
    names = rebuild_consume_queues(cl, out, 1000 * 20, warnings=warnings, batch_topics=batch_topics)
    files = {n: (out / n).read_bytes() for n in names}
    handed = [i.offset for i in seen if isinstance(i, cqrebuild.HandOver)]
    return files, warnings, sum(isinstance(i, cqrebuild.QueueUnits) for i in seen), handed


def _same(store: Path, tmp_path: Path, monkeypatch, handed: list[int] | None = None,
          **kw) -> tuple[dict[str, bytes], list[str]]:
    pure = _rebuild(store, tmp_path / "pure", monkeypatch, "0", **kw)
    fast = _rebuild(store, tmp_path / "fast", monkeypatch, "1", **kw)
    if handed is not None:
        assert fast[3] == handed
    assert pure[2] == 0 and fast[2] > 0, "each engine ran its own walk"
    assert fast[1] == pure[1]
    assert fast[0].keys() == pure[0].keys()
    for name in pure[0]:
        assert fast[0][name] == pure[0][name], name
    return pure[0], pure[1]


@pytest.mark.parametrize("batch_records", [None, 1, 3])
@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_bundled_stores_rebuild_alike(store, batch_records, tmp_path, monkeypatch):
    files, _ = _same(store, tmp_path, monkeypatch, batch_records=batch_records)
    if any((store / "consumequeue").glob("*/*/*")):
        assert files


def _awkward_store(root: Path) -> Path:
    """Records whose units only the row-by-row rules settle, over several 8 KiB files."""
    specs = [
        MessageSpec("T", b"a" * 100, queue_id=0, tags="plain", queue_offset=0),
        MessageSpec("T", b"b" * 100, queue_id=0, tags="caf\u00e9", queue_offset=1),  # not ASCII
        MessageSpec("T", b"c" * 100, queue_id=1, tags="x", queue_offset=4),  # a new queue past 0: pre-blank
        MessageSpec(SCHEDULE_TOPIC, b"d" * 100, queue_id=2, properties={"DELAY": "3", "REAL_TOPIC": "T"},
                    queue_offset=0),
        MessageSpec(SCHEDULE_TOPIC, b"e" * 100, queue_id=2, properties={"DELAY": "99"}, queue_offset=1),
        MessageSpec("T", b"f" * 100, queue_id=0, transaction=TRANSACTION_PREPARED_TYPE, queue_offset=0),
        MessageSpec("T", b"g" * 100, queue_id=0, transaction=TRANSACTION_ROLLBACK_TYPE, queue_offset=0),
        MessageSpec("T", b"h" * 100, queue_id=0, transaction=TRANSACTION_COMMIT_TYPE, tags="c", queue_offset=2),
        MessageSpec("L", b"i" * 100, queue_id=3, queue_offset=0,
                    properties={"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "0,7"}),
        MessageSpec("T", b"j" * 100, queue_id=0, tags="gap", queue_offset=5),  # a gap: written at 3
        MessageSpec("T", b"k" * 100, queue_id=0, tags="again", queue_offset=5),  # a repeat
        MessageSpec("T", b"l" * 100, queue_id=0, tags="back", queue_offset=1),  # a step back: skipped
        MessageSpec("DOTDOT", b"m" * 100, queue_id=0, queue_offset=0),  # becomes "x/../y": cannot be a directory
        MessageSpec("B", b"n" * 100, queue_id=0, queue_offset=0),  # a BatchCQ topic (batch_topics)
    ]
    with StoreWriter(root, commitlog_file_size=8192, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for n in range(6):
            for s in specs:
                w.append(s)
            for q in range(4):
                w.append(MessageSpec(f"Many{n % 3}", b"z" * (50 + q), queue_id=q, tags=f"t{q}"))
        w.sync()
    for seg in (root / "commitlog").iterdir():  # a topic the writer refuses to write (no CRC covers it)
        seg.write_bytes(seg.read_bytes().replace(b"DOTDOT", b"x/../y"))
    return root


def test_the_row_by_row_rules_alike(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    walk = Store.open(root).commitlog.walk(check_crc=False)
    assert sum(1 for _ in walk) > 100 and walk.stop.kind == "end_of_data"
    for batch_records in (None, 1, 2, 5):  # the kernel walks it all, up to the unwritten space of the last file
        files, warnings = _same(root, tmp_path / f"b{batch_records}", monkeypatch, [walk.end_offset],
                                batch_records=batch_records,
                                batch_topics=frozenset({"B"}))
    assert "consumequeue/%LMQ%b/0/00000000000000000000" in files
    assert "consumequeue/SCHEDULE_TOPIC_XXXX/2/00000000000000000000" in files
    assert any("cannot be a consume-queue directory" in w for w in warnings)
    assert any("BatchCQ topic 'B'" in w for w in warnings)


def test_a_damaged_record_hands_the_walk_to_the_pure_loop(tmp_path, monkeypatch):
    root = _awkward_store(tmp_path / "s")
    seg = sorted((root / "commitlog").iterdir())[1]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\xde\xad\xbe\xef"  # the first record's MAGICCODE
    seg.write_bytes(bytes(data))
    files, _ = _same(root, tmp_path / "out", monkeypatch, [8192], batch_records=2, batch_topics=frozenset({"B"}))
    assert "consumequeue/Many2/3/00000000000000000000" in files  # records after the damage: the pure loop's


def test_put_units_writes_what_the_one_unit_rule_writes(tmp_path):
    """The writer's bulk step and its fallbacks against ``put_message_position_info`` unit by unit."""
    import numpy as np

    from rmqdump.store.consumequeue import ConsumeQueueWriter

    cases = {
        "run": [(100 * i, 50, i, i) for i in range(1, 9)],
        "new queue past 0": [(100 * i, 50, i, i + 3) for i in range(1, 9)],
        "already built": [(100 * i, 50, i, i) for i in range(1, 9)],
        "gap": [(100, 50, 1, 0), (200, 50, 2, 1), (300, 50, 3, 9), (400, 50, 4, 10)],
        "ends not rising": [(300, 50, 1, 0), (100, 50, 2, 1), (400, 50, 3, 2)],
        "one": [(5, 5, -7, 0)],
    }
    for name, units in cases.items():
        one, bulk = tmp_path / name / "one", tmp_path / name / "bulk"
        pre = [(10, 20, 0, 0), (40, 20, 0, 1)] if name == "run" else ([(10, 1000, 0, 0)] if "built" in name else [])
        for d, how in ((one, "one"), (bulk, "bulk")):
            with ConsumeQueueWriter(d, 20 * 4) as w:
                for u in pre:
                    w.put_message_position_info(*u)
                if how == "one":
                    for u in units:
                        w.put_message_position_info(*u)
                else:
                    cols = np.array(units, np.int64).T
                    cqrebuild.put_units(w, *cols)
                state = (w.write_offset, w.max_physic_offset)
            if how == "one":
                expect = state
            else:
                assert state == expect, name
        assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in bulk.iterdir()), name
        for p in one.iterdir():
            assert (bulk / p.name).read_bytes() == p.read_bytes(), (name, p.name)


def test_a_delivery_time_past_a_long_is_the_pure_error(tmp_path, monkeypatch):
    """A delay-topic record stored at the end of time: its tagsCode (store time + the level's delay) does not fit
    a long; both rebuilds fail with the encoder's one error (the compiled one once raised OverflowError)."""
    from rmqdump.errors import FormatError

    root = tmp_path / "s"
    stand_in = SCHEDULE_TOPIC.replace("XXXX", "YYYY")  # the writer refuses the real one (it dispatches the unit)
    late = MessageSpec(stand_in, b"d", queue_id=2, properties={"DELAY": "3", "REAL_TOPIC": "T"},
                       store_timestamp=(1 << 63) - 1, uniq_key="AA000000000000000000000000000001")
    with StoreWriter(root, commitlog_file_size=8192, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for n in range(40):
            w.append(MessageSpec("T", b"x" * 100, tags="t") if n != 30 else late)
        w.sync()
    for seg in (root / "commitlog").iterdir():
        seg.write_bytes(seg.read_bytes().replace(stand_in.encode(), SCHEDULE_TOPIC.encode()))
    errors = []
    for flag in ("0", "1"):
        with pytest.raises(FormatError) as e:
            _rebuild(root, tmp_path / flag, monkeypatch, flag)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "cannot encode CQ entry" in errors[0]
