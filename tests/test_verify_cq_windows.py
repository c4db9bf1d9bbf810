"""The compiled ConsumeQueue join read a window at a time (analysis.verify.queue_fast.WINDOW_BYTES): tiny
windows (a few records each, so batches are cut at window boundaries) give the pure CqChecker's document on
healthy and damaged stores, and on a healthy store every entry is loaded into exactly one window and every
record finds its entry there (none dropped or loaded twice at a boundary)."""

from __future__ import annotations

import json

import pytest
from test_verify_cq_fast import _copy, _damage

from conftest import FIXTURES
from rmqdump.analysis.verify import queue_fast, verify_store
from rmqdump.fast import walk as fastwalk

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")


def _tiny(monkeypatch, window: int = 700) -> list:
    """Windows of ``window`` bytes, reads of 3 entries, a 2-block cache of 2 entries; returns the checkers."""
    monkeypatch.setattr(queue_fast, "WINDOW_BYTES", window)
    monkeypatch.setattr(queue_fast, "READ_UNITS", 3)
    monkeypatch.setattr(queue_fast, "BLOCK_UNITS", 2)
    monkeypatch.setattr(queue_fast, "CACHE_BLOCKS", 2)
    seen: list = []
    real = queue_fast.FastCqChecker.finish

    def finish(self, *a, **kw):
        seen.append(self)
        return real(self, *a, **kw)

    monkeypatch.setattr(queue_fast.FastCqChecker, "finish", finish)
    return seen


def _doc(path, fast: bool, monkeypatch, **kw) -> str:
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    return json.dumps(verify_store(path, **kw).to_dict(), sort_keys=True)


def test_healthy_store_every_entry_in_exactly_one_window(monkeypatch):
    store = FIXTURES / "store"
    pure = _doc(store, False, monkeypatch)
    seen = _tiny(monkeypatch)
    assert _doc(store, True, monkeypatch) == pure
    (chk,) = seen
    total = sum(q.n for q in chk.jq)
    assert total > 20 and chk.window is None
    records = json.loads(pure)["summary"]["records"]
    assert chk.loaded == total, "an entry was dropped from, or loaded into two, windows"
    assert chk.outside == 0, "a record's entry was not in its window"
    assert records * 200 > 5 * 700  # many windows
    # nothing is kept per entry: every queue's marks are closed to its end, and hold no unmatched run
    assert all(q.matched.done == q.n and q.matched.nbytes() == 0 for q in chk.jq)


@pytest.mark.parametrize("how", ["size", "tags", "hole", "missing_tail", "extra_duplicate", "extra_beyond_end",
                                 "swap", "foreign", "dangling", "queue_range", "queue_lost", "topic_deleted"])
@pytest.mark.parametrize("window", [700, 4096])
def test_windows_give_the_pure_findings_on_damaged_queues(tmp_path, monkeypatch, how, window):
    store = _copy(tmp_path, FIXTURES / "store")
    kw = _damage(store, how)
    for keep_going in (False, True):
        pure = _doc(store, False, monkeypatch, keep_going=keep_going, **kw)
        with monkeypatch.context() as m:
            _tiny(m, window)
            assert _doc(store, True, m, keep_going=keep_going, **kw) == pure, (how, keep_going)


def test_out_of_order_entry_found_outside_its_window(tmp_path, monkeypatch):
    """An entry pointing far ahead stops a queue's window early: the records after it are looked up
    outside the window, with the pure findings."""
    from test_verify_cq_fast import _cq, _put, _valid

    store = _copy(tmp_path, FIXTURES / "store")
    q0 = _cq(store, "TopicTest/0")
    e0 = _valid(q0)
    _put(q0, 1, e0[-1])  # entry 1 points at the last record of the queue
    pure = _doc(store, False, monkeypatch)
    seen = _tiny(monkeypatch)
    assert _doc(store, True, monkeypatch) == pure
    assert seen[0].outside > 0
    assert "cq_entry_duplicate" in pure or "cq_entry_misplaced" in pure
