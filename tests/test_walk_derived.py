"""The walk's derived columns (``abi.DERIVED_COLUMNS``, filled when a :class:`~rmqdump.fast.intern.TopicIntern`
is given): per record, against the bytes they stand for, on every bundled store; and verify's findings with a
topic table too small to hold the store's topics (records past it take the byte path) against the pure path."""

from __future__ import annotations

import json

import pytest
from test_fast_props import _props_reference

from conftest import FIXTURES, REAL
from rmqdump.codec.javahash import java_string_hash
from rmqdump.codec.properties import parse_properties
from rmqdump.fast import walk as fastwalk

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

STORES = [FIXTURES / "store", FIXTURES / "store-5x", *sorted(FIXTURES.glob("bugs/*/store")),
          *sorted(FIXTURES.glob("oracle/*/store"))]
STORES += sorted(p for p in REAL.glob("*") if p.is_dir()) if REAL.is_dir() else []


def _tags_hash(raw: bytes) -> int:
    from rmqdump.fast.abi import NOT_ASCII

    if not raw.isascii():
        return NOT_ASCII
    tags = parse_properties(raw.decode("ascii")).get("TAGS")
    return java_string_hash(tags) if tags else 0


def _walk_rows(path, intern):
    from rmqdump.store.commitlog import CommitLog

    for seg in CommitLog.open(path / "commitlog").segments if (path / "commitlog").is_dir() else ():
        w = fastwalk.FastSegmentWalk(segment=seg, intern=intern)
        try:
            for b in w:
                assert b.intern is intern
                for i in range(b.n):
                    yield b, i
        finally:
            w.close()


@pytest.mark.parametrize("path", STORES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_derived_columns_match_the_bytes(path):
    from rmqdump.fast.abi import NOT_ASCII
    from rmqdump.fast.intern import TopicIntern

    intern = TopicIntern()
    ids: dict[bytes, int] = {}
    rows = 0
    for b, i in _walk_rows(path, intern):
        rows += 1
        topic, props = b.topic_raw(i), b.properties_raw(i)
        wt, pv, tg = int(b["walk_topic"][i]), int(b["props_check"][i]), int(b["tags_hash"][i])
        if (wt, pv, tg) == (-1, -1, NOT_ASCII):
            continue  # a record the Python decoder took (a delay message): its consumers read its bytes
        assert wt >= 0, (path, i, topic)
        assert ids.setdefault(topic, wt) == wt, (topic, wt)  # one id per topic, one topic per id
        assert intern.topics[wt] == topic
        assert pv == _props_reference(props), props
        assert tg == _tags_hash(props), props
    assert len(set(ids.values())) == len(ids)
    if (path / "commitlog").is_dir():
        assert rows


def test_a_full_table_gives_no_id_and_keeps_the_others():
    from rmqdump.fast.intern import TopicIntern

    path = FIXTURES / "store"
    intern = TopicIntern(capacity=2)
    seen: dict[bytes, set[int]] = {}
    for b, i in _walk_rows(path, intern):
        seen.setdefault(b.topic_raw(i), set()).add(int(b["walk_topic"][i]))
    interned = intern.topics
    assert len(interned) == 2 and len(seen) > 2
    for topic, got in seen.items():
        assert got <= ({interned.index(topic), -1} if topic in interned else {-1}), (topic, got)


def _doc(path, fast: bool, monkeypatch) -> str:
    from rmqdump.analysis.verify import verify_store

    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    try:
        return json.dumps(verify_store(path, keep_going=True).to_dict(), sort_keys=True)
    finally:
        monkeypatch.delenv("RMQDUMP_FAST")


@pytest.mark.parametrize("capacity", [1, 3])
@pytest.mark.parametrize("path", [FIXTURES / "store", FIXTURES / "store-5x"], ids=lambda p: p.name)
def test_verify_with_a_small_topic_table_matches_pure(path, capacity, monkeypatch):
    """Topics past the table's capacity (and past its arena) take the byte path: same findings."""
    from rmqdump.fast import intern

    monkeypatch.setattr(intern, "CAPACITY", capacity)
    monkeypatch.setattr(intern, "ARENA", 24)
    assert _doc(path, True, monkeypatch) == _doc(path, False, monkeypatch)
