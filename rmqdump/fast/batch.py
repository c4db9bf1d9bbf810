"""A compiled walk's output: :class:`RecordBatch`, up to ``BATCH_RECORDS`` valid messages of one segment as
numpy columns (``COLUMNS``), turned back into the pure decoder's :class:`~rmqdump.codec.record.Message`
objects on demand; :class:`_Columns`, the preallocated arrays the kernel fills."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rmqdump.codec.layout import (
    BORN_HOST_POSITION,
    BORNHOST_V6_FLAG,
    HOST_V4_LENGTH,
    STORE_HOST_BASE,
    STOREHOSTADDRESS_V6_FLAG,
    host_lengths,
)
from rmqdump.codec.record import Message
from rmqdump.fast.abi import COLUMNS, DERIVED_COLUMNS, NOT_ASCII
from rmqdump.fast.engine import _numpy

_V6_HOSTS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_BORN_ADDR_V4 = BORN_HOST_POSITION  # the IPv4 addresses when neither host is IPv6
_STORE_ADDR_V4 = STORE_HOST_BASE + HOST_V4_LENGTH

if TYPE_CHECKING:
    import numpy as np

BATCH_RECORDS = 65536
BATCH_BYTES = 16 * 1024 * 1024  # bound a batch's span too (mapped pages are released behind it)


class _Columns:
    """Preallocated column arrays, reused batch after batch (``derived``: also ``DERIVED_COLUMNS``)."""

    def __init__(self, capacity: int, derived: bool = False):
        np = _numpy()
        self.capacity = capacity
        self.derived = derived
        self.arrays = {}
        self.pointers = []  # data addresses, in COLUMNS order (the kernel's argument block)
        for name, dt in COLUMNS:
            if dt == "16u1":  # filled as two native uint64 words, read as 16 bytes
                words = np.zeros((capacity, 2), dtype=np.uint64)
                self.arrays[name] = words.view(np.uint8)
                self.pointers.append(words.ctypes.data)
            else:
                self.arrays[name] = np.zeros(capacity, dtype=dt)
                self.pointers.append(self.arrays[name].ctypes.data)
        self.derived_pointers = []
        for name, dt in DERIVED_COLUMNS if derived else ():
            self.arrays[name] = np.zeros(capacity, dtype=dt)
            self.derived_pointers.append(self.arrays[name].ctypes.data)

    def like(self) -> _Columns:
        """Another set of the same capacity and columns."""
        return _Columns(self.capacity, self.derived)

    def set_row(self, i: int, msg: Message, body_start: int, topic_start: int, props_start: int) -> None:
        a = self.arrays
        for name in ("size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
                     "sys_flag", "born_timestamp", "born_port", "store_timestamp", "store_port",
                     "reconsume_times", "prepared_transaction_offset", "body_length"):
            a[name][i] = getattr(msg, name)
        a["file_pos"][i] = msg.file_pos
        for name, addr in (("born_addr", msg.born_addr), ("store_addr", msg.store_addr)):
            row = a[name][i]
            row[:] = 0
            row[:len(addr)] = _numpy().frombuffer(addr, dtype="uint8")
        a["body_start"][i] = body_start
        a["topic_start"][i] = topic_start
        a["topic_length"][i] = len(msg.topic_raw)
        a["properties_start"][i] = props_start
        a["properties_length"][i] = len(msg.properties_raw)
        a["crc_ok"][i] = 1 if msg.crc_ok else 0
        if self.derived:  # a record the Python decoder took: its consumers read its bytes
            a["walk_topic"][i], a["props_check"][i], a["tags_hash"][i] = -1, -1, NOT_ASCII


class RecordBatch:
    """Up to ``BATCH_RECORDS`` consecutive valid messages of one segment, as columns.

    ``batch[name]`` is a numpy array of ``len(batch)`` values (``COLUMNS``; ``born_addr`` and
    ``store_addr`` are ``(n, 16)`` uint8 rows whose first 4 bytes hold an IPv4 address unless
    the sysflag says IPv6). ``crc_ok`` is 1 when the body CRC was checked and matched, 0 when
    not checked (``check_crc`` off or empty body), as ``Message.crc_ok`` True/None.
    The arrays are reused for the next batch: :meth:`copy` to keep them.
    """

    def __init__(self, buf: np.ndarray, columns: dict[str, np.ndarray], n: int, seg_start: int, file: str,
                 intern: object = None):
        self.buf = buf
        self.columns = {k: v[:n] for k, v in columns.items()}
        self.n = n
        self.seg_start = seg_start
        self.file = file
        self.intern = intern  # the TopicIntern of the derived columns' walk_topic ids (None: no derived columns)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def copy(self) -> RecordBatch:
        """A batch owning copies of its column arrays (still viewing the segment bytes)."""
        b = RecordBatch(self.buf, {k: v.copy() for k, v in self.columns.items()}, self.n, self.seg_start, self.file,
                        self.intern)
        return b

    @property
    def offsets(self) -> np.ndarray:
        """Absolute commitlog offsets of the records."""
        return self.columns["file_pos"] + self.seg_start

    def _slice(self, start: str, length: str, i: int) -> bytes:
        s = int(self.columns[start][i])
        n = max(int(self.columns[length][i]), 0)
        return self.buf[s:s + n].tobytes()

    def gather(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """One variable-length field of every record as Arrow-style ``(offsets, values)``:
        int32 offsets (n + 1) into a contiguous uint8 array. ``field``: topic, properties, body.
        (``pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(values)])``.)"""
        np = _numpy()
        name = {"topic": "topic", "properties": "properties", "body": "body"}[field]
        starts = self.columns[f"{name}_start"]
        lengths = np.maximum(self.columns[f"{name}_length"], 0).astype(np.int64)
        offsets = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total >= 1 << 31:
            raise OverflowError("more than 2 GiB in one batch: use smaller batches")
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        return offsets.astype(np.int32), self.buf[index]

    def holding(self, rows: np.ndarray, *needles: bytes) -> list[int]:
        """The records among ``rows`` whose properties contain one of ``needles`` (in order, each once; searched in
        one copy of their properties bytes, a NUL after each, so that no match spans two records)."""
        np = _numpy()
        starts = self.columns["properties_start"][rows]
        lens = np.maximum(self.columns["properties_length"][rows], 0).astype(np.int64)
        bounds = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lens + 1, out=bounds[1:])
        index = np.repeat(starts - bounds[:-1], lens + 1) + np.arange(int(bounds[-1]), dtype=np.int64)
        np.minimum(index, self.buf.size - 1, out=index)
        flat = self.buf[index]
        flat[bounds[1:] - 1] = 0
        text = flat.tobytes()
        found: set[int] = set()
        for needle in needles:
            at = text.find(needle)
            while at >= 0:
                r = int(np.searchsorted(bounds, at, side="right")) - 1
                found.add(r)
                at = text.find(needle, int(bounds[r + 1]))
        return [int(rows[r]) for r in sorted(found)]

    def topic_raw(self, i: int) -> bytes:
        return self._slice("topic_start", "topic_length", i)

    def properties_raw(self, i: int) -> bytes:
        return self._slice("properties_start", "properties_length", i)

    def body(self, i: int) -> bytes:
        return self._slice("body_start", "body_length", i)

    def message(self, i: int, read_body: bool = True) -> Message:
        """Record ``i`` as the :class:`Message` the pure decoder builds."""
        return next(self.messages(read_body, i, i + 1))

    def messages(self, read_body: bool = True, lo: int = 0, hi: int | None = None) -> Iterator[Message]:
        """The records as :class:`Message` objects (identical to the pure decoder's)."""
        c = self.columns
        hi = self.n if hi is None else hi
        base = self.seg_start
        file = self.file
        cols = [c[name][lo:hi].tolist() for name in (
            "file_pos", "size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
            "sys_flag", "born_timestamp", "born_port", "store_timestamp", "store_port", "reconsume_times",
            "prepared_transaction_offset", "body_length", "body_start", "topic_start", "topic_length",
            "properties_start", "properties_length", "crc_ok")]
        with memoryview(self.buf) as mv:
            for (pos, size, magic, crc, qid, flag, qoff, phys, sysflag, born_ts, born_port, store_ts, store_port,
                 reconsume, prepared, body_len, bstart, tstart, tlen, pstart, plen, crc_ok) in zip(*cols, strict=True):
                if sysflag & _V6_HOSTS:
                    bh, sh = host_lengths(sysflag)
                    born_addr = mv[pos + BORN_HOST_POSITION:pos + BORN_HOST_POSITION + bh - 4].tobytes()
                    store_addr = mv[pos + STORE_HOST_BASE + bh:pos + STORE_HOST_BASE + bh + sh - 4].tobytes()
                else:
                    born_addr = mv[pos + _BORN_ADDR_V4:pos + _BORN_ADDR_V4 + 4].tobytes()
                    store_addr = mv[pos + _STORE_ADDR_V4:pos + _STORE_ADDR_V4 + 4].tobytes()
                yield Message(base + pos, file, pos, size, magic, crc, qid, flag, qoff, phys, sysflag, born_ts,
                              born_addr, born_port, store_ts, store_addr, store_port, reconsume, prepared, body_len,
                              mv[tstart:tstart + tlen].tobytes(), mv[pstart:pstart + plen].tobytes(),
                              mv[bstart:bstart + (body_len if body_len > 0 else 0)].tobytes() if read_body else None,
                              True if crc_ok else None)
