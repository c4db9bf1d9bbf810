"""RocksDB databases of 5.x stores, read-only: the consume queue (``storeType=defaultRocksDB``) and the config
tables (``config/topics/``... of ``configManagerVersion=v1``, ``config/rdb/`` of v2).

``db``: the read-only open (through a directory of symlinks: the store stays byte-identical); ``cq``: the CQ's
key and value layouts, queues, offset table; ``queue``: one queue as the file CQ's mapped files, for the
ConsumeQueue reader; ``config``: the config tables as the JSON files' values. Needs the ``rocksdb`` extra
(``rocksdict``); without it, opening raises the ImportError the CLI turns into one line naming the extra.
"""

from __future__ import annotations

from rmqdump.store.rocksdb.cq import RocksConsumeQueues, is_rocksdb_cq
from rmqdump.store.rocksdb.db import RocksDB, close_all, is_rocksdb_dir, open_rocksdb

__all__ = ["RocksConsumeQueues", "RocksDB", "close_all", "is_rocksdb_cq", "is_rocksdb_dir", "open_rocksdb"]
