"""A queue's per-entry "a record points back here" marks in memory that does not grow with the entries.

:class:`~rmqdump.analysis.verify.queue_checks.CqChecker` keeps one byte per consume-queue entry; on a
healthy store nearly all are set, so :class:`EntryMarks` keeps only what is *not* set: the runs of unmarked
entries behind a frontier (the entries every window so far has covered), and the few entries past it that
a record marked early (a queue offset outside the window, checked in Python). Memory is O(runs of
unmatched entries + early marks): zero runs on a healthy store, one per queue for entries that point
below the commitlog's first file. It reads like the bytearray it replaces for ``CqChecker``: ``m[i]``,
``m[i] = 1`` and ``m.find(0, start)``.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any


class EntryMarks:
    """Marks of entries ``0..n-1``; :meth:`close_window` folds in a window's marks (a numpy uint8 array)."""

    __slots__ = ("n", "done", "starts", "ends", "early")

    def __init__(self, n: int):
        self.n = n
        self.done = 0  # entries below this are described by the runs
        self.starts: list[int] = []  # runs of unmarked entries [starts[k], ends[k]), sorted, disjoint
        self.ends: list[int] = []
        self.early: set[int] = set()  # entries at or past ``done`` already marked

    def __len__(self) -> int:
        return self.n

    def _run(self, i: int) -> int:
        """The index of the run holding ``i`` (< done), or -1."""
        k = bisect_right(self.starts, i) - 1
        return k if k >= 0 and i < self.ends[k] else -1

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i >= self.done:
            return 1 if i in self.early else 0
        return 0 if self._run(i) >= 0 else 1

    def __setitem__(self, i: int, value: int) -> None:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if not value:
            raise ValueError("marks are only ever set")
        if i >= self.done:
            self.early.add(i)
            return
        k = self._run(i)
        if k < 0:
            return
        s, e = self.starts[k], self.ends[k]
        if s == i and e == i + 1:
            del self.starts[k], self.ends[k]
        elif s == i:
            self.starts[k] = i + 1
        elif e == i + 1:
            self.ends[k] = i
        else:
            self.ends[k] = i
            self.starts.insert(k + 1, i + 1)
            self.ends.insert(k + 1, e)

    def _append_run(self, s: int, e: int) -> None:
        if self.ends and self.ends[-1] == s:
            self.ends[-1] = e
        else:
            self.starts.append(s)
            self.ends.append(e)

    def close_window(self, lo: int, marks: Any) -> None:
        """Fold in entries ``lo..lo+len(marks)-1`` (``marks[j]`` non-zero: marked), the window that starts at
        the frontier (the checker's windows follow each other); the frontier moves to their end."""
        import numpy as np

        if lo != self.done:
            raise ValueError(f"window at {lo}: the next one starts at {self.done}")
        hi = lo + len(marks)
        early = [i for i in self.early if i < hi]
        self.early.difference_update(early)
        zero = np.flatnonzero(marks == 0)
        if early and zero.size:
            zero = zero[~np.isin(zero, np.asarray(early, np.int64) - lo)]
        for run in np.split(zero, np.flatnonzero(np.diff(zero) != 1) + 1) if zero.size else ():
            self._append_run(lo + int(run[0]), lo + int(run[-1]) + 1)
        self.done = hi

    def find(self, value: int, start: int = 0) -> int:
        """The first unmarked entry at or after ``start``, -1 if none (``bytearray.find(0, start)``)."""
        if value != 0:
            raise ValueError("only unmarked entries are looked for")
        start = max(start, 0)
        if start < self.done:
            k = bisect_right(self.starts, start) - 1
            if k >= 0 and start < self.ends[k]:
                return start
            if k + 1 < len(self.starts):
                return self.starts[k + 1]
            start = self.done
        while start < self.n and start in self.early:
            start += 1
        return start if start < self.n else -1

    def nbytes(self) -> int:
        """Roughly what the marks hold (for tests of the memory bound)."""
        return 16 * len(self.starts) + 64 * len(self.early)
