"""Compiled twin of :class:`~rmqdump.analysis.verify.queue_checks.CqChecker` (identical findings).

:class:`FastCqChecker` reads every queue's entries into flat numpy columns (no object per entry) and
takes the compiled segment walk's batches whole (:meth:`FastCqChecker.on_batch`): one kernel call
(:class:`rmqdump.fast.cqjoin.CqJoin`) marks every record whose entry points at it with the same size and
tagsCode, keeps the records without an entry as compact columns, and only the records that may give a
finding - sizes or tagsCodes differ, the delay topic, text that is not valid UTF-8, the first record of
a queue beyond topics.json's queue count, any record of a store with BatchCQ queues that has no
ConsumeQueue entry - are decoded and go through the pure :meth:`CqChecker.on_message`, in record order.
Records of pure-walked segments still arrive one by one through ``on_message``.
"""

from __future__ import annotations

from pathlib import Path

from rmqdump.analysis.verify.queue_checks import CqChecker, _Queue
from rmqdump.broker.recovery import QueueState
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE
from rmqdump.fast import abi
from rmqdump.fast.batch import BATCH_RECORDS
from rmqdump.fast.cqjoin import CqJoin, cq_dtype
from rmqdump.fast.engine import _numpy
from rmqdump.store.consumequeue.reader import _iter_file_units

_NO_LIMIT = (1 << 62)


class _ColumnQueue(_Queue):
    """A queue whose entry columns are filled later, as views of the join's flat columns."""

    def __init__(self, state: QueueState, root: Path):  # noqa: D107 - no entries read here
        self.state = state
        self.label = f"consumequeue/{state.topic}/{state.queue_id}"
        self.base = state.first_offset
        end = state.max_offset
        self.n = end - self.base if end > self.base else 0

    def fill(self, phys, sizes, tags) -> None:
        """What :class:`_Queue` reads from ``state.cq.iter_entries()``, a file chunk at a time."""
        if not self.n:
            return
        np = _numpy()
        cq = self.state.cq
        end = cq.max_offset
        files = cq.files
        first = files[0].start // CQ_STORE_UNIT_SIZE if files else 0
        if first >= end:
            return
        dt = cq_dtype()
        for f in files:
            file_end = f.start + min(f.size, cq.file_size)
            begin = max(first * CQ_STORE_UNIT_SIZE, f.start)
            if begin >= file_end:
                continue
            for pos, chunk in _iter_file_units(f.path, CQ_STORE_UNIT_SIZE, begin - f.start, cq.file_size):
                units = np.frombuffer(chunk, dt)
                qoff = (f.start + pos) // CQ_STORE_UNIT_SIZE + np.arange(units.size, dtype=np.int64)
                stop = np.flatnonzero(qoff >= end)
                if stop.size:
                    units, qoff = units[:stop[0]], qoff[:stop[0]]
                i = qoff - self.base
                keep = (i >= 0) & (i < self.n)
                i = i[keep]
                phys[i] = units["phys"][keep]
                sizes[i] = units["size"][keep]
                tags[i] = units["tags"][keep]
                if stop.size:
                    return


class FastCqChecker(CqChecker):
    """:class:`CqChecker` fed column batches by the compiled walk (:meth:`on_batch`)."""

    queue_class = _ColumnQueue

    def __init__(self, root: Path, states: list[QueueState], cl, **kwargs):
        super().__init__(root, states, cl, **kwargs)
        self.join = CqJoin([(topic, q.state.queue_id, q.base, q.n) for topic, qd in self.by_topic.items()
                            for q in qd.values()], BATCH_RECORDS)
        k = 0
        for qd in self.by_topic.values():
            for q in qd.values():
                q.phys, q.sizes, q.tags, q.matched = self.join.columns(k, q.n)
                q.fill(q.phys, q.sizes, q.tags)
                k += 1

    def _limit(self, raw: bytes) -> int:
        cfg = self.topics.get(raw.decode("utf-8", "replace")) if self.topics else None
        return _NO_LIMIT if cfg is None else max(cfg.read_queue_nums, cfg.write_queue_nums)

    def on_batch(self, batch, lo: int, hi: int) -> None:
        """:meth:`on_message` for rows ``lo..hi-1`` of a compiled walk's batch, in bulk."""
        if hi <= lo:
            return
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
        if self.bcq:
            code[code == abi.JCODE_UNMATCHED] = abi.JCODE_PYTHON
        cleared = code == abi.JCODE_CLEARED
        j.matched[j.gidx[lo:hi][cleared]] = 1
        unm = np.flatnonzero(code == abi.JCODE_UNMATCHED)
        self.records_checked += int(np.count_nonzero(cleared)) + unm.size
        offsets = batch["file_pos"][lo:hi] + batch.seg_start
        size, qoff = batch["size"][lo:hi], batch["queue_offset"][lo:hi]

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
        for q in self.queues:
            q.matched = bytearray(q.matched)
        return super().finish(*args, **kwargs)
