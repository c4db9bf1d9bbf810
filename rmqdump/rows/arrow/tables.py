"""ConsumeQueue and index files as Arrow tables (for joins): their schemas, one split per queue or
index file, and the batches of one split."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rmqdump.errors import StoreError
from rmqdump.rows.arrow.columns import _STR
from rmqdump.rows.arrow.splits import broker_names
from rmqdump.store.root import Store

CQ_SCHEMA = pa.schema([
    pa.field("broker", _STR), pa.field("store", _STR), pa.field("topic", _STR), pa.field("queue_id", pa.int32()),
    pa.field("queue_offset", pa.int64()), pa.field("commitlog_offset", pa.int64()), pa.field("size", pa.int32()),
    pa.field("tags_code", pa.int64()), pa.field("file", _STR), pa.field("file_pos", pa.int64()),
    pa.field("valid", pa.bool_()),
])
INDEX_SCHEMA = pa.schema([
    pa.field("broker", _STR), pa.field("store", _STR), pa.field("file", _STR), pa.field("number", pa.int32()),
    pa.field("key_hash", pa.int32()), pa.field("phy_offset", pa.int64()), pa.field("time_diff", pa.int32()),
    pa.field("prev_index", pa.int32()), pa.field("store_timestamp", pa.int64()),
])


@dataclass(frozen=True)
class QueueSplit:
    """One ``consumequeue/<topic>/<queueId>`` directory of one store."""

    store: str
    broker: str
    root: str
    topic: str
    queue_id: int
    path: str
    file_size: int | None


@dataclass(frozen=True)
class IndexSplit:
    """One index file of one store."""

    store: str
    broker: str
    path: str


def _store_root(path: str) -> Path:
    store = Store.open(path)
    if store.root is None:
        raise StoreError("consumequeue/index need a store root (the directory holding commitlog/)", path)
    return store.root


def queue_splits(paths: Iterable[str | os.PathLike]) -> list[QueueSplit]:
    """Every consume queue of every store (RocksDB consume queues raise UnsupportedError)."""
    from rmqdump.store.consumequeue import discover_queues, infer_store_cq_file_size

    out = []
    paths = [os.fspath(p) for p in paths]
    names = broker_names(paths)
    for key in paths:
        root = _store_root(key)
        size = infer_store_cq_file_size(root)
        for ref in discover_queues(root):
            out.append(QueueSplit(key, names[key], str(root), ref.topic, ref.queue_id, str(ref.path), size))
    return out


def read_queue(split: QueueSplit, raw: bool = False, batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """CQ entries of one queue: the broker's view (up to its recovered max offset), or every unit with ``raw``."""
    from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE
    from rmqdump.disk.segment import offset_to_file_name
    from rmqdump.store.consumequeue import ConsumeQueue

    cq = ConsumeQueue(Path(split.path), split.topic, split.queue_id, split.file_size, strict=False)
    fsize = cq.file_size or 0
    cols: dict[str, list] = {n: [] for n in CQ_SCHEMA.names}

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays([pa.array(cols[f.name], type=f.type) for f in CQ_SCHEMA], schema=CQ_SCHEMA)
        for v in cols.values():
            v.clear()
        return batch

    n = 0
    for e in (cq.iter_raw() if raw else cq.iter_entries()):
        byte = e.queue_offset * CQ_STORE_UNIT_SIZE
        start = byte - byte % fsize if fsize else 0
        cols["commitlog_offset"].append(e.commit_log_offset)
        cols["queue_offset"].append(e.queue_offset)
        cols["size"].append(e.size)
        cols["tags_code"].append(e.tags_code)
        cols["file"].append(offset_to_file_name(start))
        cols["file_pos"].append(byte - start)
        cols["valid"].append(e.is_valid)
        n += 1
        if n == batch_size:
            yield _fill_const(cols, split, n, flush)
            n = 0
    if n:
        yield _fill_const(cols, split, n, flush)


def _fill_const(cols: dict[str, list], split: QueueSplit, n: int, flush: Callable[[], pa.RecordBatch]):
    cols["broker"].extend([split.broker] * n)
    cols["store"].extend([split.store] * n)
    cols["topic"].extend([split.topic] * n)
    cols["queue_id"].extend([split.queue_id] * n)
    return flush()


def index_splits(paths: Iterable[str | os.PathLike]) -> list[IndexSplit]:
    """Every index file of every store."""
    from rmqdump.store.indexfile import list_index_files

    out = []
    paths = [os.fspath(p) for p in paths]
    names = broker_names(paths)
    for key in paths:
        out.extend(IndexSplit(key, names[key], str(p)) for p in list_index_files(_store_root(key)))
    return out


def read_index(split: IndexSplit, batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """Entries 1 .. indexCount-1 of one index file, with the reconstructed store time (ms)."""
    from rmqdump.store.indexfile import IndexFile

    with IndexFile(split.path, strict=False) as f:
        begin = f.header.begin_timestamp
        name = f.name
        rows: list[tuple] = []
        for e in f.iter_entries():
            rows.append(e)
            if len(rows) == batch_size:
                yield _index_batch(rows, split, name, begin)
                rows = []
        if rows:
            yield _index_batch(rows, split, name, begin)


def _index_batch(rows: list, split: IndexSplit, name: str, begin: int) -> pa.RecordBatch:
    n = len(rows)
    number, key_hash, phy, diff, prev = (list(c) for c in zip(*rows, strict=True))
    data = {
        "broker": [split.broker] * n, "store": [split.store] * n, "file": [name] * n, "number": number,
        "key_hash": key_hash, "phy_offset": phy, "time_diff": diff, "prev_index": prev,
        "store_timestamp": [begin + d * 1000 for d in diff],
    }
    return pa.RecordBatch.from_arrays([pa.array(data[f.name], type=f.type) for f in INDEX_SCHEMA], schema=INDEX_SCHEMA)
