"""The vectorised record columns: Arrow columns built from the compiled walk's batches
(:mod:`rmqdump.fast.walk`) with the compiled column renderer (:mod:`rmqdump.fast.render`) and numpy,
the rows it cannot derive identically through the per-record :class:`~rmqdump.rows.arrow.columns._Columns`."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pyarrow as pa

from rmqdump.codec.layout import MESSAGE_MAGIC_CODE_V2, SCHEDULE_TOPIC
from rmqdump.codec.record import Message
from rmqdump.rows.arrow.columns import (
    _FIELD_TYPES,
    _LINEAGE_TYPES,
    _MAX_TS_MS,
    _SCHEDULE_RAW,
    RECORD_SCHEMA,
    _Columns,
)
from rmqdump.rows.arrow.splits import SegmentSplit
from rmqdump.rows.filters import RecordFilter
from rmqdump.rows.schema import BodyErrors, output_body

_V4_ONLY = 0x30  # BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG


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
        self.body_errors = BodyErrors()  # bodies that would not decompress (exported as stored)
        self._repeats: dict[tuple[str | None, int], pa.Array] = {}

    def repeat(self, value: str | None, n: int) -> pa.Array:
        """``value`` ``n`` times as a string array, one array per value and length for the split: the batches
        share it (its bytes are held once, not once per batch of a row group, and built once)."""
        key = (value, n)
        arr = self._repeats.get(key)
        if arr is None:
            if len(self._repeats) >= 32:
                self._repeats.clear()
            arr = self._repeats[key] = pa.repeat(pa.scalar(value, pa.string()), n)
        return arr

    def flag_columns(self, sys_flag) -> tuple[pa.Array, pa.Array]:
        """The transaction and compression names of every row."""
        import numpy as np

        n = len(sys_flag)
        first = int(sys_flag[0]) if n else 0
        if n and (sys_flag == first).all():  # the usual case: one sysflag in the whole batch
            tx, comp = self._names(first)
            return self.repeat(tx, n), self.repeat(comp, n)
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
        magic = ctx.repeat("v2" if n and v2[0] else "v1", n)
    else:
        magic = pa.array(["v1", "v2"], pa.string()).take(pa.array(v2.astype(np.int8)))
    body = _gather(rb, "body") if include_body else pa.nulls(n, pa.binary())
    compressed = np.flatnonzero(sys_flag & 0x1) if include_body and decompress else ()
    if len(compressed):  # decompress those bodies, per record
        bodies = body.to_pylist()
        for i in compressed.tolist():
            m = rb.message(i, read_body=True)
            if m.compression != "none":
                bodies[i] = output_body(m, True, ctx.body_errors)
        body = pa.array(bodies, pa.binary())
    crc_flag = c["crc_ok"]
    split = ctx.split
    cols = {
        "offset": pa.array(c["file_pos"] + rb.seg_start), "file": ctx.repeat(rb.file, n),
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
        "body": body, "broker": ctx.repeat(split.broker, n), "store": ctx.repeat(split.store, n),
        "segment": ctx.repeat(split.path, n),
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
                cols.add(m, output_body(m, decompress, ctx.body_errors), m.crc_ok)
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
