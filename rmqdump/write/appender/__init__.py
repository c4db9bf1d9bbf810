"""Append records to a stopped broker's store, safely (spec §10, §11, §14): the package re-exports its names.

``geometry``: the store's file sizes; ``liveness``: the ``abort`` marker and signs of a running or starting
broker; ``state``: the store before an append (the true end, a dirty tail); ``locked``: the locked appender
(lock, ``abort``, commits, checkpoint); ``jsonl``: scan JSONL records as message specs; ``bulk``: many records
under one lock.
"""

from __future__ import annotations

# the names importers use (``__all__``: the public API)
from rmqdump.write.appender.bulk import DEFAULT_BATCH_BYTES, BulkResult, bulk_append  # noqa: F401
from rmqdump.write.appender.geometry import StoreGeometry, require_cq_file_size, store_geometry  # noqa: F401
from rmqdump.write.appender.jsonl import decode_body, read_jsonl, record_to_spec
from rmqdump.write.appender.liveness import (  # noqa: F401
    ABORT_TAG,
    AbortInfo,
    broker_evidence,
    pid_alive,
    processes_using,
    read_abort,
)
from rmqdump.write.appender.locked import DEFAULT_STORE_HOST, LockedAppender, refusal_message  # noqa: F401
from rmqdump.write.appender.state import QueueTail, StoreState, inspect_store, nonzero_span, stale_after_end  # noqa: F401

__all__ = [
    "AbortInfo", "BulkResult", "LockedAppender", "StoreGeometry", "StoreState", "bulk_append", "broker_evidence",
    "decode_body", "inspect_store", "nonzero_span", "processes_using", "stale_after_end", "read_jsonl", "record_to_spec",
    "store_geometry",
]
