"""Record filters shared by scan, export and the Spark source: one :class:`RecordFilter`, its forms side
by side - :meth:`~RecordFilter.match` (one decoded record, the reference), :meth:`~RecordFilter.batch_mask`
(numpy, a compiled walk's :class:`~rmqdump.fast.walk.RecordBatch`) and :meth:`~RecordFilter.arrow_mask`
(pyarrow, an Arrow record batch). A new criterion goes into all three."""

from __future__ import annotations

from dataclasses import dataclass, field

from rmqdump.codec.record import Message


@dataclass
class RecordFilter:
    """Which records to keep; every given criterion must match. Times are store time, epoch ms."""

    topics: tuple[str, ...] = ()
    queue_id: int | None = None
    tags: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    since: int | None = None
    until: int | None = None
    topic_bytes: frozenset = field(default=frozenset(), init=False, repr=False)  # topics as stored (UTF-8)

    def __post_init__(self):
        self.topic_bytes = frozenset(t.encode("utf-8") for t in self.topics)

    @property
    def empty(self) -> bool:
        return not (self.topics or self.tags or self.keys) and self.queue_id is None and \
            self.since is None and self.until is None

    def match(self, m: Message) -> bool:
        if self.topic_bytes and m.topic_raw not in self.topic_bytes:
            return False
        if self.queue_id is not None and m.queue_id != self.queue_id:
            return False
        if self.since is not None and m.store_timestamp < self.since:
            return False
        if self.until is not None and m.store_timestamp > self.until:
            return False
        if self.tags and m.tags not in self.tags:
            return False
        if self.keys:
            have = set(m.keys)
            if m.uniq_key:
                have.add(m.uniq_key)
            if not have.intersection(self.keys):
                return False
        return True

    def batch_mask(self, rb):
        """:meth:`match` of every row of a compiled walk's batch, vectorised (numpy): topic, queue and time
        criteria (scan takes the compiled path only without tags and keys)."""
        import numpy as np

        keep = np.ones(rb.n, dtype=bool)
        if self.queue_id is not None:
            keep &= rb["queue_id"] == self.queue_id
        ts = rb["store_timestamp"]
        if self.since is not None:
            keep &= ts >= self.since
        if self.until is not None:
            keep &= ts <= self.until
        if self.topics:
            starts, lengths = rb["topic_start"], rb["topic_length"]
            hit = np.zeros(rb.n, dtype=bool)
            for raw in self.topic_bytes:
                rows = np.flatnonzero(keep & (lengths == len(raw)))
                if len(raw) and len(rows):
                    got = rb.buf[starts[rows][:, None] + np.arange(len(raw))]
                    rows = rows[(got == np.frombuffer(raw, dtype=np.uint8)).all(axis=1)]
                hit[rows] = True
            keep &= hit
        return keep

    def arrow_mask(self, batch):
        """:meth:`match` of every row of an Arrow record batch, vectorised (topics compared as raw bytes)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keep = np.ones(batch.num_rows, dtype=bool)
        if self.topics:
            raw = pc.cast(batch.column("topic"), pa.binary())
            keep &= pc.is_in(raw, value_set=pa.array(sorted(self.topic_bytes), pa.binary())).to_numpy(zero_copy_only=False)
        if self.queue_id is not None:
            keep &= batch.column("queue_id").to_numpy() == self.queue_id
        ts = batch.column("store_timestamp").to_numpy()
        if self.since is not None:
            keep &= ts >= self.since
        if self.until is not None:
            keep &= ts <= self.until
        if self.tags:
            tags = pc.is_in(batch.column("tags"), value_set=pa.array(list(self.tags), pa.string()))
            keep &= pc.fill_null(tags, False).to_numpy(zero_copy_only=False)
        if self.keys:
            want = pa.array(list(self.keys), pa.string())
            keys = batch.column("keys")
            hit = pc.is_in(pc.list_flatten(keys), value_set=want).to_numpy(zero_copy_only=False)
            any_key = np.bincount(pc.list_parent_indices(keys).to_numpy()[hit], minlength=batch.num_rows) > 0
            uniq = pc.fill_null(pc.is_in(batch.column("uniq_key"), value_set=want), False).to_numpy(zero_copy_only=False)
            keep &= any_key | uniq
        return pa.array(keep)
