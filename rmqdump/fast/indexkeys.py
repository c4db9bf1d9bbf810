"""Compiled twin of the walk behind ``repair --rebuild-index`` (``write.repair.index.build_index_files``): the
keyHashes ``IndexService.buildIndex`` puts for each record, with its offset and store time, from column batches.

The pure reference decodes a :class:`~rmqdump.codec.record.Message` per record, builds its key strings and hashes
each. Here each segment is walked by the compiled kernel (CRC off) and a batch's keys are hashed by
``record_keys`` (:mod:`rmqdump.fast._indexkernels`) in the record bytes; a record it cannot settle (text that is
not valid UTF-8, too many properties, keys beyond the batch's room) is decoded and keyed by the pure rule
(:func:`~rmqdump.store.indexfile.writer.record_index_keys`), its keys put in their place. A file the kernel cannot
walk to its end hands the rest of the walk back to the pure loop (:class:`~rmqdump.fast.filewalk.HandOver`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqdump.codec.javahash import index_key_hash
from rmqdump.fast import filewalk
from rmqdump.fast.batch import RecordBatch
from rmqdump.fast.engine import _numpy
from rmqdump.fast.filewalk import HandOver
from rmqdump.fast.indexabi import (
    K_BLOCK,
    K_BUF,
    K_BUF_SIZE,
    K_CAP,
    K_HASHES,
    K_I0,
    K_N,
    K_OUT,
    K_PROPS_LEN,
    K_PROPS_START,
    K_PYTHON,
    K_ROWS,
    K_SCRATCH,
    K_SCRATCH_CAP,
    K_SYS_FLAG,
    K_TOPIC_LEN,
    K_TOPIC_START,
    SCRATCH_PAIRS,
)
from rmqdump.store.indexfile.writer import record_index_keys

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.store.commitlog import CommitLog

ROOM = 1 << 18  # keys one kernel call may write


@dataclass
class BatchKeys:
    """One batch's index entries to put, in order: keyHash, commitlog offset and store time of its record."""

    hashes: np.ndarray
    offsets: np.ndarray
    store_timestamps: np.ndarray


def applies(cl: CommitLog, start: int, end: int, use_mmap: bool) -> bool:
    """Whether the rebuild's walk of [start, end) takes the compiled path."""
    return filewalk.applies(cl, start, end, use_mmap)


def index_keys(cl: CommitLog, *, start: int, end: int,
               batch_records: int | None = None) -> Iterator[BatchKeys | HandOver]:
    """The index entries of the records in [``start``, ``end``), batch by batch; a :class:`HandOver` last when the
    kernel could not walk it all. ``batch_records``: records per batch (tests use small batches)."""
    keys = KeyHasher()
    for item in filewalk.walk_files(cl, start=start, end=end, batch_records=batch_records):
        if isinstance(item, HandOver):
            yield item
        elif isinstance(item, RecordBatch):
            got = keys.batch(item)
            if got is not None:
                yield got


class KeyHasher:
    """Index keyHashes of walk batches (kernel ``record_keys``; its buffers reused from batch to batch)."""

    def __init__(self):
        np = self.np = _numpy()
        from rmqdump.fast.indexjoin import backend

        self.call = backend().keys
        self.scratch = np.zeros((SCRATCH_PAIRS, 4), np.int64)
        self.hashes = np.zeros(ROOM, np.int64)
        self.rows = np.zeros(ROOM, np.int32)
        self.python = np.zeros(0, np.uint8)
        self.out = np.zeros(2, np.int64)
        self.block = np.zeros(K_BLOCK, np.int64)

    def batch(self, b: RecordBatch) -> BatchKeys | None:
        np = self.np
        n = b.n
        if not n:
            return None
        if self.python.size < n:
            self.python = np.zeros(n, np.uint8)
        k = self.block
        k[K_BUF], k[K_BUF_SIZE], k[K_N] = b.buf.ctypes.data, b.buf.size, n
        for slot, name in ((K_TOPIC_START, "topic_start"), (K_TOPIC_LEN, "topic_length"),
                           (K_PROPS_START, "properties_start"), (K_PROPS_LEN, "properties_length"),
                           (K_SYS_FLAG, "sys_flag")):
            k[slot] = b[name].ctypes.data
        k[K_SCRATCH], k[K_SCRATCH_CAP] = self.scratch.ctypes.data, SCRATCH_PAIRS
        k[K_HASHES], k[K_ROWS], k[K_CAP] = self.hashes.ctypes.data, self.rows.ctypes.data, ROOM
        k[K_PYTHON], k[K_OUT] = self.python.ctypes.data, self.out.ctypes.data
        hashes, rows = [], []
        i = 0
        while i < n:
            k[K_I0] = i
            self.call(k.ctypes.data)
            m, i = int(self.out[0]), int(self.out[1])
            hashes.append(self.hashes[:m].copy())
            rows.append(self.rows[:m].astype(np.int64))
        h = np.concatenate(hashes)
        r = np.concatenate(rows)
        for row in np.flatnonzero(self.python[:n]).tolist():  # the pure rule, its keys in their place
            extra = [index_key_hash(s) for s in record_index_keys(b.message(row, read_body=False))]
            if extra:
                at = int(np.searchsorted(r, row))
                h = np.insert(h, at, extra)
                r = np.insert(r, at, [row] * len(extra))
        if not h.size:
            return None
        return BatchKeys(h, b.offsets[r].astype(np.int64), b["store_timestamp"][r].astype(np.int64))
