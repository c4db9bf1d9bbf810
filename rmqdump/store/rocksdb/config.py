"""The RocksDB config tables of 5.x brokers (RocketMQ 5.3.3), read-only, as raw rows for
:mod:`rmqdump.store.config` (which decodes them as it decodes the JSON files).

* ``configManagerVersion=v2`` (``broker/config/v2``): one database ``config/rdb/`` (``ConfigStorage``),
  column family ``default``, big-endian keys ``[tablePrefix 1][tableId:int16][recordPrefix]...``: table ids
  1 consumer offsets, 2 pull offsets, 3 topics, 4 subscription groups; record prefix 1 the table's data
  version (``"data_version"`` -> stateVersion, timestamp, counter as int64), 2 data. Topics and groups:
  ``[len:int16][name]`` -> ``[serialization 1 = JSON][json]``; consumer offsets: ``[len:int16][group] 0x01
  [len:int16][topic] 0x01 [queueId:int32]`` -> offset:int64.
* v1 (``broker/config/v1``, ``ConfigRocksDBStorage``): one database per table, ``config/topics/``,
  ``config/subscriptionGroups/``, ``config/consumerOffsets/``; family ``default``: key the name (UTF-8; a
  consumer offset's ``topic@group``), value its JSON (a consumer offset ``{"offsetTable": {queueId: offset}}``);
  families ``kvDataVersion`` (key ``kvDataVersionKey`` -> DataVersion JSON) and ``forbidden``.

v2 wins over v1 when both are present (a broker keeps only the one its ``configManagerVersion`` names).
"""

from __future__ import annotations

import os
from pathlib import Path

from rmqdump.codec.layout import STORE_CONFIG_DIR
from rmqdump.errors import FormatError
from rmqdump.store.rocksdb.db import is_rocksdb_dir, open_rocksdb

V2_DIR = "rdb"
#: table -> (v1 folder, v2 tableId)
TABLES = {"topics": ("topics", 3), "subscriptionGroups": ("subscriptionGroups", 4),
          "consumerOffsets": ("consumerOffsets", 1)}
_TABLE_PREFIX, _DATA_VERSION, _DATA = 1, 1, 2
_CTRL_1 = 1


def v2_table_key(table_id: int, name: str) -> bytes:
    """``ConfigHelper.keyBufOf``: a topic's or group's key."""
    b = name.encode("utf-8")
    return bytes([_TABLE_PREFIX]) + table_id.to_bytes(2, "big") + bytes([_DATA]) + len(b).to_bytes(2, "big") + b


def v2_offset_key(group: str, topic: str, queue_id: int) -> bytes:
    """``ConsumerOffsetManagerV2.keyOfConsumerOffset``."""
    g, t = group.encode("utf-8"), topic.encode("utf-8")
    return (bytes([_TABLE_PREFIX]) + (1).to_bytes(2, "big") + bytes([_DATA]) + len(g).to_bytes(2, "big") + g
            + bytes([_CTRL_1]) + len(t).to_bytes(2, "big") + t + bytes([_CTRL_1])
            + queue_id.to_bytes(4, "big", signed=True))


def config_db_path(store_root: str | os.PathLike, table: str) -> Path | None:
    """The database holding ``table`` (v2's ``config/rdb/``, else v1's folder), None if neither exists."""
    cfg = Path(store_root) / STORE_CONFIG_DIR
    if is_rocksdb_dir(cfg / V2_DIR):
        return cfg / V2_DIR
    v1 = cfg / TABLES[table][0]
    return v1 if is_rocksdb_dir(v1) else None


def _name(key: bytes, pos: int, path: Path) -> tuple[str, int]:
    if pos + 2 > len(key):
        raise FormatError(f"config key {key[:64].hex()} ends inside a name length", path)
    n = int.from_bytes(key[pos:pos + 2], "big")
    if pos + 2 + n > len(key):
        raise FormatError(f"config key {key[:64].hex()}: name of {n} bytes runs past the key", path)
    try:
        return key[pos + 2:pos + 2 + n].decode("utf-8"), pos + 2 + n
    except UnicodeDecodeError:
        raise FormatError(f"config key {key[:64].hex()}: name is not UTF-8", path) from None


def _v2_rows(path: Path, table: str) -> dict:
    db = open_rocksdb(path)
    tid = TABLES[table][1]
    prefix = bytes([_TABLE_PREFIX]) + tid.to_bytes(2, "big") + bytes([_DATA])
    rows: dict = {}
    for key, value in db.items("default", prefix):
        if not key.startswith(prefix):
            break
        name, pos = _name(key, 4, path)
        if table != "consumerOffsets":
            if pos != len(key) or not value or value[0] != 1:
                raise FormatError(f"{table} row {name!r}: trailing key bytes or not JSON (serialization "
                                  f"{value[:1].hex() or 'none'})", path)
            rows[name] = value[1:]
            continue
        if pos >= len(key) or key[pos] != _CTRL_1:
            raise FormatError(f"consumer offset key {key[:64].hex()}: no separator after the group", path)
        topic, pos = _name(key, pos + 1, path)
        if len(key) != pos + 5 or key[pos] != _CTRL_1 or len(value) != 8:
            raise FormatError(f"consumer offset {topic}@{name}: bad queue id or a {len(value)}-byte value", path)
        qid = int.from_bytes(key[pos + 1:], "big", signed=True)
        rows.setdefault(f"{topic}@{name}", {})[qid] = int.from_bytes(value, "big", signed=True)
    return rows


def read_config_table(store_root: str | os.PathLike, table: str) -> tuple[Path, dict] | None:
    """(database path, rows) of ``table`` (``topics``, ``subscriptionGroups``, ``consumerOffsets``): name ->
    JSON bytes (v2 consumer offsets: ``topic@group`` -> {queueId: offset}); None without RocksDB tables."""
    path = config_db_path(store_root, table)
    if path is None:
        return None
    if path.name == V2_DIR:
        return path, _v2_rows(path, table)
    rows: dict = {}
    for key, value in open_rocksdb(path).items("default"):
        try:
            rows[key.decode("utf-8")] = value
        except UnicodeDecodeError:
            raise FormatError(f"{table} key {key[:64].hex()} is not UTF-8", path) from None
    return path, rows
