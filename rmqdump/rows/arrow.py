"""Core -> Arrow: the record schema as a pyarrow schema and bounded record batches per segment.

A commitlog segment is the unit of work (the *split*): records never cross a segment
boundary (the end-of-file BLANK rule), so every segment is walked on its own with the
core :class:`~rmqdump.store.commitlog.Walk` and turned into :class:`pyarrow.RecordBatch` es of
at most ``batch_size`` rows / ``max_batch_bytes`` body bytes. The single-process export
and the Spark data source share this module; it imports pyarrow but never pyspark.

Columns: the stable JSONL schema (:data:`rmqdump.rows.schema.FIELDS`) in proper types (``body``
is binary, ``properties`` a map, ``keys`` a list), then lineage columns ``broker``,
``store``, ``segment`` (full path of the segment file), ``crc_ok`` and ``store_time``
(``store_timestamp`` as a UTC timestamp; null when outside years 1970-9999).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa

from rmqdump.codec.crc import body_crc
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, tags_hash
from rmqdump.codec.layout import (
    MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE_V2,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    STORE_COMMITLOG_DIR,
)
from rmqdump.codec.msgid import format_host
from rmqdump.codec.properties import split_keys
from rmqdump.codec.record import Blank, Message
from rmqdump.disk.segment import Segment
from rmqdump.errors import StoreError
from rmqdump.rows.filters import RecordFilter
from rmqdump.store.commitlog import CommitLog, Skipped
from rmqdump.store.root import Store

DEFAULT_BATCH_SIZE = 8192
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
CRC_MODES = ("check", "flag", "off")
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


@dataclass(frozen=True)
class SegmentSplit:
    """One commitlog segment of one store: the unit of parallel work (picklable, paths as str)."""

    store: str  # the path the user gave for the store
    broker: str
    path: str  # segment file
    start: int
    size: int
    index: int  # position in the global split list (stable output file names)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def segment(self) -> Segment:
        return Segment(Path(self.path), self.start, self.size)


@dataclass
class SegmentReport:
    """How the walk of one segment ended."""

    segment: str
    records: int  # valid records walked (before filtering)
    rows: int  # rows produced (after filtering)
    stop_kind: str  # end_of_data, blank (clean BLANK end), or the invalid kind that stopped it
    stop_offset: int
    stop_detail: str
    skipped: int  # damaged ranges stepped over (keep_going)


def broker_name(path: str | os.PathLike) -> str:
    """A default broker name for a store path: its directory name (the parent's for ``store``/``commitlog``
    directories and segment files)."""
    p = Path(os.path.abspath(path))
    if p.is_file():
        p = p.parent
    if p.name == STORE_COMMITLOG_DIR:
        p = p.parent
    if p.name == "store" and p.parent.name:
        p = p.parent
    return p.name or str(p)


def segment_splits(paths: Iterable[str | os.PathLike], brokers: dict[str, str] | None = None) -> list[SegmentSplit]:
    """Every segment of every store in ``paths`` as a split (stores in the given order)."""
    out: list[SegmentSplit] = []
    for path in paths:
        key = os.fspath(path)
        cl = Store.open(key).commitlog
        broker = (brokers or {}).get(key) or broker_name(key)
        for seg in cl.segments:
            out.append(SegmentSplit(key, broker, str(seg.path), seg.start, seg.size, len(out)))
    return out


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


def read_split(split: SegmentSplit, *, batch_size: int = DEFAULT_BATCH_SIZE,
               max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, include_body: bool = False, decompress: bool = False,
               flt: RecordFilter | None = None, crc: str = "check", keep_going: bool = False, use_mmap: bool = True,
               max_record_size: int = MAX_RECORD_SIZE, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS,
               on_segment: Callable[[SegmentReport], None] | None = None,
               fast: bool | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of one segment (see :func:`record_batches` for the options).

    ``fast``: use the compiled walk (:mod:`rmqdump.fast.walk`) and build the columns from its
    batches with the compiled renderer (:func:`rmqdump.fast.render.derive`: properties, keys,
    tags, hosts, msg_id as Arrow offsets + data) and numpy, instead of one Python call per
    record — same rows (records it cannot derive identically, e.g. IPv6 hosts or undecodable
    properties, go through the per-record path in their place). Segments of at least
    ``READ_AHEAD_BYTES`` are walked on a helper thread meanwhile. None: when available and the
    segment is big enough (``fastwalk.use_fast``); never with ``keep_going``, ``crc="flag"``
    or ``use_mmap=False``.
    """
    if crc not in CRC_MODES:
        raise ValueError(f"crc must be one of {CRC_MODES}, not {crc!r}")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    if fast is not False and not keep_going and crc != "flag" and use_mmap and _fast_usable(split.size, fast):
        yield from _fast_read_split(split, batch_size=batch_size, include_body=include_body, decompress=decompress,
                                    flt=flt, crc=crc, max_record_size=max_record_size,
                                    delay_levels_ms=delay_levels_ms, on_segment=on_segment)
        return
    seg = split.segment()
    cl = CommitLog([seg], seg.size, seg.path.parent, [])
    walk = cl.walk(start=seg.start, end=seg.end, check_crc=crc == "check", read_body=include_body or crc == "flag",
                   keep_going=keep_going, use_mmap=use_mmap, max_record_size=max_record_size)
    match = None if flt is None or flt.empty else flt.match
    cols = _Columns(split.broker, split.store, split.path, delay_levels_ms)
    rows = skipped = 0
    blank = None
    for rec in walk:
        if isinstance(rec, Message):
            if match is not None and not match(rec):
                continue
            body = rec.body
            if crc == "flag":  # like the decoder's check: None for an empty body
                crc_ok = None if rec.body_length <= 0 else body_crc(body) == rec.body_crc
            else:
                crc_ok = rec.crc_ok
            if not include_body:
                body = None
            elif decompress and rec.compression != "none":
                body = rec.decompressed_body()
            cols.add(rec, body, crc_ok)
            if len(cols) >= batch_size or cols.body_bytes >= max_batch_bytes:
                rows += len(cols)
                yield cols.to_batch()
        elif isinstance(rec, Blank):
            blank = rec
        elif isinstance(rec, Skipped):
            skipped += 1
    if len(cols):
        rows += len(cols)
        yield cols.to_batch()
    if on_segment is not None:
        stop = walk.stop
        if blank is not None and stop is not None and stop.offset >= seg.end:
            kind, off, detail = "blank", blank.offset, f"BLANK record of {blank.size} bytes ends the file"
        elif stop is not None:
            kind, off, detail = stop.kind, stop.offset, stop.detail
        else:
            kind, off, detail = "end_of_data", seg.end, "end of the segment"
        on_segment(SegmentReport(split.path, walk.records, rows, kind, off, detail, skipped))


