"""The compiled ConsumeQueue join (analysis.verify.queue_fast + fast.cqjoin) against the pure CqChecker.

Every bundled store with consume queues and damaged copies of them (entry sizes, tagsCodes, holes, missing
tails, extra / swapped / foreign / dangling entries, queues beyond topics.json, LMQ fan-out, BatchCQ units,
delay-topic delivery times, findings past the per-kind cap) are verified with ``RMQDUMP_FAST=0`` (pure) and
``RMQDUMP_FAST=1`` (compiled walk + column join): the JSON documents must be identical, and the compiled run
must really have cleared records in the kernel (not handed them all to the pure checker).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES
from rmqdump.analysis.verify import verify_store
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT
from rmqdump.fast import abi
from rmqdump.fast import walk as fastwalk

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

CQ_STORES = [FIXTURES / "store", FIXTURES / "store-5x", *sorted(FIXTURES.glob("oracle/*/store")),
             *sorted(p for p in FIXTURES.glob("bugs/*/store") if (p / "consumequeue").is_dir())]
SEG0 = "00000000000000000000"


def _doc(path, fast: bool, monkeypatch, spy: dict | None = None, **kw) -> str:
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    try:
        if spy is not None:
            from rmqdump.analysis.verify import queue_fast

            real = queue_fast.FastCqChecker.on_batch

            def on_batch(self, batch, lo, hi):
                real(self, batch, lo, hi)
                spy["rows"] += hi - lo
                spy["cleared"] += int((self.join.code[lo:hi] == abi.JCODE_CLEARED).sum())

            monkeypatch.setattr(queue_fast.FastCqChecker, "on_batch", on_batch)
        return json.dumps(verify_store(path, **kw).to_dict(), sort_keys=True)
    finally:
        monkeypatch.undo()


def assert_same(path, monkeypatch, *, cleared: bool = True, **kw) -> dict:
    """Pure and compiled documents are equal (with and without --keep-going); returns the pure one."""
    for keep_going in (False, True):
        spy = {"rows": 0, "cleared": 0}
        pure = _doc(path, False, monkeypatch, keep_going=keep_going, **kw)
        fast = _doc(path, True, monkeypatch, spy=spy, keep_going=keep_going, **kw)
        assert fast == pure, (path, keep_going)
        doc = json.loads(pure)
        if cleared and doc["summary"]["cq_records_checked"]:
            assert spy["cleared"] > 0, "the kernel cleared no record: the join did not run"
    return doc


@pytest.mark.parametrize("path", CQ_STORES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_join_matches_pure_on_every_store(path, monkeypatch):
    assert_same(path, monkeypatch, cleared=False)


def _copy(tmp_path, src: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _cq(store: Path, queue: str) -> Path:
    return store / "consumequeue" / queue / SEG0


def _entries(path: Path) -> list[tuple[int, int, int]]:
    data = path.read_bytes()
    return [CQ_UNIT.unpack_from(data, k) for k in range(0, len(data) - len(data) % CQ_STORE_UNIT_SIZE,
                                                         CQ_STORE_UNIT_SIZE)]


def _valid(path: Path) -> list[tuple[int, int, int]]:
    out = []
    for e in _entries(path):
        if e[1] <= 0:
            break
        out.append(e)
    return out


def _put(path: Path, k: int, entry: tuple[int, int, int]) -> None:
    with open(path, "r+b") as f:
        f.seek(k * CQ_STORE_UNIT_SIZE)
        f.write(CQ_UNIT.pack(*entry))


def _damage(store: Path, how: str) -> dict:
    """Damage a copy of fixtures/store; returns verify keywords."""
    q0, q1 = _cq(store, "TopicTest/0"), _cq(store, "TopicTest/1")
    e0, e1 = _valid(q0), _valid(q1)
    assert len(e0) >= 4 and len(e1) >= 2
    if how == "size":
        _put(q0, 1, (e0[1][0], e0[1][1] + 3, e0[1][2]))
    elif how == "tags":
        _put(q0, 2, (e0[2][0], e0[2][1], e0[2][2] ^ 0x5A5A))
    elif how == "tags_every_entry_cap":
        for k, (p, s, t) in enumerate(e0):
            _put(q0, k, (p, s, t + 1))
        return {"max_findings_per_kind": 2}
    elif how == "schedule_delivery_time":
        for qd in (store / "consumequeue" / "SCHEDULE_TOPIC_XXXX").iterdir():
            es = _valid(qd / SEG0)
            if es:
                _put(qd / SEG0, 0, (es[0][0], es[0][1], es[0][2] + 1000))
    elif how == "missing_tail":
        with open(q0, "r+b") as f:
            f.seek((len(e0) - 2) * CQ_STORE_UNIT_SIZE)
            f.write(bytes(2 * CQ_STORE_UNIT_SIZE))
    elif how == "hole":
        _put(q0, 1, (0, 0, 0))
    elif how == "extra_duplicate":
        _put(q0, len(e0), e0[0])
    elif how == "extra_beyond_end":
        end = store.joinpath("commitlog", SEG0).stat().st_size
        _put(q0, len(e0), (end - 4096, e0[0][1], e0[0][2]))
    elif how == "swap":
        _put(q0, len(e0) - 2, e0[-1])
        _put(q0, len(e0) - 1, e0[-2])
    elif how == "foreign":
        _put(q0, 2, e1[0])
    elif how == "dangling":
        _put(q0, 3, (e0[3][0] + 1, e0[3][1], e0[3][2]))
    elif how == "queue_range":
        cfg = store / "config" / "topics.json"
        doc = json.loads(cfg.read_text())
        tc = doc["topicConfigTable"]["TopicTest"]
        tc["readQueueNums"] = tc["writeQueueNums"] = 1
        cfg.write_text(json.dumps(doc))
    elif how == "queue_lost":
        shutil.rmtree(store / "consumequeue" / "TopicTest" / "1")
    elif how == "topic_deleted":
        cfg = store / "config" / "topics.json"
        doc = json.loads(cfg.read_text())
        del doc["topicConfigTable"]["TopicTest"]
        cfg.write_text(json.dumps(doc))
        shutil.rmtree(store / "consumequeue" / "TopicTest")
    return {}


DAMAGE = ["size", "tags", "tags_every_entry_cap", "schedule_delivery_time", "missing_tail", "hole",
          "extra_duplicate", "extra_beyond_end", "swap", "foreign", "dangling", "queue_range", "queue_lost",
          "topic_deleted"]


@pytest.mark.parametrize("how", DAMAGE)
def test_join_matches_pure_on_damaged_queues(tmp_path, monkeypatch, how):
    store = _copy(tmp_path, FIXTURES / "store")
    kw = _damage(store, how)
    doc = assert_same(store, monkeypatch, **kw)
    kinds = {f["kind"] for f in doc["findings"]}
    assert kinds & {k for k in kinds if k.startswith(("cq_", "queue_id"))}, (how, kinds)


def test_join_matches_pure_on_damaged_lmq(tmp_path, monkeypatch):
    """LMQ fan-out: entries of %LMQ% queues point at another topic's records (multi-dispatch)."""
    store = _copy(tmp_path, FIXTURES / "oracle" / "498-healthy-lmq" / "store")
    lmq = sorted((store / "consumequeue").glob("%LMQ%*/*/" + SEG0))[0]
    es = _valid(lmq)
    _put(lmq, 0, es[1])  # now misplaced: the record's INNER_MULTI_QUEUE_OFFSET names queue offset 1
    other = _cq(store, "MqttTopic/0") if _cq(store, "MqttTopic/0").exists() else sorted(
        (store / "consumequeue" / "MqttTopic").glob("*/" + SEG0))[0]
    m = _valid(other)
    _put(other, 0, (m[0][0], m[0][1], m[0][2] + 7))
    doc = assert_same(store, monkeypatch)
    assert {"cq_entry_misplaced", "cq_tags_mismatch"} <= {f["kind"] for f in doc["findings"]}


