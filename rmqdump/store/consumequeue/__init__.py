"""ConsumeQueue (and 5.x BatchConsumeQueue) reading and writing (spec §1.2, §8, §11.5).

Reading is bounded in memory: files are read in chunks with ``os.pread`` and entries are
yielded one by one. Queue offsets are entry numbers (byte offset / unit size).

The units as values and their encoders are in :mod:`~rmqdump.store.consumequeue.entries`, the
queues and mapped files found on disk in :mod:`~rmqdump.store.consumequeue.discovery`, the
ConsumeQueue (and ConsumeQueueExt) reader in :mod:`~rmqdump.store.consumequeue.reader`, the
BatchConsumeQueue in :mod:`~rmqdump.store.consumequeue.batch`, the writer in
:mod:`~rmqdump.store.consumequeue.writer`; their names are re-exported here.
"""

from __future__ import annotations

from rmqdump.store.consumequeue.batch import BatchConsumeQueue, batch_cq_topics, open_batch_queues
from rmqdump.store.consumequeue.discovery import (
    INT32_MAX,
    INT32_MIN,
    MappedFileInfo,
    QueueRef,
    check_not_rocksdb,
    discover_queues,
    infer_file_size,
    infer_store_cq_file_size,
    is_rocksdb_consumequeue,
    list_mapped_files,
    mapped_file_count,
    parse_queue_id,
)
from rmqdump.store.consumequeue.entries import (
    BCQ_INVALID_POS,
    CQ_EXT_MAX_REAL_OFFSET,
    LONG_MIN,
    PRE_BLANK_ENTRY,
    BcqEntry,
    CqEntry,
    encode_bcq_entry,
    encode_cq_entry,
    ext_address,
    ext_real_offset,
    file_name,
    is_ext_addr,
    is_valid_cq_unit,
    queue_offset_location,
)
from rmqdump.store.consumequeue.reader import CHUNK_UNITS, RECOVER_FILES_BACK, ConsumeQueue, CqExtUnit, read_ext_unit
from rmqdump.store.consumequeue.writer import ConsumeQueueWriter

__all__ = ["BCQ_INVALID_POS", "CHUNK_UNITS", "CQ_EXT_MAX_REAL_OFFSET", "INT32_MAX", "INT32_MIN", "LONG_MIN",
           "PRE_BLANK_ENTRY", "RECOVER_FILES_BACK", "BatchConsumeQueue", "BcqEntry", "ConsumeQueue",
           "ConsumeQueueWriter", "CqEntry", "CqExtUnit", "MappedFileInfo", "QueueRef", "batch_cq_topics",
           "check_not_rocksdb", "discover_queues", "encode_bcq_entry", "encode_cq_entry", "ext_address",
           "ext_real_offset", "file_name", "infer_file_size", "infer_store_cq_file_size", "is_ext_addr",
           "is_rocksdb_consumequeue", "is_valid_cq_unit", "list_mapped_files", "mapped_file_count", "open_batch_queues",
           "parse_queue_id", "queue_offset_location", "read_ext_unit"]
