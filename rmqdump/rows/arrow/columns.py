"""The record schema as a pyarrow schema, and its per-record column builder (the reference path).

Columns: the stable JSONL schema (:data:`rmqdump.rows.schema.FIELDS`) in proper types (``body``
is binary, ``properties`` a map, ``keys`` a list), then lineage columns ``broker``,
``store``, ``segment`` (full path of the segment file), ``crc_ok`` and ``store_time``
(``store_timestamp`` as a UTC timestamp; null when outside years 1970-9999).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, tags_hash
from rmqdump.codec.layout import (
    MESSAGE_MAGIC_CODE_V2,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
)
from rmqdump.codec.msgid import format_host
from rmqdump.codec.properties import split_keys
from rmqdump.codec.record import Message
from rmqdump.rows.schema import output_body

_MAX_TS_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
_SCHEDULE_RAW = SCHEDULE_TOPIC.encode()

_STR = pa.string()
#: Types of the JSONL fields, in FIELDS order.
_FIELD_TYPES: dict[str, pa.DataType] = {
    "offset": pa.int64(), "file": _STR, "file_pos": pa.int64(), "size": pa.int32(), "magic": _STR,
    "body_crc": pa.int32(), "queue_id": pa.int32(), "flag": pa.int32(), "queue_offset": pa.int64(),
    "physical_offset": pa.int64(), "sys_flag": pa.int32(), "transaction": _STR, "compression": _STR,
    "born_timestamp": pa.int64(), "born_host": _STR, "store_timestamp": pa.int64(), "store_host": _STR,
    "reconsume_times": pa.int32(), "prepared_transaction_offset": pa.int64(), "topic": _STR,
    # the exact layout Spark's to_arrow_schema produces, so batches pass its schema check as they are
    "properties": pa.map_(pa.field("key", _STR, nullable=False), pa.field("value", _STR)),
    "keys": pa.list_(pa.field("element", _STR)), "tags": _STR, "uniq_key": _STR, "msg_id": _STR,
    "tags_code": pa.int64(), "body_length": pa.int32(), "body": pa.binary(),
}
LINEAGE_FIELDS = ("broker", "store", "segment", "crc_ok", "store_time")
_LINEAGE_TYPES: dict[str, pa.DataType] = {
    "broker": _STR, "store": _STR, "segment": _STR, "crc_ok": pa.bool_(), "store_time": pa.timestamp("us", tz="UTC"),
}

#: The record schema: JSONL fields then lineage columns (all nullable).
RECORD_SCHEMA = pa.schema([pa.field(n, t) for n, t in (*_FIELD_TYPES.items(), *_LINEAGE_TYPES.items())])
COLUMNS = tuple(RECORD_SCHEMA.names)


class _Columns:
    """Rows of one batch under construction (tuples in :data:`COLUMNS` order), with per-split caches."""

    def __init__(self, broker: str, store: str, segment: str, delay_levels_ms: list[int]):
        self.rows: list[tuple] = []
        self.body_bytes = 0
        self.broker, self.store, self.segment = broker, store, segment
        self.delay = delay_levels_ms
        self.hosts: dict[tuple, str] = {}
        self.tag_codes: dict[str | None, int] = {}
        self.flags: dict[int, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def host(self, addr: bytes, port: int) -> str:
        key = (addr, port)
        h = self.hosts.get(key)
        if h is None:
            h = self.hosts[key] = format_host(addr, port)
        return h

    def add(self, m: Message, body: bytes | None, crc_ok: bool | None) -> None:
        """Append one message (the values of :func:`rmqdump.rows.schema.message_to_dict`)."""
        props = m.properties
        tags = props.get(PROPERTY_TAGS)
        if m.topic_raw == _SCHEDULE_RAW:
            try:
                tags_code = m.tags_code(self.delay)
            except Exception:  # a malformed DELAY: the broker would not dispatch it either
                tags_code = None
        else:  # dispatch_tags_code of any other topic: the TAGS hash
            tags_code = self.tag_codes.get(tags)
            if tags_code is None:
                tags_code = self.tag_codes[tags] = tags_hash(tags)
        sf = m.sys_flag
        names = self.flags.get(sf)
        if names is None:
            names = self.flags[sf] = (m.transaction, m.compression)
        ts = m.store_timestamp
        self.rows.append((
            m.offset, m.file, m.file_pos, m.size, "v2" if m.magic == MESSAGE_MAGIC_CODE_V2 else "v1", m.body_crc,
            m.queue_id, m.flag, m.queue_offset, m.physical_offset, sf, names[0], names[1], m.born_timestamp,
            self.host(m.born_addr, m.born_port), ts, self.host(m.store_addr, m.store_port), m.reconsume_times,
            m.prepared_transaction_offset, m.topic, props, split_keys(props.get(PROPERTY_KEYS)), tags,
            props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), m.msg_id, tags_code, m.body_length, body,
            self.broker, self.store, self.segment, crc_ok, ts * 1000 if 0 <= ts <= _MAX_TS_MS else None,
        ))
        if body is not None:
            self.body_bytes += len(body)

    def to_batch(self) -> pa.RecordBatch:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(COLUMNS)
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, RECORD_SCHEMA, strict=True)]
        self.rows = []
        self.body_bytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=RECORD_SCHEMA)


def messages_batch(messages: Iterable[Message], *, broker: str, store: str, segment_of: Callable[[Message], str],
                   include_body: bool = False, decompress: bool = False,
                   delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> pa.RecordBatch:
    """Decoded messages (e.g. lookup hits) as one batch of :data:`RECORD_SCHEMA`; ``segment_of(msg)``
    names the segment path for the lineage column. ``crc_ok`` is taken from the messages."""
    cols = _Columns(broker, store, "", delay_levels_ms)
    for m in messages:
        body = output_body(m, decompress) if include_body else None
        cols.segment = segment_of(m)
        cols.add(m, body, m.crc_ok)
    return cols.to_batch()


def empty_batch() -> pa.RecordBatch:
    """A zero-row batch of :data:`RECORD_SCHEMA`."""
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)
