"""The 5.x BatchConsumeQueue (spec §8.3): the reader of one ``batchconsumequeue/<topic>/<queueId>/``
directory, every such queue of a store, and which topics are BatchCQ topics."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rmqdump.codec.layout import BCQ_STORE_UNIT_SIZE, BCQ_UNIT, STORE_BATCH_CONSUMEQUEUE_DIR
from rmqdump.errors import FormatError, NotFoundError, RmqdumpError
from rmqdump.store.consumequeue.discovery import (
    MappedFileInfo,
    _scandir_dirs,
    discover_queues,
    infer_store_cq_file_size,
)
from rmqdump.store.consumequeue.entries import BcqEntry, file_name, queue_offset_location
from rmqdump.store.consumequeue.reader import _iter_file_units, _pread, _QueueBase


class BatchConsumeQueue(_QueueBase):
    """Reader of one ``batchconsumequeue/<topic>/<queueId>/`` directory (§8.3)."""

    unit_size = BCQ_STORE_UNIT_SIZE

    def _leading_valid(self, f: MappedFileInfo) -> tuple[int, tuple | None]:
        last = None
        valid_end = 0
        for pos, chunk in _iter_file_units(f.path, BCQ_STORE_UNIT_SIZE, 0, self.file_size):
            for i, unit in enumerate(BCQ_UNIT.iter_unpack(chunk)):
                if not (unit[0] >= 0 and unit[1] > 0 and unit[4] >= 0 and unit[5] > 0):
                    return pos + i * BCQ_STORE_UNIT_SIZE, last
                last = unit
            valid_end = pos + len(chunk)
        return valid_end, last

    @property
    def unit_count_end(self) -> int:
        """Unit index after the last valid unit."""
        return self._recover()[0] // BCQ_STORE_UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """Max queue (message) offset: last valid unit's msgBaseOffset + batchSize, 0 if none."""
        last = self._recover()[1]
        return 0 if last is None else last[4] + last[5]

    def unit_at(self, unit_index: int) -> BcqEntry:
        """The unit number ``unit_index`` (not a message offset)."""
        if unit_index < 0 or not self.file_size:
            raise NotFoundError(f"no BCQ unit {unit_index}", self.path)
        start, pos = queue_offset_location(unit_index, self.file_size, BCQ_STORE_UNIT_SIZE)
        f = self._by_start.get(start)
        if f is None:
            raise NotFoundError(f"no file {file_name(start)} for unit {unit_index}", self.path)
        data = _pread(f.path, BCQ_STORE_UNIT_SIZE, pos)
        if len(data) < BCQ_STORE_UNIT_SIZE:
            raise FormatError(f"file ends inside unit {unit_index}", f.path, pos)
        return BcqEntry(unit_index, *BCQ_UNIT.unpack(data))

    def iter_units(self, include_invalid: bool = False) -> Iterator[BcqEntry]:
        """Units in file order up to the recovered end (all units with ``include_invalid``)."""
        end = None if include_invalid else self._recover()[0]
        for f in self.files:
            if end is not None and f.start >= end:
                return
            for pos, chunk in _iter_file_units(f.path, BCQ_STORE_UNIT_SIZE, 0, self.file_size):
                base = (f.start + pos) // BCQ_STORE_UNIT_SIZE
                for i, unit in enumerate(BCQ_UNIT.iter_unpack(chunk)):
                    if end is not None and (base + i) * BCQ_STORE_UNIT_SIZE >= end:
                        return
                    yield BcqEntry(base + i, *unit)

    @property
    def max_physic_end(self) -> int:
        """End (offset + size) of the record of the last valid unit, -1 if none: dispatch reached it."""
        last = self._recover()[1]
        return -1 if last is None else last[0] + last[1]

    def find(self, queue_offset: int) -> BcqEntry:
        """The unit holding message ``queue_offset`` (binary search on msgBaseOffset)."""
        lo, hi = self.files[0].start // BCQ_STORE_UNIT_SIZE if self.files else 0, self.unit_count_end - 1
        found = None
        while lo <= hi:
            mid = (lo + hi) // 2
            unit = self.unit_at(mid)
            if unit.msg_base_offset <= queue_offset:
                found, lo = unit, mid + 1
            else:
                hi = mid - 1
        if found is None or queue_offset >= found.next_offset:
            raise NotFoundError(f"queue offset {queue_offset} not in batch consume queue", self.path)
        return found


def open_batch_queues(store_root: str | os.PathLike) -> dict[tuple[str, int], BatchConsumeQueue]:
    """Every ``batchconsumequeue/TOPIC/QID`` of a 5.x store, opened leniently (``strict=False``).

    A BatchCQ topic (``queue.type=BatchCQ``) is dispatched into these 46-byte units instead of
    ``consumequeue/``: its records count as dispatched when a unit points at them. A queue whose
    directory cannot be read is left out.
    """
    out: dict[tuple[str, int], BatchConsumeQueue] = {}
    root = Path(store_root)
    if not (root / STORE_BATCH_CONSUMEQUEUE_DIR).is_dir():
        return out
    try:
        size = infer_store_cq_file_size(root, batch=True)
        refs = list(discover_queues(root, batch=True))
    except RmqdumpError:
        return out
    for ref in refs:
        try:
            out[(ref.topic, ref.queue_id)] = BatchConsumeQueue(ref.path, ref.topic, ref.queue_id, size, strict=False)
        except RmqdumpError:
            continue
    return out


def batch_cq_topics(store_root: str | os.PathLike) -> set[str]:
    """5.x BatchCQ topics: a ``batchconsumequeue/TOPIC`` directory (how the store marks one on disk) or
    ``queue.type=BatchCQ`` in ``config/topics.json`` (what the broker declares to the store)."""
    out: set[str] = set()
    try:
        out = {e.name for e in _scandir_dirs(Path(store_root) / STORE_BATCH_CONSUMEQUEUE_DIR)}
    except RmqdumpError:
        pass
    from rmqdump.store.config import load_topics

    try:
        topics = load_topics(store_root).data or {}
    except RmqdumpError:
        return out
    for name, cfg in topics.items():
        attrs = cfg.attributes
        if (attrs.get("queue.type") or attrs.get("+queue.type") or "").lower() == "batchcq":
            out.add(name)
    return out
