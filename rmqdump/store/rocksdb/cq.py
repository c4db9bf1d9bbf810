"""The RocksDB consume queue of 5.x ``storeType=defaultRocksDB`` (RocketMQ 5.3.3).

One database in ``consumequeue/`` (``StorePathConfigHelper.getStorePathConsumeQueue``, as the file CQ;
``ConsumeQueueRocksDBStorage``), big-endian throughout (``RocksDBConsumeQueueTable`` / ``...OffsetTable``):

* column family ``default``, one key per unit: ``topicLen:int32 0x01 topic 0x01 queueId:int32 0x01
  cqOffset:int64`` -> ``commitLogOffset:int64 size:int32 tagsCode:int64 storeTime:int64`` (28 bytes; its first
  20 bytes are exactly a file CQ unit);
* column family ``offset``, two keys per queue: ``topicLen:int32 0x01 topic 0x01 "max"|"min" 0x01
  queueId:int32`` -> ``commitLogOffset:int64 cqOffset:int64`` (the last and the first unit; the broker's
  ``getMaxOffsetInQueue`` is max cqOffset + 1), and one for ``CHECKPOINT_TOPIC`` whose 8-byte value is the
  largest commitlog offset dispatched.

Keys sort by bytes, so one queue's units are one contiguous key range in cqOffset order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import STORE_CONSUMEQUEUE_DIR
from rmqdump.errors import FormatError
from rmqdump.store.rocksdb.db import RocksDB, is_rocksdb_dir, open_rocksdb

CTRL_0, CTRL_1, CTRL_2 = b"\x00", b"\x01", b"\x02"
#: the value of one unit: commitLogOffset(8) size(4) tagsCode(8) storeTime(8)
CQ_VALUE_SIZE = 28
#: the part of a value that is a file CQ unit (commitLogOffset, size, tagsCode)
FILE_UNIT_SIZE = 20
OFFSET_FAMILY = "offset"
#: ``TopicValidator.RMQ_SYS_ROCKSDB_OFFSET_TOPIC``: the offset table's max-dispatched-offset checkpoint
CHECKPOINT_TOPIC = "CHECKPOINT_TOPIC"


def _i32(b: bytes) -> int:
    return int.from_bytes(b, "big", signed=True)


def _i64(b: bytes) -> int:
    return int.from_bytes(b, "big", signed=True)


def queue_prefix(topic: str, queue_id: int) -> bytes:
    """The key prefix of a queue's units (everything before cqOffset)."""
    t = topic.encode("utf-8")
    return len(t).to_bytes(4, "big") + CTRL_1 + t + CTRL_1 + queue_id.to_bytes(4, "big", signed=True) + CTRL_1


def cq_key(topic: str, queue_id: int, cq_offset: int) -> bytes:
    """``buildCQKeyBB``: the key of one unit."""
    return queue_prefix(topic, queue_id) + cq_offset.to_bytes(8, "big", signed=True)


def cq_value(commit_log_offset: int, size: int, tags_code: int, store_time: int) -> bytes:
    """``buildCQValueBB``: the 28-byte value of one unit."""
    return (commit_log_offset.to_bytes(8, "big", signed=True) + size.to_bytes(4, "big", signed=True)
            + tags_code.to_bytes(8, "big", signed=True) + store_time.to_bytes(8, "big", signed=True))


def offset_key(topic: str, queue_id: int, which: str) -> bytes:
    """``buildOffsetKeyByteBuffer``: the key of a queue's ``max`` or ``min`` entry."""
    t = topic.encode("utf-8")
    return (len(t).to_bytes(4, "big") + CTRL_1 + t + CTRL_1 + which.encode() + CTRL_1
            + queue_id.to_bytes(4, "big", signed=True))


def offset_value(commit_log_offset: int, cq_offset: int) -> bytes:
    return commit_log_offset.to_bytes(8, "big", signed=True) + cq_offset.to_bytes(8, "big", signed=True)


def decode_cq_key(key: bytes, path: Path | None = None) -> tuple[str, int, int]:
    """(topic, queueId, cqOffset) of a unit key (FormatError if it does not follow the layout)."""
    n = _i32(key[:4]) if len(key) >= 4 else -1
    if n < 0 or len(key) != n + 19 or key[4:5] != CTRL_1 or key[5 + n:6 + n] != CTRL_1 or key[10 + n:11 + n] != CTRL_1:
        raise FormatError(f"consume queue key {key[:64].hex()} does not follow the RocksDB CQ key layout", path)
    try:
        topic = key[5:5 + n].decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"consume queue key {key[:64].hex()}: topic is not UTF-8", path) from None
    return topic, _i32(key[6 + n:10 + n]), _i64(key[11 + n:])


@dataclass(frozen=True)
class OffsetEntry:
    """One entry of the offset table: a queue's ``max`` or ``min`` unit."""

    topic: str
    queue_id: int
    kind: str  # "max" | "min"
    commit_log_offset: int
    cq_offset: int


def decode_offset_entry(key: bytes, value: bytes, path: Path | None = None) -> OffsetEntry | None:
    """An offset-table entry; None for the ``CHECKPOINT_TOPIC`` key. FormatError if malformed."""
    n = _i32(key[:4]) if len(key) >= 4 else -1
    if n < 0 or len(key) != n + 14 or key[4:5] != CTRL_1 or key[5 + n:6 + n] != CTRL_1 or key[9 + n:10 + n] != CTRL_1:
        raise FormatError(f"offset table key {key[:64].hex()} does not follow the RocksDB CQ offset layout", path)
    topic = key[5:5 + n].decode("utf-8", "replace")
    if topic == CHECKPOINT_TOPIC:
        return None
    kind = key[6 + n:9 + n].decode("ascii", "replace")
    if kind not in ("max", "min") or len(value) != 16:
        raise FormatError(f"offset table entry of {topic}: {kind!r}, {len(value)}-byte value (want max|min, 16)",
                          path)
    return OffsetEntry(topic, _i32(key[10 + n:]), kind, _i64(value[:8]), _i64(value[8:]))


