"""The compiled re-dispatch (rmqdump.fast.redispatch) against the pure reference (rmqdump.broker.redispatch).

Every bundled store (RocketMQ-written oracle stores with LMQ multi-dispatch, transactions, BatchCQ topics,
IPv6 hosts, V2 records, several files) is re-dispatched by both with the consume queues as read, with no
queues at all (every queue re-created), with queue ends cut back (entries re-appended), shifted forward
(records skipped as already built) and shifted back (entries misplaced), from several ``after`` offsets and
with one-record and multi-record column batches, walked a batch ahead on a second thread or not: the
results must be equal. ``verify`` documents must be
equal under ``RMQDUMP_FAST=0`` and ``=1`` on stores whose recovery re-dispatches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from conftest import FIXTURES
from rmqdump.analysis.verify import verify_store
from rmqdump.broker.recovery import consume_queue_states
from rmqdump.broker.redispatch import redispatch
from rmqdump.fast import readahead
from rmqdump.fast import walk as fastwalk
from rmqdump.store.root import Store

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

STORES = [FIXTURES / "store", FIXTURES / "store-5x",
          *sorted(p for p in FIXTURES.glob("oracle/*/store") if not p.parent.name.endswith("dledger"))]
LMQ_STORES = [FIXTURES / "oracle" / n / "store" for n in ("498-healthy-lmq", "498-crash-cq-lag")]


@dataclass
class _State:
    """The fields of recovery.QueueState the model reads."""

    topic: str
    queue_id: int
    max_offset: int
    max_physic_offset: int
    files: list = field(default_factory=lambda: [1])

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.queue_id}"


def _variants(states) -> dict[str, list]:
    real = [_State(s.topic, s.queue_id, s.max_offset, s.max_physic_offset, list(s.files)) for s in states]
    return {
        "as_read": real,
        "none": [],
        "cut_back": [_State(s.topic, s.queue_id, s.max_offset // 2, -1) for s in real],
        "ahead": [_State(s.topic, s.queue_id, s.max_offset + 3, -1) for s in real],
        "behind": [_State(s.topic, s.queue_id, max(s.max_offset - 2, 1), -1) for s in real],
        "no_files": [_State(s.topic, s.queue_id, 0, -1, []) for s in real],
    }


def _docs(result) -> list[dict]:
    return [vars(q) for q in result]


def _compare(store, monkeypatch) -> int:
    """Pure and compiled re-dispatch equal in every variant; returns the entries the pure one predicted."""
    from rmqdump.fast.redispatch import redispatch_fast

    monkeypatch.setenv("RMQDUMP_FAST", "1")
    st = Store.open(store)
    cl = st.commitlog
    states = consume_queue_states(st)[0] if st.root is not None else []
    end = cl.segments[-1].end
    total = 0
    for name, sts in _variants(states).items():
        for after in (-1, cl.min_offset + 1, (cl.min_offset + end) // 2):
            for bcq in (frozenset(), frozenset({"TopicA", "BatchTopic"})):
                kw = {"start_index": 0, "end_offset": end, "after": after, "batch_topics": bcq}
                pure = _docs(redispatch(cl, sts, **kw))
                total += sum(q["count"] for q in pure)
                for batch, ahead in ((1, False), (3, False), (3, True), (65536, True)):
                    monkeypatch.setattr(readahead, "wanted", lambda segments, use_mmap, a=ahead: a)
                    ran.clear()
                    fast = _docs(redispatch_fast(cl, sts, batch_records=batch, **kw))
                    assert fast == pure, (store, name, after, sorted(bcq), batch, ahead)
                    assert bool(ran) == ahead
    return total


@pytest.fixture(autouse=True)
def _spy_read_ahead(monkeypatch):
    """Which re-dispatches walked a batch ahead on a second thread (``ran``)."""
    real = readahead.ReadAhead.__iter__

    def spy(self):
        ran.append(1)
        yield from real(self)

    monkeypatch.setattr(readahead.ReadAhead, "__iter__", spy)


ran: list = []


@pytest.mark.parametrize("store", STORES, ids=lambda p: p.parent.name if p.name == "store" and
                         p.parent.name != "fixtures" else p.name)
def test_compiled_redispatch_equals_pure(store, monkeypatch):
    assert _compare(store, monkeypatch) > 0


def test_lmq_targets_are_redispatched_by_both(monkeypatch):
    """The multi-dispatch rows really are exercised: LMQ queues come back in both results."""
    from rmqdump.fast.redispatch import redispatch_fast

    monkeypatch.setenv("RMQDUMP_FAST", "1")
    for store in LMQ_STORES:
        cl = Store.open(store).commitlog
        kw = {"start_index": 0, "end_offset": cl.segments[-1].end}
        fast = {q.queue: q.count for q in redispatch_fast(cl, [], **kw)}
        assert fast == {q.queue: q.count for q in redispatch(cl, [], **kw)}
        assert any(name.startswith("%LMQ%") and n for name, n in fast.items()), store


@pytest.mark.parametrize("patch", [{"_MAX_WORDS": 0}, {"_PRIME": 0}], ids=["long_topics", "hash_collisions"])
def test_topic_grouping_fallbacks(patch, monkeypatch):
    """Topics too long to hash as words, and hash collisions, take the exact dict grouping: same results."""
    from rmqdump.fast import topics

    for k, v in patch.items():
        monkeypatch.setattr(topics, k, v)
    for store in [*LMQ_STORES, FIXTURES / "oracle" / "498-multi-topic" / "store"]:
        assert _compare(store, monkeypatch) > 0


def _verify_doc(store, fast: bool, monkeypatch, **kw) -> str:
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    return json.dumps(verify_store(store, **kw).to_dict(), sort_keys=True)


@pytest.mark.parametrize("name", ["498-crash-cq-lag", "533-normal-cq-lag", "498-healthy-lmq", "498-healthy-tx-v6"])
@pytest.mark.parametrize("store_checks", [True, False])
def test_verify_documents_equal(name, store_checks, monkeypatch):
    store = FIXTURES / "oracle" / name / "store"
    pure = _verify_doc(store, False, monkeypatch, store_checks=store_checks)
    assert _verify_doc(store, True, monkeypatch, store_checks=store_checks) == pure


LONG = ("L" * 249 + "a", "L" * 249 + "b")


def _grouping_store(root):
    """A store whose column batches mix topics the one-topic check must tell apart: sharing their first 8 bytes,
    of equal length differing only in the last byte, 250 bytes long (V2 records), at every offset
    within an 8-byte word (bodies of varying length), over interleaved, large and negative queue ids, with
    transaction records not dispatched in between."""
    import random

    from rmqdump.codec.layout import (
        MESSAGE_QUEUE_ID_POSITION,
        TRANSACTION_COMMIT_TYPE,
        TRANSACTION_PREPARED_TYPE,
        TRANSACTION_ROLLBACK_TYPE,
    )
    from rmqdump.write.message import MessageSpec
    from rmqdump.write.writer import StoreWriter

    rnd = random.Random(15)
    long_a, long_b = LONG
    runs = [["BenchTopicX"] * 24, ["BenchTopicX", "BenchTopicY"] * 12, ["BenchTopicY"] * 5 + ["BenchTopicX"],
            ["TopicAAA1", "TopicAAA1", "TopicAAA2"] * 6, [long_a] * 9 + [long_b], [long_a, long_b] * 4,
            ["T"] * 7 + ["U"], ["BenchTopicX"] * 12 + ["BenchTopicX2"]]
    tx = [TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE]
    odd = []
    with StoreWriter(root, commitlog_file_size=4096, cq_file_size=600) as w:
        for run in runs:
            for n, topic in enumerate(run):
                qid = rnd.choice([0, 1, 2, 3, 7, 40000]) if n % 5 else n % 4
                t = tx[n % 3] if n % 7 == 6 else 0
                a = w.append(MessageSpec(topic, bytes(rnd.randrange(0, 40)), queue_id=qid, transaction=t))
                if n % 11 == 10:
                    odd.append(a.offset)  # its QUEUEID patched below: a queue id no writer would use
    size = 4096
    for off in odd:
        with open(root / "commitlog" / f"{off - off % size:020d}", "r+b") as f:
            f.seek(off % size + MESSAGE_QUEUE_ID_POSITION)
            f.write((-3 - off % 5).to_bytes(4, "big", signed=True))
    return root


@pytest.mark.parametrize("max_words", [32, 1], ids=["words", "longer_than_words"])
def test_batches_of_mixed_topics_and_queues(max_words, tmp_path, monkeypatch):
    """Batches whose rows look like one topic but are not, or spread over many queues: the compiled re-dispatch
    (its one-topic path and the general grouping) equals the pure one for every batch size; ``max_words`` 1:
    every topic but the 1-byte ones is longer than the words compared in place."""
    from rmqdump.fast import redispatch as fr
    from rmqdump.fast import topics

    monkeypatch.setattr(topics, "_MAX_WORDS", max_words)
    store = _grouping_store(tmp_path / "s")
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    cl = Store.open(store).commitlog
    assert len(cl.segments) > 3
    kw = {"start_index": 0, "end_offset": cl.segments[-1].end}
    for sts in ([], [_State("BenchTopicX", 1, 2, -1), _State("TopicAAA2", 40000, 0, -1, [])]):
        for bcq in (frozenset(), frozenset({"BenchTopicY"})):
            pure = _docs(redispatch(cl, sts, batch_topics=bcq, **kw))
            names = [q["queue"].rsplit("/", 1) for q in pure]
            assert {"BenchTopicX", "BenchTopicX2", "TopicAAA1", "TopicAAA2", *LONG, "T", "U"} <= {t for t, _ in names}
            assert ("BenchTopicY" in {t for t, _ in names}) == (not bcq)
            assert {"40000", "-4", "-5"} <= {qid for _, qid in names}
            for batch in (1, 2, 3, 5, 8, 13, 64, 65536):
                fast = _docs(fr.redispatch_fast(cl, sts, batch_records=batch, batch_topics=bcq, **kw))
                assert fast == pure, (len(sts), sorted(bcq), batch)


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 65536])
def test_one_topic_check_is_exact(batch, tmp_path):
    """``_single_topic`` names the topic exactly when every row has the same topic bytes (never a near miss,
    never a fallback for the topics it compares in place), at any offset within a word and on any subset."""
    import numpy as np

    from rmqdump.fast.segment_walk import FastSegmentWalk
    from rmqdump.fast.topics import _single_topic

    cl = Store.open(_grouping_store(tmp_path / "s")).commitlog
    seen = {"one": 0, "mixed": 0}
    for seg in cl.segments:
        with FastSegmentWalk(segment=seg, check_crc=False, end_offset=seg.end, batch_records=batch) as w:
            for b in w:
                for rows in (np.arange(b.n), np.arange(b.n)[::2], np.arange(b.n)[1:]):
                    if not rows.size:
                        continue
                    topics = {b.topic_raw(int(i)) for i in rows}
                    one = topics.pop() if len(topics) == 1 else None
                    assert _single_topic(b, rows) == one, (seg.name, batch, rows.tolist())
                    seen["mixed" if one is None else "one"] += 1
    assert seen["one"] and (seen["mixed"] or batch == 1)
