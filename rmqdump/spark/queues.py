"""``format("rocketmq_cq")`` rows: ConsumeQueue entries and 5.x BatchConsumeQueue units in one table.

:data:`QUEUE_SCHEMA` is :data:`rmqdump.rows.arrow.CQ_SCHEMA` plus ``queue_kind`` (``consumequeue`` or
``batchconsumequeue``, the directory) and ``batch_size`` (messages behind the unit: 1 for a ConsumeQueue
entry). For a BatchConsumeQueue unit ``queue_offset`` is its msgBaseOffset (its first message's queue
offset), ``file_pos`` the unit's position in its 46-byte-unit file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rmqdump.codec.layout import BCQ_STORE_UNIT_SIZE
from rmqdump.disk.segment import offset_to_file_name
from rmqdump.rows import arrow as rarrow

CQ_KIND, BCQ_KIND = "consumequeue", "batchconsumequeue"
QUEUE_SCHEMA = rarrow.CQ_SCHEMA.append(pa.field("queue_kind", pa.string())).append(pa.field("batch_size", pa.int32()))


@dataclass(frozen=True)
class BatchQueueSplit:
    """One ``batchconsumequeue/<topic>/<queueId>`` directory of one store."""

    store: str
    broker: str
    topic: str
    queue_id: int
    path: str
    file_size: int | None


def batch_queue_splits(paths: Iterable[str | os.PathLike]) -> list[BatchQueueSplit]:
    """Every BatchConsumeQueue of every store (stores without ``batchconsumequeue/`` have none)."""
    from rmqdump.store.consumequeue import discover_queues, infer_store_cq_file_size
    from rmqdump.store.root import Store

    out = []
    paths = [os.fspath(p) for p in paths]
    names = rarrow.broker_names(paths)
    for key in paths:
        root = Store.open(key).root
        if root is None:
            continue  # queue_splits already refused it
        size = infer_store_cq_file_size(root, batch=True)
        for ref in discover_queues(root, batch=True):
            out.append(BatchQueueSplit(key, names[key], ref.topic, ref.queue_id, str(ref.path), size))
    return out


def queue_splits(paths: Iterable[str | os.PathLike]) -> list:
    """ConsumeQueue splits (:func:`rmqdump.rows.arrow.queue_splits`), then BatchConsumeQueue splits."""
    paths = list(paths)
    return [*rarrow.queue_splits(paths), *batch_queue_splits(paths)]


def read_queue(split, raw: bool = False, batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """Rows of one queue: the broker's recovered view, or every unit with ``raw``."""
    if isinstance(split, BatchQueueSplit):
        yield from _read_batch_queue(split, raw, batch_size)
        return
    for b in rarrow.read_queue(split, raw=raw, batch_size=batch_size):
        n = b.num_rows
        yield pa.RecordBatch.from_arrays([*b.columns, pa.array([CQ_KIND] * n, pa.string()),
                                          pa.array([1] * n, pa.int32())], schema=QUEUE_SCHEMA)


def _read_batch_queue(split: BatchQueueSplit, raw: bool, batch_size: int) -> Iterator[pa.RecordBatch]:
    from rmqdump.store.consumequeue.batch import BatchConsumeQueue

    q = BatchConsumeQueue(Path(split.path), split.topic, split.queue_id, split.file_size, strict=False)
    fsize = q.file_size or 0
    rows: list[dict] = []
    for u in q.iter_units(include_invalid=raw):
        byte = u.unit_index * BCQ_STORE_UNIT_SIZE
        start = byte - byte % fsize if fsize else 0
        rows.append({"broker": split.broker, "store": split.store, "topic": split.topic, "queue_id": split.queue_id,
                     "queue_offset": u.msg_base_offset, "commitlog_offset": u.commit_log_offset, "size": u.size,
                     "tags_code": u.tags_code, "file": offset_to_file_name(start), "file_pos": byte - start,
                     "valid": u.is_valid, "queue_kind": BCQ_KIND, "batch_size": u.batch_size})
        if len(rows) == batch_size:
            yield pa.RecordBatch.from_pylist(rows, schema=QUEUE_SCHEMA)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=QUEUE_SCHEMA)