def messages_batch(messages: Iterable[Message], *, broker: str, store: str, segment_of: Callable[[Message], str],
                   include_body: bool = False, decompress: bool = False,
                   delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> pa.RecordBatch:
    """Decoded messages (e.g. lookup hits) as one batch of :data:`RECORD_SCHEMA`; ``segment_of(msg)``
    names the segment path for the lineage column. ``crc_ok`` is taken from the messages."""
    cols = _Columns(broker, store, "", delay_levels_ms)
    for m in messages:
        body = m.body if include_body else None
        if body is not None and decompress and m.compression != "none":
            body = m.decompressed_body()
        cols.segment = segment_of(m)
        cols.add(m, body, m.crc_ok)
    return cols.to_batch()


def record_batches(source: str | os.PathLike | Store | CommitLog | Segment | SegmentSplit,
                   batch_size: int = DEFAULT_BATCH_SIZE, include_body: bool = False, **options
                   ) -> Iterator[pa.RecordBatch]:
    """Record batches of a store, commitlog, one segment or one split, one segment at a time.

    Options (keywords): ``decompress`` (bodies, needs ``include_body``), ``flt`` (a
    :class:`~rmqdump.rows.filters.RecordFilter`), ``crc`` (``check``: stop a segment at a body-CRC
    mismatch like ``scan``; ``flag``: keep walking and set ``crc_ok``; ``off``), ``keep_going``
    (resynchronise past damage inside a segment), ``use_mmap``, ``max_record_size``,
    ``max_batch_bytes``, ``broker`` (name for the lineage column), ``on_segment`` (called
    with a :class:`SegmentReport` after each segment).

    Every segment is walked from its first byte to its own end of valid data, independently
    of the others (the Spark split); on a healthy store this equals one ``scan`` walk.
    """
    broker = options.pop("broker", None)
    for split in iter_splits(source, broker):
        yield from read_split(split, batch_size=batch_size, include_body=include_body, **options)


def iter_splits(source: str | os.PathLike | Store | CommitLog | Segment | SegmentSplit,
                broker: str | None = None) -> list[SegmentSplit]:
    """The splits of any commitlog source (a path, Store, CommitLog, Segment or SegmentSplit)."""
    if isinstance(source, SegmentSplit):
        return [source]
    if isinstance(source, Segment):
        return [SegmentSplit(str(source.path), broker or broker_name(source.path), str(source.path),
                             source.start, source.size, 0)]
    if isinstance(source, Store):
        label = str(source.root) if source.root is not None else str(source.commitlog.location)
        segs = source.commitlog.segments
    elif isinstance(source, CommitLog):
        label = str(source.location)
        segs = source.segments
    elif isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        segs = Store.open(label).commitlog.segments
    else:
        raise StoreError(f"not a commitlog source: {type(source).__name__}")
    name = broker or broker_name(label)
    return [SegmentSplit(label, name, str(s.path), s.start, s.size, i) for i, s in enumerate(segs)]


def empty_batch() -> pa.RecordBatch:
    """A zero-row batch of :data:`RECORD_SCHEMA`."""
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)


