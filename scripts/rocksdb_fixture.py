"""Build a RocksDB-CQ store from a file-CQ store, with the real RocksDB library (``rocksdict``).

    python scripts/rocksdb_fixture.py SRC_STORE DEST [--config v1|v2|json]

RocketMQ's oracle cannot write these stores (its RocksDB JNI library is not there), so the databases are
written here in the layout RocketMQ 5.3.3's source documents, not by RocketMQ:

* ``consumequeue/``: ``ConsumeQueueRocksDBStorage`` (column families ``default`` and ``offset``), one unit
  per file CQ entry below the queue's max offset (``RocksDBConsumeQueueTable``: key topic/queueId/cqOffset,
  28-byte value with the record's store time), a ``max`` and a ``min`` entry per queue and the
  ``CHECKPOINT_TOPIC`` entry (``RocksDBConsumeQueueOffsetTable``);
* ``config/``: v2 (``configManagerVersion=v2``): one database ``config/rdb/`` (``ConfigStorage``; keys
  ``[1][tableId:int16][2][len:int16][name]``, values ``[1 = JSON][json]``, consumer offsets
  ``[1][1][2][len group][group][1][len topic][topic][1][queueId:int32]`` -> offset:int64, a data version
  per table); v1: ``config/topics/``, ``config/subscriptionGroups/``, ``config/consumerOffsets/``
  (``ConfigRocksDBStorage``: families ``default``, ``kvDataVersion``, ``forbidden``; key = name or
  ``topic@group``, value = JSON). The JSON files they replace are left out; ``json`` keeps them.

Everything else of SRC_STORE is copied. RocksDB's info logs and the binding's own file are removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rmqdump.store.config import load_consumer_offsets, load_subscription_groups, load_topics  # noqa: E402
from rmqdump.store.consumequeue import ConsumeQueue, discover_queues, infer_store_cq_file_size  # noqa: E402
from rmqdump.store.rocksdb.config import v2_offset_key, v2_table_key  # noqa: E402
from rmqdump.store.rocksdb.cq import (  # noqa: E402
    CHECKPOINT_TOPIC,
    cq_key,
    cq_value,
    offset_key,
    offset_value,
)
from rmqdump.store.root import Store  # noqa: E402

_CONFIG_JSON = ("topics.json", "subscriptionGroup.json", "consumerOffset.json")
_V2_TABLES = {"consumer_offset": 1, "topic": 3, "subscription_group": 4}


def _open(path: Path, families: tuple[str, ...] = ()):
    from rocksdict import Options, Rdict

    path.mkdir(parents=True, exist_ok=True)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    return Rdict(str(path), opts, column_families={f: Options(raw_mode=True) for f in families} or None)


def _close(db, path: Path) -> None:
    db.flush()
    db.close()
    for p in path.iterdir():
        if p.name.startswith("LOG") or p.name == "rocksdict-config.json":
            p.unlink()


def write_cq(src: Path, dest: Path) -> int:
    """The file CQ of ``src`` as a RocksDB CQ in ``dest/consumequeue``; returns the unit count."""
    store = Store.open(src)
    times = {r.offset: r.store_timestamp for r in store.commitlog.walk(check_crc=False, read_body=False)
             if hasattr(r, "store_timestamp")}
    size = infer_store_cq_file_size(src)
    path = dest / "consumequeue"
    db = _open(path, ("offset",))
    off_cf = db.get_column_family("offset")
    units, max_phy = 0, 0
    for ref in discover_queues(src):
        q = ConsumeQueue(ref.path, ref.topic, ref.queue_id, size, strict=False)
        entries = [e for e in q.iter_entries() if e.is_valid]
        for e in entries:
            db[cq_key(ref.topic, ref.queue_id, e.queue_offset)] = cq_value(
                e.commit_log_offset, e.size, e.tags_code, times.get(e.commit_log_offset, 0))
            max_phy = max(max_phy, e.commit_log_offset + e.size)
            units += 1
        if entries:
            first, last = entries[0], entries[-1]
            off_cf[offset_key(ref.topic, ref.queue_id, "min")] = offset_value(first.commit_log_offset,
                                                                               first.queue_offset)
            off_cf[offset_key(ref.topic, ref.queue_id, "max")] = offset_value(last.commit_log_offset,
                                                                               last.queue_offset)
    off_cf[offset_key(CHECKPOINT_TOPIC, 0, "max")] = max_phy.to_bytes(8, "big")
    _close(db, path)
    return units


def _tables(src: Path) -> tuple[dict, dict, dict]:
    topics = load_topics(src)
    groups = load_subscription_groups(src)
    offsets = load_consumer_offsets(src)
    return ({n: t.raw for n, t in (topics.data or {}).items()}, groups.data or {},
            offsets.data.table if offsets.data else {})


def write_config_v2(src: Path, dest: Path) -> None:
    topics, groups, offsets = _tables(src)
    path = dest / "config" / "rdb"
    db = _open(path)
    for name, cfg in topics.items():
        db[v2_table_key(_V2_TABLES["topic"], name)] = b"\x01" + json.dumps(cfg).encode()
    for name, cfg in groups.items():
        db[v2_table_key(_V2_TABLES["subscription_group"], name)] = b"\x01" + json.dumps(cfg).encode()
    for key, queues in offsets.items():
        topic, group = key.split("@", 1)
        for qid, off in queues.items():
            db[v2_offset_key(group, topic, qid)] = off.to_bytes(8, "big", signed=True)
    for table in _V2_TABLES.values():  # [1][table][1 = DATA_VERSION]"data_version" -> state, timestamp, counter
        db[b"\x01" + table.to_bytes(2, "big") + b"\x01data_version"] = (0).to_bytes(8, "big") * 2 + \
            (1).to_bytes(8, "big")
    _close(db, path)


def write_config_v1(src: Path, dest: Path) -> None:
    topics, groups, offsets = _tables(src)
    version = json.dumps({"counter": 1, "stateVersion": 0, "timestamp": 0}).encode()
    for folder, rows in (("topics", {n: c for n, c in topics.items()}),
                         ("subscriptionGroups", groups),
                         ("consumerOffsets", {k: {"offsetTable": {str(q): o for q, o in v.items()}}
                                              for k, v in offsets.items()})):
        path = dest / "config" / folder
        db = _open(path, ("kvDataVersion", "forbidden"))
        for name, value in rows.items():
            db[name.encode()] = json.dumps(value).encode()
        db.get_column_family("kvDataVersion")[b"kvDataVersionKey"] = version
        _close(db, path)


def build(src: Path, dest: Path, config: str = "v2") -> int:
    """Copy ``src`` to ``dest`` with a RocksDB CQ and RocksDB config tables; returns the unit count."""
    src, dest = Path(src), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    skip = {"consumequeue"}
    shutil.copytree(src, dest, symlinks=True, ignore=lambda d, names: [
        n for n in names if (Path(d) == src and n in skip) or
        (config != "json" and Path(d) == src / "config" and n.removesuffix(".bak") in _CONFIG_JSON)])
    units = write_cq(src, dest)
    if config == "v2":
        write_config_v2(src, dest)
    elif config == "v1":
        write_config_v1(src, dest)
    return units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--config", choices=("v1", "v2", "json"), default="v2")
    a = ap.parse_args()
    print(f"{build(a.src, a.dest, a.config)} consume queue units written to {a.dest}/consumequeue")


if __name__ == "__main__":
    main()
