"""Compiled fast path for the commitlog walk, the header decode and the body CRC.

Results are identical to the pure path (:class:`rmqdump.store.commitlog.Walk` /
:func:`rmqdump.codec.record.decode_record`): same records, same fields, same stop verdict (offset and
kind); ``tests/test_fastwalk.py`` checks this on every real store, the fixtures and hostile
inputs. Importing this module is cheap: numpy and numba (``pip install 'rmqdump[fast]'``) load
only when a fast walk actually runs, so small jobs should ask :func:`use_fast` first.

Layers:

* :func:`walk_segment_fast` / :func:`walk_buffer_fast` -> :class:`FastSegmentWalk`: iterate
  one segment as :class:`RecordBatch` column batches (numpy arrays of every fixed header field
  plus positions of body, topic and properties), then read ``.stop`` (:class:`SegmentStop`).
* :class:`FastWalk`: a drop-in for ``CommitLog.walk(...)`` (without ``keep_going``) yielding the
  same :class:`~rmqdump.codec.record.Message` / :class:`~rmqdump.codec.record.Blank` objects.
* :func:`summarize_segment`, :func:`verify_segments` (segments in parallel threads; the kernel
  releases the GIL) and :func:`parallel_segment_map` (any picklable function, in processes).

Kernels: numba code in :mod:`rmqdump.fast._kernels`, compiled once per machine (in a child
process) into a shared library under :func:`cache_dir` and then loaded with ctypes, so a run
pays neither numba's import (~0.4 s, ~90 MB) nor compilation; without a C compiler the same
kernels run through numba's JIT (numba's own cache). The kernels release the GIL.

Environment: ``RMQDUMP_FAST=0`` disables the fast path, ``RMQDUMP_FAST=1`` forces it whatever
the size; ``RMQDUMP_CRC=table`` uses the slice-by-8 table CRC instead of PCLMULQDQ folding;
``RMQDUMP_FAST_LIBRARY=0`` skips the shared library (numba JIT); ``RMQDUMP_CACHE_DIR`` moves
the cache (default ``$XDG_CACHE_HOME/rmqdump`` or ``~/.cache/rmqdump``); ``CC`` the compiler.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.codec.record import (
    END_OF_DATA,
    Blank,
    Invalid,
    Message,
    decode_record,
)
from rmqdump.errors import StoreError
from rmqdump.fast.abi import (
    A_BUF,
    A_BYTE_LIMIT,
    A_CHECK_CRC,
    A_COLUMNS,
    A_CRC_MODE,
    A_LIMIT,
    A_MAX_N,
    A_MAX_RECORD_SIZE,
    A_N,
    A_OUT_CODE,
    A_OUT_N,
    A_OUT_POS,
    A_POS,
    A_SEG_START,
    A_SIZE,
    A_STATS,
    ARG_BLOCK_SIZE,
    BLANK,
    COLUMNS,
    CRC_TABLE,
    DEFER,
    FULL,
    INVALID,
    KINDS,
    LIMIT,
)
from rmqdump.fast.engine import (  # noqa: F401 - the engine's names, re-exported for the callers
    FAST_THRESHOLD,
    Backend,
    _abi,
    _as_array,
    _cpu_signature,
    _import_fastkernels,
    _load_library,
    _np,
    _numpy,
    _toolchain_signature,
    backend,
    build_kernel_library,
    build_library,
    build_lock,
    cache_dir,
    crc32,
    crc_mode,
    fast_available,
    kernel_library_path,
    kernels,
    library_path,
    library_ready,
    use_fast,
)

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.disk.segment import Segment
    from rmqdump.store.commitlog import CommitLog

BATCH_RECORDS = 65536
BATCH_BYTES = 16 * 1024 * 1024  # bound a batch's span too (mapped pages are released behind it)

class _Columns:
    """Preallocated column arrays, reused batch after batch."""

    def __init__(self, capacity: int):
        np = _numpy()
        self.capacity = capacity
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


class RecordBatch:
    """Up to ``BATCH_RECORDS`` consecutive valid messages of one segment, as columns.

    ``batch[name]`` is a numpy array of ``len(batch)`` values (``COLUMNS``; ``born_addr`` and
    ``store_addr`` are ``(n, 16)`` uint8 rows whose first 4 bytes hold an IPv4 address unless
    the sysflag says IPv6). ``crc_ok`` is 1 when the body CRC was checked and matched, 0 when
    not checked (``check_crc`` off or empty body), as ``Message.crc_ok`` True/None.
    The arrays are reused for the next batch: :meth:`copy` to keep them.
    """

    def __init__(self, buf: np.ndarray, columns: dict[str, np.ndarray], n: int, seg_start: int, file: str):
        self.buf = buf
        self.columns = {k: v[:n] for k, v in columns.items()}
        self.n = n
        self.seg_start = seg_start
        self.file = file

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def copy(self) -> RecordBatch:
        """A batch owning copies of its column arrays (still viewing the segment bytes)."""
        b = RecordBatch(self.buf, {k: v.copy() for k, v in self.columns.items()}, self.n, self.seg_start, self.file)
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
                if sysflag & 0x30:
                    bh = 20 if sysflag & 0x10 else 8
                    born_addr = mv[pos + 48:pos + 44 + bh].tobytes()
                    store_addr = mv[pos + 56 + bh:pos + 52 + bh + (20 if sysflag & 0x20 else 8)].tobytes()
                else:
                    born_addr = mv[pos + 48:pos + 52].tobytes()
                    store_addr = mv[pos + 64:pos + 68].tobytes()
                yield Message(base + pos, file, pos, size, magic, crc, qid, flag, qoff, phys, sysflag, born_ts,
                              born_addr, born_port, store_ts, store_addr, store_port, reconsume, prepared, body_len,
                              mv[tstart:tstart + tlen].tobytes(), mv[pstart:pstart + plen].tobytes(),
                              mv[bstart:bstart + (body_len if body_len > 0 else 0)].tobytes() if read_body else None,
                              True if crc_ok else None)


@dataclass
class SegmentStop:
    """Why a segment walk ended.

    ``kind``: ``"end"`` (a record ended exactly at the end of the segment), ``"blank"`` (a valid
    end-of-file BLANK at ``pos``: ``blank`` holds it), ``"limit"`` (reached ``end_offset``) or
    ``"invalid"`` (``invalid`` holds the pure decoder's verdict at ``pos``).
    """

    kind: str
    pos: int
    offset: int
    invalid: Invalid | None = None
    blank: Blank | None = None

    @property
    def damaged(self) -> bool:
        """An invalid record other than unwritten (zero) space."""
        return self.invalid is not None and self.invalid.kind != END_OF_DATA


class FastSegmentWalk:
    """Walk one segment (or a buffer) with the compiled kernel; iterate for :class:`RecordBatch`.

    After iteration: ``stop`` (:class:`SegmentStop`), ``records``, ``end_pos`` (segment position
    after the last valid record; the segment size after a BLANK), ``phys_mismatches`` and
    ``first_phys_mismatch`` (records whose PHYSICALOFFSET field is not their offset; the broker
    does not check it, so neither does the walk - it only counts).
    """

    def __init__(self, *, segment: Segment | None = None, buf=None, seg_start: int = 0, name: str = "",
                 start_pos: int = 0, check_crc: bool = True, end_offset: int | None = None,
                 max_record_size: int = MAX_RECORD_SIZE, batch_records: int = BATCH_RECORDS,
                 batch_bytes: int = BATCH_BYTES, release_pages: bool = True, strict: bool = False,
                 columns: _Columns | None = None):
        self.k = backend()
        self.segment = segment
        self._mm = None
        if segment is not None:
            self.seg_start, self.name = segment.start, segment.name
            self._mm, self.buf = _map(segment)
        else:
            self.seg_start, self.name = seg_start, name
            self.buf = _as_array(buf)
        self.size = int(self.buf.size)
        self.start_pos = start_pos
        self.check_crc = check_crc
        self.limit = self.size + 1 if end_offset is None else max(end_offset - self.seg_start, -1)
        self.max_record_size = max_record_size
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.release_pages = release_pages and self._mm is not None and hasattr(self._mm, "madvise")
        self.strict = strict
        self.cols = columns if columns is not None and columns.capacity >= batch_records else _Columns(batch_records)
        np = _numpy()
        self.stats = np.array([0, -1], dtype=np.int64)
        a = self.block = np.zeros(ARG_BLOCK_SIZE, dtype=np.int64)
        a[A_BUF] = self.buf.ctypes.data if self.size else 0
        a[A_SIZE] = self.size
        a[A_LIMIT] = self.limit
        a[A_MAX_RECORD_SIZE] = max_record_size
        a[A_CHECK_CRC] = 1 if check_crc else 0
        a[A_CRC_MODE] = crc_mode() if check_crc else CRC_TABLE
        a[A_MAX_N] = batch_records
        a[A_SEG_START] = self.seg_start
        a[A_STATS] = self.stats.ctypes.data
        a[A_COLUMNS:A_COLUMNS + len(COLUMNS)] = self.cols.pointers
        self.stop: SegmentStop | None = None
        self.records = 0
        self.end_pos = start_pos
        self.kernel_kind: str | None = None  # the kernel's own verdict at an invalid stop
        self._released = 0

    @property
    def phys_mismatches(self) -> int:
        return int(self.stats[0])

    @property
    def first_phys_mismatch(self) -> int | None:
        return None if self.stats[0] == 0 else int(self.stats[1])

    def __iter__(self) -> Iterator[RecordBatch]:
        walk = self.k.walk
        a = self.block
        addr = a.ctypes.data
        buf, size = self.buf, self.size
        cols = self.cols
        pos = self.start_pos
        try:
            while True:
                n = 0
                batch_start = pos
                a[A_BYTE_LIMIT] = pos + self.batch_bytes
                while True:
                    a[A_POS] = pos
                    a[A_N] = n
                    walk(addr)
                    n, pos, code = int(a[A_OUT_N]), int(a[A_OUT_POS]), int(a[A_OUT_CODE])
                    if code == DEFER or code >= INVALID:
                        rec = self._pure(pos)
                        if code >= INVALID:
                            self.kernel_kind = KINDS[code - INVALID]
                            if self.strict and (not isinstance(rec, Invalid) or rec.kind != self.kernel_kind):
                                raise AssertionError(f"fast walk verdict {self.kernel_kind} at {pos} differs from "
                                                     f"the pure decoder's {rec!r}")
                        if isinstance(rec, Message):
                            self._take(rec, n, pos)
                            n += 1
                            pos += rec.size
                            continue
                        self._finish(n, pos)
                        if n:
                            yield RecordBatch(buf, cols.arrays, n, self.seg_start, self.name)
                        if isinstance(rec, Blank):
                            self.end_pos = size
                            self.stop = SegmentStop("blank", pos, self.seg_start + pos, blank=rec)
                        else:
                            self.stop = SegmentStop("invalid", pos, self.seg_start + pos, invalid=rec)
                        return
                    break
                self._finish(n, pos)
                if n:
                    yield RecordBatch(buf, cols.arrays, n, self.seg_start, self.name)
                if code == FULL:
                    self._release(batch_start)
                    continue
                if code == BLANK:
                    self.end_pos = size
                    self.stop = SegmentStop("blank", pos, self.seg_start + pos,
                                            blank=Blank(self.seg_start + pos, self.name, pos, size - pos, size - pos))
                elif code == LIMIT:
                    self.stop = SegmentStop("limit", pos, self.seg_start + pos)
                else:
                    self.stop = SegmentStop("end", pos, self.seg_start + pos)
                return
        finally:
            self._release(size)

    def _finish(self, n: int, pos: int) -> None:
        self.records += n
        if n:
            self.end_pos = pos

    def _pure(self, pos: int) -> Message | Blank | Invalid:
        """The pure decoder's verdict at ``pos`` (for kernel stops: DEFER or invalid)."""
        to_end = self.size - pos
        with memoryview(self.buf) as mv:
            return decode_record(mv, pos, to_end, pos, self.seg_start, self.name, to_end=to_end,
                                 check_crc=self.check_crc, read_body=False, max_record_size=self.max_record_size)

    def _take(self, msg: Message, n: int, pos: int) -> None:
        """Store a record the Python decoder accepted as row ``n``."""
        bh = 20 if msg.sys_flag & 0x10 else 8
        sh = 20 if msg.sys_flag & 0x20 else 8
        body_start = pos + 72 + bh + sh
        topic_start = body_start + max(msg.body_length, 0) + (2 if msg.magic_name == "v2" else 1)
        self.cols.set_row(n, msg, body_start, topic_start, topic_start + len(msg.topic_raw) + 2)
        if msg.physical_offset != self.seg_start + pos:
            if self.stats[0] == 0:
                self.stats[1] = pos
            self.stats[0] += 1

    def _release(self, upto: int) -> None:
        """Drop mapped pages before ``upto`` from our RSS (they stay in the page cache)."""
        if not self.release_pages:
            return
        end = upto & ~(mmap.PAGESIZE - 1)
        if end - self._released >= (1 << 20) or (upto >= self.size and end > self._released):
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            except (OSError, ValueError):
                self.release_pages = False
            self._released = end

    def close(self) -> None:
        """Unmap the segment (views still held elsewhere keep the mapping alive)."""
        self.buf = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass
            self._mm = None

    def __enter__(self) -> FastSegmentWalk:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _map(segment: Segment):
    """Read-only mapping of a segment file and a uint8 array over it (no copy)."""
    try:
        fd = os.open(segment.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", segment.path) from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None, _as_array(b"")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot map: {e}", segment.path) from None
    finally:
        os.close(fd)
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
        try:
            mm.madvise(mmap.MADV_SEQUENTIAL)
        except OSError:
            pass
    return mm, _as_array(mm)


def walk_segment_fast(segment: Segment, start_pos: int = 0, check_crc: bool = True, *,
                      end_offset: int | None = None, max_record_size: int = MAX_RECORD_SIZE,
                      batch_records: int = BATCH_RECORDS, batch_bytes: int = BATCH_BYTES,
                      release_pages: bool = True, strict: bool = False) -> FastSegmentWalk:
    """Walk ``segment`` from ``start_pos`` like ``Walk._walk_segment`` (no ``keep_going``).

    Iterate the result for :class:`RecordBatch` column batches; afterwards ``.stop`` says why
    it ended (a pure-path :class:`Invalid` for damage), ``.end_pos`` where valid data ended.
    ``end_offset`` is the absolute ``--to-offset`` bound. ``strict`` raises AssertionError if
    the kernel's verdict ever differs from the pure decoder's (tests).
    """
    return FastSegmentWalk(segment=segment, start_pos=start_pos, check_crc=check_crc, end_offset=end_offset,
                           max_record_size=max_record_size, batch_records=batch_records, batch_bytes=batch_bytes,
                           release_pages=release_pages, strict=strict)


def walk_buffer_fast(buf, *, seg_start: int = 0, name: str = "", start_pos: int = 0, check_crc: bool = True,
                     end_offset: int | None = None, max_record_size: int = MAX_RECORD_SIZE,
                     batch_records: int = BATCH_RECORDS, strict: bool = False) -> FastSegmentWalk:
    """Like :func:`walk_segment_fast` over an in-memory segment image (bytes, mmap, array)."""
    return FastSegmentWalk(buf=buf, seg_start=seg_start, name=name, start_pos=start_pos, check_crc=check_crc,
                           end_offset=end_offset, max_record_size=max_record_size, batch_records=batch_records,
                           strict=strict)


class FastWalk:
    """Drop-in for :class:`rmqdump.store.commitlog.Walk` without ``keep_going``: same iteration
    (:class:`Message` and :class:`Blank`), same ``stop``, ``end_offset``, ``records``,
    ``bytes_done`` afterwards. ``use_mmap`` is implied (the kernel reads a mapping)."""

    def __init__(self, commitlog: CommitLog, *, start: int | None = None, end: int | None = None,
                 check_crc: bool = True, read_body: bool = True, max_record_size: int = MAX_RECORD_SIZE,
                 batch_records: int = BATCH_RECORDS, strict: bool = False):
        self.cl = commitlog
        self.start = commitlog.min_offset if start is None else start
        self.end = end
        self.check_crc = check_crc
        self.read_body = read_body
        self.max_record_size = max_record_size
        self.batch_records = batch_records
        self.strict = strict
        self.stop: Invalid | None = None
        self.end_offset = self.start
        self.records = 0
        self.bytes_done = 0

    def batches(self) -> Iterator[RecordBatch | Blank]:
        """The walk as column batches (and Blank records); sets ``stop`` like :meth:`__iter__`."""
        segs = [s for s in self.cl.segments if s.start + s.size > self.start]
        if not segs:
            self.stop = Invalid(self.start, "", 0, END_OF_DATA, f"offset {self.start} is past the end of the commitlog")
            return
        columns = None
        for seg in segs:
            w = FastSegmentWalk(segment=seg, start_pos=max(0, self.start - seg.start), check_crc=self.check_crc,
                                end_offset=self.end, max_record_size=self.max_record_size,
                                batch_records=self.batch_records, strict=self.strict, columns=columns)
            columns = w.cols
            try:
                for batch in w:
                    self.records += batch.n
                    self.end_offset = seg.start + int(batch["file_pos"][-1]) + int(batch["size"][-1])
                    yield batch
            finally:
                w.close()
            self.bytes_done += seg.size
            st = w.stop
            if st.kind == "blank":
                self.end_offset = seg.start + seg.size
                yield st.blank
            elif st.kind == "limit":
                self.stop = Invalid(st.offset, seg.name, st.pos, END_OF_DATA, f"reached --to-offset {self.end}")
                return
            elif st.kind == "invalid":
                self.stop = st.invalid
                return
        last = segs[-1]
        self.stop = Invalid(last.end, last.name, last.size, END_OF_DATA, "end of the last commitlog segment")

    def __iter__(self) -> Iterator[Message | Blank]:
        for item in self.batches():
            if isinstance(item, RecordBatch):
                yield from item.messages(self.read_body)
            else:
                yield item


# --- whole-segment jobs and parallelism ------------------------------------------------------------
@dataclass
class SegmentSummary:
    """What walking one segment found (picklable; one per segment for verify-like commands)."""

    file: str
    start: int  # segment start offset
    size: int
    start_pos: int
    records: int
    end_pos: int  # segment position after the last valid record (size after a BLANK)
    stop: str  # "end", "blank", "limit" or an Invalid kind
    stop_pos: int
    stop_detail: str
    stop_size: int  # the invalid record's TOTALSIZE when usable, else -1
    phys_mismatches: int
    first_phys_mismatch: int | None
    min_store_timestamp: int | None
    max_store_timestamp: int | None

    @property
    def stop_offset(self) -> int:
        return self.start + self.stop_pos


def summarize_segment(segment: Segment, start_pos: int = 0, check_crc: bool = True, end_offset: int | None = None,
                      max_record_size: int = MAX_RECORD_SIZE) -> SegmentSummary:
    """Walk one segment with the fast kernel and summarise it (verify's per-segment step)."""
    lo = hi = None
    with walk_segment_fast(segment, start_pos, check_crc, end_offset=end_offset,
                           max_record_size=max_record_size) as w:
        for b in w:
            ts = b["store_timestamp"]
            bmin, bmax = int(ts.min()), int(ts.max())
            lo = bmin if lo is None else min(lo, bmin)
            hi = bmax if hi is None else max(hi, bmax)
        st = w.stop
        inv = st.invalid
        return SegmentSummary(
            file=segment.name, start=segment.start, size=w.size, start_pos=start_pos, records=w.records,
            end_pos=w.end_pos, stop=inv.kind if inv is not None else st.kind, stop_pos=st.pos,
            stop_detail=inv.detail if inv is not None else "", stop_size=inv.size if inv is not None else -1,
            phys_mismatches=w.phys_mismatches, first_phys_mismatch=w.first_phys_mismatch,
            min_store_timestamp=lo, max_store_timestamp=hi)


def verify_segments(segments: Sequence[Segment], *, jobs: int = 1, check_crc: bool = True,
                    start: int | None = None, end: int | None = None,
                    max_record_size: int = MAX_RECORD_SIZE) -> list[SegmentSummary]:
    """:func:`summarize_segment` over every segment (from ``start``, up to ``end``), ``jobs`` at a
    time in threads (the kernel releases the GIL). Combine in order: the commitlog's valid data
    ends at the first summary whose ``stop`` is an Invalid kind."""
    segs = [s for s in segments if start is None or s.start + s.size > start]
    args = [(s, max(0, start - s.start) if start is not None else 0) for s in segs]
    backend()  # load once, before the threads start

    def one(a):
        return summarize_segment(a[0], a[1], check_crc, end, max_record_size)

    if jobs <= 1 or len(args) <= 1:
        return [one(a) for a in args]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(jobs, len(args))) as ex:
        return list(ex.map(one, args))


def default_jobs() -> int:
    """CPUs this process may use: its CPU affinity, capped by ``$OMP_NUM_THREADS`` (which Spark
    sets to a task's ``spark.task.cpus``, so a task's threads keep to its share)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    try:
        cap = int(os.environ.get("OMP_NUM_THREADS", "0"))
    except ValueError:
        cap = 0
    return max(1, min(n, cap) if cap > 0 else n)


def parallel_segment_map(func: Callable[[Segment], Any], segments: Iterable[Segment], jobs: int | None = None, *,
                         threads: bool = False) -> list:
    """``[func(s) for s in segments]``, ``jobs`` at a time, results in segment order.

    Processes (``forkserver`` context where available, else ``spawn``) by default, so ``func``
    must be a picklable module-level function and its result picklable; ``threads=True`` for
    functions that release the GIL (compiled kernels). ``jobs`` None = all CPUs; <= 1 runs inline.
    """
    segs = list(segments)
    jobs = default_jobs() if jobs is None else jobs
    if jobs <= 1 or len(segs) <= 1:
        return [func(s) for s in segs]
    workers = min(jobs, len(segs))
    if threads:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as ex:
            return list(ex.map(func, segs))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as ex:
        return list(ex.map(func, segs))