# --- ConsumeQueue and index files as tables (for joins) ----------------------------------------

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
    for path in paths:
        key = os.fspath(path)
        root = _store_root(key)
        size = infer_store_cq_file_size(root)
        for ref in discover_queues(root):
            out.append(QueueSplit(key, broker_name(key), str(root), ref.topic, ref.queue_id, str(ref.path), size))
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
    for path in paths:
        key = os.fspath(path)
        out.extend(IndexSplit(key, broker_name(key), str(p)) for p in list_index_files(_store_root(key)))
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


# --- the vectorised path: compiled walk + compiled column renderer (rmqdump.fast.render) -------------

_V4_ONLY = 0x30  # BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG


def _fast_usable(nbytes: int, fast: bool | None) -> bool:
    try:
        from rmqdump.fast import walk as fastwalk
    except ImportError:  # pragma: no cover - numpy missing
        return False
    if fast:
        return fastwalk.fast_available()
    return fastwalk.use_fast(nbytes)


def _binary(offsets, values) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def _gather(rb, field: str) -> pa.Array:
    """One variable-length field (topic, properties, body) of every record as a binary array.

    The fields lie in increasing, disjoint byte ranges of the segment, so for big fields
    (bodies) one mask over the batch's span selects them all in order, cheaper than
    ``RecordBatch.gather``'s index per byte.
    """
    import numpy as np

    starts = rb.columns[f"{field}_start"]
    lengths = np.maximum(rb.columns[f"{field}_length"], 0).astype(np.int64)
    n = rb.n
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise OverflowError("more than 2 GiB of one field in a batch")
    if n == 0 or offsets[-1] == 0:
        return _binary(offsets.astype(np.int32), np.zeros(0, dtype=np.uint8))
    nz = lengths > 0
    lo = int(starts[nz][0])
    hi = int((starts + lengths)[nz][-1])
    if offsets[-1] * 8 < hi - lo:  # small fields (topics, properties): an index per byte is cheaper
        return _binary(*rb.gather(field))
    edge = np.zeros(hi - lo + 1, dtype=np.int8)
    edge[starts[nz] - lo] = 1
    edge[starts[nz] + lengths[nz] - lo] -= 1
    mask = np.cumsum(edge[:-1], dtype=np.int8).view(bool)
    return _binary(offsets.astype(np.int32), rb.buf[lo:hi][mask])


class _FastContext:
    """Per-split state of the vectorised builder (the split, delay levels, sysflag names)."""

    def __init__(self, split: SegmentSplit, delay_levels_ms: list[int]):
        self.split = split
        self.delay = delay_levels_ms
        self.flags: dict[int, tuple[str, str]] = {}

    def flag_columns(self, sys_flag) -> tuple[pa.Array, pa.Array]:
        """The transaction and compression names of every row."""
        import numpy as np

        n = len(sys_flag)
        first = int(sys_flag[0]) if n else 0
        if n and (sys_flag == first).all():  # the usual case: one sysflag in the whole batch
            tx, comp = self._names(first)
            return pa.repeat(pa.scalar(tx, pa.string()), n), pa.repeat(pa.scalar(comp, pa.string()), n)
        uniq, inverse = np.unique(sys_flag, return_inverse=True)
        names = [self._names(f) for f in uniq.tolist()]
        idx = pa.array(inverse.ravel())
        return (pa.array([t for t, _ in names], pa.string()).take(idx),
                pa.array([c for _, c in names], pa.string()).take(idx))

    def _names(self, f: int) -> tuple[str, str]:
        names = self.flags.get(f)
        if names is None:  # Message's own properties, on a stand-in holding only the sysflag
            m = SimpleNamespace(sys_flag=f)
            names = self.flags[f] = (Message.transaction.fget(m), Message.compression.fget(m))
        return names


