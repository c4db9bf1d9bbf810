"""Record filters shared by scan, export and the Spark source: one :class:`RecordFilter`, its forms side
by side - :meth:`~RecordFilter.match` (one decoded record, the reference), :meth:`~RecordFilter.batch_mask`
(numpy, a compiled walk's :class:`~rmqdump.fast.walk.RecordBatch`) and :meth:`~RecordFilter.arrow_mask`
(pyarrow, an Arrow record batch). A new criterion goes into all three.

The body criteria (``body_contains``, ``body_regex``) match the body as the producer sent it: decompressed
per the record's sysflag (a body that does not decompress is matched as stored). They need the records'
bodies: :meth:`~RecordFilter.match` wants messages read with their body, :meth:`~RecordFilter.batch_mask`
reads them from the walk's segment bytes, and an Arrow batch has none to match (``needs_body`` tells
callers to take the record path)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rmqdump.codec.layout import COMPRESSED_FLAG, COMPRESSION_NAMES, COMPRESSION_TYPE_COMPARATOR
from rmqdump.codec.record import Message, decompress
from rmqdump.errors import FormatError, RmqdumpError


def _plain_body(body: bytes, sys_flag: int) -> bytes:
    """``body`` decompressed per ``sys_flag`` (as stored when it is not compressed or does not decompress)."""
    if not sys_flag & COMPRESSED_FLAG or not body:
        return body
    try:
        return decompress(body, COMPRESSION_NAMES.get((sys_flag & COMPRESSION_TYPE_COMPARATOR) >> 8, "unknown"))
    except RmqdumpError:
        return body


@dataclass
class RecordFilter:
    """Which records to keep; every given criterion must match. Times are store time, epoch ms."""

    topics: tuple[str, ...] = ()
    queue_id: int | None = None
    tags: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    since: int | None = None
    until: int | None = None
    body_contains: tuple[str, ...] = ()  # any of these texts (UTF-8) in the body
    body_regex: str | None = None  # Python regex searched in the body (UTF-8, undecodable bytes kept as escapes)
    topic_bytes: frozenset = field(default=frozenset(), init=False, repr=False)  # topics as stored (UTF-8)
    _texts: tuple = field(default=(), init=False, repr=False)
    _regex: re.Pattern | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.topic_bytes = frozenset(t.encode("utf-8") for t in self.topics)
        self._texts = tuple(t.encode("utf-8") for t in self.body_contains)
        if self.body_regex is not None:
            try:
                self._regex = re.compile(self.body_regex)
            except (re.error, RecursionError, OverflowError) as e:
                raise FormatError(f"bad body regex {self.body_regex!r}: {e}") from None

    @property
    def empty(self) -> bool:
        return not (self.topics or self.tags or self.keys) and self.queue_id is None and \
            self.since is None and self.until is None and not self.needs_body

    @property
    def needs_body(self) -> bool:
        """Whether a body criterion is given (the records must be read with their bodies)."""
        return bool(self.body_contains) or self.body_regex is not None

    def body_match(self, body: bytes, sys_flag: int) -> bool:
        """The body criteria on one stored body (decompressed per ``sys_flag`` first)."""
        plain = _plain_body(body, sys_flag)
        if self._texts and not any(t in plain for t in self._texts):
            return False
        return self._regex is None or self._regex.search(plain.decode("utf-8", "surrogateescape")) is not None

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
        if self.keys and not self._has_key(m):
            return False
        if self.needs_body:
            if m.body is None:
                raise ValueError("body criteria need messages read with their body")
            return self.body_match(m.body, m.sys_flag)
        return True

    def batch_mask(self, rb):
        """:meth:`match` of every row of a compiled walk's batch, vectorised (numpy): topic, queue and time
        criteria and the body criteria (bodies from the segment bytes the batch views, for the rows the other
        criteria keep); tags and keys on the rows whose properties hold a wanted text, decoded."""
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
        if self.tags or self.keys:
            self._property_mask(rb, keep)
        if self.needs_body:
            sys_flags = rb["sys_flag"]
            for i in np.flatnonzero(keep).tolist():
                keep[i] = self.body_match(rb.body(i), int(sys_flags[i]))
        return keep

    def _property_mask(self, rb, keep) -> None:
        """The tag and key criteria on the rows ``keep`` holds (cleared in place where they fail): only rows whose
        properties hold the bytes of a wanted tag and of a wanted key are decoded and judged by :meth:`match`'s
        rules. A wanted text with U+FFFD (it may stand for undecodable bytes) has no such bytes: every row is."""
        import numpy as np

        rows = np.flatnonzero(keep)
        for wanted in (self.tags, self.keys):
            if wanted and rows.size and all("\ufffd" not in w for w in wanted):
                rows = np.array(rb.holding(rows, *(w.encode("utf-8", "surrogatepass") for w in wanted)), np.int64)
        keep[:] = False
        for i in rows.tolist():
            m = rb.message(i, read_body=False)
            keep[i] = (not self.tags or m.tags in self.tags) and (not self.keys or self._has_key(m))

    def _has_key(self, m: Message) -> bool:
        have = set(m.keys)
        if m.uniq_key:
            have.add(m.uniq_key)
        return bool(have.intersection(self.keys))

    def arrow_mask(self, batch):
        """:meth:`match` of every row of an Arrow record batch, vectorised (topics compared as raw bytes).
        Not for body criteria (:attr:`needs_body`): a batch holds no body, or one already rendered."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.needs_body:
            raise ValueError("body criteria cannot be applied to Arrow batches: filter the records (match)")
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
