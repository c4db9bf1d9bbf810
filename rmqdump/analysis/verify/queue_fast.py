"""Compiled twin of :class:`~rmqdump.analysis.verify.queue_checks.CqChecker` (identical findings), in bounded
memory.

:class:`FastCqChecker` takes the compiled segment walk's batches whole (:meth:`FastCqChecker.on_batch`). The
commitlog is cut into windows of :data:`WINDOW_BYTES`; for each window every queue's next run of entries
(from where its previous window ended, up to its last entry, in a read chunk, that points below the window's
end) is loaded as flat numpy columns, and one kernel call (:class:`rmqdump.fast.cqjoin.CqJoin`) marks every
record whose entry points at it with the same size and tagsCode and keeps the records without an entry as
compact columns. Only the records that may give a finding - sizes or tagsCodes differ, the delay topic, text
that is not valid UTF-8, the first record of a queue beyond topics.json's queue count, any record of a store
with BatchCQ queues that has no ConsumeQueue entry, a record whose queue offset lies outside its queue's
window (out-of-order entries) - are decoded and go through the pure :meth:`CqChecker.on_message`, in record
order; there, and in :meth:`CqChecker.finish`, a queue's ``phys``/``sizes``/``tags`` outside the window are
read from its files through a small block cache. Nothing stays per entry: ``matched`` keeps the runs of
unmatched entries (:class:`~rmqdump.analysis.verify.marks.EntryMarks`).
Records of pure-walked segments still arrive one by one through ``on_message``.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from rmqdump.analysis.verify.marks import EntryMarks
from rmqdump.analysis.verify.queue_checks import CqChecker, _Queue
from rmqdump.broker.recovery import QueueState
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE
from rmqdump.fast import abi
from rmqdump.fast.batch import BATCH_RECORDS
from rmqdump.fast.cqjoin import CqJoin, cq_dtype
from rmqdump.fast.engine import _numpy
from rmqdump.store.consumequeue.reader import _iter_file_units

_NO_LIMIT = (1 << 62)
#: commitlog bytes per window of consume-queue entries (64 MiB: ~0.7 M entries of 100-byte records, ~14 MB)
WINDOW_BYTES = 64 << 20
#: at most this many entries are read at a time while a window is extended (about 1.25 x what the queue's
#: last window took; what lies past the window is kept for the next one), and per block of the out-of-window
#: cache
READ_UNITS = 1 << 16
BLOCK_UNITS = 1024
CACHE_BLOCKS = 64


class _Column:
    """One entry column of a queue (0 phys, 1 size, 2 tagsCode) as ``CqChecker`` indexes it."""

    __slots__ = ("q", "f")

    def __init__(self, q: _ColumnQueue, f: int):
        self.q, self.f = q, f

    def __getitem__(self, i: int) -> int:
        return self.q.entry(int(i))[self.f]

    def __len__(self) -> int:
        return self.q.n


class _ColumnQueue(_Queue):
    """A queue whose entries are read a window at a time (:meth:`read`); ``matched`` keeps what is unmarked."""

    def __init__(self, state: QueueState, root: Path):  # noqa: D107 - no entries read here
        self.state = state
        self.label = f"consumequeue/{state.topic}/{state.queue_id}"
        self.base = state.first_offset
        end = state.max_offset
        self.n = end - self.base if end > self.base else 0
        self.matched = EntryMarks(self.n)
        self.phys, self.sizes, self.tags = _Column(self, 0), _Column(self, 1), _Column(self, 2)
        self.lo = self.hi = 0  # the window: entries lo..hi-1, at `at` of the join's columns
        self.k = self.at = 0
        self.ahead = None  # entries read past the last window (phys, sizes, tags), from `hi` on
        self.took = 0  # entries the last window took: the next read's size
        self.join: CqJoin | None = None
        self.cache: OrderedDict = OrderedDict()

    def read(self, lo: int, hi: int):
        """(phys, sizes, tags) of entries ``lo..hi-1`` as ``_Queue`` reads them from ``state.cq.iter_entries()``
        (an entry no file holds: offset -1, size 0, tagsCode 0)."""
        np = _numpy()
        phys = np.full(hi - lo, -1, np.int64)
        sizes = np.zeros(hi - lo, np.int32)
        tags = np.zeros(hi - lo, np.int64)
        cq = self.state.cq
        end = min(cq.max_offset, self.base + hi)
        files = cq.files
        first = max(files[0].start // CQ_STORE_UNIT_SIZE if files else 0, self.base + lo)
        if first >= end:
            return phys, sizes, tags
        dt = cq_dtype()
        for f in files:
            file_end = f.start + min(f.size, cq.file_size)
            begin = max(first * CQ_STORE_UNIT_SIZE, f.start)
            if begin >= file_end:
                continue
            stop = min(cq.file_size, end * CQ_STORE_UNIT_SIZE - f.start)
            for pos, chunk in _iter_file_units(f.path, CQ_STORE_UNIT_SIZE, begin - f.start, stop):
                units = np.frombuffer(chunk, dt)
                i = (f.start + pos) // CQ_STORE_UNIT_SIZE - self.base - lo  # where the chunk's first unit goes
                a, z = max(0, -i), min(units.size, hi - lo - i)
                if z > a:
                    phys[i + a:i + z] = units["phys"][a:z]
                    sizes[i + a:i + z] = units["size"][a:z]
                    tags[i + a:i + z] = units["tags"][a:z]
            if stop < cq.file_size:
                break  # this file holds the queue's end (or this read's)
        return phys, sizes, tags

    def entry(self, i: int) -> tuple[int, int, int]:
        """Entry ``i`` (0-based from :attr:`base`): from the window, else through the block cache."""
        if self.lo <= i < self.hi:
            j, g = self.join, self.at + i - self.lo
            return int(j.phys[g]), int(j.sizes[g]), int(j.tags[g])
        if not 0 <= i < self.n:
            raise IndexError(i)
        key = (self.k, i // BLOCK_UNITS)
        cols = self.cache.get(key)
        if cols is None:
            lo = key[1] * BLOCK_UNITS
            cols = self.read(lo, min(self.n, lo + BLOCK_UNITS))
            self.cache[key] = cols
            if len(self.cache) > CACHE_BLOCKS:
                self.cache.popitem(last=False)
        r = i % BLOCK_UNITS
        return int(cols[0][r]), int(cols[1][r]), int(cols[2][r])


class FastCqChecker(CqChecker):
    """:class:`CqChecker` fed column batches by the compiled walk (:meth:`on_batch`), a window at a time."""

    queue_class = _ColumnQueue

    def __init__(self, root: Path, states: list[QueueState], cl, **kwargs):
        super().__init__(root, states, cl, **kwargs)
        self.jq: list[_ColumnQueue] = [q for qd in self.by_topic.values() for q in qd.values()]
        self.join = CqJoin([(topic, q.state.queue_id, q.base, q.n) for topic, qd in self.by_topic.items()
                            for q in qd.values()], BATCH_RECORDS)
        cache: OrderedDict = OrderedDict()
        for k, q in enumerate(self.jq):
            q.k, q.join, q.cache = k, self.join, cache
        self.window: int | None = None
        self.loaded = 0  # entries loaded into windows (each entry at most once)
        self.outside = 0  # records whose queue offset lay outside their queue's window

    def _set_window(self, w: int) -> None:
        """Load every queue's entries up to the end of window ``w``, continuing where the last window ended."""
        if w == self.window:
            return
        self._flush()
        np = _numpy()
        b = (w + 1) * WINDOW_BYTES
        parts = []
        for q in self.jq:
            lo = hi = q.hi
            cols = []
            used = 0
            while hi < q.n:
                ahead, q.ahead = q.ahead, None
                if ahead is None:  # read about what the last window took (each entry is read once)
                    units = min(READ_UNITS, max(BLOCK_UNITS, q.took + q.took // 4))
                    ahead = q.read(hi, min(q.n, hi + units))
                phys, sizes, tags = ahead
                below = np.flatnonzero(phys < b)
                if not below.size:
                    q.ahead = ahead
                    break
                last = int(below[-1]) + 1
                cols.append((phys[:last], sizes[:last], tags[:last]))
                hi += last
                used += last
                if last < phys.size:
                    q.ahead = (phys[last:], sizes[last:], tags[last:])  # the next window's first entries
                    break
            q.took = used
            q.lo, q.hi = lo, hi
            if hi > lo:
                parts.append((q.k, lo, hi, *(np.concatenate(c) for c in zip(*cols, strict=True))))
        self.join.set_window(parts)
        for k, *_ in parts:
            self.jq[k].at = int(self.join.q_at[k])
        self.loaded += sum(hi - lo for _, lo, hi, *_ in parts)
        self.window = w

    def _flush(self) -> None:
        """The window's matched marks into the queues' ``matched``."""
        if self.window is None:
            return
        wm = self.join.wmatched
        for q in self.jq:
            if q.hi > q.lo:
                q.matched.close_window(q.lo, wm[q.at:q.at + q.hi - q.lo])

    def _limit(self, raw: bytes) -> int:
        cfg = self.topics.get(raw.decode("utf-8", "replace")) if self.topics else None
        return _NO_LIMIT if cfg is None else max(cfg.read_queue_nums, cfg.write_queue_nums)

    def on_batch(self, batch, lo: int, hi: int) -> None:
        """:meth:`on_message` for rows ``lo..hi-1`` of a compiled walk's batch, in bulk, window by window."""
        if hi <= lo:
            return
        np = _numpy()
        w = (batch["file_pos"][lo:hi] + batch.seg_start) // WINDOW_BYTES
        cuts = [*(np.flatnonzero(w[1:] != w[:-1]) + 1 + lo).tolist(), hi]
        start = lo
        for cut in cuts:
            self._set_window(int(w[start - lo]))
            self._rows(batch, start, cut)
            start = cut

    def _rows(self, batch, lo: int, hi: int) -> None:
        np = _numpy()
        j = self.join
        j.classify(batch, lo, hi, self._limit)
        code = j.code[lo:hi]
        tid = j.tid[lo:hi]
        qid = batch["queue_id"][lo:hi]
        if self.topics and j.topics:
            live = np.flatnonzero(code != abi.JCODE_SKIP)
            over = live[qid[live] >= np.asarray(j.limits, np.int64)[tid[live]]]
            if over.size:
                keys = (tid[over].astype(np.int64) << 32) | (qid[over].astype(np.int64) & 0xFFFFFFFF)
                _, first = np.unique(keys, return_index=True)
                for r in over[np.sort(first)].tolist():
                    if (j.topics[int(tid[r])], int(qid[r])) not in self.queue_range_warned:
                        code[r] = abi.JCODE_PYTHON
        size, qoff = batch["size"][lo:hi], batch["queue_offset"][lo:hi]
        gidx = j.gidx[lo:hi]
        out = np.flatnonzero((code == abi.JCODE_UNMATCHED) & (gidx < 0))
        if out.size:  # queue offsets outside the window: an entry may still point at the record
            slot = -1 - gidx[out]
            k = qoff[out] - j.g_base[slot]
            out = out[(k >= 0) & (k < j.g_n[slot])]
            code[out] = abi.JCODE_PYTHON
            self.outside += out.size
        if self.bcq:
            code[code == abi.JCODE_UNMATCHED] = abi.JCODE_PYTHON
        cleared = code == abi.JCODE_CLEARED
        j.wmatched[gidx[cleared]] = 1
        unm = np.flatnonzero(code == abi.JCODE_UNMATCHED)
        self.records_checked += int(np.count_nonzero(cleared)) + unm.size
        offsets = batch["file_pos"][lo:hi] + batch.seg_start

        def rows(sel) -> None:
            self.unmatched.add_rows(offsets[sel], size[sel], tid[sel], j.topics, qid[sel], qoff[sel], batch.file)

        done = 0
        for r in np.flatnonzero(code == abi.JCODE_PYTHON).tolist():
            cut = int(np.searchsorted(unm, r))
            if cut > done:
                rows(unm[done:cut])
                done = cut
            self.on_message(batch.message(lo + r, read_body=False))
        if done < unm.size:
            rows(unm[done:])

    def finish(self, *args, **kwargs):
        self._flush()
        self.window = None
        return super().finish(*args, **kwargs)