def _fast_columns(rb, d, ctx: _FastContext, include_body: bool, decompress: bool) -> pa.RecordBatch:
    """One fastwalk RecordBatch as Arrow columns; ``d``: its :func:`rmqdump.fast.render.derive` columns
    (properties, keys, tags, hosts, msg_id ...) built by the compiled renderer, no row flagged."""
    import numpy as np

    c = rb.columns
    n = rb.n
    sys_flag = c["sys_flag"]
    props_type = _FIELD_TYPES["properties"]
    properties = pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, d.entries]), d.names,
                                         d.values)
    if properties.type != props_type:
        properties = properties.cast(props_type)
    keys = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, d.keys]), d.key_values,
                                    type=_FIELD_TYPES["keys"])
    tags, uniq, topic = d.tags, d.uniq, d.topic
    tag_codes = d.tags_code
    tag_null = np.zeros(n, dtype=bool)
    sched = c["topic_length"] == len(_SCHEDULE_RAW)
    if sched.any():
        import pyarrow.compute as pc

        sched &= pc.equal(topic, SCHEDULE_TOPIC).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(sched).tolist():  # delivery times of the delay topic: per record
        try:
            tag_codes[i] = rb.message(i, read_body=False).tags_code(ctx.delay)
        except Exception:  # a malformed DELAY: the broker would not dispatch it either
            tag_null[i] = True
    ts = c["store_timestamp"].copy()
    ts_ok = (ts >= 0) & (ts <= _MAX_TS_MS)
    tx, comp = ctx.flag_columns(sys_flag)
    v2 = c["magic"] == MESSAGE_MAGIC_CODE_V2
    if v2.all() or not v2.any():
        magic = pa.repeat(pa.scalar("v2" if n and v2[0] else "v1", pa.string()), n)
    else:
        magic = pa.array(["v1", "v2"], pa.string()).take(pa.array(v2.astype(np.int8)))
    body = _gather(rb, "body") if include_body else pa.nulls(n, pa.binary())
    compressed = np.flatnonzero(sys_flag & 0x1) if include_body and decompress else ()
    if len(compressed):  # decompress those bodies, per record
        bodies = body.to_pylist()
        for i in compressed.tolist():
            m = rb.message(i, read_body=True)
            if m.compression != "none":
                bodies[i] = m.decompressed_body()
        body = pa.array(bodies, pa.binary())
    crc_flag = c["crc_ok"]
    split = ctx.split
    cols = {
        "offset": pa.array(c["file_pos"] + rb.seg_start), "file": pa.repeat(pa.scalar(rb.file, pa.string()), n),
        "file_pos": pa.array(c["file_pos"].copy()), "size": pa.array(c["size"].copy()), "magic": magic,
        "body_crc": pa.array(c["body_crc"].copy()), "queue_id": pa.array(c["queue_id"].copy()),
        "flag": pa.array(c["flag"].copy()), "queue_offset": pa.array(c["queue_offset"].copy()),
        "physical_offset": pa.array(c["physical_offset"].copy()), "sys_flag": pa.array(sys_flag.copy()),
        "transaction": tx, "compression": comp, "born_timestamp": pa.array(c["born_timestamp"].copy()),
        "born_host": d.born_host, "store_timestamp": pa.array(ts), "store_host": d.store_host,
        "reconsume_times": pa.array(c["reconsume_times"].copy()),
        "prepared_transaction_offset": pa.array(c["prepared_transaction_offset"].copy()), "topic": topic,
        "properties": properties, "keys": keys, "tags": tags, "uniq_key": uniq,
        "msg_id": d.msg_id,
        "tags_code": pa.array(tag_codes, pa.int64(), mask=tag_null), "body_length": pa.array(c["body_length"].copy()),
        "body": body, "broker": pa.repeat(pa.scalar(split.broker, pa.string()), n),
        "store": pa.repeat(pa.scalar(split.store, pa.string()), n),
        "segment": pa.repeat(pa.scalar(split.path, pa.string()), n),
        "crc_ok": pa.array(np.ones(n, dtype=bool), mask=crc_flag == 0),
        "store_time": pa.array(np.where(ts_ok, ts * 1000, 0), _LINEAGE_TYPES["store_time"], mask=~ts_ok),
    }
    return pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) if cols[f.name].type != f.type else cols[f.name]
                                       for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)