def test_join_matches_pure_on_damaged_batchcq(tmp_path, monkeypatch):
    """5.x BatchCQ topics: records are matched against batchconsumequeue units (the pure checker's path)."""
    store = _copy(tmp_path, FIXTURES / "oracle" / "533-batchcq" / "store")
    units = sorted((store / "batchconsumequeue").rglob(SEG0))
    assert units
    with open(units[0], "r+b") as f:
        f.seek(8)
        size = int.from_bytes(f.read(4), "big")
        f.seek(8)
        f.write((size + 1).to_bytes(4, "big"))
    doc = assert_same(store, monkeypatch, cleared=False)
    assert "cq_size_mismatch" in {f["kind"] for f in doc["findings"]}


@pytest.mark.parametrize(("first", "most"), [(256, 16384), (1, 2), (3, 5)])
def test_cq_truncation_reads_whole_files_like_unit_by_unit(monkeypatch, first, most):
    """The recovery prediction's truncateDirtyLogicFiles over raw file bytes (``_file_keep``, read in chunks of
    ``first`` units growing to ``most``) gives the unit-by-unit verdict, at every process offset around every
    entry of every bundled queue."""
    from rmqdump.broker.recovery import queues as Q
    from rmqdump.store.root import Store

    monkeypatch.setattr(Q, "RECOVER_FIRST_UNITS", first)
    monkeypatch.setattr(Q, "RECOVER_CHUNK_UNITS", most)

    compared = 0
    for path in CQ_STORES:
        states, _ = Q.consume_queue_states(Store.open(path))
        for st in states:
            offsets = {0, 1 << 62}
            for f in st.files:
                for off, size, _ in _entries(f.path)[: st.file_size // CQ_STORE_UNIT_SIZE]:
                    offsets |= {off - 1, off, off + 1, off + size}
            for p in sorted(offsets):
                fast = Q.cq_truncation(st, p, True)
                with monkeypatch.context() as m:
                    m.setattr(Q, "_file_keep", lambda *a: None)
                    m.setattr(st, "keeps", {})  # not the verdict remembered from the call above
                    slow = Q.cq_truncation(st, p, True)
                assert (fast.new_end, fast.dropped) == (slow.new_end, slow.dropped), (path, st.name, p)
                compared += 1
    assert compared > 1000


def test_cq_truncation_reads_a_file_once_per_process_offset(monkeypatch):
    """verify predicts two brokers' recoveries over the same queue states: a file's truncation verdict at a
    process offset is read from its bytes once and remembered; another offset reads again."""
    from rmqdump.broker.recovery import queues as Q
    from rmqdump.store.root import Store

    reads = []
    real = Q._file_keep
    monkeypatch.setattr(Q, "_file_keep", lambda st, f, p: reads.append((f.start, p)) or real(st, f, p))
    states, _ = Q.consume_queue_states(Store.open(CQ_STORES[0]))
    st = next(s for s in states if s.files and s.max_offset > 2)
    first_off = _entries(st.files[-1].path)[0][0]
    for p in (1 << 62, first_off + 1):
        once = Q.cq_truncation(st, p, True)
        assert Q.cq_truncation(st, p, True) == once
        fresh = next(s for s in Q.consume_queue_states(Store.open(CQ_STORES[0]))[0] if s.name == st.name)
        assert Q.cq_truncation(fresh, p, True) == once
    assert reads.count((st.files[-1].start, 1 << 62)) == 2  # st's call and fresh's call
    assert reads.count((st.files[-1].start, first_off + 1)) == 2


def _leading_reference(raw: bytes, below: int | None = None) -> int:
    n = 0
    for off, size, _ in CQ_UNIT.iter_unpack(raw[:len(raw) - len(raw) % CQ_STORE_UNIT_SIZE]):
        if not (off >= 0 and size > 0 and (below is None or off < below)):
            break
        n += 1
    return n


@pytest.mark.parametrize(("with_numpy", "small"), [(True, 0), (False, 0), (True, 1 << 30)])
def test_leading_valid_units_matches_unit_by_unit(monkeypatch, with_numpy, small):
    """The column test behind the CQ recovery scans gives the unit-by-unit answer, with numpy and without
    it (then columns decide the broker's own layout, valid units then zero fill, and a unit loop the rest),
    and so does the loop small inputs take (``small``: the inputs up to that many units)."""
    import random
    import sys

    from rmqdump.store.consumequeue.entries import leading_valid_units

    if not with_numpy:
        monkeypatch.setitem(sys.modules, "numpy", None)

    from rmqdump.store.consumequeue import entries

    monkeypatch.setattr(entries, "_SMALL", small)

    columns = 0
    real = entries._valid_then_zero

    def counted(*a):
        nonlocal columns
        m = real(*a)
        columns += m is not None
        return m

    monkeypatch.setattr(entries, "_valid_then_zero", counted)
    rnd = random.Random(5)
    for _ in range(3000):
        n = rnd.randrange(0, 40)
        units = [(rnd.randrange(0, 1 << 40), rnd.randrange(1, 1 << 20), rnd.randrange(-(1 << 40), 1 << 40))
                 for _ in range(n)]
        r = rnd.random()
        if r < 0.3 and units:  # an invalid unit somewhere
            k = rnd.randrange(len(units))
            units[k] = rnd.choice([(-1, 5, 0), (7, 0, 0), (7, -3, 1), (0, 0, 0), (0, 0, 9)])
        raw = b"".join(CQ_UNIT.pack(*u) for u in units) + bytes(CQ_STORE_UNIT_SIZE * rnd.randrange(0, 5))
        raw += bytes(rnd.randrange(0, CQ_STORE_UNIT_SIZE))  # a partial unit is ignored
        below = rnd.choice([None, 1 << 62, 1 << 64, rnd.randrange(0, 1 << 40)])
        before = columns
        assert leading_valid_units(raw, below) == _leading_reference(raw, below), (units, below)
        if not with_numpy and r >= 0.3 and below is None:
            assert columns == before + 1, f"the broker's layout went unit by unit: {units}"
    assert with_numpy or 1000 < columns < 3000  # without numpy: both the column test and the unit loop ran
    assert not small or columns == 0


def test_cq_recovery_scan_matches_unit_by_unit(monkeypatch):
    """``ConsumeQueue`` recovery (max offset, max physic offset) with and without the column test."""
    from rmqdump.broker.recovery import queues as Q
    from rmqdump.store.consumequeue import reader
    from rmqdump.store.root import Store

    def view():
        out = []
        for path in CQ_STORES:
            states, problems = Q.consume_queue_states(Store.open(path))
            out.append(([(s.name, s.max_offset, s.max_physic_offset, s.first_offset, s.beyond) for s in states],
                        list(problems)))
        return out

    fast = view()
    monkeypatch.setattr(reader, "leading_valid_units", _leading_reference)
    monkeypatch.setattr(Q, "leading_valid_units", _leading_reference)
    assert view() == fast
