"""``EntryMarks`` (the fast CQ checker's per-entry marks, kept as runs of unmarked entries) reads like the
bytearray the pure checker keeps, under every mix of window folds (one after the other, as the checker's
windows come) and early marks; and what it holds does not grow with the entries of a healthy queue."""

from __future__ import annotations

import random

import pytest

np = pytest.importorskip("numpy")

from rmqdump.analysis.verify.marks import EntryMarks  # noqa: E402


def _all_zeros(m) -> list[int]:
    out, i = [], m.find(0)
    while i >= 0:
        out.append(i)
        i = m.find(0, i + 1)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_marks_read_like_a_bytearray(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 300)
    ref, got = bytearray(n), EntryMarks(n)
    lo = 0
    while lo < n or rng.random() < 0.2:
        for _ in range(rng.randint(0, 6)):  # records checked in Python mark entries anywhere
            if n:
                i = rng.randrange(n)
                ref[i] = 1
                got[i] = 1
        if lo >= n or rng.random() < 0.05:  # the last entries may never be in a window (past the walk)
            break
        hi = min(n, lo + rng.randint(0, 40))  # windows follow each other, some empty
        dense = rng.random()
        marks = np.array([1 if rng.random() < dense else 0 for _ in range(hi - lo)], np.uint8)
        for j, v in enumerate(marks.tolist()):
            ref[lo + j] |= v
        got.close_window(lo, marks)
        assert all(i >= got.done for i in got.early)  # early marks behind the frontier are let go
        lo = hi
        for i in rng.sample(range(n), min(n, 8)):
            assert got[i] == ref[i], (i, seed)
        s = rng.randint(0, n + 2)
        assert got.find(0, s) == ref.find(0, s), (s, seed)
    assert [got[i] for i in range(n)] == list(ref)
    assert _all_zeros(got) == [i for i in range(n) if not ref[i]]


def test_a_healthy_queue_holds_nothing_per_entry():
    n = 3_000_000
    m = EntryMarks(n)
    for lo in range(0, n, 65536):
        m.close_window(lo, np.ones(min(65536, n - lo), np.uint8))
    assert m.find(0) == -1 and m.nbytes() == 0
    m2 = EntryMarks(n)  # entries below the commitlog's first file: one run, whatever their number
    for lo in range(0, n, 65536):
        m2.close_window(lo, (np.arange(lo, min(n, lo + 65536)) >= n // 2).astype(np.uint8))
    assert (m2.starts, m2.ends) == ([0], [n // 2])


def test_a_window_must_start_at_the_frontier():
    m = EntryMarks(10)
    m.close_window(0, np.ones(4, np.uint8))
    for lo in (3, 5):  # an overlap, a gap: the checker's windows never make them
        with pytest.raises(ValueError, match="the next one starts at 4"):
            m.close_window(lo, np.ones(2, np.uint8))