def _fast_pieces(rb, ctx: _FastContext, include_body: bool, decompress: bool,
                 flt: RecordFilter | None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one fastwalk batch, in row order: runs of rows the compiled renderer
    derived through :func:`_fast_columns`, the rows it flagged (IPv6 hosts, undecodable text)
    through the per-record :class:`_Columns`."""
    import numpy as np

    from rmqdump.fast import render as fastrender
    from rmqdump.fast.walk import RecordBatch

    d = fastrender.derive(rb)
    flags = d.flags.astype(bool)
    if not flags.any():
        runs = [(0, rb.n)]
    else:
        edges = np.flatnonzero(flags[1:] != flags[:-1]) + 1
        bounds = [0, *edges.tolist(), rb.n]
        runs = list(zip(bounds[:-1], bounds[1:], strict=True))
    split = ctx.split
    for lo, hi in runs:
        if flags[lo]:
            cols = _Columns(split.broker, split.store, split.path, ctx.delay)
            for m in rb.messages(include_body, lo, hi):
                if flt is not None and not flt.match(m):
                    continue
                body = m.body
                if body is not None and decompress and m.compression != "none":
                    body = m.decompressed_body()
                cols.add(m, body, m.crc_ok)
            yield cols.to_batch()
            continue
        if (lo, hi) == (0, rb.n):
            sub, sd = rb, d
        else:
            sub = RecordBatch(rb.buf, {k: v[lo:hi] for k, v in rb.columns.items()}, hi - lo, rb.seg_start, rb.file)
            sd = fastrender.derive(sub)
        batch = _fast_columns(sub, sd, ctx, include_body, decompress)
        if flt is not None:
            batch = batch.filter(flt.arrow_mask(batch))
        yield batch


#: Segments from this size are walked on a second thread while the first builds columns.
READ_AHEAD_BYTES = 64 * 1024 * 1024


def _read_ahead(walk, depth: int = 2) -> Iterator:
    """The batches of a fastwalk segment walk, walked (and CRC-checked) on a helper thread up to
    ``depth`` batches ahead: the kernels release the GIL, so the walk and the column building
    overlap. The batches are copies (the walk reuses its column arrays)."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for rb in walk:
                if not put(rb.copy()):
                    return
            put(done)
        except BaseException as e:  # re-raised on the consumer's thread
            put(e)

    t = threading.Thread(target=run, name="rmqdump-walk", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()


def _fast_read_split(split: SegmentSplit, *, batch_size: int, include_body: bool, decompress: bool,
                     flt: RecordFilter | None, crc: str, max_record_size: int, delay_levels_ms: list[int],
                     on_segment: Callable[[SegmentReport], None] | None) -> Iterator[pa.RecordBatch]:
    from rmqdump.fast import walk as fastwalk

    seg = split.segment()
    ctx = _FastContext(split, delay_levels_ms)
    flt = None if flt is None or flt.empty else flt
    rows = 0
    walk = fastwalk.walk_segment_fast(seg, check_crc=crc == "check", max_record_size=max_record_size)
    batches = _read_ahead(walk) if split.size >= READ_AHEAD_BYTES and fastwalk.default_jobs() > 1 else walk
    try:
        for rb in batches:
            for batch in _fast_pieces(rb, ctx, include_body, decompress, flt):
                for start in range(0, batch.num_rows, batch_size):
                    piece = batch.slice(start, batch_size)
                    rows += piece.num_rows
                    yield piece
    finally:
        if batches is not walk:
            batches.close()  # stops and joins the walking thread
        walk.close()
    if on_segment is not None:
        st = walk.stop
        if st is None:
            kind, off, detail = "end_of_data", seg.end, "end of the segment"
        elif st.kind == "blank":
            kind, off, detail = "blank", st.offset, f"BLANK record of {st.blank.size} bytes ends the file"
        elif st.kind == "invalid":
            kind, off, detail = st.invalid.kind, st.invalid.offset, st.invalid.detail
        else:
            kind, off, detail = "end_of_data", seg.end, "end of the last commitlog segment"
        on_segment(SegmentReport(split.path, walk.records, rows, kind, off, detail, 0))
