"""Compiled twin of the walk behind ``rmqdump stats`` (``analysis.stats.compute_stats``): a batch's records as
groups that share every value the statistics key on, from column batches.

The pure walk decodes every record and files it under its topic, queue, tag, producer host, hour, compression
and system kind. Here each segment is walked by the compiled kernel (CRC as asked) and the rows are grouped on
the bytes those values come from: the topic, the queue id, the TAGS value (its byte range from ``record_prop``,
:mod:`rmqdump.fast._indexkernels`), the born address, the store-time hour, the compression bits and the
transaction type; one record per group is decoded and the pure accessors name the group's values. Rows whose
values the columns cannot settle are handed over decoded (:attr:`StatsBatch.records`): system topics (their
destination is in their properties), properties that are not valid UTF-8 or name a detour (a delivered copy's
``DELAY``/``TIMER_*``: the clock-skew rule). The hour is keyed as ``store time // 3,600,000`` (floor): the hour
label of a time (UTC, ``invalid`` outside the calendar, whose limits fall on whole hours) is the same for every
time of one key. A file the kernel cannot walk to its end hands the rest back to the pure walk
(:class:`~rmqdump.fast.filewalk.HandOver`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rmqdump.broker.systopics import resolved_by_topic
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_COMPARATOR,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.record import Message
from rmqdump.fast import filewalk
from rmqdump.fast.batch import RecordBatch
from rmqdump.fast.engine import _numpy
from rmqdump.fast.filewalk import FileEnd, HandOver
from rmqdump.fast.indexabi import (
    P_BLOCK,
    P_BUF,
    P_BUF_SIZE,
    P_I0,
    P_LEN,
    P_N,
    P_NAME,
    P_NAME_LEN,
    P_PROPS_LEN,
    P_PROPS_START,
    P_PYTHON,
    P_SCRATCH,
    P_SCRATCH_CAP,
    P_START,
    SCRATCH_PAIRS,
)
from rmqdump.fast.intern import TopicIntern
from rmqdump.fast.topics import TopicNames, byte_groups

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.store.commitlog import CommitLog

__all__ = ["FileEnd", "Group", "HandOver", "StatsBatch", "applies", "stats_batches"]

_DETOURS = (b"DELAY\x01", b"TIMER_OUT_MS\x01", b"TIMER_ENQUEUE_MS\x01")  # resolve()'s "via" properties
HOUR_MS = 3_600_000
_HUGE = 1 << 62  # times at or past this far from 1970 are filed one by one (Python's ints do not overflow)


@dataclass
class Group:
    """Records sharing every value the statistics key on; ``rep``: one of them, decoded (no body)."""

    rep: Message
    records: int
    bytes: int
    body_bytes: int


@dataclass
class StatsBatch:
    """One batch: its groups, the records to file one by one (decoded, in order), and for the grouped rows their
    body lengths, the clock skews (store minus born time) of those the skew counts, and their store times."""

    file: str
    groups: list[Group] = field(default_factory=list)
    records: list[Message] = field(default_factory=list)
    body_lengths: Any = None
    skews: Any = None
    store_times: Any = None
    end_offset: int = 0


def applies(cl: CommitLog, use_mmap: bool) -> bool:
    """Whether the statistics walk takes the compiled path."""
    return filewalk.applies(cl, use_mmap=use_mmap)


def stats_batches(cl: CommitLog, *, check_crc: bool, max_record_size: int,
                  batch_records: int | None = None) -> Iterator[StatsBatch | FileEnd | HandOver]:
    """The commitlog's records as :class:`StatsBatch` es, a :class:`~rmqdump.fast.filewalk.FileEnd` after each file
    (a ``blank`` stop: the file ends with a BLANK); a :class:`HandOver` last when the kernel could not walk it
    all."""
    grouper = _Grouper()
    for item in filewalk.walk_files(cl, check_crc=check_crc, max_record_size=max_record_size,
                                    intern=grouper.names.intern, batch_records=batch_records):
        yield grouper.batch(item) if isinstance(item, RecordBatch) else item


class _Grouper:
    def __init__(self):
        np = self.np = _numpy()
        from rmqdump.fast.indexjoin import backend

        self.call = backend().prop
        self.names = TopicNames(TopicIntern())
        self.scratch = np.zeros((SCRATCH_PAIRS, 4), np.int64)
        self.tag_name = np.frombuffer(b"TAGS", np.uint8).copy()
        self.block = np.zeros(P_BLOCK, np.int64)
        self.start = self.length = self.python = np.zeros(0, np.int64)

    def _tags(self, b: RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row the TAGS value's byte range (length -1: none) and whether the pure decoder must read it."""
        np, n = self.np, b.n
        if self.start.size < n:
            self.start, self.length, self.python = np.zeros(n, np.int64), np.zeros(n, np.int32), np.zeros(n, np.uint8)
        k = self.block
        k[P_BUF], k[P_BUF_SIZE], k[P_I0], k[P_N] = b.buf.ctypes.data, b.buf.size, 0, n
        k[P_PROPS_START], k[P_PROPS_LEN] = b["properties_start"].ctypes.data, b["properties_length"].ctypes.data
        k[P_SCRATCH], k[P_SCRATCH_CAP] = self.scratch.ctypes.data, SCRATCH_PAIRS
        k[P_NAME], k[P_NAME_LEN] = self.tag_name.ctypes.data, self.tag_name.size
        k[P_START], k[P_LEN], k[P_PYTHON] = self.start.ctypes.data, self.length.ctypes.data, self.python.ctypes.data
        self.call(k.ctypes.data)
        return self.start[:n], self.length[:n], self.python[:n].astype(bool)

    def batch(self, b: RecordBatch) -> StatsBatch:
        np, n = self.np, b.n
        every = np.arange(n)
        tids, topics = self.names.of(b, every)
        sys_flag = b["sys_flag"][:n]
        system = np.array([resolved_by_topic(t) for t in topics], bool)
        tag_start, tag_len, one_by_one = self._tags(b)
        one_by_one = one_by_one | system[tids]
        one_by_one[b.holding(every, *_DETOURS)] = True
        ts = b["store_timestamp"][:n].astype(np.int64)
        born = b["born_timestamp"][:n].astype(np.int64)
        one_by_one |= (np.abs(ts) >= _HUGE) | (np.abs(born) >= _HUGE)  # their skew would overflow an int64
        hour = ts // HOUR_MS
        rows = np.flatnonzero(~one_by_one)
        out = StatsBatch(b.file, end_offset=int(b.offsets[n - 1]) + int(b["size"][n - 1]))
        out.records = [b.message(i, read_body=False) for i in np.flatnonzero(one_by_one).tolist()]
        if not rows.size:
            out.body_lengths = out.skews = out.store_times = np.zeros(0, np.int64)
            return out
        has_tags = tag_len[rows] >= 0
        tag_ids = np.full(rows.size, -1, np.int64)
        if has_tags.any():
            with_tags = rows[has_tags]
            tag_ids[has_tags] = byte_groups(b.buf, tag_start[with_tags], tag_len[with_tags])[0]
        addr = b["born_addr"][rows].view(np.int64).reshape(rows.size, -1)
        flags = sys_flag[rows]
        columns = (tids[rows], b["queue_id"][rows].astype(np.int64), tag_ids, *addr.T,
                   (flags & BORNHOST_V6_FLAG).astype(np.int64), hour[rows],
                   (flags & (COMPRESSED_FLAG | COMPRESSION_TYPE_COMPARATOR | TRANSACTION_TYPE_MASK)).astype(np.int64))
        first, inv = _groups(np, columns)
        sizes = b["size"][rows].astype(np.int64)
        blen = np.maximum(b["body_length"][rows], 0).astype(np.int64)
        counts = np.bincount(inv, minlength=first.size)
        size_sums = np.bincount(inv, weights=sizes, minlength=first.size)
        body_sums = np.bincount(inv, weights=blen, minlength=first.size)
        for g, f in enumerate(first.tolist()):
            out.groups.append(Group(b.message(int(rows[f]), read_body=False), int(counts[g]), int(size_sums[g]),
                                    int(body_sums[g])))
        out.body_lengths = blen
        normal = (flags & TRANSACTION_TYPE_MASK) == 0  # the skew counts producer writes (kind normal, no detour)
        out.skews = ts[rows][normal] - born[rows][normal]
        out.store_times = ts[rows]
        return out


def _groups(np, columns) -> tuple[np.ndarray, np.ndarray]:
    """Rows equal in every column: (a first row of each group, each row's group), the columns folded one by one
    into dense group numbers (each step one sort of int64s)."""
    inv = np.zeros(columns[0].size, np.int64)
    n = 1
    for col in columns:
        values, rank = np.unique(col, return_inverse=True)
        if values.size == 1:
            continue
        _, inv = np.unique(inv * values.size + rank.reshape(-1), return_inverse=True)
        inv = inv.reshape(-1)
        n = int(inv.max()) + 1
    first = np.full(n, inv.size, np.int64)
    np.minimum.at(first, inv, np.arange(inv.size))
    return first, inv