class RocksConsumeQueues:
    """The RocksDB consume queue of one store: its queues, offset table and units."""

    def __init__(self, store_root: str | os.PathLike):
        self.root = Path(store_root)
        self.path = self.root / STORE_CONSUMEQUEUE_DIR
        self.db: RocksDB = open_rocksdb(self.path)
        self._offsets: dict[tuple[str, int], dict[str, OffsetEntry]] | None = None
        self.checkpoint: int | None = None

    def offsets(self) -> dict[tuple[str, int], dict[str, OffsetEntry]]:
        """{(topic, queueId): {"max"|"min": entry}} from the ``offset`` column family."""
        if self._offsets is None:
            out: dict[tuple[str, int], dict[str, OffsetEntry]] = {}
            if OFFSET_FAMILY in self.db.column_families:
                for k, v in self.db.items(OFFSET_FAMILY):
                    e = decode_offset_entry(k, v, self.path)
                    if e is None:
                        self.checkpoint = _i64(v[:8]) if len(v) >= 8 else None
                    else:
                        out.setdefault((e.topic, e.queue_id), {})[e.kind] = e
            self._offsets = out
        return self._offsets

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queueId) with units or an offset-table entry (a skip scan: one seek per queue)."""
        found = set(self.offsets())
        start: bytes | None = b""
        while start is not None:
            key = self.db.seek_keys("default", start)
            if key is None:
                break
            topic, qid, _ = decode_cq_key(key, self.path)
            found.add((topic, qid))
            start = queue_prefix(topic, qid) + b"\xff" * 9  # past every cqOffset of this queue
        return sorted(found, key=lambda q: (q[0], str(q[1])))  # as directory names sort

    def units(self, topic: str, queue_id: int, start: int = 0, stop: int | None = None):
        """(cqOffset, 28-byte value) of a queue's units in [start, stop), in cqOffset order."""
        prefix = queue_prefix(topic, queue_id)
        n = len(prefix)
        for k, v in self.db.items("default", prefix + max(start, 0).to_bytes(8, "big")):
            if len(k) != n + 8 or k[:n] != prefix:
                return
            off = int.from_bytes(k[n:], "big", signed=True)
            if stop is not None and off >= stop:
                return
            if len(v) != CQ_VALUE_SIZE:
                raise FormatError(f"consume queue unit {topic}/{queue_id}/{off} is {len(v)} bytes, not "
                                  f"{CQ_VALUE_SIZE}", self.path)
            yield off, v

    def contiguous_values(self, topic: str, queue_id: int, start: int, stop: int) -> tuple[int, list[bytes]] | None:
        """(first cqOffset, values) of the units in [start, stop) when no key is missing between the first and
        the last (two seeks and the values alone); None otherwise (use :meth:`unit_rows`)."""
        prefix = queue_prefix(topic, queue_id)
        n = len(prefix)
        lo, hi = prefix + start.to_bytes(8, "big"), prefix + stop.to_bytes(8, "big")
        first = self.db.seek_keys("default", lo)
        if first is None or first >= hi:
            return start, []
        last = self.db.last_key_before("default", prefix + (stop - 1).to_bytes(8, "big"))
        if len(first) != n + 8 or last is None or len(last) != n + 8 or last[:n] != prefix:
            return None
        a, b = int.from_bytes(first[n:], "big"), int.from_bytes(last[n:], "big")
        values = self.db.range_values("default", lo, hi)
        if len(values) != b - a + 1 or sum(map(len, values)) != CQ_VALUE_SIZE * len(values):
            return None
        return a, values

    def unit_rows(self, topic: str, queue_id: int, start: int, stop: int) -> list[tuple[int, bytes]]:
        """(cqOffset, 28-byte value) of a queue's units in [start, stop) (0 <= start < stop), as one list."""
        prefix = queue_prefix(topic, queue_id)
        n = len(prefix)
        rows = self.db.range("default", prefix + start.to_bytes(8, "big"), prefix + stop.to_bytes(8, "big"))
        bad = [k for k, v in rows if len(k) != n + 8 or len(v) != CQ_VALUE_SIZE]
        if bad:
            raise FormatError(f"consume queue {topic}/{queue_id}: key {bad[0].hex()} or its value does not follow "
                              f"the RocksDB CQ layout ({CQ_VALUE_SIZE}-byte values)", self.path)
        return [(int.from_bytes(k[n:], "big"), v) for k, v in rows]

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(first cqOffset, max offset): from the offset table's min and max entries where present, else from
        the first and last unit. max is ``getMaxOffsetInQueue`` (last cqOffset + 1; 0 for no unit)."""
        ent = self.offsets().get((topic, queue_id), {})
        first = last = None
        if "min" in ent:
            first = ent["min"].cq_offset
        if "max" in ent:
            last = ent["max"].cq_offset
        if first is None or last is None:
            offs = [o for o, _ in self.units(topic, queue_id)] if first is None or last is None else []
            if first is None:
                first = offs[0] if offs else 0
            if last is None:
                last = offs[-1] if offs else -1
        return first, last + 1


def is_rocksdb_cq(store_root: str | os.PathLike) -> bool:
    """True if the store's ``consumequeue/`` is a RocksDB database."""
    return is_rocksdb_dir(Path(store_root) / STORE_CONSUMEQUEUE_DIR)
